//! RoPE against its CPU reference on every device and variant, in both layouts.

use std::sync::Arc;

use webshard::gpu::{self, testing, Gpu, Recorder, Variant};
use webshard::ops::rope::{self, RopeParams};

fn each_variant() -> Vec<(Arc<Gpu>, Variant)> {
    pollster::block_on(testing::device_variants()).expect("gpu devices")
}

/// (name, params, heads): the three models' settings plus partial rotation and linear scaling.
fn configurations() -> Vec<(&'static str, RopeParams, u32)> {
    let p = |head_dim, rope_dims, freq_base, freq_scale, neox| RopeParams {
        head_dim,
        rope_dims,
        freq_base,
        freq_scale,
        neox,
    };
    vec![
        ("smollm2", p(64, 64, 100_000.0, 1.0, false), 9),
        ("qwen2", p(64, 64, 1_000_000.0, 1.0, true), 14),
        ("gemma3 global", p(256, 256, 1_000_000.0, 1.0, true), 4),
        ("gemma3 local", p(256, 256, 10_000.0, 1.0, true), 1),
        ("partial normal", p(64, 32, 10_000.0, 1.0, false), 3),
        ("partial neox", p(256, 96, 10_000.0, 1.0, true), 2),
        ("linear scaling", p(64, 64, 10_000.0, 0.25, false), 5),
    ]
}

#[test]
fn rope_matches_reference() {
    let seed = testing::fresh_seed();
    for (gpu, variant) in each_variant() {
        for (name, params, heads) in configurations() {
            for (tokens, start_pos) in [(1u32, 0u32), (5, 17), (33, 3967), (1, 4000)] {
                let n = (tokens * heads * params.head_dim) as usize;
                let case_seed = seed + u64::from(tokens * 7919 + start_pos);
                let x: Vec<f32> = testing::random_f32(n, case_seed)
                    .into_iter()
                    .map(|v| v * 8.0)
                    .collect();
                let buffer = gpu::upload_f32(&gpu, "x", &x);
                let mut rec = Recorder::with_variant(&gpu, variant);
                rope::rope(&mut rec, &buffer, tokens, heads, start_pos, &params);
                rec.submit();
                let got = pollster::block_on(gpu::read_f32(&gpu, &buffer, 0, n as u64)).unwrap();
                let mut want = x.clone();
                rope::rope_reference(&mut want, tokens, heads, start_pos, &params);
                let what = format!(
                    "rope {name} tokens={tokens} start={start_pos} {} ({}) {variant} seed={case_seed}",
                    gpu.caps.adapter, gpu.caps.backend
                );
                eprintln!(
                    "{what}: relative error {:e}",
                    testing::relative_error(&got, &want)
                );
                testing::assert_close(&got, &want, 2e-6, &what);
                assert_untouched_beyond_rope_dims(&got, &x, &params, &what);
            }
        }
    }
}

fn assert_untouched_beyond_rope_dims(got: &[f32], input: &[f32], p: &RopeParams, what: &str) {
    for (head_got, head_in) in got
        .chunks(p.head_dim as usize)
        .zip(input.chunks(p.head_dim as usize))
    {
        let tail = p.rope_dims as usize..;
        assert_eq!(
            &head_got[tail.clone()],
            &head_in[tail],
            "{what}: changed dims past rope_dims"
        );
    }
}

/// The reference against the textbook definition in f64: pair i of a head rotates by
/// pos * freq_scale * base^(-2i / rope_dims); the layout decides which two values form pair i.
#[test]
fn rope_reference_matches_the_definition() {
    let seed = testing::fresh_seed();
    for (name, p, heads) in configurations() {
        let (tokens, start_pos) = (3u32, 3998u32);
        let x = testing::random_f32((tokens * heads * p.head_dim) as usize, seed);
        let mut got = x.clone();
        rope::rope_reference(&mut got, tokens, heads, start_pos, &p);
        let half = (p.rope_dims / 2) as usize;
        for (row, (head_got, head_in)) in got
            .chunks(p.head_dim as usize)
            .zip(x.chunks(p.head_dim as usize))
            .enumerate()
        {
            let pos = f64::from(start_pos) + (row / heads as usize) as f64;
            for i in 0..half {
                let theta = pos
                    * f64::from(p.freq_scale)
                    * f64::from(p.freq_base).powf(-2.0 * i as f64 / f64::from(p.rope_dims));
                let (a, b) = if p.neox {
                    (i, i + half)
                } else {
                    (2 * i, 2 * i + 1)
                };
                let (x0, x1) = (f64::from(head_in[a]), f64::from(head_in[b]));
                let want = [
                    x0 * theta.cos() - x1 * theta.sin(),
                    x0 * theta.sin() + x1 * theta.cos(),
                ];
                // f32 angles near 4000 rad carry ~2e-4 rad of rounding, in ggml as here.
                for (got, want) in [head_got[a], head_got[b]].iter().zip(want) {
                    assert!(
                        (f64::from(*got) - want).abs() < 2e-3,
                        "{name} row {row} pair {i}: {got} vs {want}"
                    );
                }
            }
        }
    }
}
