//! Attention over a KV cache in GPU memory: decode split over the keys (flash-decoding),
//! tiled causal prefill, both with grouped-query heads, an optional sliding window and an
//! optional logit soft-cap; plus the KV cache itself, a standalone softmax, and CPU references.
//!
//! The kernels use no subgroup operations (no cross-lane reduction is on their critical path),
//! so the subgroup variants compile the same code; f16 variants keep prefill's key/value tiles
//! in f16 workgroup memory, which doubles the keys per tile. Everything accumulates in f32.

mod kv_cache;
mod reference;
mod softmax;

pub use kv_cache::{kv_write, KvCache};
pub use reference::attention_reference;
pub use softmax::{softmax, softmax_reference};

use crate::gpu::{Gpu, Kernel, Recorder, Variant};

const DECODE: Kernel = Kernel {
    name: "attention_decode",
    source: include_str!("../../wgsl/attention_decode.wgsl"),
    entry: "main",
    libs: &[],
};

const COMBINE: Kernel = Kernel {
    name: "attention_combine",
    source: include_str!("../../wgsl/attention_combine.wgsl"),
    entry: "main",
    libs: &[],
};

const PREFILL: Kernel = Kernel {
    name: "attention_prefill",
    source: include_str!("../../wgsl/attention_prefill.wgsl"),
    entry: "main",
    libs: &[],
};

/// Lanes of a decode workgroup, which is also its keys per tile.
const DECODE_WG: u32 = 64;
/// Most workgroups one (token, kv head) is split into. Enough for large GPUs at long contexts;
/// each split costs a partial result and a barrier pair per tile on CPU adapters.
const MAX_SPLITS: u32 = 32;
/// Private arrays in the decode kernel are sized by the query heads per kv head.
const DECODE_MAX_GROUP: u32 = 16;
/// Rows (token, head) per prefill workgroup, one per lane.
const PREFILL_WG: u32 = 64;
const PREFILL_MAX_TILE: u32 = 64;
/// Up to this many query tokens, `attention` uses the split decode kernels: they spread few
/// queries over the whole key range, while prefill workgroups each walk all their keys.
const DECODE_MAX_TOKENS: u32 = 1;

/// Shape and masking of one attention call.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttentionParams {
    pub heads: u32,
    pub kv_heads: u32,
    pub head_dim: u32,
    /// Multiplies q·k before the soft-cap and softmax (usually 1/sqrt(head_dim)).
    pub scale: f32,
    /// Sliding window: key j is visible to the query at position i iff j <= i and i - j < window.
    pub window: Option<u32>,
    /// Logit soft-cap: scores become softcap * tanh(score / softcap).
    pub softcap: Option<f32>,
}

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct KernelParams {
    kv_heads: u32,
    heads: u32,
    start_pos: u32,
    tokens: u32,
    window: u32,
    splits: u32,
    scale: f32,
    softcap: f32,
}

impl KernelParams {
    fn new(p: &AttentionParams, start_pos: u32, tokens: u32, splits: u32) -> Self {
        KernelParams {
            kv_heads: p.kv_heads,
            heads: p.heads,
            start_pos,
            tokens,
            window: p.window.unwrap_or(u32::MAX),
            splits,
            scale: p.scale,
            softcap: p.softcap.unwrap_or(0.0),
        }
    }
}

/// out[t, h*hd..] = softmax(q·K^T * scale, causal (+window)) V over keys 0..=start_pos+t of
/// `layer`. `q` and `out` are [tokens, heads * head_dim] f32; the cache must already hold the
/// keys and values of positions up to start_pos + tokens - 1 (kv_write them first).
///
/// Panics when shapes disagree with the cache or positions exceed it: the model code bounds them.
#[allow(clippy::too_many_arguments)]
pub fn attention(
    rec: &mut Recorder,
    q: &wgpu::Buffer,
    cache: &KvCache,
    layer: u32,
    out: &wgpu::Buffer,
    start_pos: u32,
    tokens: u32,
    p: &AttentionParams,
) {
    let decode_fits = decode_supported(rec.gpu(), p);
    if tokens <= DECODE_MAX_TOKENS && decode_fits {
        attention_decode(rec, q, cache, layer, out, start_pos, tokens, p);
    } else {
        attention_prefill(rec, q, cache, layer, out, start_pos, tokens, p);
    }
}

/// Whether the split decode kernels can run this shape on this device (else use prefill).
pub fn decode_supported(gpu: &Gpu, p: &AttentionParams) -> bool {
    let group = p.heads / p.kv_heads.max(1);
    let shared_floats = group * p.head_dim + 2 * group * DECODE_WG;
    group <= DECODE_MAX_GROUP
        && shared_floats * 4 <= gpu.device.limits().max_compute_workgroup_storage_size
}

/// Attention through the split decode kernels (any `tokens`, built for few).
#[allow(clippy::too_many_arguments)]
pub fn attention_decode(
    rec: &mut Recorder,
    q: &wgpu::Buffer,
    cache: &KvCache,
    layer: u32,
    out: &wgpu::Buffer,
    start_pos: u32,
    tokens: u32,
    p: &AttentionParams,
) {
    check_call(cache, layer, q, out, start_pos, tokens, p);
    if tokens == 0 {
        return;
    }
    assert!(
        decode_supported(rec.gpu(), p),
        "decode attention cannot hold {} query heads of {} per kv head",
        p.heads / p.kv_heads,
        p.head_dim
    );
    let group = p.heads / p.kv_heads;
    let last_pos = start_pos + tokens - 1;
    let visible = last_pos - first_visible(last_pos, p.window) + 1;
    let splits = visible.div_ceil(DECODE_WG).min(MAX_SPLITS);
    let slots = u64::from(tokens) * u64::from(p.heads) * u64::from(splits);
    let (partial_acc, partial_stats) = cache.decode_scratch(rec.gpu(), slots);
    let params = KernelParams::new(p, start_pos, tokens, splits);
    let items = (group * p.head_dim / 4).div_ceil(DECODE_WG);
    let decode = rec.pipeline(
        &DECODE,
        &[
            ("WG", DECODE_WG),
            ("GQ", group),
            ("HD", p.head_dim),
            ("ITEMS", items),
        ],
    );
    rec.dispatch(
        &decode,
        &params,
        &[
            q.as_entire_binding(),
            cache.k_layer(layer),
            cache.v_layer(layer),
            partial_acc.as_entire_binding(),
            partial_stats.as_entire_binding(),
        ],
        [splits, p.kv_heads, tokens],
    );
    let combine = rec.pipeline(&COMBINE, &[("WG", DECODE_WG), ("HD", p.head_dim)]);
    rec.dispatch(
        &combine,
        &params,
        &[
            partial_acc.as_entire_binding(),
            partial_stats.as_entire_binding(),
            out.as_entire_binding(),
        ],
        [p.heads, tokens, 1],
    );
}

/// Attention through the tiled prefill kernel (any `tokens`, built for many).
#[allow(clippy::too_many_arguments)]
pub fn attention_prefill(
    rec: &mut Recorder,
    q: &wgpu::Buffer,
    cache: &KvCache,
    layer: u32,
    out: &wgpu::Buffer,
    start_pos: u32,
    tokens: u32,
    p: &AttentionParams,
) {
    check_call(cache, layer, q, out, start_pos, tokens, p);
    if tokens == 0 {
        return;
    }
    let rows = tokens * (p.heads / p.kv_heads);
    let tile = prefill_tile(rec.gpu(), rec.variant(), p.head_dim);
    let pipeline = rec.pipeline(
        &PREFILL,
        &[("WG", PREFILL_WG), ("HD", p.head_dim), ("BK", tile)],
    );
    rec.dispatch(
        &pipeline,
        &KernelParams::new(p, start_pos, tokens, 1),
        &[
            q.as_entire_binding(),
            cache.k_layer(layer),
            cache.v_layer(layer),
            out.as_entire_binding(),
        ],
        [rows.div_ceil(PREFILL_WG), p.kv_heads, 1],
    );
}

/// Keys per prefill tile: as many as fit twice (keys and values) in workgroup memory.
fn prefill_tile(gpu: &Gpu, variant: Variant, head_dim: u32) -> u32 {
    let element = if variant.f16 { 2 } else { 4 };
    let storage = gpu.device.limits().max_compute_workgroup_storage_size;
    let tile = (storage / (2 * head_dim * element)).min(PREFILL_MAX_TILE);
    assert!(
        tile > 0,
        "head_dim {head_dim} too large for {storage} bytes of workgroup memory"
    );
    tile
}

fn first_visible(pos: u32, window: Option<u32>) -> u32 {
    window.map_or(0, |w| (pos + 1).saturating_sub(w))
}

fn check_call(
    cache: &KvCache,
    layer: u32,
    q: &wgpu::Buffer,
    out: &wgpu::Buffer,
    start_pos: u32,
    tokens: u32,
    p: &AttentionParams,
) {
    assert!(
        p.kv_heads == cache.kv_heads && p.head_dim == cache.head_dim,
        "attention with {} kv heads of {} on a cache of {} kv heads of {}",
        p.kv_heads,
        p.head_dim,
        cache.kv_heads,
        cache.head_dim
    );
    assert!(
        p.heads > 0 && p.heads % p.kv_heads == 0,
        "{} query heads do not share {} kv heads evenly",
        p.heads,
        p.kv_heads
    );
    assert!(p.window != Some(0), "a sliding window of 0 sees no key");
    assert!(layer < cache.layers, "layer {layer} of {}", cache.layers);
    assert!(
        u64::from(start_pos) + u64::from(tokens) <= u64::from(cache.max_ctx),
        "attention at positions {start_pos}..+{tokens} beyond the cache's {} positions",
        cache.max_ctx
    );
    let needed = u64::from(tokens) * u64::from(p.heads) * u64::from(p.head_dim) * 4;
    assert!(
        q.size() >= needed && out.size() >= needed,
        "attention of {tokens} tokens needs {needed}-byte q and out buffers, got {} and {}",
        q.size(),
        out.size()
    );
}
