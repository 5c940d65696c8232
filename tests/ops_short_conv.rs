//! LFM2's gated short convolution against its CPU reference, on every device and variant: a
//! sequence fed as a prompt in chunks and then token by token (the state carrying the earlier
//! positions), and taken up again from a shorter prefix with new tokens.

use std::sync::Arc;

use webshard::gpu::{self, testing, Gpu, Recorder, Variant};
use webshard::ops::short_conv::{self, ShortConvCall, ShortConvState};

/// Extra elements after each output, which must keep their poison.
const GUARD: usize = 5;

fn each_variant() -> Vec<(Arc<Gpu>, Variant)> {
    pollster::block_on(testing::device_variants()).expect("gpu devices")
}

struct Case {
    channels: usize,
    kernel_len: usize,
    /// Token counts of successive calls over one sequence.
    chunks: &'static [usize],
}

const CASES: [Case; 4] = [
    Case {
        channels: 256,
        kernel_len: 3,
        chunks: &[7, 1, 1, 5, 1],
    },
    Case {
        channels: 1024,
        kernel_len: 3,
        chunks: &[1, 1, 1, 40],
    },
    Case {
        channels: 37,
        kernel_len: 4,
        chunks: &[2, 1, 9],
    },
    Case {
        channels: 64,
        kernel_len: 1,
        chunks: &[3, 1],
    },
];

/// Runs one call of `tokens` rows of `bcx` at `start_pos` and returns its checked output.
#[allow(clippy::too_many_arguments)]
fn run_chunk(
    gpu: &Gpu,
    variant: Variant,
    state: &ShortConvState,
    weight: &wgpu::Buffer,
    bcx: &[f32],
    case: &Case,
    start_pos: usize,
    what: &str,
) -> Vec<f32> {
    let tokens = bcx.len() / (3 * case.channels);
    let n = tokens * case.channels;
    let out = gpu::storage_buffer(gpu, "out", ((n + GUARD) * 4) as u64);
    gpu::poison_f32(gpu, &out);
    let bcx_buf = gpu::upload_f32(gpu, "bcx", bcx);
    let call = ShortConvCall {
        bcx: &bcx_buf,
        weight,
        history: &state.layers[0],
        tokens: tokens as u32,
        channels: case.channels as u32,
        kernel_len: case.kernel_len as u32,
        start_pos: start_pos as u32,
    };
    let mut rec = Recorder::with_variant(gpu, variant);
    short_conv::short_conv(&mut rec, &call, &out);
    rec.submit();
    let all = pollster::block_on(gpu::read_f32(gpu, &out, 0, (n + GUARD) as u64)).unwrap();
    for (i, v) in all[n..].iter().enumerate() {
        assert_eq!(
            v.to_bits(),
            gpu::POISON,
            "{what}: wrote past the end at {}",
            n + i
        );
    }
    all[..n].to_vec()
}

/// Feeds `bcx` (a whole sequence) from position `from` in the case's chunks.
#[allow(clippy::too_many_arguments)]
fn run_sequence(
    gpu: &Gpu,
    variant: Variant,
    state: &ShortConvState,
    weight: &wgpu::Buffer,
    bcx: &[f32],
    case: &Case,
    from: usize,
    what: &str,
) -> Vec<f32> {
    let row = 3 * case.channels;
    let total = bcx.len() / row;
    let (mut pos, mut got) = (from, Vec::new());
    for &chunk in case.chunks.iter().cycle() {
        if pos >= total {
            break;
        }
        let end = (pos + chunk).min(total);
        let what = format!("{what} chunk {pos}..{end}");
        let rows = &bcx[pos * row..end * row];
        got.extend(run_chunk(
            gpu, variant, state, weight, rows, case, pos, &what,
        ));
        pos = end;
    }
    got
}

#[test]
fn short_conv_matches_reference_across_chunks_and_a_rewound_prefix() {
    let seed = testing::fresh_seed();
    for (gpu, variant) in each_variant() {
        for (index, case) in CASES.iter().enumerate() {
            let tokens: usize = case.chunks.iter().sum();
            let row = 3 * case.channels;
            let case_seed = seed + 97 * index as u64;
            let bcx = testing::random_f32(tokens * row, case_seed);
            let weights = testing::random_f32(case.channels * case.kernel_len, case_seed + 1);
            let weight = gpu::upload_f32(&gpu, "weight", &weights);
            let state = ShortConvState::new(&gpu, 1, tokens as u32 + 8, case.channels as u32)
                .expect("state");
            // Positions never written must never be read.
            gpu::poison_f32(&gpu, &state.layers[0]);
            let what = format!(
                "short_conv d={} L={} {} ({}) {variant} seed={case_seed}",
                case.channels, case.kernel_len, gpu.caps.adapter, gpu.caps.backend
            );
            let got = run_sequence(&gpu, variant, &state, &weight, &bcx, case, 0, &what);
            let want =
                short_conv::short_conv_reference(&bcx, &weights, case.channels, case.kernel_len);
            eprintln!(
                "{what}: relative error {:e}",
                testing::relative_error(&got, &want)
            );
            testing::assert_close(&got, &want, 1e-5, &what);

            // Take the sequence up again after its first `keep` positions, with new tokens.
            let keep = tokens / 2;
            let mut rewound = bcx[..keep * row].to_vec();
            rewound.extend(testing::random_f32((tokens - keep) * row, case_seed + 2));
            let what = format!("{what} rewound to {keep}");
            let got = run_sequence(&gpu, variant, &state, &weight, &rewound, case, keep, &what);
            let want = short_conv::short_conv_reference(
                &rewound,
                &weights,
                case.channels,
                case.kernel_len,
            );
            testing::assert_close(&got, &want[keep * case.channels..], 1e-5, &what);
        }
    }
}
