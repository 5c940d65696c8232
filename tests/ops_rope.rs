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

/// Packed sequences (lengths 1, 7, 64 and 30, each counting from 0, as an encoder's batch
/// packs them): `rope_at` against the reference run on each sequence alone.
#[test]
fn rope_at_restarts_positions_per_sequence() {
    let seed = testing::fresh_seed();
    let lengths = [1u32, 7, 64, 30];
    let positions: Vec<u32> = lengths.iter().flat_map(|&n| 0..n).collect();
    let tokens = positions.len() as u32;
    for (gpu, variant) in each_variant() {
        for (name, params, heads) in configurations() {
            let row = (heads * params.head_dim) as usize;
            let x: Vec<f32> = testing::random_f32(tokens as usize * row, seed)
                .into_iter()
                .map(|v| v * 8.0)
                .collect();
            let buffer = gpu::upload_f32(&gpu, "x", &x);
            let position_buffer = gpu::upload_u32(&gpu, "positions", &positions);
            let mut rec = Recorder::with_variant(&gpu, variant);
            rope::rope_at(&mut rec, &buffer, tokens, heads, &position_buffer, &params);
            rec.submit();
            let n = x.len() as u64;
            let got = pollster::block_on(gpu::read_f32(&gpu, &buffer, 0, n)).unwrap();
            let mut want = x.clone();
            let mut start = 0usize;
            for &length in &lengths {
                let end = start + length as usize * row;
                rope::rope_reference(&mut want[start..end], length, heads, 0, &params);
                start = end;
            }
            let what = format!(
                "rope_at {name} {} ({}) {variant} seed={seed}",
                gpu.caps.adapter, gpu.caps.backend
            );
            testing::assert_close(&got, &want, 2e-6, &what);
            assert_untouched_beyond_rope_dims(&got, &x, &params, &what);
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

/// rope_store against rope_reference (after the per-head norm reference, when asked) plus
/// plain copies into the cache: q rotated in place, k rotated and v copied into one cache
/// layer at start_pos, and no other cache element touched.
#[test]
fn rope_store_matches_rope_then_cache_write() {
    use webshard::ops::attention::KvCache;
    use webshard::ops::norm::rms_norm_reference;
    use webshard::ops::rope::{HeadNorms, Section, StoreTarget};
    let seed = testing::fresh_seed();
    let max_ctx = 64u32;
    for (gpu, variant) in each_variant() {
        for (name, params, heads) in configurations() {
            let kv_heads = if heads % 3 == 0 { 3 } else { 1 };
            for (case, (tokens, start_pos, norm)) in [
                (1u32, 0u32, false),
                (3, 17, true),
                (1, 63, true),
                (2, 40, false),
            ]
            .into_iter()
            .enumerate()
            {
                let case_seed = seed + case as u64 * 7919 + u64::from(heads);
                let hd = params.head_dim as usize;
                let q_len = tokens as usize * heads as usize * hd;
                let kv_len = tokens as usize * kv_heads as usize * hd;
                let q: Vec<f32> = testing::random_f32(q_len, case_seed)
                    .iter()
                    .map(|v| v * 8.0)
                    .collect();
                let k: Vec<f32> = testing::random_f32(kv_len, case_seed ^ 1)
                    .iter()
                    .map(|v| v * 8.0)
                    .collect();
                let v = testing::random_f32(kv_len, case_seed ^ 2);
                let q_norm = testing::random_f32(hd, case_seed ^ 3);
                let k_norm = testing::random_f32(hd, case_seed ^ 4);
                let cache = KvCache::new(&gpu, 2, max_ctx, kv_heads, params.head_dim).unwrap();
                cache
                    .k
                    .iter()
                    .chain(&cache.v)
                    .for_each(|b| gpu::poison_f32(&gpu, b));
                let buffers =
                    [&q, &k, &v, &q_norm, &k_norm].map(|data| gpu::upload_f32(&gpu, "in", data));
                // Odd cases read q, k and v from sections of one buffer, as decode does.
                let packed = case % 2 == 1;
                let qkv: Vec<f32> = q.iter().chain(&k).chain(&v).copied().collect();
                let qkv_buffer = gpu::upload_f32(&gpu, "qkv", &qkv);
                let section = |index: usize, offset: usize| match packed {
                    true => Section {
                        buffer: &qkv_buffer,
                        offset: offset as u32,
                    },
                    false => Section::from(&buffers[index]),
                };
                let q_buffer = if packed { &qkv_buffer } else { &buffers[0] };
                let target = StoreTarget {
                    q: section(0, 0),
                    k: section(1, q_len),
                    v: section(2, q_len + kv_len),
                    cache: &cache,
                    cache_layer: 1,
                    heads,
                    kv_heads,
                };
                let norms = HeadNorms {
                    q: &buffers[3],
                    k: &buffers[4],
                    eps: 1e-6,
                };
                let mut rec = Recorder::with_variant(&gpu, variant);
                rope::rope_store(
                    &mut rec,
                    &target,
                    norm.then_some(&norms),
                    tokens,
                    start_pos,
                    &params,
                );
                rec.submit();

                let normed = |x: &[f32], w: &[f32]| {
                    if norm {
                        rms_norm_reference(x, w, 1e-6)
                    } else {
                        x.to_vec()
                    }
                };
                let mut want_q = normed(&q, &q_norm);
                rope::rope_reference(&mut want_q, tokens, heads, start_pos, &params);
                let mut want_k = normed(&k, &k_norm);
                rope::rope_reference(&mut want_k, tokens, kv_heads, start_pos, &params);
                let what = format!("rope_store {name} tokens={tokens} start={start_pos} norm={norm} packed={packed} {} {variant} seed={case_seed}", gpu.caps.backend);

                let got_q =
                    pollster::block_on(gpu::read_f32(&gpu, q_buffer, 0, q_len as u64)).unwrap();
                testing::assert_close(&got_q, &want_q, 4e-6, &format!("{what}: q"));
                let (index, offset) = cache.layer_location(1);
                let layer_floats = cache.layer_bytes() / 4;
                for (label, buffers, want) in [("k", &cache.k, &want_k), ("v", &cache.v, &v)] {
                    let layer = pollster::block_on(gpu::read_f32(
                        &gpu,
                        &buffers[index],
                        offset / 4,
                        layer_floats,
                    ))
                    .unwrap();
                    let first = start_pos as usize * kv_heads as usize * hd;
                    testing::assert_close(
                        &layer[first..first + kv_len],
                        want,
                        4e-6,
                        &format!("{what}: {label} cache"),
                    );
                    let untouched = layer[..first].iter().chain(&layer[first + kv_len..]);
                    assert!(
                        untouched.into_iter().all(|x| x.to_bits() == gpu::POISON),
                        "{what}: {label} cache written outside the new rows"
                    );
                }
            }
        }
    }
}
