//! Attention over a KV cache in GPU memory: decode split over the keys (flash-decoding),
//! tiled causal prefill, both with grouped-query heads, an optional sliding window and an
//! optional logit soft-cap; bidirectional attention for encoders through the prefill kernel
//! without its causal mask, over one sequence or several packed ones (`segments`: each query
//! sees its own sequence only); plus the KV cache itself, a standalone softmax, and CPU
//! references.
//!
//! Decode has two kernels: `attention_decode.wgsl` for CPU adapters (`Caps::cpu_work_split`),
//! whose lanes walk whole tiles serially, and `attention_decode_gpu.wgsl` (see `decode_gpu`)
//! for GPUs, which spreads scoring, softmax and value sums over the lanes and uses the
//! workgroup reductions of `Lib::Reduce`; for one token, `decode_rope` also takes over
//! `rope_store`'s work in the same dispatch; `decode_rows` attends a batched step's rows, each
//! in its own slot of a KV pool, in one dispatch. The other kernels use no subgroup operations, so
//! their subgroup variants compile the same code; f16 variants keep prefill's key/value tiles
//! in f16 workgroup memory, which doubles the keys per tile. Everything accumulates in f32.

mod decode_gpu;
mod decode_rope;
mod decode_rows;
mod kv_cache;
mod paged;
mod prefill;
mod prefill_coop;
mod reference;
mod segments;
mod softmax;

pub use decode_gpu::attention_decode_gpu;
pub use decode_rope::{
    rope_attention_decode, rope_attention_decode_rows, rope_attention_rows_supported,
    rope_attention_supported,
};
pub use decode_rows::{
    attention_decode_rows, attention_rows_reference, decode_rows_supported, row_table, DecodeRows,
    ReferenceRow,
};
pub use kv_cache::{kv_write, KvCache};
pub use paged::{Pages, PAGE_TOKENS};
pub use prefill::{attention_prefill, bidirectional_attention};
pub use prefill_coop::prefill_uses_coop_matrix;
pub use reference::{
    attention_reference, bidirectional_attention_reference, segmented_attention_reference,
};
pub use segments::{segment_table, segmented_attention, Segments};
pub use softmax::{softmax, softmax_reference};

use crate::gpu::{Gpu, Kernel, Lib, Recorder};

const DECODE: Kernel = Kernel {
    name: "attention_decode",
    source: include_str!("../../wgsl/attention_decode.wgsl"),
    entry: "main",
    libs: &[Lib::AttentionParams, Lib::AttentionMask],
};

const COMBINE: Kernel = Kernel {
    name: "attention_combine",
    source: include_str!("../../wgsl/attention_combine.wgsl"),
    entry: "main",
    libs: &[Lib::AttentionParams],
};

/// Lanes of a decode workgroup, which is also its keys per tile.
const DECODE_WG: u32 = 64;
/// Splits wanted for parallelism: enough workgroups for large GPUs at long contexts; each
/// split costs a partial result and the query load on CPU adapters.
const PARALLEL_SPLITS: u32 = 32;
/// llvmpipe (lavapipe, GL) ends every loop of an invocation after 65535 back-edges in total,
/// silently, so the keys one invocation walks are bounded: a decode tile costs under ~900
/// back-edges, and prefill keys are budgeted from the prefill kernel's loop shape.
const DECODE_MAX_TILES_PER_SPLIT: u32 = 32;
/// Private arrays in the decode kernel are sized by the query heads per kv head.
const DECODE_MAX_GROUP: u32 = 16;
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

impl AttentionParams {
    /// Scaled dot-product attention as most models run it: scale 1/sqrt(head_dim), every
    /// earlier key visible, no soft-cap (set `window` and `softcap` on the result otherwise).
    pub fn standard(heads: u32, kv_heads: u32, head_dim: u32) -> AttentionParams {
        AttentionParams {
            heads,
            kv_heads,
            head_dim,
            scale: 1.0 / (head_dim as f32).sqrt(),
            window: None,
            softcap: None,
        }
    }

    /// Panics when these shapes disagree with `cache` or `layer` is beyond it, or the heads or
    /// window are impossible: the model code bounds them.
    fn check_cache(&self, cache: &KvCache, layer: u32) {
        assert!(
            self.kv_heads == cache.kv_heads && self.head_dim == cache.head_dim,
            "attention with {} kv heads of {} on a cache of {} kv heads of {}",
            self.kv_heads,
            self.head_dim,
            cache.kv_heads,
            cache.head_dim
        );
        assert!(
            self.heads > 0 && self.heads.is_multiple_of(self.kv_heads),
            "{} query heads do not share {} kv heads evenly",
            self.heads,
            self.kv_heads
        );
        assert!(self.window != Some(0), "a sliding window of 0 sees no key");
        assert!(layer < cache.layers, "layer {layer} of {}", cache.layers);
    }

    /// Panics when `q` or `out` cannot hold `rows` rows of these heads.
    fn check_buffers(&self, q: &wgpu::Buffer, out: &wgpu::Buffer, rows: u64) {
        let needed = rows * u64::from(self.heads) * u64::from(self.head_dim) * 4;
        assert!(
            q.size() >= needed && out.size() >= needed,
            "attention of {rows} rows needs {needed}-byte q and out buffers, got {} and {}",
            q.size(),
            out.size()
        );
    }
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

/// The buffers and positions of one attention call, which every entry point takes with its
/// `AttentionParams`.
#[derive(Debug, Clone, Copy)]
pub struct AttentionCall<'a> {
    /// The queries: [tokens, heads * head_dim] f32.
    pub q: &'a wgpu::Buffer,
    /// The keys and values the queries attend; it must already hold those of positions up to
    /// start_pos + tokens - 1 (kv_write them first).
    pub cache: &'a KvCache,
    /// The cache layer read.
    pub layer: u32,
    /// The result: [tokens, heads * head_dim] f32.
    pub out: &'a wgpu::Buffer,
    /// The cache position of the first query.
    pub start_pos: u32,
    /// Queries, at positions start_pos..start_pos + tokens.
    pub tokens: u32,
}

impl AttentionCall<'_> {
    /// Panics when the shapes disagree with the cache or the positions exceed it: the model
    /// code bounds them.
    fn check(&self, p: &AttentionParams) {
        let AttentionCall {
            q,
            cache,
            layer,
            out,
            start_pos,
            tokens,
        } = *self;
        p.check_cache(cache, layer);
        assert!(
            u64::from(start_pos) + u64::from(tokens) <= u64::from(cache.max_ctx),
            "attention at positions {start_pos}..+{tokens} beyond the cache's {} positions",
            cache.max_ctx
        );
        p.check_buffers(q, out, u64::from(tokens));
    }
}

/// out[t, h*hd..] = softmax(q·K^T * scale, causal (+window)) V over keys 0..=start_pos+t of
/// the call's layer (shapes as `AttentionCall`'s). A seat of a paged pool takes the prefill
/// kernel for one token too: only it and the batched rows kernel read pages.
///
/// Panics when shapes disagree with the cache or positions exceed it: the model code bounds them.
pub fn attention(rec: &mut Recorder, call: &AttentionCall, p: &AttentionParams) {
    let decode_fits = decode_supported(rec.gpu(), p) && call.cache.pages().is_none();
    if call.tokens <= DECODE_MAX_TOKENS && decode_fits {
        attention_decode(rec, call, p);
    } else {
        attention_prefill(rec, call, p);
    }
}

/// Whether the split decode kernels can run this shape on this device (else use prefill).
pub fn decode_supported(gpu: &Gpu, p: &AttentionParams) -> bool {
    if gpu.caps.cpu_work_split {
        decode_cpu_supported(gpu, p)
    } else {
        decode_gpu::supported(gpu, p)
    }
}

/// Whether `attention_decode.wgsl` (the CPU adapters' decode kernel) can run this shape.
fn decode_cpu_supported(gpu: &Gpu, p: &AttentionParams) -> bool {
    let group = p.heads / p.kv_heads.max(1);
    // The query heads, two tiles of scores (double-buffered), the tile maxima.
    let shared_floats = group * p.head_dim + 2 * group * DECODE_WG + group;
    group <= DECODE_MAX_GROUP && shared_floats * 4 <= gpu.caps.max_workgroup_storage
}

/// Attention through the split decode kernels (any `tokens`, built for few): the GPU kernel
/// (`attention_decode_gpu`) unless the device splits work for a CPU.
pub fn attention_decode(rec: &mut Recorder, call: &AttentionCall, p: &AttentionParams) {
    if !rec.gpu().caps.cpu_work_split {
        attention_decode_gpu(rec, call, p);
        return;
    }
    call.check(p);
    let AttentionCall {
        q,
        cache,
        layer,
        out,
        start_pos,
        tokens,
    } = *call;
    if tokens == 0 {
        return;
    }
    assert!(
        decode_cpu_supported(rec.gpu(), p),
        "decode attention cannot hold {} query heads of {} per kv head",
        p.heads / p.kv_heads,
        p.head_dim
    );
    let group = p.heads / p.kv_heads;
    let last_pos = start_pos + tokens - 1;
    let visible = last_pos - first_visible(last_pos, p.window) + 1;
    let tiles = visible.div_ceil(DECODE_WG);
    let needed = tiles.div_ceil(DECODE_MAX_TILES_PER_SPLIT);
    let splits = choose_splits(rec.gpu(), p, tokens, needed, tiles.min(PARALLEL_SPLITS));
    let (partial_acc, partial_stats) = partials(rec, cache, tokens, p, splits);
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
    combine(rec, &params, p.head_dim, &partial_acc, &partial_stats, out);
}

/// Scratch for `splits` partial results of every (token, head).
fn partials(
    rec: &Recorder,
    cache: &KvCache,
    tokens: u32,
    p: &AttentionParams,
    splits: u32,
) -> (wgpu::Buffer, wgpu::Buffer) {
    let slots = u64::from(tokens) * u64::from(p.heads) * u64::from(splits);
    let bytes = slots * u64::from(p.head_dim) * 4;
    assert!(
        bytes <= rec.gpu().caps.max_binding,
        "attention of {tokens} tokens in {splits} key splits needs {bytes} bytes of partial \
         results, more than one binding holds: attend fewer tokens per call"
    );
    cache.decode_scratch(rec.gpu(), slots)
}

/// Merges split partial results into `out`.
fn combine(
    rec: &mut Recorder,
    params: &KernelParams,
    head_dim: u32,
    partial_acc: &wgpu::Buffer,
    partial_stats: &wgpu::Buffer,
    out: &wgpu::Buffer,
) {
    let pipeline = rec.pipeline(&COMBINE, &[("WG", DECODE_WG), ("HD", head_dim)]);
    rec.dispatch(
        &pipeline,
        params,
        &[
            partial_acc.as_entire_binding(),
            partial_stats.as_entire_binding(),
            out.as_entire_binding(),
        ],
        [params.heads, params.tokens, 1],
    );
}

/// One attention call of a kernel that splits the keys, as its dispatch sees it.
pub(super) struct SplitCall<'a> {
    pub call: AttentionCall<'a>,
    pub splits: u32,
}

/// Dispatches a split-keys kernel (bindings: q, k and v of the layer, out, partials) and
/// merges its splits. With one split the kernel writes `out` directly and leaves the partials
/// alone, so no merge runs.
pub(super) fn dispatch_split(
    rec: &mut Recorder,
    pipeline: &wgpu::ComputePipeline,
    split: &SplitCall,
    p: &AttentionParams,
    grid: [u32; 3],
) {
    let (call, splits) = (&split.call, split.splits);
    let params = KernelParams::new(p, call.start_pos, call.tokens, splits);
    dispatch_split_with(
        rec,
        pipeline,
        split,
        p,
        grid,
        bytemuck::bytes_of(&params),
        &[],
    );
}

/// `dispatch_split` for kernels with a larger uniform (beginning with `KernelParams`) and
/// `extra` bindings after the partials.
pub(super) fn dispatch_split_with(
    rec: &mut Recorder,
    pipeline: &wgpu::ComputePipeline,
    split: &SplitCall,
    p: &AttentionParams,
    grid: [u32; 3],
    uniform: &[u8],
    extra: &[wgpu::BindingResource<'_>],
) {
    let (call, splits) = (&split.call, split.splits);
    let partial_tokens = if splits > 1 { call.tokens } else { 1 };
    let (partial_acc, partial_stats) = partials(rec, call.cache, partial_tokens, p, splits);
    let mut bindings = vec![
        call.q.as_entire_binding(),
        call.cache.k_layer(call.layer),
        call.cache.v_layer(call.layer),
        call.out.as_entire_binding(),
        partial_acc.as_entire_binding(),
        partial_stats.as_entire_binding(),
    ];
    bindings.extend(extra.iter().cloned());
    rec.dispatch_bytes(pipeline, uniform, &bindings, grid);
    if splits > 1 {
        let params = KernelParams::new(p, call.start_pos, call.tokens, splits);
        combine(
            rec,
            &params,
            p.head_dim,
            &partial_acc,
            &partial_stats,
            call.out,
        );
    }
}

/// The splits the loop budget needs, raised towards `parallel` as far as the partial results
/// of every (token, head) still fit one binding.
fn choose_splits(gpu: &Gpu, p: &AttentionParams, tokens: u32, needed: u32, parallel: u32) -> u32 {
    let split_bytes = u64::from(tokens) * u64::from(p.heads) * u64::from(p.head_dim) * 4;
    let affordable = (gpu.caps.max_binding / split_bytes).min(u64::from(parallel)) as u32;
    needed.max(affordable).max(1)
}

fn first_visible(pos: u32, window: Option<u32>) -> u32 {
    window.map_or(0, |w| (pos + 1).saturating_sub(w))
}
