//! Every WGSL kernel family in the browser (WebGPU through wasm), against the same CPU
//! references as the native tests in `tests/ops_*.rs`, on every variant the browser's adapter
//! offers (SwiftShader in CI: f32, and f32+subgroups where exposed). Shapes are fewer than
//! natively: the point is the browser's compiler and runtime, not the kernels' math again.
//!
//! Run with `CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_RUNNER=wasm-bindgen-test-runner
//! cargo test --target wasm32-unknown-unknown --test web_kernels` (`.ci/test.sh` does).
#![cfg(target_arch = "wasm32")]

use std::sync::Arc;

use wasm_bindgen_test::{wasm_bindgen_test, wasm_bindgen_test_configure};
use webshard::gpu::{self, testing, Gpu, Recorder, Variant, WeightTensor};
use webshard::ops::attention::{
    attention_decode, attention_prefill, attention_reference, kv_write, segment_table,
    segmented_attention, segmented_attention_reference, softmax, softmax_reference, AttentionCall,
    AttentionParams, KvCache, Segments,
};
use webshard::ops::elementwise::{self, Activation};
use webshard::ops::quant::testing::random_weights;
use webshard::ops::quant::{
    dequant_row_reference, embed, matmul, matmul_reference, QuantMatrix, QuantType,
};
use webshard::ops::rope::{rope, rope_at, rope_reference, RopeParams};
use webshard::ops::{norm, select};

wasm_bindgen_test_configure!(run_in_browser);

/// The browser's device with each variant it supports; fails (never skips) without WebGPU.
async fn variants() -> Vec<(Arc<Gpu>, Variant)> {
    let variants = testing::device_variants()
        .await
        .expect("a WebGPU adapter (start Chromium with --enable-unsafe-webgpu)");
    assert!(!variants.is_empty(), "no device under test");
    variants
}

/// Runs `body` (which records, submits and reads kernels) inside a validation error scope, so
/// a kernel the browser's compiler rejects (Tint is stricter than naga) fails with the
/// compiler's message instead of as poison in the output. Futures are lazy: the scope is
/// open before `body` records anything.
async fn checked<T>(gpu: &Gpu, what: &str, body: impl std::future::Future<Output = T>) -> T {
    let scope = gpu.device.push_error_scope(wgpu::ErrorFilter::Validation);
    let out = body.await;
    if let Some(err) = scope.pop().await {
        panic!("{what}: WebGPU validation error: {err}");
    }
    out
}

async fn run_and_read(rec: Recorder<'_>, out: &wgpu::Buffer, floats: usize) -> Vec<f32> {
    let bytes = rec
        .submit_and_read(out, 0, (floats * 4) as u64)
        .await
        .expect("read back");
    bytemuck::pod_collect_to_vec(&bytes)
}

/// A poisoned output buffer of `floats` f32 values.
fn output(gpu: &Gpu, floats: usize) -> wgpu::Buffer {
    let out = gpu::storage_buffer(gpu, "out", (floats * 4) as u64);
    gpu::poison_f32(gpu, &out);
    out
}

fn label(gpu: &Gpu, variant: Variant, what: &str, seed: u64) -> String {
    format!("{} {variant} {what} seed {seed}", gpu.caps.backend)
}

fn upload_weights(gpu: &Gpu, bytes: &[u8], rows: usize) -> WeightTensor {
    let tensor = WeightTensor::allocate(gpu, "w", rows as u64, (bytes.len() / rows) as u64)
        .expect("allocate");
    for piece in tensor.upload_pieces(1 << 20) {
        let start = piece.tensor_offset as usize;
        tensor.write_piece(gpu, &piece, &bytes[start..start + piece.bytes as usize]);
    }
    tensor
}

#[wasm_bindgen_test]
async fn quant_matmul_and_embed_match_reference() {
    let seed = testing::fresh_seed();
    for (gpu, variant) in variants().await {
        for quant in QuantType::ALL {
            let cols = if quant.block_size() == 256 { 512 } else { 96 };
            let rows = 37;
            let bytes = random_weights(quant, rows, cols, seed);
            let tensor = upload_weights(&gpu, &bytes, rows);
            let w = QuantMatrix::new(&tensor, quant, cols as u32, rows as u32).expect("matrix");
            let float = matches!(quant, QuantType::F32 | QuantType::F16 | QuantType::BF16);
            let tolerance = if float { 2e-5 } else { 1e-4 };
            // One token takes the matrix-vector kernel, several the tiled one.
            for tokens in [1usize, 5] {
                let x = testing::random_f32(tokens * cols, seed + tokens as u64);
                let what = label(
                    &gpu,
                    variant,
                    &format!("matmul {quant:?} tokens {tokens}"),
                    seed,
                );
                let got = checked(&gpu, &what, async {
                    let out = output(&gpu, tokens * rows);
                    let mut rec = Recorder::with_variant(&gpu, variant);
                    matmul(
                        &mut rec,
                        &w,
                        &gpu::upload_f32(&gpu, "x", &x),
                        &out,
                        tokens as u32,
                    );
                    run_and_read(rec, &out, tokens * rows).await
                })
                .await;
                let want = matmul_reference(quant, &bytes, rows, cols, &x, tokens);
                testing::assert_close(&got, &want, tolerance, &what);
            }
            let ids = [0u32, 36, 5, 5];
            let what = label(&gpu, variant, &format!("embed {quant:?}"), seed);
            let got = checked(&gpu, &what, async {
                let out = output(&gpu, ids.len() * cols);
                let mut rec = Recorder::with_variant(&gpu, variant);
                let ids_buffer = gpu::upload_u32(&gpu, "ids", &ids);
                embed(&mut rec, &w, &ids_buffer, &out, ids.len() as u32, 1.5);
                run_and_read(rec, &out, ids.len() * cols).await
            })
            .await;
            let row_bytes = quant.row_bytes(cols as u64) as usize;
            let mut want = vec![0.0; ids.len() * cols];
            for (&id, values) in ids.iter().zip(want.chunks_exact_mut(cols)) {
                dequant_row_reference(
                    quant,
                    &bytes[id as usize * row_bytes..][..row_bytes],
                    values,
                );
                values.iter_mut().for_each(|v| *v *= 1.5);
            }
            testing::assert_close(&got, &want, 1e-6, &what);
        }
    }
}

#[wasm_bindgen_test]
async fn rms_norm_matches_reference() {
    let seed = testing::fresh_seed();
    for (gpu, variant) in variants().await {
        for (rows, cols) in [(1usize, 576usize), (5, 1000), (3, 1152)] {
            let x: Vec<f32> = testing::random_f32(rows * cols, seed)
                .iter()
                .map(|v| v * 3.0 + 0.25)
                .collect();
            let weight = testing::random_f32(cols, seed ^ 7);
            let what = label(&gpu, variant, &format!("rms_norm {rows}x{cols}"), seed);
            let got = checked(&gpu, &what, async {
                let out = output(&gpu, rows * cols);
                let x_buf = gpu::upload_f32(&gpu, "x", &x);
                let w_buf = gpu::upload_f32(&gpu, "w", &weight);
                let mut rec = Recorder::with_variant(&gpu, variant);
                norm::rms_norm(
                    &mut rec,
                    &x_buf,
                    &w_buf,
                    &out,
                    rows as u32,
                    cols as u32,
                    1e-5,
                );
                run_and_read(rec, &out, rows * cols).await
            })
            .await;
            let want = norm::rms_norm_reference(&x, &weight, 1e-5);
            testing::assert_close(&got, &want, 1e-5, &what);
        }
    }
}

#[wasm_bindgen_test]
async fn elementwise_matches_reference() {
    let seed = testing::fresh_seed();
    let (rows, cols) = (7usize, 333usize);
    let n = rows * cols;
    let a = testing::random_f32(n, seed);
    let b = testing::random_f32(n, seed + 1);
    let bias = testing::random_f32(cols, seed + 2);
    for (gpu, variant) in variants().await {
        let (a_buf, b_buf) = (
            gpu::upload_f32(&gpu, "a", &a),
            gpu::upload_f32(&gpu, "b", &b),
        );
        let what = label(&gpu, variant, "add", seed);
        let got = checked(&gpu, &what, async {
            let out = output(&gpu, n);
            let mut rec = Recorder::with_variant(&gpu, variant);
            elementwise::add(&mut rec, &a_buf, &b_buf, &out, n as u32);
            run_and_read(rec, &out, n).await
        })
        .await;
        testing::assert_close(&got, &elementwise::add_reference(&a, &b), 0.0, &what);

        let what = label(&gpu, variant, "add_bias", seed);
        let got = checked(&gpu, &what, async {
            let x = gpu::upload_f32(&gpu, "x", &a);
            let bias_buf = gpu::upload_f32(&gpu, "bias", &bias);
            let mut rec = Recorder::with_variant(&gpu, variant);
            elementwise::add_bias(&mut rec, &x, &bias_buf, rows as u32, cols as u32);
            run_and_read(rec, &x, n).await
        })
        .await;
        testing::assert_close(
            &got,
            &elementwise::add_bias_reference(&a, &bias),
            0.0,
            &what,
        );

        for act in [Activation::Silu, Activation::GeluTanh] {
            let what = label(&gpu, variant, &format!("gated {act:?}"), seed);
            let got = checked(&gpu, &what, async {
                let out = output(&gpu, n);
                let mut rec = Recorder::with_variant(&gpu, variant);
                elementwise::gated_activation(&mut rec, &a_buf, &b_buf, &out, n as u32, act);
                run_and_read(rec, &out, n).await
            })
            .await;
            let want = elementwise::gated_activation_reference(&a, &b, act);
            testing::assert_close(&got, &want, 1e-5, &what);
        }
    }
}

#[wasm_bindgen_test]
async fn rope_matches_reference() {
    let seed = testing::fresh_seed();
    let (tokens, heads) = (3u32, 4u32);
    let configurations = [
        (false, 64u32, 64u32, 0u32),
        (true, 64, 64, 37),
        (true, 256, 128, 1000),
    ];
    for (gpu, variant) in variants().await {
        for (neox, head_dim, rope_dims, start_pos) in configurations {
            let p = RopeParams {
                head_dim,
                rope_dims,
                freq_base: 10_000.0,
                freq_scale: 1.0,
                neox,
            };
            let x = testing::random_f32((tokens * heads * head_dim) as usize, seed);
            let what = format!("rope neox {neox} dims {rope_dims}/{head_dim} start {start_pos}");
            let what = label(&gpu, variant, &what, seed);
            let got = checked(&gpu, &what, async {
                let buffer = gpu::upload_f32(&gpu, "x", &x);
                let mut rec = Recorder::with_variant(&gpu, variant);
                rope(&mut rec, &buffer, tokens, heads, start_pos, &p);
                run_and_read(rec, &buffer, x.len()).await
            })
            .await;
            let mut want = x.clone();
            rope_reference(&mut want, tokens, heads, start_pos, &p);
            // WGSL bounds sin/cos only to an absolute 2^-11 (SwiftShader's are ~1e-4 off).
            testing::assert_close(&got, &want, 1e-3, &what);
        }
    }
}

#[wasm_bindgen_test]
async fn argmax_and_top_k_match_reference() {
    let seed = testing::fresh_seed();
    for (gpu, variant) in variants().await {
        for n in [1usize, 1000, 49_152] {
            let logits: Vec<f32> = testing::random_f32(n, seed + n as u64)
                .iter()
                .map(|v| v * 20.0)
                .collect();
            let logits_buf = gpu::upload_f32(&gpu, "logits", &logits);
            let what = label(&gpu, variant, &format!("argmax n {n}"), seed);
            let got = checked(&gpu, &what, async {
                let out = output(&gpu, 1);
                let mut rec = Recorder::with_variant(&gpu, variant);
                select::argmax(&mut rec, &logits_buf, n as u32, &out);
                run_and_read(rec, &out, 1).await[0].to_bits()
            })
            .await;
            assert_eq!(got, select::argmax_reference(&logits), "{what}");

            let k = n.min(40);
            let what = label(&gpu, variant, &format!("top_k n {n} k {k}"), seed);
            let got = checked(&gpu, &what, async {
                let (ids, values) = (output(&gpu, k), output(&gpu, k));
                let mut rec = Recorder::with_variant(&gpu, variant);
                select::top_k(&mut rec, &logits_buf, n as u32, k as u32, &ids, &values);
                let ids: Vec<u32> = run_and_read(rec, &ids, k)
                    .await
                    .iter()
                    .map(|v| v.to_bits())
                    .collect();
                ids
            })
            .await;
            assert_eq!(got, select::top_k_reference(&logits, k), "{what}");
        }
    }
}

#[wasm_bindgen_test]
async fn softmax_matches_reference() {
    let seed = testing::fresh_seed();
    let (rows, cols) = (3usize, 1500usize);
    let x: Vec<f32> = testing::random_f32(rows * cols, seed)
        .iter()
        .map(|v| v * 10.0)
        .collect();
    for (gpu, variant) in variants().await {
        let what = label(&gpu, variant, "softmax", seed);
        let got = checked(&gpu, &what, async {
            let buffer = gpu::upload_f32(&gpu, "x", &x);
            let mut rec = Recorder::with_variant(&gpu, variant);
            softmax(&mut rec, &buffer, rows as u32, cols as u32);
            run_and_read(rec, &buffer, x.len()).await
        })
        .await;
        testing::assert_close(&got, &softmax_reference(&x, cols), 1e-5, &what);
    }
}

/// One attention case: inputs and the path (split decode or tiled prefill) to run.
struct AttentionCase<'a> {
    p: AttentionParams,
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    start_pos: u32,
    tokens: u32,
    decode: bool,
}

/// Fills layer 1 of a cache (layer 0 holds decoys) as a chat does, prefix then new tokens,
/// and runs the case's attention path.
async fn gpu_attention(gpu: &Gpu, variant: Variant, case: &AttentionCase<'_>) -> Vec<f32> {
    let (p, start_pos, tokens) = (&case.p, case.start_pos, case.tokens);
    let ctx = start_pos + tokens;
    let cache = KvCache::new(gpu, 2, ctx + 3, p.kv_heads, p.head_dim).expect("cache");
    let split = (start_pos * p.kv_heads * p.head_dim) as usize;
    let upload = |data: &[f32]| gpu::upload_f32(gpu, "kv", data);
    let decoy = upload(&testing::random_f32(case.k.len(), 99));
    let (k_old, v_old) = (upload(&case.k[..split]), upload(&case.v[..split]));
    let (k_new, v_new) = (upload(&case.k[split..]), upload(&case.v[split..]));
    let (q, out) = (upload(case.q), output(gpu, case.q.len()));
    let mut rec = Recorder::with_variant(gpu, variant);
    kv_write(&mut rec, &cache, 0, &decoy, &decoy, 0, ctx);
    kv_write(&mut rec, &cache, 1, &k_old, &v_old, 0, start_pos);
    kv_write(&mut rec, &cache, 1, &k_new, &v_new, start_pos, tokens);
    let run = if case.decode {
        attention_decode
    } else {
        attention_prefill
    };
    let call = AttentionCall {
        q: &q,
        cache: &cache,
        layer: 1,
        out: &out,
        start_pos,
        tokens,
    };
    run(&mut rec, &call, p);
    run_and_read(rec, &out, case.q.len()).await
}

#[wasm_bindgen_test]
async fn attention_matches_reference() {
    let seed = testing::fresh_seed();
    // SmolLM2's heads (9 over 3 kv heads of 64) and Gemma 3's (4 over 1 of 256, windowed).
    let shapes = [(9u32, 3u32, 64u32, None), (4, 1, 256, Some(48u32))];
    for (gpu, variant) in variants().await {
        for &(heads, kv_heads, head_dim, window) in &shapes {
            let p = AttentionParams {
                window,
                ..AttentionParams::standard(heads, kv_heads, head_dim)
            };
            for (start_pos, tokens) in [(0u32, 1u32), (70, 1), (0, 5), (61, 7)] {
                let ctx = (start_pos + tokens) as usize;
                let q: Vec<f32> = testing::random_f32((tokens * heads * head_dim) as usize, seed)
                    .iter()
                    .map(|x| x * 4.0)
                    .collect();
                let k = testing::random_f32(ctx * (kv_heads * head_dim) as usize, seed + 1);
                let v = testing::random_f32(ctx * (kv_heads * head_dim) as usize, seed + 2);
                let want = attention_reference(&q, &k, &v, start_pos, tokens, &p);
                for decode in [true, false] {
                    let path = if decode { "decode" } else { "prefill" };
                    let what = format!(
                        "attention {path} heads {heads}/{kv_heads}x{head_dim} start {start_pos} tokens {tokens}"
                    );
                    let what = label(&gpu, variant, &what, seed);
                    let case = AttentionCase {
                        p,
                        q: &q,
                        k: &k,
                        v: &v,
                        start_pos,
                        tokens,
                        decode,
                    };
                    let got = checked(&gpu, &what, gpu_attention(&gpu, variant, &case)).await;
                    let tolerance = if variant.f16 && !decode { 3e-3 } else { 2e-5 };
                    testing::assert_close(&got, &want, tolerance, &what);
                }
            }
        }
    }
}

/// An encoder's packed batch: sequences of 1, 5, 66 and 2 tokens (the third crossing the
/// 64-row workgroup), rope at positions restarting per sequence, then segmented attention.
#[wasm_bindgen_test]
async fn packed_sequences_match_reference() {
    let seed = testing::fresh_seed();
    let lengths = [1u32, 5, 66, 2];
    let tokens: u32 = lengths.iter().sum();
    let (heads, head_dim) = (12u32, 32u32);
    let p = AttentionParams::standard(heads, heads, head_dim);
    let rope_p = RopeParams {
        head_dim,
        rope_dims: head_dim,
        freq_base: 1000.0,
        freq_scale: 1.0,
        neox: true,
    };
    let n = (tokens * heads * head_dim) as usize;
    let q: Vec<f32> = testing::random_f32(n, seed)
        .iter()
        .map(|x| x * 4.0)
        .collect();
    let (k, v) = (
        testing::random_f32(n, seed + 1),
        testing::random_f32(n, seed + 2),
    );
    let positions: Vec<u32> = lengths.iter().flat_map(|&len| 0..len).collect();
    let mut rotated = q.clone();
    let mut start = 0usize;
    for &len in &lengths {
        let end = start + (len * heads * head_dim) as usize;
        rope_reference(&mut rotated[start..end], len, heads, 0, &rope_p);
        start = end;
    }
    let want_attention = segmented_attention_reference(&q, &k, &v, &lengths, &p);
    for (gpu, variant) in variants().await {
        let what = label(&gpu, variant, "rope_at", seed);
        let got = checked(&gpu, &what, async {
            let buffer = gpu::upload_f32(&gpu, "x", &q);
            let position_buffer = gpu::upload_u32(&gpu, "positions", &positions);
            let mut rec = Recorder::with_variant(&gpu, variant);
            rope_at(&mut rec, &buffer, tokens, heads, &position_buffer, &rope_p);
            run_and_read(rec, &buffer, n).await
        })
        .await;
        testing::assert_close(&got, &rotated, 1e-3, &what);
        let what = label(&gpu, variant, "segmented attention", seed);
        let got = checked(&gpu, &what, async {
            let cache = KvCache::new(&gpu, 1, tokens, heads, head_dim).expect("cache");
            let upload = |data: &[f32]| gpu::upload_f32(&gpu, "x", data);
            let (q, k, v, out) = (upload(&q), upload(&k), upload(&v), output(&gpu, n));
            let table = gpu::upload_u32(&gpu, "segments", &segment_table(&lengths));
            let segments = Segments {
                lengths: &lengths,
                table: &table,
            };
            let mut rec = Recorder::with_variant(&gpu, variant);
            kv_write(&mut rec, &cache, 0, &k, &v, 0, tokens);
            segmented_attention(&mut rec, &q, &cache, 0, &out, &segments, &p);
            run_and_read(rec, &out, n).await
        })
        .await;
        let tolerance = if variant.f16 { 3e-3 } else { 2e-5 };
        testing::assert_close(&got, &want_attention, tolerance, &what);
    }
}

/// wgpu's WebGPU backend never asks for subgroups (`gpu/browser.rs`), so the device asks
/// beside it: an adapter that has them gives a device whose caps and variants use them, with
/// the adapter's subgroup sizes. (SwiftShader has them, size 4, so in CI the kernels above run
/// their subgroup variants too.)
#[wasm_bindgen_test]
async fn an_adapter_with_subgroups_gives_a_device_that_uses_them() {
    let navigator = js_sys::Reflect::get(&js_sys::global(), &"navigator".into()).unwrap();
    let gpu_api = js_sys::Reflect::get(&navigator, &"gpu".into()).unwrap();
    let request: js_sys::Function = js_sys::Reflect::get(&gpu_api, &"requestAdapter".into())
        .unwrap()
        .into();
    let promise: js_sys::Promise = request.call0(&gpu_api).unwrap().into();
    let adapter = wasm_bindgen_futures::JsFuture::from(promise).await.unwrap();
    let features = js_sys::Reflect::get(&adapter, &"features".into()).unwrap();
    let has: js_sys::Function = js_sys::Reflect::get(&features, &"has".into())
        .unwrap()
        .into();
    let adapter_has = has
        .call1(&features, &"subgroups".into())
        .unwrap()
        .is_truthy();

    let (gpu, _) = variants().await.remove(0);
    assert_eq!(gpu.caps.subgroups, adapter_has, "{:?}", gpu.caps);
    let with_subgroups = gpu.caps.all_variants().iter().any(|v| v.subgroups);
    assert_eq!(with_subgroups, adapter_has, "{:?}", gpu.caps.all_variants());
    if adapter_has {
        assert!(
            gpu.caps.subgroup_min >= 1 && gpu.caps.subgroup_min <= gpu.caps.subgroup_max,
            "{:?}",
            gpu.caps
        );
    }
}
