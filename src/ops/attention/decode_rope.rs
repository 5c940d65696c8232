//! Decode attention for one token with `rope_store`'s work fused in
//! (`wgsl/attention_decode_rope.wgsl` around `attention_decode_core.wgsl`): the per-head q/k
//! norms, the rotation and the KV cache write happen in the attention dispatch itself, so a
//! decode step has one dependent dispatch fewer per layer. Only on the GPU work split, where
//! `attention_decode_gpu` would run. A seat of a paged pool (a serving sequence alone in its
//! step) takes it too, reading and writing through its pages: the rows kernels' two
//! dispatches cost 8% of a one-stream decode step on the H200 (docs/perf.md, session 27).

use super::decode_gpu::{self, MAX_KEYS_PER_SPLIT};
use super::decode_rows::{check_rows, row_splits, rows_constants, DecodeRows, RowsCall};
use super::{
    dispatch_split_with, first_visible, AttentionCall, AttentionParams, KernelParams, SplitCall,
    PAGE_TOKENS,
};
use crate::gpu::{Gpu, Kernel, Lib, Recorder};
use crate::ops::rope::{HeadNorms, RopeParams, StoreTarget};

const LIBS: &[Lib] = &[Lib::Reduce, Lib::Rotary, Lib::AttentionMask];

/// Over one sequence's contiguous cache.
const DECODE_ROPE: Kernel = Kernel {
    name: "attention_decode_rope",
    source: concat!(
        include_str!("../../../wgsl/attention_decode_rope.wgsl"),
        include_str!("../../../wgsl/attention_decode_rope_slots.wgsl"),
        include_str!("../../../wgsl/attention_decode_core.wgsl")
    ),
    entry: "main",
    libs: LIBS,
};

/// Over a seat of a paged pool, through its page table.
const DECODE_ROPE_PAGED: Kernel = Kernel {
    name: "attention_decode_rope_paged",
    source: concat!(
        include_str!("../../../wgsl/attention_decode_rope.wgsl"),
        include_str!("../../../wgsl/attention_decode_rope_pages.wgsl"),
        include_str!("../../../wgsl/attention_decode_core.wgsl")
    ),
    entry: "main",
    libs: LIBS,
};

/// Over a batched step's rows of distinct sequences, in the slots or seats of one pool.
const DECODE_ROPE_ROWS: Kernel = Kernel {
    name: "attention_decode_rope_rows",
    source: concat!(
        include_str!("../../../wgsl/attention_decode_rope.wgsl"),
        include_str!("../../../wgsl/attention_decode_rope_rows.wgsl"),
        include_str!("../../../wgsl/attention_rows_table.wgsl"),
        include_str!("../../../wgsl/attention_decode_core.wgsl")
    ),
    entry: "main",
    libs: LIBS,
};

/// Storage bindings of the fused kernel: q/k/v, two cache layers, out, two partials and two
/// norms, which WebGPU's default limit of 8 holds; a paged seat's page table, or a batched
/// step's row table, is a ninth (Chromium's adapters give 10, SwiftShader's included).
fn storage_bindings(table: bool) -> u32 {
    8 + u32::from(table)
}

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct RopeAttentionParams {
    attention: KernelParams,
    rope_dims: u32,
    neox: u32,
    freq_scale: f32,
    norm: u32,
    eps: f32,
    q_offset: u32,
    k_offset: u32,
    v_offset: u32,
    theta_scale: f32,
    pad: [u32; 3],
}

impl RopeAttentionParams {
    fn new(
        attention: KernelParams,
        target: &StoreTarget,
        norms: Option<&HeadNorms>,
        rope: &RopeParams,
    ) -> RopeAttentionParams {
        RopeAttentionParams {
            attention,
            rope_dims: rope.rope_dims,
            neox: u32::from(rope.neox),
            freq_scale: rope.freq_scale,
            norm: u32::from(norms.is_some()),
            eps: norms.map_or(0.0, |n| n.eps),
            q_offset: target.q.offset,
            k_offset: target.k.offset,
            v_offset: target.v.offset,
            theta_scale: rope.theta_scale(),
            pad: [0; 3],
        }
    }
}

/// Each rotated pair's theta at `pos` (the kernel's `thetas`, four to a vec4): `pos ·
/// theta_scale^p` as ggml builds it and `rotary.wgsl`'s `pair_theta` too, by repeated f32
/// products, so the angles are the same bits as `rope_store`'s. On the host because a lane's
/// chain of up to 127 dependent products was ~2.5 µs of Gemma 3's attention dispatch on the
/// H200, and unrolled on the GPU its compiler reassociated them.
fn pair_thetas(rope: &RopeParams, pos: u32) -> Vec<f32> {
    let scale = rope.theta_scale();
    let pairs = (rope.rope_dims / 2) as usize;
    let mut thetas = Vec::with_capacity(pairs.next_multiple_of(4));
    let mut theta = pos as f32;
    for _ in 0..pairs {
        thetas.push(theta);
        theta *= scale;
    }
    thetas.resize(pairs.next_multiple_of(4), 0.0);
    thetas
}

/// Whether the fused kernel runs this shape on this device, over a `paged` cache or not: a GPU
/// work split, the GPU decode kernel's shapes, and room for its bindings and its rotated q and
/// k rows.
pub fn rope_attention_supported(gpu: &Gpu, p: &AttentionParams, paged: bool) -> bool {
    !gpu.caps.cpu_work_split
        && decode_gpu::supported_with(gpu, p, 2 * p.head_dim * 4)
        && gpu.caps.max_storage_bindings >= storage_bindings(paged)
}

/// One decode token: normalises (with `norms`) and rotates q and k of `target` at position
/// `start_pos`, writes k and v into the cache, and attends, into `out`. Equal to `rope_store`
/// followed by `attention`. q, k and v must be sections of one buffer.
pub fn rope_attention_decode(
    rec: &mut Recorder,
    target: &StoreTarget,
    norms: Option<&HeadNorms>,
    start_pos: u32,
    rope: &RopeParams,
    p: &AttentionParams,
    out: &wgpu::Buffer,
) {
    rope.check();
    let qkv = one_buffer(target);
    let cache = target.cache;
    let paged = cache.is_paged();
    assert!(
        rope_attention_supported(rec.gpu(), p, paged) && rope.head_dim == p.head_dim,
        "fused decode attention cannot run head_dim {} here",
        p.head_dim
    );
    let call = AttentionCall {
        q: qkv,
        cache,
        layer: target.cache_layer,
        out,
        start_pos,
        tokens: 1,
    };
    call.check(p);
    let visible = start_pos - first_visible(start_pos, p.window) + 1;
    let splits = decode_gpu::splits(rec.gpu(), p, 1, visible);
    let thetas = pair_thetas(rope, start_pos);
    let [wg, hd, kps, lpk] = decode_gpu::constants(p.head_dim);
    let pairs4 = ("PAIRS4", thetas.len() as u32 / 4);
    let consts = [
        wg,
        hd,
        kps,
        lpk,
        pairs4,
        ("PAGE", PAGE_TOKENS),
        ("HOST_THETAS", 1),
    ];
    let kernel = if paged {
        &DECODE_ROPE_PAGED
    } else {
        &DECODE_ROPE
    };
    let pipeline = rec.pipeline(kernel, &consts);
    let attention = KernelParams::new(p, start_pos, 1, splits);
    let uniform = RopeAttentionParams::new(attention, target, norms, rope);
    let mut uniform = bytemuck::bytes_of(&uniform).to_vec();
    uniform.extend_from_slice(bytemuck::cast_slice(&thetas));
    let split = SplitCall { call, splits };
    let placeholder = rec.gpu().placeholder().clone();
    let mut extra = norm_bindings(norms, &placeholder).to_vec();
    extra.extend(cache.page_binding());
    let grid = [splits, p.heads, 1];
    dispatch_split_with(rec, &pipeline, &split, p, grid, &uniform, &extra);
}

/// The one buffer of `target`'s q, k and v sections; panics when they are in several.
fn one_buffer<'a>(target: &StoreTarget<'a>) -> &'a wgpu::Buffer {
    let qkv = target.q.buffer;
    assert!(
        target.k.buffer == qkv && target.v.buffer == qkv,
        "fused decode attention needs q, k and v in one buffer"
    );
    qkv
}

/// The norms' weights as bindings (the placeholder where there are none).
fn norm_bindings<'a>(
    norms: Option<&HeadNorms<'a>>,
    placeholder: &'a wgpu::Buffer,
) -> [wgpu::BindingResource<'a>; 2] {
    let q_norm = norms.map_or(placeholder, |n| n.q);
    let k_norm = norms.map_or(placeholder, |n| n.k);
    [q_norm.as_entire_binding(), k_norm.as_entire_binding()]
}

/// Whether the fused rows kernel runs this shape on this device, over a paged pool or slots:
/// `rope_attention_supported`'s conditions with the row table as a ninth binding, and room for
/// a paged pool's key rows.
pub fn rope_attention_rows_supported(gpu: &Gpu, p: &AttentionParams, paged: bool) -> bool {
    let key_rows = if paged { MAX_KEYS_PER_SPLIT } else { 1 };
    !gpu.caps.cpu_work_split
        && decode_gpu::supported_with(gpu, p, 2 * p.head_dim * 4 + key_rows * 4)
        && gpu.caps.max_storage_bindings >= storage_bindings(true)
}

/// A batched decode step of rows of distinct sequences: for row r at `rows.positions[r]` in
/// its own slot or seat of `rows.cache`'s pool (through `rows.table`, `row_table`'s words),
/// normalises (with `norms`) and rotates its q and k of `target` (the rows' sections of one
/// buffer), writes its k and v into its cache and attends, into row r of `out`. Equal to
/// `rope_store_rows` followed by `attention_decode_rows`. Two rows of one sequence would race
/// (each reads the other's new key from the cache): the caller keeps them apart.
pub fn rope_attention_decode_rows(
    rec: &mut Recorder,
    target: &StoreTarget,
    norms: Option<&HeadNorms>,
    rows: &DecodeRows,
    rope: &RopeParams,
    p: &AttentionParams,
    out: &wgpu::Buffer,
) {
    rope.check();
    let qkv = one_buffer(target);
    let count = rows.positions.len() as u32;
    if count == 0 {
        return;
    }
    check_rows(rows, target.cache_layer, qkv, out, p);
    let paged = rows.cache.is_paged();
    assert!(
        rope_attention_rows_supported(rec.gpu(), p, paged) && rope.head_dim == p.head_dim,
        "fused batched decode attention cannot run head_dim {} here",
        p.head_dim
    );
    let splits = row_splits(rec.gpu(), rows, p);
    let mut consts = rows_constants(p, rows.cache);
    consts.extend([("PAIRS4", 1), ("HOST_THETAS", 0)]);
    let pipeline = rec.pipeline(&DECODE_ROPE_ROWS, &consts);
    let call = RowsCall {
        rows,
        layer: target.cache_layer,
        q: qkv,
        out,
        params: KernelParams::new(p, 0, count, splits),
    };
    let uniform = RopeAttentionParams::new(call.params, target, norms, rope);
    let mut uniform = bytemuck::bytes_of(&uniform).to_vec();
    // The unread angles (PAIRS4 = 1).
    uniform.extend_from_slice(&[0; 16]);
    let placeholder = rec.gpu().placeholder().clone();
    let norms = norm_bindings(norms, &placeholder);
    call.dispatch(rec, &pipeline, p, &uniform, &norms);
}
