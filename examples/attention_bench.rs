//! Throughput of attention on the local adapter, per variant: decode of one token over 1000
//! keys and a causal prefill of 256 tokens, for the real models' head shapes (SmolLM2 9/3
//! heads of 64, Qwen2.5 14/2 of 64, Gemma 3 4/1 of 256). Correctness is `tests/ops_attention`'s.
//!
//! `cargo run --release --example attention_bench -- [CTX] [PREFILL_TOKENS]` (default 1000 256).

use std::time::Instant;

use webshard::gpu::{self, testing, Gpu, GpuOptions, Recorder, Variant};
use webshard::ops::attention::{
    attention_decode, attention_prefill, kv_write, AttentionCall, AttentionParams, KvCache,
};

/// (name, heads, kv heads, head_dim)
const SHAPES: [(&str, u32, u32, u32); 3] = [
    ("smollm2", 9, 3, 64),
    ("qwen2.5", 14, 2, 64),
    ("gemma3", 4, 1, 256),
];

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let number =
        |i: usize, default: u32| args.get(i).map_or(default, |a| a.parse().expect("number"));
    let (ctx, prefill) = (number(0, 1000), number(1, 256));
    let gpu = pollster::block_on(Gpu::new(&GpuOptions::default())).expect("gpu");
    println!("{} ({})", gpu.caps.adapter, gpu.caps.backend);
    for (name, heads, kv_heads, head_dim) in SHAPES {
        let params = AttentionParams::standard(heads, kv_heads, head_dim);
        for variant in gpu.caps.all_variants() {
            let seconds = time_calls(&gpu, variant, &params, ctx - 1, 1, 30);
            let kv_bytes = f64::from(ctx * kv_heads * head_dim) * 8.0;
            println!(
                "{variant} {name}: decode at ctx {ctx}: {:.0} us per layer call, K+V read {:.2} GB/s",
                seconds * 1e6,
                kv_bytes / seconds / 1e9
            );
            let seconds = time_calls(&gpu, variant, &params, 0, prefill, 3);
            // Causal: n(n+1)/2 query-key pairs per head, two head_dim FMAs each.
            let pairs = f64::from(prefill) * f64::from(prefill + 1) / 2.0;
            let flops = pairs * f64::from(heads * head_dim) * 4.0;
            println!(
                "{variant} {name}: prefill of {prefill} tokens: {:.1} ms per layer call, {:.0} tokens/s, {:.2} GFLOP/s",
                seconds * 1e3,
                f64::from(prefill) / seconds,
                flops / seconds / 1e9
            );
        }
    }
}

/// The best of three submits of `calls` attention calls (as a model records its layers) over
/// random keys, values and queries; seconds per call.
fn time_calls(
    gpu: &Gpu,
    variant: Variant,
    p: &AttentionParams,
    start_pos: u32,
    tokens: u32,
    calls: u32,
) -> f64 {
    let ctx = start_pos + tokens;
    let cache = KvCache::new(gpu, 1, ctx, p.kv_heads, p.head_dim).expect("cache");
    let kv_len = (ctx * p.kv_heads * p.head_dim) as usize;
    let k = gpu::upload_f32(gpu, "k", &testing::random_f32(kv_len, 1));
    let v = gpu::upload_f32(gpu, "v", &testing::random_f32(kv_len, 2));
    let q_len = (tokens * p.heads * p.head_dim) as usize;
    let q = gpu::upload_f32(gpu, "q", &testing::random_f32(q_len, 3));
    let out = gpu::storage_buffer(gpu, "out", (q_len * 4) as u64);
    let mut rec = Recorder::with_variant(gpu, variant);
    kv_write(&mut rec, &cache, 0, &k, &v, 0, ctx);
    rec.submit();
    let entry = if tokens == 1 {
        attention_decode
    } else {
        attention_prefill
    };
    let call = AttentionCall {
        q: &q,
        cache: &cache,
        layer: 0,
        out: &out,
        start_pos,
        tokens,
    };
    let mut best = f64::MAX;
    // The first submit also compiles the pipelines.
    for _ in 0..4 {
        let mut rec = Recorder::with_variant(gpu, variant);
        for _ in 0..calls {
            entry(&mut rec, &call, p);
        }
        let started = Instant::now();
        pollster::block_on(rec.submit_and_read(&out, 0, 4)).expect("read");
        best = best.min(started.elapsed().as_secs_f64() / f64::from(calls));
    }
    best
}
