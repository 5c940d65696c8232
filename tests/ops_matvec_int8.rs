//! The integer products of decode (`quant::int8_products`, through `matvec_tokens` and `matmul`
//! as decode steps call them): x quantized to 8 bits (with its RMS norm) against the CPU
//! reference quarter by quarter, then every integer weight type with every epilogue, the GLU,
//! the norm, one token (a lone step) and token counts that fill, split and leave short the
//! workgroups of each work split, against the reference product on the same quantized x, on
//! every device and variant.

use std::sync::Arc;

use webshard::gpu::{
    self, testing, BackendChoice, Gpu, GpuOptions, Int8Products, Recorder, Variant,
};
use webshard::ops::elementwise::{activation_reference, Activation};
use webshard::ops::quant::testing::random_weights;
use webshard::ops::quant::{
    int8_products_reference, integer_type, matmul, matvec_tokens, quantize_int8,
    quantize_int8_reference, quantize_quarter_reference, Epilogue, Fusion, QuantMatrix, QuantType,
    ReferenceEpilogue,
};

/// Every device under test with the integer products on, in the work split of case `turn`
/// (the built-in one of 8 tokens a workgroup, the earlier one of 16 with fewer lanes a row, one
/// of 12 with fewer lanes, in turn, so that every count of token vec4s runs: each split is a
/// pipeline per type to compile, seconds each on a CPU adapter), in the variant of that case.
fn int8_devices(turn: usize, seed: u64) -> Vec<(Arc<Gpu>, Variant)> {
    let devices = pollster::block_on(testing::devices_under_test()).expect("devices under test");
    let splits = [None, Some([64, 8, 16]), Some([32, 16, 12])];
    let split = splits[(turn + seed as usize) % splits.len()];
    devices
        .iter()
        .map(|device| {
            let options = GpuOptions {
                backend: BackendChoice::parse(&device.caps.backend).unwrap_or_default(),
                gpu_work_split: true,
                int8_products: Some(Int8Products::Decode),
                int8_split: split,
                ..Default::default()
            };
            let gpu = pollster::block_on(Gpu::new(&options)).expect("device");
            let variant = testing::variant_for_case(&gpu.caps.all_variants(), turn, seed);
            (gpu, variant)
        })
        .collect()
}

fn upload_matrix(gpu: &Gpu, bytes: &[u8], rows: usize) -> gpu::WeightTensor {
    let row_bytes = (bytes.len() / rows) as u64;
    let tensor = gpu::WeightTensor::allocate(gpu, "w", rows as u64, row_bytes).expect("allocate");
    for piece in tensor.upload_pieces(1 << 20) {
        let start = piece.tensor_offset as usize;
        tensor.write_piece(gpu, &piece, &bytes[start..start + piece.bytes as usize]);
    }
    tensor
}

/// Records `body` into an output of `len` values holding `previous` (poisoned if `None`) and
/// reads it back.
fn run(
    gpu: &Gpu,
    variant: Variant,
    len: usize,
    previous: Option<&[f32]>,
    body: impl FnOnce(&mut Recorder, &wgpu::Buffer),
) -> Vec<u8> {
    let out = gpu::upload_f32(gpu, "out", previous.unwrap_or(&vec![0.0; len]));
    if previous.is_none() {
        gpu::poison_f32(gpu, &out);
    }
    let mut rec = Recorder::with_variant(gpu, variant);
    body(&mut rec, &out);
    pollster::block_on(rec.submit_and_read(&out, 0, (len * 4) as u64)).expect("read")
}

/// Each quarter of 8 values: its integers within one of the reference's (a tie may round
/// either way after the GPU's division), its scale, and d times the sum of its own integers.
#[test]
fn quantize_int8_matches_the_reference() {
    let seed = testing::fresh_seed();
    let (tokens, cols) = (3usize, 160usize);
    let x = testing::random_f32(tokens * cols, seed);
    let norm_weight = testing::random_f32(cols, seed ^ 1);
    for (turn, norm) in [false, true].into_iter().enumerate() {
        let normed = match norm {
            true => webshard::ops::norm::rms_norm_reference(&x, &norm_weight, 1e-5),
            false => x.clone(),
        };
        for (gpu, variant) in int8_devices(turn, seed) {
            let x_buf = gpu::upload_f32(&gpu, "x", &x);
            let norm_buf = gpu::upload_f32(&gpu, "norm", &norm_weight);
            let len = tokens * cols / 2;
            let bytes = run(&gpu, variant, len, None, |rec, out| {
                let norm = norm.then_some((&norm_buf, 1e-5));
                let xq = quantize_int8(rec, &x_buf, norm, tokens as u32, cols as u32);
                rec.copy(&xq, 0, out, 0, (len * 4) as u64);
            });
            let words: Vec<u32> = bytemuck::pod_collect_to_vec(&bytes);
            let what = format!("{} {variant} norm={norm} seed={seed}", gpu.caps.adapter);
            let mut flips = 0;
            for (quarter, values) in normed.chunks(8).enumerate() {
                let (want_q, want_d) = quantize_quarter_reference(values);
                let word = &words[quarter * 4..][..4];
                let q: Vec<i8> = bytemuck::cast_slice::<u32, i8>(&word[..2]).to_vec();
                let d = f32::from_bits(word[2]);
                let at = format!("{what}: quarter {quarter}");
                assert!(
                    (d - want_d).abs() <= want_d * 1e-5,
                    "{at}: d {d} want {want_d}"
                );
                for (i, (&got, &want)) in q.iter().zip(&want_q).enumerate() {
                    let diff = (i32::from(got) - i32::from(want)).abs();
                    assert!(diff <= 1, "{at} value {i}: q {got} want {want}");
                    flips += diff;
                }
                let sum: i32 = q.iter().map(|&v| i32::from(v)).sum();
                let (got_sum, want_sum) = (f32::from_bits(word[3]), d * sum as f32);
                let close = (got_sum - want_sum).abs() <= 1e-5 * want_sum.abs().max(1.0);
                assert!(close, "{at}: d * sum(q) {got_sum} want {want_sum}");
            }
            assert!(flips <= 2, "{what}: {flips} integers one off the reference");
        }
    }
}

/// One case: a type, a token count, an epilogue, the norm or not.
struct Case {
    quant: QuantType,
    tokens: usize,
    epilogue: ReferenceEpilogue,
    norm: bool,
}

const ROWS: usize = 75;

fn check_case(case: &Case, turn: usize, seed: u64) {
    let (quant, tokens) = (case.quant, case.tokens);
    let cols = if quant.block_size() == 256 { 512 } else { 192 };
    let bytes = random_weights(quant, ROWS, cols, seed ^ turn as u64);
    let x = testing::random_f32(tokens * cols, seed ^ 11);
    let aux = testing::random_f32(tokens * ROWS, seed ^ 12);
    let previous = testing::random_f32(tokens * ROWS, seed ^ 13);
    let norm_weight = testing::random_f32(cols, seed ^ 14);
    let norm = case.norm.then_some((norm_weight.as_slice(), 1e-5));
    let xq = quantize_int8_reference(&x, norm);
    let mut want = previous.clone();
    int8_products_reference(
        quant,
        &bytes,
        ROWS,
        &xq,
        tokens,
        case.epilogue,
        &aux,
        &mut want,
    );
    for (gpu, variant) in int8_devices(turn, seed) {
        let tensor = upload_matrix(&gpu, &bytes, ROWS);
        let w = QuantMatrix::new(&tensor, quant, cols as u32, ROWS as u32).expect("matrix");
        let x_buf = gpu::upload_f32(&gpu, "x", &x);
        let aux_buf = gpu::upload_f32(&gpu, "aux", &aux);
        let norm_buf = gpu::upload_f32(&gpu, "norm", &norm_weight);
        let fusion = Fusion {
            residual: None,
            norm: case.norm.then_some((&norm_buf, 1e-5)),
            epilogue: match case.epilogue {
                ReferenceEpilogue::Store => Epilogue::Store,
                ReferenceEpilogue::Bias => Epilogue::Bias(&aux_buf),
                ReferenceEpilogue::Accumulate => Epilogue::Accumulate,
                ReferenceEpilogue::Gated(act) => Epilogue::Gated(&aux_buf, act),
            },
            out_offset: 0,
        };
        let accumulates = matches!(case.epilogue, ReferenceEpilogue::Accumulate);
        let len = tokens * ROWS;
        let got = run(
            &gpu,
            variant,
            len,
            accumulates.then_some(&previous),
            |rec, out| matvec_tokens(rec, &w, &x_buf, out, &fusion, tokens as u32),
        );
        let what = format!(
            "{quant:?} {} {variant} split={:?} tokens={tokens} norm={} {:?} seed={seed}",
            gpu.caps.adapter, gpu.caps.int8_split, case.norm, case.epilogue
        );
        testing::assert_close(&bytemuck::pod_collect_to_vec(&got), &want, 1e-3, &what);
        if case.norm || !matches!(case.epilogue, ReferenceEpilogue::Store) {
            continue;
        }
        let got = run(&gpu, variant, len, None, |rec, out| {
            matmul(rec, &w, &x_buf, out, tokens as u32)
        });
        testing::assert_close(
            &bytemuck::pod_collect_to_vec(&got),
            &want,
            1e-3,
            &format!("matmul {what}"),
        );
    }
}

/// Every integer type once, with the epilogues, the norm and the token counts in turn.
#[test]
fn int8_products_match_the_reference() {
    let seed = testing::fresh_seed();
    let epilogues = [
        ReferenceEpilogue::Store,
        ReferenceEpilogue::Bias,
        ReferenceEpilogue::Accumulate,
        ReferenceEpilogue::Gated(Activation::Silu),
        ReferenceEpilogue::Gated(Activation::GeluTanh),
    ];
    let token_counts = [2, 5, 16, 7, 1, 12, 9, 4, 16, 6, 11, 1];
    let types = QuantType::ALL.into_iter().filter(|&q| integer_type(q));
    for (turn, quant) in types.enumerate() {
        let case = Case {
            quant,
            tokens: token_counts[turn % token_counts.len()],
            epilogue: epilogues[turn % epilogues.len()],
            norm: turn % 2 == 1,
        };
        check_case(&case, turn, seed);
    }
}

/// The GLU epilogue: gate rows and up rows of one matrix, each token's pair from the same
/// quantized x.
#[test]
fn int8_glu_matches_the_reference() {
    let seed = testing::fresh_seed();
    let gate_rows = 37;
    for (turn, (quant, tokens, act)) in [
        (QuantType::Q4_K, 16, Activation::GeluTanh),
        (QuantType::Q8_0, 1, Activation::Silu),
        (QuantType::Q6_K, 9, Activation::Silu),
    ]
    .into_iter()
    .enumerate()
    {
        let cols = if quant.block_size() == 256 { 256 } else { 96 };
        let bytes = random_weights(quant, 2 * gate_rows, cols, seed ^ turn as u64);
        let x = testing::random_f32(tokens * cols, seed ^ 21);
        let norm_weight = testing::random_f32(cols, seed ^ 22);
        let xq = quantize_int8_reference(&x, Some((&norm_weight, 1e-6)));
        let mut both = vec![0.0; tokens * 2 * gate_rows];
        let store = ReferenceEpilogue::Store;
        int8_products_reference(
            quant,
            &bytes,
            2 * gate_rows,
            &xq,
            tokens,
            store,
            &[],
            &mut both,
        );
        let want: Vec<f32> = (0..tokens * gate_rows)
            .map(|i| {
                let row = &both[i / gate_rows * 2 * gate_rows..];
                let r = i % gate_rows;
                activation_reference(row[r], act) * row[gate_rows + r]
            })
            .collect();
        for (gpu, variant) in int8_devices(turn, seed) {
            let tensor = upload_matrix(&gpu, &bytes, 2 * gate_rows);
            let rows = 2 * gate_rows as u32;
            let w = QuantMatrix::new(&tensor, quant, cols as u32, rows).expect("matrix");
            let x_buf = gpu::upload_f32(&gpu, "x", &x);
            let norm_buf = gpu::upload_f32(&gpu, "norm", &norm_weight);
            let up = w.rows(gate_rows as u32..rows);
            let fusion = Fusion {
                residual: None,
                norm: Some((&norm_buf, 1e-6)),
                epilogue: Epilogue::Glu(up, act),
                out_offset: 0,
            };
            let gate = w.rows(0..gate_rows as u32);
            let got = run(&gpu, variant, tokens * gate_rows, None, |rec, out| {
                matvec_tokens(rec, &gate, &x_buf, out, &fusion, tokens as u32)
            });
            let what = format!(
                "GLU {quant:?} {act:?} {} {variant} split={:?} tokens={tokens} seed={seed}",
                gpu.caps.adapter, gpu.caps.int8_split
            );
            testing::assert_close(&bytemuck::pod_collect_to_vec(&got), &want, 1e-3, &what);
        }
    }
}

/// A token's integer products are the same alone as among others (bit for bit: no sum crosses
/// tokens), so a batched step's rows keep their single steps' numerics.
#[test]
fn int8_products_of_a_token_do_not_depend_on_the_others() {
    let seed = testing::fresh_seed();
    let (rows, tokens) = (200usize, 5usize);
    for (turn, (quant, cols)) in [
        (QuantType::Q4_K, 2048),
        (QuantType::Q8_0, 1024),
        (QuantType::Q5_0, 640),
    ]
    .into_iter()
    .enumerate()
    {
        let bytes = random_weights(quant, rows, cols, seed ^ turn as u64);
        let x = testing::random_f32(tokens * cols, seed ^ 31);
        let norm_weight = testing::random_f32(cols, seed ^ 32);
        for (gpu, variant) in int8_devices(turn, seed) {
            let tensor = upload_matrix(&gpu, &bytes, rows);
            let w = QuantMatrix::new(&tensor, quant, cols as u32, rows as u32).expect("matrix");
            let norm_buf = gpu::upload_f32(&gpu, "norm", &norm_weight);
            let fusion = Fusion {
                residual: None,
                norm: Some((&norm_buf, 1e-6)),
                epilogue: Epilogue::Store,
                out_offset: 0,
            };
            let x_buf = gpu::upload_f32(&gpu, "x", &x);
            let together = run(&gpu, variant, tokens * rows, None, |rec, out| {
                matvec_tokens(rec, &w, &x_buf, out, &fusion, tokens as u32)
            });
            let together: Vec<f32> = bytemuck::pod_collect_to_vec(&together);
            for t in 0..tokens {
                let one = gpu::upload_f32(&gpu, "x", &x[t * cols..][..cols]);
                let alone = run(&gpu, variant, rows, None, |rec, out| {
                    matvec_tokens(rec, &w, &one, out, &fusion, 1)
                });
                let alone: Vec<f32> = bytemuck::pod_collect_to_vec(&alone);
                let what = format!(
                    "{quant:?} {} {variant} token {t} seed={seed}",
                    gpu.caps.adapter
                );
                assert_eq!(alone, together[t * rows..][..rows], "{what}");
            }
        }
    }
}
