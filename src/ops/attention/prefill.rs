//! Prefill attention: the tiled kernel (`attention_prefill.wgsl`) or, where the device has
//! them, the cooperative-matrix one (`prefill_coop`), under a causal, bidirectional or
//! per-sequence mask, with the keys split so that every invocation stays within llvmpipe's loop
//! budget and few-token calls still fill the GPU.

use crate::gpu::{Gpu, Kernel, Lib, Recorder, Variant};
use crate::ops::quant::MATVEC_TOKENS_ON_GPU;

use super::prefill_coop::{CoopPrefill, PREFILL_COOP};
use super::{
    choose_splits, dispatch_split_with, AttentionCall, AttentionParams, KernelParams, Segments,
    SplitCall, PAGE_TOKENS, PARALLEL_SPLITS,
};

const PREFILL: Kernel = Kernel {
    name: "attention_prefill",
    source: include_str!("../../../wgsl/attention_prefill.wgsl"),
    entry: "main",
    libs: &[
        Lib::AttentionParams,
        Lib::AttentionMask,
        Lib::AttentionPrefill,
    ],
};

/// Prefill workgroups wanted on GPUs: several per SM of a large GPU (the H200 has 132). Without
/// splits a 512-token prompt gives SmolLM2 72 workgroups and Gemma 3 only 32.
const PREFILL_GPU_WORKGROUPS: u32 = 1024;
/// llvmpipe ends every loop of an invocation after 65535 back-edges in total (see
/// `DECODE_MAX_TILES_PER_SPLIT`), so prefill keys are budgeted from the kernel's loop shape.
const PREFILL_LOOP_BUDGET: u32 = 40_000;
/// Rows (token, head) per prefill workgroup, one per lane.
pub(super) const PREFILL_WG: u32 = 64;
const PREFILL_MAX_TILE: u32 = 64;

/// Attention through the tiled prefill kernel (any `tokens`, built for many).
pub fn attention_prefill(rec: &mut Recorder, call: &AttentionCall, p: &AttentionParams) {
    prefill_masked(rec, call, p, PrefillMask::Causal);
}

/// out[t, h*hd..] = softmax(q·K^T * scale) V over keys 0..tokens of the call's layer, with no
/// causal mask: every query sees every key of the sequence (BERT-style encoders). Shapes as
/// `attention`; the call starts at position 0 (nothing precedes an encoder's sequence), and
/// the cache must hold the keys and values of positions 0..tokens. A sliding window has no
/// meaning here and is refused.
pub fn bidirectional_attention(rec: &mut Recorder, call: &AttentionCall, p: &AttentionParams) {
    assert_eq!(
        call.start_pos, 0,
        "bidirectional attention starts at position 0"
    );
    assert!(
        p.window.is_none(),
        "bidirectional attention has no sliding window"
    );
    prefill_masked(rec, call, p, PrefillMask::Bidirectional);
}

/// Which keys each query of a prefill call sees.
#[derive(Clone, Copy)]
pub(super) enum PrefillMask<'a> {
    /// Keys up to its own position (and within the window).
    Causal,
    /// Every key of the call.
    Bidirectional,
    /// The keys of its own sequence, packed in `segments::Segments` order.
    Segments(&'a Segments<'a>),
}

/// The prefill kernel under one of its masks.
pub(super) fn prefill_masked(
    rec: &mut Recorder,
    call: &AttentionCall,
    p: &AttentionParams,
    mask: PrefillMask,
) {
    call.check(p);
    let (cache, start_pos, tokens) = (call.cache, call.start_pos, call.tokens);
    if tokens == 0 {
        return;
    }
    let group = p.heads / p.kv_heads;
    let coop = CoopPrefill::plan(rec.gpu(), rec.variant(), p.head_dim, tokens);
    // One variant for the kernel chosen: the tensor cores' is the recorder's (f16 operands).
    let (variant, rows, tile) = match coop {
        Some(plan) => (rec.variant(), plan.rows, plan.tile),
        None => {
            let variant = tiles_variant(rec.variant(), tokens, mask);
            (
                variant,
                PREFILL_WG,
                prefill_tile(rec.gpu(), variant, p.head_dim),
            )
        }
    };
    let row_blocks = (tokens * group).div_ceil(rows);
    // Packed sequences: a workgroup walks only the keys of the sequences its rows belong to
    // (its rows are within one of `PREFILL_WG`'s blocks, so that block's keys bound them).
    let (causal, table, keys) = match mask {
        PrefillMask::Causal => (true, None, None),
        PrefillMask::Bidirectional => (false, None, None),
        PrefillMask::Segments(s) => (false, Some(s.table), Some(s.widest_block(group))),
    };
    let splits = prefill_splits(rec.gpu(), p, start_pos, tokens, keys, [rows, tile]);
    let shape = [
        ("HD", p.head_dim),
        ("BK", tile),
        ("CAUSAL", u32::from(causal)),
        ("SEGMENTS", u32::from(table.is_some())),
        ("PAGED", cache.paged_constant()),
        ("PAGE", PAGE_TOKENS),
    ];
    // The cooperative kernel derives its workgroup from head_dim.
    let (kernel, lanes) = match coop {
        Some(_) => (&PREFILL_COOP, None),
        None => (&PREFILL, Some(("WG", PREFILL_WG))),
    };
    let consts: Vec<_> = lanes.into_iter().chain(shape).collect();
    let pipeline = rec.gpu().pipeline(kernel, variant, &consts);
    let split = SplitCall {
        call: *call,
        splits,
    };
    let params = KernelParams::new(p, start_pos, tokens, splits);
    // The kernel binds the segment table and the pages in every variant; it reads them only
    // where its constants say so.
    let placeholder = rec.gpu().placeholder();
    let table = table.unwrap_or(placeholder);
    let pages = cache
        .page_binding()
        .unwrap_or(placeholder.as_entire_binding());
    let grid = [row_blocks, p.kv_heads, splits];
    let extra = [table.as_entire_binding(), pages];
    dispatch_split_with(
        rec,
        &pipeline,
        &split,
        p,
        grid,
        bytemuck::bytes_of(&params),
        &extra,
    );
}

/// The variant of the tiled kernel for `tokens` queries under `mask`: a decoder's few-token
/// step (at most `MATVEC_TOKENS_ON_GPU`, as a speculative verification is) keeps its key and
/// value tiles in f32, so its logits are its tokens' single steps' (which read f32 keys) up to
/// f32 rounding and greedy speculation keeps plain decoding's ids at near-ties. With f16 tiles
/// they moved by up to 1e-2 of the largest logit on lavapipe, 2e-6 without
/// (`batch_step::few_tokens_*`). Encoders keep one variant whatever a pass's size, so a text's
/// vector does not depend on what it was packed with.
fn tiles_variant(variant: Variant, tokens: u32, mask: PrefillMask) -> Variant {
    match tokens <= MATVEC_TOKENS_ON_GPU && matches!(mask, PrefillMask::Causal) {
        true => Variant {
            f16: false,
            ..variant
        },
        false => variant,
    }
}

/// Key splits of prefill: enough that no invocation exceeds the loop budget, and, where the
/// partial results fit one binding, enough that few-token calls (chunked prefill deep into a
/// context) still fill the GPU.
/// `keys`, where given, bounds the keys of one workgroup more tightly than the call's shape;
/// `[rows, tile]` is the kernel's query rows per workgroup and keys per tile.
fn prefill_splits(
    gpu: &Gpu,
    p: &AttentionParams,
    start_pos: u32,
    tokens: u32,
    keys: Option<u32>,
    [rows, tile]: [u32; 2],
) -> u32 {
    let group = p.heads / p.kv_heads;
    let workgroups = (tokens * group).div_ceil(rows) * p.kv_heads;
    // Keys one workgroup may see: its tokens' positions plus the window behind the first.
    let tokens_per_block = rows.div_ceil(group) + 1;
    let keys = keys.unwrap_or(p.window.map_or(start_pos + tokens, |w| {
        (start_pos + tokens).min(w.saturating_add(tokens_per_block))
    }));
    let tiles = keys.div_ceil(tile);
    // Back-edges of the kernel's loops per key (two head_dim loops of 4 vec4s, the key loops)
    // and per tile (the tile load, the rescale, the tile loop).
    let per_key = 2 * p.head_dim / 16 + 2;
    let per_tile = tile * p.head_dim / 4 / rows + p.head_dim / 16 + 1;
    let tiles_per_split = (PREFILL_LOOP_BUDGET / (per_key * tile + per_tile)).max(1);
    let needed = tiles.div_ceil(tiles_per_split);
    let wanted = match gpu.caps.cpu_work_split {
        true => PARALLEL_SPLITS,
        false => PREFILL_GPU_WORKGROUPS,
    };
    let parallel = wanted.div_ceil(workgroups).min(tiles);
    choose_splits(gpu, p, tokens, needed, parallel)
}

/// Keys per prefill tile: as many as fit twice (keys and values) in workgroup memory.
fn prefill_tile(gpu: &Gpu, variant: Variant, head_dim: u32) -> u32 {
    let element = if variant.f16 { 2 } else { 4 };
    let storage = gpu.caps.max_workgroup_storage;
    let tile = (storage / (2 * head_dim * element)).min(PREFILL_MAX_TILE);
    assert!(
        tile > 0,
        "head_dim {head_dim} too large for {storage} bytes of workgroup memory"
    );
    tile
}
