//! Rotary position embedding, as ggml's `rope_f32` without YaRN (ext_factor 0), with ggml's
//! optional per-pair frequency factors and magnitude (`RopeScaling`: Llama 3's `rope_freqs`,
//! Phi-3's long/short factors and attn_factor).
//!
//! llama.cpp's mode by architecture: LLAMA uses the normal layout, QWEN2, GEMMA3 and PHI3 NeoX.

use crate::gpu::{Kernel, Lib, Recorder};
use crate::ops::attention::{KvCache, PAGE_TOKENS};
use crate::ops::elementwise::workgroup_grid;

const ROPE: Kernel = Kernel {
    name: "rope",
    source: include_str!("../../wgsl/rope.wgsl"),
    entry: "rope",
    libs: &[Lib::Reduce, Lib::Rotary],
};

const ROPE_STORE: Kernel = Kernel {
    name: "rope_store",
    source: include_str!("../../wgsl/rope.wgsl"),
    entry: "rope_store",
    libs: &[Lib::Reduce, Lib::Rotary],
};
const ROPE_STORE_ROWS: Kernel = Kernel {
    name: "rope_store_rows",
    source: include_str!("../../wgsl/rope.wgsl"),
    entry: "rope_store_rows",
    libs: &[Lib::Reduce, Lib::Rotary],
};
const ROPE_STORE_PAGES: Kernel = Kernel {
    name: "rope_store_pages",
    source: include_str!("../../wgsl/rope.wgsl"),
    entry: "rope_store_pages",
    libs: &[Lib::Reduce, Lib::Rotary],
};
/// Storage buffers `rope_store_rows` and `rope_store` on pages bind (one more than `rope_store`:
/// the row table or the seat's page table).
const ROWS_STORAGE_BINDINGS: u32 = 9;
const ROPE_AT: Kernel = Kernel {
    name: "rope_at",
    source: include_str!("../../wgsl/rope_at.wgsl"),
    entry: "main",
    libs: &[Lib::Rotary],
};
const WG: u32 = 64;

/// How one model applies RoPE to each head.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RopeParams {
    pub head_dim: u32,
    /// Leading dimensions of each head that rotate (`rope.dimension_count`); even, <= head_dim.
    pub rope_dims: u32,
    pub freq_base: f32,
    /// Linear position scaling: angles use position * freq_scale.
    pub freq_scale: f32,
    /// NeoX layout: pairs (i, i + rope_dims/2) instead of (2i, 2i + 1).
    pub neox: bool,
}

impl RopeParams {
    /// base^(-2 / rope_dims) in f32 through powf, as ggml computes it.
    pub(crate) fn theta_scale(&self) -> f32 {
        self.freq_base.powf(-2.0 / self.rope_dims as f32)
    }

    pub(crate) fn check(&self) {
        assert!(
            self.rope_dims > 0
                && self.rope_dims.is_multiple_of(2)
                && self.rope_dims <= self.head_dim,
            "rope_dims {} must be even, positive and at most head_dim {}",
            self.rope_dims,
            self.head_dim
        );
    }
}

/// What ggml's `rope_ext` adds to `RopeParams` where a model asks for it: pair i's angle is
/// divided by ggml's `freq_factors[i]`, and cos and sin are multiplied by `mscale`
/// (`attn_factor`). `inverse_factors` holds `1 / freq_factors[i]` (rope_dims / 2 f32 values,
/// divided on the host) and the kernels multiply by it: WGSL lets a division be 2.5 ulp off,
/// and the H200's is, which at angles of thousands of radians turned a pair ~1e-4 away from
/// the reference (`ops_rope_scaled`, docs/perf.md session 24). θ · (1 / f) is within an ulp of
/// ggml's θ / f and the same on every device.
#[derive(Clone, Copy)]
pub struct RopeScaling<'a> {
    pub inverse_factors: &'a wgpu::Buffer,
    pub mscale: f32,
}

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct RopeUniform {
    tokens: u32,
    heads: u32,
    head_dim: u32,
    rope_dims: u32,
    start_pos: u32,
    neox: u32,
    theta_scale: f32,
    freq_scale: f32,
    groups_x: u32,
    kv_heads: u32,
    norm: u32,
    eps: f32,
    cache_offset: u32,
    q_offset: u32,
    k_offset: u32,
    v_offset: u32,
    scaled: u32,
    mscale: f32,
    pad: [u32; 2],
}

/// The uniform's scaling fields, and the factors binding (a placeholder without scaling).
fn scaling_fields<'a>(
    scaling: Option<&RopeScaling<'a>>,
    placeholder: &'a wgpu::Buffer,
) -> (u32, f32, &'a wgpu::Buffer) {
    match scaling {
        Some(s) => (1, s.mscale, s.inverse_factors),
        None => (0, 1.0, placeholder),
    }
}

/// Rotates x, laid out [tokens, heads * head_dim], in place; token t is at position
/// start_pos + t.
pub fn rope(
    rec: &mut Recorder,
    x: &wgpu::Buffer,
    tokens: u32,
    heads: u32,
    start_pos: u32,
    p: &RopeParams,
) {
    rope_scaled(rec, x, tokens, heads, start_pos, p, None);
}

/// `rope` with the model's `RopeScaling`, where it has one.
pub fn rope_scaled(
    rec: &mut Recorder,
    x: &wgpu::Buffer,
    tokens: u32,
    heads: u32,
    start_pos: u32,
    p: &RopeParams,
    scaling: Option<&RopeScaling>,
) {
    p.check();
    let invocations = tokens
        .checked_mul(heads)
        .and_then(|n| n.checked_mul(p.rope_dims / 2))
        .expect("rope: tokens * heads * rope_dims/2 overflows u32");
    if invocations == 0 {
        return;
    }
    let pipeline = rec.pipeline(&ROPE, &rope_constants(0, 0));
    let grid = workgroup_grid(rec.gpu(), invocations.div_ceil(WG));
    let (scaled, mscale, factors) = scaling_fields(scaling, rec.gpu().placeholder());
    let params = RopeUniform {
        tokens,
        heads,
        head_dim: p.head_dim,
        rope_dims: p.rope_dims,
        start_pos,
        neox: u32::from(p.neox),
        theta_scale: p.theta_scale(),
        freq_scale: p.freq_scale,
        groups_x: grid[0],
        kv_heads: 0,
        norm: 0,
        eps: 0.0,
        cache_offset: 0,
        q_offset: 0,
        k_offset: 0,
        v_offset: 0,
        scaled,
        mscale,
        pad: [0; 2],
    };
    let bindings = [x.as_entire_binding(), factors.as_entire_binding()];
    rec.dispatch(&pipeline, &params, &bindings, grid);
}

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct RopeAtUniform {
    tokens: u32,
    heads: u32,
    head_dim: u32,
    rope_dims: u32,
    neox: u32,
    theta_scale: f32,
    freq_scale: f32,
    groups_x: u32,
}

/// `rope` with token t at position `positions[t]` (one u32 a token): several sequences packed
/// into one call (an encoder's batch), each counting its positions from 0.
pub fn rope_at(
    rec: &mut Recorder,
    x: &wgpu::Buffer,
    tokens: u32,
    heads: u32,
    positions: &wgpu::Buffer,
    p: &RopeParams,
) {
    p.check();
    assert!(
        positions.size() >= u64::from(tokens) * 4,
        "rope_at: {} bytes of positions for {tokens} tokens",
        positions.size()
    );
    let invocations = tokens
        .checked_mul(heads)
        .and_then(|n| n.checked_mul(p.rope_dims / 2))
        .expect("rope_at: tokens * heads * rope_dims/2 overflows u32");
    if invocations == 0 {
        return;
    }
    let pipeline = rec.pipeline(&ROPE_AT, &[("WG", WG)]);
    let grid = workgroup_grid(rec.gpu(), invocations.div_ceil(WG));
    let params = RopeAtUniform {
        tokens,
        heads,
        head_dim: p.head_dim,
        rope_dims: p.rope_dims,
        neox: u32::from(p.neox),
        theta_scale: p.theta_scale(),
        freq_scale: p.freq_scale,
        groups_x: grid[0],
    };
    let bindings = [x.as_entire_binding(), positions.as_entire_binding()];
    rec.dispatch(&pipeline, &params, &bindings, grid);
}

/// The f32 values of `buffer` from element `offset` on.
#[derive(Clone, Copy)]
pub struct Section<'a> {
    pub buffer: &'a wgpu::Buffer,
    pub offset: u32,
}

impl<'a> From<&'a wgpu::Buffer> for Section<'a> {
    fn from(buffer: &'a wgpu::Buffer) -> Self {
        Section { buffer, offset: 0 }
    }
}

/// The new rows of one step, and where they go. q, k and v may be sections of one buffer.
pub struct StoreTarget<'a> {
    pub q: Section<'a>,
    pub k: Section<'a>,
    pub v: Section<'a>,
    pub cache: &'a KvCache,
    pub cache_layer: u32,
    pub heads: u32,
    pub kv_heads: u32,
}

impl<'a> StoreTarget<'a> {
    /// One token's q, k and v packed one after another in `qkv` (as a decode step's products
    /// leave them), for `cache`'s layer `cache_layer`.
    pub fn packed(
        qkv: &'a wgpu::Buffer,
        heads: u32,
        cache: &'a KvCache,
        cache_layer: u32,
    ) -> StoreTarget<'a> {
        StoreTarget::sections(qkv, 1, heads, cache, cache_layer)
    }

    /// `tokens` tokens' q, k and v in sections of `qkv`: q `[tokens, heads · head_dim]`, then k
    /// and v `[tokens, kv_heads · head_dim]` (as `quant::matvec_sections` leaves a batched
    /// step's products); one token's are `packed`.
    pub fn sections(
        qkv: &'a wgpu::Buffer,
        tokens: u32,
        heads: u32,
        cache: &'a KvCache,
        cache_layer: u32,
    ) -> StoreTarget<'a> {
        let (kv_heads, head_dim) = (cache.kv_heads, cache.head_dim);
        let section = |offset| Section {
            buffer: qkv,
            offset,
        };
        StoreTarget {
            q: section(0),
            k: section(tokens * heads * head_dim),
            v: section(tokens * (heads + kv_heads) * head_dim),
            cache,
            cache_layer,
            heads,
            kv_heads,
        }
    }
}

/// Per-head RMS norms of q and k rows (Gemma 3), applied before the rotation.
pub struct HeadNorms<'a> {
    pub q: &'a wgpu::Buffer,
    pub k: &'a wgpu::Buffer,
    pub eps: f32,
}

/// A step's q/k/v epilogue in one dispatch: optional per-head norms of q and k, rope on both,
/// q left in place, k and v written into the cache layer at `start_pos..`. The same as `rope`
/// on q and k followed by `attention::kv_write` (and, with norms, `rms_norm` per head first).
/// On a seat of a paged pool through its pages, where `rope_store_rows_supported` (a ninth
/// storage binding, the seat's page table).
pub fn rope_store(
    rec: &mut Recorder,
    target: &StoreTarget,
    norms: Option<&HeadNorms>,
    tokens: u32,
    start_pos: u32,
    p: &RopeParams,
) {
    rope_store_scaled(rec, target, norms, None, tokens, start_pos, p);
}

/// `rope_store` with the model's `RopeScaling`, where it has one.
pub fn rope_store_scaled(
    rec: &mut Recorder,
    target: &StoreTarget,
    norms: Option<&HeadNorms>,
    scaling: Option<&RopeScaling>,
    tokens: u32,
    start_pos: u32,
    p: &RopeParams,
) {
    let cache = target.cache;
    assert!(
        start_pos + tokens <= cache.max_ctx,
        "rope_store: positions {start_pos}..{} past the cache's {}",
        start_pos + tokens,
        cache.max_ctx
    );
    record_rope_store(
        rec,
        target,
        norms,
        scaling,
        tokens,
        Place::From(start_pos),
        p,
    );
}

/// Whether `rope_store_rows` can run on this device: it binds one storage buffer more than
/// WebGPU's default limit of 8.
pub fn rope_store_rows_supported(gpu: &crate::gpu::Gpu) -> bool {
    gpu.caps.max_storage_bindings >= ROWS_STORAGE_BINDINGS
}

/// `rope_store_scaled` for a batched decode step's `rows` rows (q, k and v `[rows, ...]` from
/// the target's offsets) in one dispatch: row r goes to its own position in its own slot of the
/// target cache's pool, as the row table `table` says (`attention::row_table`, which checked
/// every position against its slot).
pub fn rope_store_rows(
    rec: &mut Recorder,
    target: &StoreTarget,
    norms: Option<&HeadNorms>,
    scaling: Option<&RopeScaling>,
    rows: u32,
    table: &wgpu::Buffer,
    p: &RopeParams,
) {
    record_rope_store(rec, target, norms, scaling, rows, Place::Rows(table), p);
}

/// Where a rope_store dispatch's tokens go: consecutive positions from one in the target's
/// cache, or each row where a row table says (the whole pool's layers bound).
enum Place<'a> {
    From(u32),
    Rows(&'a wgpu::Buffer),
}

/// The constants of every entry of `rope.wgsl`: `PAGED` matters to `rope_store_rows` alone.
fn rope_constants(packed: u32, paged: u32) -> [(&'static str, u32); 4] {
    [
        ("WG", WG),
        ("PACKED", packed),
        ("PAGED", paged),
        ("PAGE", PAGE_TOKENS),
    ]
}

fn record_rope_store(
    rec: &mut Recorder,
    target: &StoreTarget,
    norms: Option<&HeadNorms>,
    scaling: Option<&RopeScaling>,
    tokens: u32,
    place: Place,
    p: &RopeParams,
) {
    p.check();
    let cache = target.cache;
    assert_eq!(
        cache.kv_heads, target.kv_heads,
        "rope_store: kv heads of the cache"
    );
    assert_eq!(
        cache.head_dim, p.head_dim,
        "rope_store: head_dim of the cache"
    );
    if tokens == 0 {
        return;
    }
    let (q, k, v) = (target.q.buffer, target.k.buffer, target.v.buffer);
    let packed = k == q && v == q;
    assert!(
        packed || (k != q && v != q && k != v),
        "rope_store: q, k and v are all sections of one buffer or three buffers"
    );
    let (start_pos, table) = match place {
        Place::From(start) => (start, None),
        Place::Rows(table) => (0, Some(table)),
    };
    let paged = u32::from(cache.pages().is_some());
    let kernel = match (table.is_some(), paged) {
        (true, _) => &ROPE_STORE_ROWS,
        (false, 1) => &ROPE_STORE_PAGES,
        (false, _) => &ROPE_STORE,
    };
    assert!(
        paged == 0 || rope_store_rows_supported(rec.gpu()),
        "rope_store on a seat of a paged pool needs a ninth storage binding"
    );
    let pipeline = rec.pipeline(kernel, &rope_constants(u32::from(packed), paged));
    let placeholder = rec.gpu().placeholder();
    let (k, v) = if packed {
        (placeholder, placeholder)
    } else {
        (k, v)
    };
    let (scaled, mscale, factors) = scaling_fields(scaling, placeholder);
    let params = RopeUniform {
        tokens,
        heads: target.heads,
        head_dim: p.head_dim,
        rope_dims: p.rope_dims,
        start_pos,
        neox: u32::from(p.neox),
        theta_scale: p.theta_scale(),
        freq_scale: p.freq_scale,
        groups_x: 0,
        kv_heads: target.kv_heads,
        norm: u32::from(norms.is_some()),
        eps: norms.map_or(0.0, |n| n.eps),
        cache_offset: start_pos * target.kv_heads * p.head_dim,
        q_offset: target.q.offset,
        k_offset: target.k.offset,
        v_offset: target.v.offset,
        scaled,
        mscale,
        pad: [0; 2],
    };
    let (k_cache, v_cache) = match table {
        Some(_) => (
            cache.pooled_k_layer(target.cache_layer),
            cache.pooled_v_layer(target.cache_layer),
        ),
        None => (
            cache.k_layer(target.cache_layer),
            cache.v_layer(target.cache_layer),
        ),
    };
    let rows = target.heads + 2 * target.kv_heads;
    rec.dispatch(
        &pipeline,
        &params,
        &[
            q.as_entire_binding(),
            factors.as_entire_binding(),
            k.as_entire_binding(),
            v.as_entire_binding(),
            k_cache,
            v_cache,
            norms.map_or(placeholder, |n| n.q).as_entire_binding(),
            norms.map_or(placeholder, |n| n.k).as_entire_binding(),
        ]
        .into_iter()
        .chain(table.map_or_else(|| cache.page_binding(), |t| Some(t.as_entire_binding())))
        .collect::<Vec<_>>(),
        [rows, tokens, 1],
    );
}

/// ggml's rope in f32: theta accumulated by repeated multiplication, cos/sin of f32 angles.
pub fn rope_reference(x: &mut [f32], tokens: u32, heads: u32, start_pos: u32, p: &RopeParams) {
    rope_reference_scaled(x, tokens, heads, start_pos, p, None, 1.0);
}

/// `rope_reference` with ggml's freq_factors (one per pair; theta · (1 / factor) before the
/// linear scale, as the kernels compute ggml's theta / factor: see `RopeScaling`) and
/// attn_factor (`mscale`, multiplying cos and sin).
pub fn rope_reference_scaled(
    x: &mut [f32],
    tokens: u32,
    heads: u32,
    start_pos: u32,
    p: &RopeParams,
    factors: Option<&[f32]>,
    mscale: f32,
) {
    p.check();
    let head_dim = p.head_dim as usize;
    let pairs = (p.rope_dims / 2) as usize;
    if let Some(factors) = factors {
        assert_eq!(factors.len(), pairs, "rope: one frequency factor per pair");
    }
    let angles = Angles {
        theta_scale: p.theta_scale(),
        freq_scale: p.freq_scale,
        factors,
        mscale,
    };
    for token in 0..tokens as usize {
        let rotations = angles.pair_rotations(start_pos + token as u32, pairs);
        let row = &mut x[token * heads as usize * head_dim..][..heads as usize * head_dim];
        for head in row.chunks_mut(head_dim) {
            for (pair, &(cos, sin)) in rotations.iter().enumerate() {
                let (a, b) = if p.neox {
                    (pair, pair + pairs)
                } else {
                    (2 * pair, 2 * pair + 1)
                };
                let (x0, x1) = (head[a], head[b]);
                head[a] = x0 * cos - x1 * sin;
                head[b] = x0 * sin + x1 * cos;
            }
        }
    }
}

/// How the reference turns pairs at a position.
struct Angles<'a> {
    theta_scale: f32,
    freq_scale: f32,
    factors: Option<&'a [f32]>,
    mscale: f32,
}

impl Angles<'_> {
    /// (cos, sin) of each pair at `position`, in ggml's order of f32 operations.
    fn pair_rotations(&self, position: u32, pairs: usize) -> Vec<(f32, f32)> {
        let mut theta = position as f32;
        (0..pairs)
            .map(|pair| {
                let inverse = self.factors.map_or(1.0, |f| 1.0 / f[pair]);
                let angle = self.freq_scale * (theta * inverse);
                theta *= self.theta_scale;
                (angle.cos() * self.mscale, angle.sin() * self.mscale)
            })
            .collect()
    }
}
