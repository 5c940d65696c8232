//! Fused decode attention (`rope_attention_decode`: per-head norms, rope, the cache write and
//! attention in one dispatch) against the CPU references of each part, on every device and
//! variant where the fused kernel runs (GPUs, and CPU adapters under the GPU work split): the
//! three models' head layouts and rope settings, contexts in one split and in several, a
//! sliding window, and the cache rows it may and may not write.

use std::sync::Arc;

use webshard::gpu::{self, testing, BackendChoice, Gpu, GpuOptions, Recorder, Variant};
use webshard::ops::attention::{
    attention_reference, rope_attention_decode, rope_attention_supported, AttentionParams, KvCache,
};
use webshard::ops::norm::rms_norm_reference;
use webshard::ops::rope::{rope_reference, HeadNorms, RopeParams, StoreTarget};

pub(crate) const MAX_CTX: u32 = 1024;
pub(crate) const LAYER: u32 = 1;
pub(crate) const EPS: f32 = 1e-6;

/// (name, heads, kv_heads, rope, per-head norms, window)
pub(crate) struct Model {
    pub name: &'static str,
    pub heads: u32,
    pub kv_heads: u32,
    pub rope: RopeParams,
    pub norms: bool,
    pub window: Option<u32>,
}

pub(crate) fn models() -> Vec<Model> {
    let rope = |head_dim, rope_dims, freq_base, neox| RopeParams {
        head_dim,
        rope_dims,
        freq_base,
        freq_scale: 1.0,
        neox,
    };
    let model = |name, heads, kv_heads, rope, norms, window| Model {
        name,
        heads,
        kv_heads,
        rope,
        norms,
        window,
    };
    vec![
        model("smollm2", 9, 3, rope(64, 64, 100_000.0, false), false, None),
        model(
            "qwen2.5",
            14,
            2,
            rope(64, 64, 1_000_000.0, true),
            false,
            None,
        ),
        model(
            "gemma3 global",
            4,
            1,
            rope(256, 256, 1_000_000.0, true),
            true,
            None,
        ),
        model(
            "gemma3 local",
            4,
            1,
            rope(256, 256, 10_000.0, true),
            true,
            Some(300),
        ),
        model(
            "partial rope",
            4,
            2,
            rope(128, 64, 10_000.0, false),
            true,
            None,
        ),
    ]
}

/// Random inputs of one case: packed q/k/v of the new token, the norms' weights, and the
/// cache layer's keys and values of every earlier position.
pub(crate) struct Inputs {
    pub qkv: Vec<f32>,
    pub q_norm: Vec<f32>,
    pub k_norm: Vec<f32>,
    pub k_cache: Vec<f32>,
    pub v_cache: Vec<f32>,
}

impl Inputs {
    pub(crate) fn new(m: &Model, pos: u32, seed: u64) -> Inputs {
        let hd = m.rope.head_dim as usize;
        let q_len = m.heads as usize * hd;
        let kv_len = m.kv_heads as usize * hd;
        let scaled = |n, seed, by: f32| -> Vec<f32> {
            testing::random_f32(n, seed)
                .iter()
                .map(|v| v * by)
                .collect()
        };
        let mut qkv = scaled(q_len + kv_len, seed, 4.0);
        qkv.extend(testing::random_f32(kv_len, seed ^ 1));
        Inputs {
            qkv,
            q_norm: scaled(hd, seed ^ 2, 1.0),
            k_norm: scaled(hd, seed ^ 3, 1.0),
            k_cache: scaled(pos as usize * kv_len, seed ^ 4, 2.0),
            v_cache: testing::random_f32(pos as usize * kv_len, seed ^ 5),
        }
    }
}

/// What the fused kernel should leave: the attention output and the new cache rows.
pub(crate) struct Expected {
    pub out: Vec<f32>,
    pub k_row: Vec<f32>,
    pub v_row: Vec<f32>,
}

pub(crate) fn reference(m: &Model, x: &Inputs, pos: u32) -> Expected {
    let hd = m.rope.head_dim as usize;
    let q_len = m.heads as usize * hd;
    let kv_len = m.kv_heads as usize * hd;
    let normed = |values: &[f32], weight: &[f32]| match m.norms {
        true => rms_norm_reference(values, weight, EPS),
        false => values.to_vec(),
    };
    let mut q = normed(&x.qkv[..q_len], &x.q_norm);
    rope_reference(&mut q, 1, m.heads, pos, &m.rope);
    let mut k_row = normed(&x.qkv[q_len..q_len + kv_len], &x.k_norm);
    rope_reference(&mut k_row, 1, m.kv_heads, pos, &m.rope);
    let v_row = x.qkv[q_len + kv_len..].to_vec();
    let keys: Vec<f32> = x.k_cache.iter().chain(&k_row).copied().collect();
    let values: Vec<f32> = x.v_cache.iter().chain(&v_row).copied().collect();
    let out = attention_reference(&q, &keys, &values, pos, 1, &params(m));
    Expected { out, k_row, v_row }
}

pub(crate) fn params(m: &Model) -> AttentionParams {
    AttentionParams {
        window: m.window,
        ..AttentionParams::standard(m.heads, m.kv_heads, m.rope.head_dim)
    }
}

/// The cache with layer 0 random (a wrong layer offset reads it), layer 1's earlier positions
/// from `x` and every later position poisoned.
fn filled_cache(gpu: &Gpu, m: &Model, x: &Inputs, seed: u64) -> KvCache {
    let cache = KvCache::new(gpu, 2, MAX_CTX, m.kv_heads, m.rope.head_dim).unwrap();
    let layer_floats = (cache.layer_bytes() / 4) as usize;
    for (buffers, earlier) in [(&cache.k, &x.k_cache), (&cache.v, &x.v_cache)] {
        gpu::poison_f32(gpu, &buffers[0]);
        let (index, offset) = cache.layer_location(0);
        let other = testing::random_f32(layer_floats, seed ^ 6);
        gpu.queue
            .write_buffer(&buffers[index], offset, bytemuck::cast_slice(&other));
        let (index, offset) = cache.layer_location(LAYER);
        gpu.queue
            .write_buffer(&buffers[index], offset, bytemuck::cast_slice(earlier));
    }
    cache
}

fn read_layer(gpu: &Gpu, cache: &KvCache, buffers: &[wgpu::Buffer]) -> Vec<f32> {
    let (index, offset) = cache.layer_location(LAYER);
    let floats = cache.layer_bytes() / 4;
    pollster::block_on(gpu::read_f32(gpu, &buffers[index], offset / 4, floats)).unwrap()
}

fn check_case(gpu: &Arc<Gpu>, variant: Variant, m: &Model, pos: u32, seed: u64) {
    let what = format!(
        "fused decode attention {} pos={pos} {} ({}) {variant} seed={seed}",
        m.name, gpu.caps.adapter, gpu.caps.backend
    );
    let x = Inputs::new(m, pos, seed);
    let cache = filled_cache(gpu, m, &x, seed);
    let hd = m.rope.head_dim;
    let qkv = gpu::upload_f32(gpu, "qkv", &x.qkv);
    let norm_buffers = [&x.q_norm, &x.k_norm].map(|w| gpu::upload_f32(gpu, "norm", w));
    let out = gpu::storage_buffer(gpu, "out", u64::from(m.heads * hd) * 4);
    gpu::poison_f32(gpu, &out);
    let target = StoreTarget::packed(&qkv, m.heads, &cache, LAYER);
    let norms = HeadNorms {
        q: &norm_buffers[0],
        k: &norm_buffers[1],
        eps: EPS,
    };
    let mut rec = Recorder::with_variant(gpu, variant);
    let norms = m.norms.then_some(&norms);
    rope_attention_decode(&mut rec, &target, norms, pos, &m.rope, &params(m), &out);
    rec.submit();

    let want = reference(m, &x, pos);
    let n = u64::from(m.heads * hd);
    let got = pollster::block_on(gpu::read_f32(gpu, &out, 0, n)).unwrap();
    testing::assert_close(&got, &want.out, 2e-5, &format!("{what}: out"));
    let row = (m.kv_heads * hd) as usize;
    let first = pos as usize * row;
    for (label, buffers, earlier, new_row) in [
        ("k", &cache.k, &x.k_cache, &want.k_row),
        ("v", &cache.v, &x.v_cache, &want.v_row),
    ] {
        let layer = read_layer(gpu, &cache, buffers);
        assert_eq!(
            &layer[..first],
            &earlier[..],
            "{what}: {label} rows before pos changed"
        );
        let written = &layer[first..first + row];
        testing::assert_close(
            written,
            new_row,
            4e-6,
            &format!("{what}: {label} row at pos"),
        );
        assert!(
            layer[first + row..]
                .iter()
                .all(|v| v.to_bits() == gpu::POISON),
            "{what}: {label} cache written past pos"
        );
    }
}

#[test]
fn fused_decode_attention_matches_rope_store_then_attention() {
    let seed = testing::fresh_seed();
    let devices = pollster::block_on(testing::device_variants_both_splits()).unwrap();
    let mut checked = 0;
    for (gpu, variant) in &devices {
        for (index, m) in models().iter().enumerate() {
            if !rope_attention_supported(gpu, &params(m), false) {
                continue;
            }
            // One key, a full single split, the first of two splits, and several splits.
            for pos in [0u32, 255, 256, 700] {
                check_case(
                    gpu,
                    *variant,
                    m,
                    pos,
                    seed + index as u64 * 7919 + u64::from(pos),
                );
                checked += 1;
            }
        }
    }
    assert!(
        checked > 0,
        "no device ran the fused kernel: the GPU work split of a CPU adapter should"
    );
    eprintln!("{checked} fused decode attention cases checked");
}

/// Over a contiguous cache the fused kernel fits WebGPU's default of 8 storage bindings, all a
/// browser adapter may grant: on devices asked for no more than 8 (so the device validates the
/// pipeline against that limit) it runs and matches the references, while a paged seat, whose
/// page table is a ninth binding, is not sent there.
#[test]
fn the_contiguous_fused_kernel_fits_eight_storage_bindings() {
    let seed = testing::fresh_seed();
    let mut checked = 0;
    for full in pollster::block_on(testing::devices_under_test()).unwrap() {
        let options = GpuOptions {
            backend: BackendChoice::parse(&full.caps.backend).unwrap_or_default(),
            gpu_work_split: true,
            storage_bindings_limit: Some(8),
            ..Default::default()
        };
        let gpu = pollster::block_on(Gpu::new(&options)).unwrap();
        assert!(gpu.caps.max_storage_bindings <= 8, "{}", gpu.caps.adapter);
        for (index, m) in models().iter().enumerate() {
            let p = params(m);
            assert!(!rope_attention_supported(&gpu, &p, true), "{}", m.name);
            if rope_attention_supported(&gpu, &p, false) {
                let variant = gpu.variant();
                check_case(&gpu, variant, m, 300, seed + index as u64 * 7919);
                checked += 1;
            }
        }
    }
    assert!(
        checked > 0,
        "no device ran the fused kernel within 8 storage bindings"
    );
}
