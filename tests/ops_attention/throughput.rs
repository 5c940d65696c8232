//! How long attention takes on the devices under test, decode at 1000 keys and a 256-token
//! prefill: the times are printed, never asserted; the last call's result is checked.

use super::*;

/// Times `calls` attention calls recorded into one submit (as a model records its layers) on
/// the first device under test (lavapipe natively), checking the result of the last.
fn time_attention(gpu: &Gpu, variant: Variant, case: &Case, path: Path, calls: u32) -> f64 {
    let s = case.shape;
    let ctx = case.start_pos + case.tokens;
    let cache = KvCache::new(gpu, 1, ctx, s.kv_heads, s.head_dim).unwrap();
    let k = gpu::upload_f32(gpu, "k", &case.k);
    let v = gpu::upload_f32(gpu, "v", &case.v);
    let q = gpu::upload_f32(gpu, "q", &case.q);
    let out = gpu::storage_buffer(gpu, "out", (case.q.len() * 4) as u64);
    let mut rec = Recorder::with_variant(gpu, variant);
    kv_write(&mut rec, &cache, 0, &k, &v, 0, ctx);
    rec.submit();
    let call = if path == Path::Decode {
        attention_decode
    } else {
        attention_prefill
    };
    let mut best = f64::MAX;
    for _ in 0..3 {
        gpu::poison_f32(gpu, &out);
        let mut rec = Recorder::with_variant(gpu, variant);
        for _ in 0..calls {
            call(
                &mut rec,
                &q,
                &cache,
                0,
                &out,
                case.start_pos,
                case.tokens,
                &case.params,
            );
        }
        let started = Instant::now();
        let bytes = pollster::block_on(rec.submit_and_read(&out, 0, (case.q.len() * 4) as u64));
        best = best.min(started.elapsed().as_secs_f64() / f64::from(calls));
        let got: Vec<f32> = bytemuck::pod_collect_to_vec(&bytes.unwrap());
        let what = format!("{} {variant} timed {}", gpu.caps.backend, case.label());
        testing::assert_close(
            &got,
            &case.want,
            tolerance(variant, path, case.tokens),
            &what,
        );
    }
    best
}

#[test]
fn throughput_decode_ctx_1000_and_prefill_256() {
    let seed = testing::fresh_seed();
    let devices = devices();
    let gpu = &devices[0];
    let mut variants = vec![Variant::default()];
    variants.extend((gpu.variant() != Variant::default()).then(|| gpu.variant()));
    for shape in SHAPES {
        let decode = Case::new(shape, 999, 1, None, None, seed);
        let prefill = Case::new(shape, 0, 256, None, None, seed + 10);
        let kv_bytes = 1000.0 * f64::from(shape.kv_heads * shape.head_dim) * 8.0;
        for &variant in &variants {
            let seconds = time_attention(gpu, variant, &decode, Path::Decode, 30);
            println!(
                "{} {variant} {}: decode at ctx 1000: {:.0} us per layer call, K+V read {:.2} GB/s",
                gpu.caps.adapter,
                shape.name,
                seconds * 1e6,
                kv_bytes / seconds / 1e9
            );
            let seconds = time_attention(gpu, variant, &prefill, Path::Prefill, 3);
            // Causal: 256 * 257 / 2 query-key pairs per head, two head_dim FMAs each.
            let flops = 256.0 * 257.0 / 2.0 * f64::from(shape.heads * shape.head_dim) * 4.0;
            println!(
                "{} {variant} {}: prefill of 256 tokens: {:.1} ms per layer call, {:.0} tokens/s, {:.2} GFLOP/s",
                gpu.caps.adapter,
                shape.name,
                seconds * 1e3,
                256.0 / seconds,
                flops / seconds / 1e9
            );
        }
    }
}
