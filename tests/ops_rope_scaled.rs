//! RoPE with ggml's frequency factors and cos/sin magnitude (`RopeScaling`: Llama 3's
//! `rope_freqs`, Phi-3's long/short factors and attn_factor) against its CPU reference on every
//! device and variant, and the reference against the definition.

use std::sync::Arc;

use webshard::gpu::{self, testing, Gpu, Recorder, Variant};
use webshard::ops::attention::KvCache;
use webshard::ops::rope::{self, RopeParams, RopeScaling, StoreTarget};

fn each_variant() -> Vec<(Arc<Gpu>, Variant)> {
    pollster::block_on(testing::device_variants()).expect("gpu devices")
}

/// (name, params, heads, mscale): Llama 3.2's and Phi-3's settings, and partial rotation.
fn configurations() -> Vec<(&'static str, RopeParams, u32, f32)> {
    let p = |head_dim, rope_dims, freq_base, neox| RopeParams {
        head_dim,
        rope_dims,
        freq_base,
        freq_scale: 1.0,
        neox,
    };
    vec![
        ("llama3", p(64, 64, 500_000.0, false), 4, 1.0),
        ("phi3 long", p(96, 96, 10_000.0, true), 3, 1.190_239),
        ("phi4 partial", p(128, 96, 250_000.0, true), 2, 1.0),
    ]
}

/// Fresh factors in [1, 32], as Llama 3's (1 for high frequencies up to `factor` for low ones).
fn factors(p: &RopeParams, seed: u64) -> Vec<f32> {
    testing::random_f32((p.rope_dims / 2) as usize, seed)
        .into_iter()
        .map(|v| 1.0 + 31.0 * v.abs())
        .collect()
}

fn scaled_input(n: usize, seed: u64) -> Vec<f32> {
    testing::random_f32(n, seed)
        .into_iter()
        .map(|v| v * 8.0)
        .collect()
}

#[test]
fn scaled_rope_matches_reference() {
    let seed = testing::fresh_seed();
    for (gpu, variant) in each_variant() {
        for (name, params, heads, mscale) in configurations() {
            for (tokens, start_pos) in [(1u32, 0u32), (5, 17), (33, 3967)] {
                let n = (tokens * heads * params.head_dim) as usize;
                let case_seed = seed + u64::from(tokens * 7919 + start_pos);
                let x = scaled_input(n, case_seed);
                let f = factors(&params, case_seed ^ 5);
                let buffer = gpu::upload_f32(&gpu, "x", &x);
                let inverse: Vec<f32> = f.iter().map(|v| 1.0 / v).collect();
                let factor_buffer = gpu::upload_f32(&gpu, "inverse factors", &inverse);
                let scaling = RopeScaling {
                    inverse_factors: &factor_buffer,
                    mscale,
                };
                let mut rec = Recorder::with_variant(&gpu, variant);
                rope::rope_scaled(
                    &mut rec,
                    &buffer,
                    tokens,
                    heads,
                    start_pos,
                    &params,
                    Some(&scaling),
                );
                rec.submit();
                let got = pollster::block_on(gpu::read_f32(&gpu, &buffer, 0, n as u64)).unwrap();
                let mut want = x.clone();
                rope::rope_reference_scaled(
                    &mut want,
                    tokens,
                    heads,
                    start_pos,
                    &params,
                    Some(&f),
                    mscale,
                );
                let what = format!(
                    "scaled rope {name} tokens={tokens} start={start_pos} {} ({}) {variant} seed={case_seed}",
                    gpu.caps.adapter, gpu.caps.backend
                );
                testing::assert_close(&got, &want, 2e-6, &what);
                let mut unscaled = x.clone();
                rope::rope_reference(&mut unscaled, tokens, heads, start_pos, &params);
                if start_pos > 0 {
                    assert!(
                        testing::relative_error(&unscaled, &want) > 1e-3,
                        "{what}: the factors changed nothing"
                    );
                }
            }
        }
    }
}

#[test]
fn scaled_rope_store_matches_reference() {
    let seed = testing::fresh_seed();
    let max_ctx = 64u32;
    for (gpu, variant) in each_variant() {
        for (name, params, heads, mscale) in configurations() {
            let kv_heads = 1;
            let (tokens, start_pos) = (1u32, 41u32);
            let case_seed = seed + u64::from(heads);
            let hd = params.head_dim as usize;
            let (q_len, kv_len) = (heads as usize * hd, kv_heads as usize * hd);
            let qkv = scaled_input(q_len + 2 * kv_len, case_seed);
            let f = factors(&params, case_seed ^ 5);
            let qkv_buffer = gpu::upload_f32(&gpu, "qkv", &qkv);
            let inverse: Vec<f32> = f.iter().map(|v| 1.0 / v).collect();
            let factor_buffer = gpu::upload_f32(&gpu, "inverse factors", &inverse);
            let cache = KvCache::new(&gpu, 1, max_ctx, kv_heads, params.head_dim).unwrap();
            cache
                .k
                .iter()
                .chain(&cache.v)
                .for_each(|b| gpu::poison_f32(&gpu, b));
            let target = StoreTarget::packed(&qkv_buffer, heads, &cache, 0);
            let scaling = RopeScaling {
                inverse_factors: &factor_buffer,
                mscale,
            };
            let mut rec = Recorder::with_variant(&gpu, variant);
            rope::rope_store_scaled(
                &mut rec,
                &target,
                None,
                Some(&scaling),
                tokens,
                start_pos,
                &params,
            );
            rec.submit();
            let reference = |x: &[f32], heads| {
                let mut out = x.to_vec();
                rope::rope_reference_scaled(
                    &mut out,
                    tokens,
                    heads,
                    start_pos,
                    &params,
                    Some(&f),
                    mscale,
                );
                out
            };
            let want_q = reference(&qkv[..q_len], heads);
            let want_k = reference(&qkv[q_len..q_len + kv_len], kv_heads);
            let what = format!(
                "scaled rope_store {name} {} {variant} seed={case_seed}",
                gpu.caps.backend
            );
            let got_q =
                pollster::block_on(gpu::read_f32(&gpu, &qkv_buffer, 0, q_len as u64)).unwrap();
            testing::assert_close(&got_q, &want_q, 4e-6, &format!("{what}: q"));
            let (index, offset) = cache.layer_location(0);
            let first = start_pos as usize * kv_len;
            let k_layer = pollster::block_on(gpu::read_f32(
                &gpu,
                &cache.k[index],
                offset / 4 + first as u64,
                kv_len as u64,
            ))
            .unwrap();
            testing::assert_close(&k_layer, &want_k, 4e-6, &format!("{what}: k cache"));
        }
    }
}

/// The reference against the definition in f64: pair i turns by
/// pos * freq_scale * base^(-2i / rope_dims) / factor_i, and both outputs scale by mscale.
#[test]
fn scaled_reference_matches_the_definition() {
    let seed = testing::fresh_seed();
    for (name, p, heads, mscale) in configurations() {
        let (tokens, start_pos) = (2u32, 3998u32);
        let x = testing::random_f32((tokens * heads * p.head_dim) as usize, seed);
        let f = factors(&p, seed ^ 5);
        let mut got = x.clone();
        rope::rope_reference_scaled(&mut got, tokens, heads, start_pos, &p, Some(&f), mscale);
        let half = (p.rope_dims / 2) as usize;
        for (row, (head_got, head_in)) in got
            .chunks(p.head_dim as usize)
            .zip(x.chunks(p.head_dim as usize))
            .enumerate()
        {
            let pos = f64::from(start_pos) + (row / heads as usize) as f64;
            for (i, &factor) in f.iter().enumerate().take(half) {
                let theta = pos
                    * f64::from(p.freq_scale)
                    * f64::from(p.freq_base).powf(-2.0 * i as f64 / f64::from(p.rope_dims))
                    / f64::from(factor);
                let (a, b) = if p.neox {
                    (i, i + half)
                } else {
                    (2 * i, 2 * i + 1)
                };
                let (x0, x1) = (f64::from(head_in[a]), f64::from(head_in[b]));
                let m = f64::from(mscale);
                let want = [
                    m * (x0 * theta.cos() - x1 * theta.sin()),
                    m * (x0 * theta.sin() + x1 * theta.cos()),
                ];
                for (got, want) in [head_got[a], head_got[b]].iter().zip(want) {
                    assert!(
                        (f64::from(*got) - want).abs() < 3e-3,
                        "{name} row {row} pair {i}: {got} vs {want}"
                    );
                }
            }
            let tail = p.rope_dims as usize..;
            assert_eq!(&head_got[tail.clone()], &head_in[tail], "{name}: tail");
        }
    }
}
