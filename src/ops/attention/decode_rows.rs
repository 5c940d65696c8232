//! Decode attention of a batched step in one dispatch (`wgsl/attention_decode_rows.wgsl`
//! around `attention_decode_core.wgsl`): row `r` of `q` is one sequence's query at its own
//! position, over its own slot of a KV pool (`KvCache::pooled`), whose whole layer is bound
//! once. A row table on the GPU gives each row's position and slot region. Without it a step
//! of R rows took R attention calls per layer (plus the copies in and out of row 0).
//!
//! The kernel is the GPU decode kernel's, on every adapter: it bounds the keys per workgroup,
//! so it also stays within llvmpipe's loop limits, and one dispatch over R rows beats R
//! dispatches of the CPU adapters' kernel there too.

use super::{combine, first_visible, partials, AttentionParams, KernelParams};
use crate::gpu::{Kernel, Lib, Recorder};
use crate::ops::attention::decode_gpu::{self, MAX_KEYS_PER_SPLIT};
use crate::ops::attention::{attention_reference, KvCache, PAGE_TOKENS};

const DECODE_ROWS: Kernel = Kernel {
    name: "attention_decode_rows",
    source: concat!(
        include_str!("../../../wgsl/attention_decode_rows.wgsl"),
        include_str!("../../../wgsl/attention_rows_table.wgsl"),
        include_str!("../../../wgsl/attention_decode_core.wgsl")
    ),
    entry: "main",
    libs: &[Lib::Reduce, Lib::AttentionParams, Lib::AttentionMask],
};

/// The rows of one batched step as the kernel reads them: one cache of the pool (any slot:
/// they share the bindings), the GPU row table (`row_table`'s words; for seats of a paged
/// pool, the pool's page table with those words in front) and the positions.
pub struct DecodeRows<'a> {
    pub cache: &'a KvCache,
    pub table: &'a wgpu::Buffer,
    pub positions: &'a [u32],
}

/// The row table's words, (position, `KvCache::row_region`) per row, for rows at `positions`
/// in `caches` (slots of one pool, or seats of one paged pool, whose page table then holds
/// these words in front of the seats' entries);
/// an error that says which row when a cache is not in the first one's pool or a position is
/// outside its cache.
pub fn row_table(caches: &[&KvCache], positions: &[u32]) -> Result<Vec<u32>, String> {
    if caches.is_empty() || caches.len() != positions.len() {
        return Err(format!(
            "{} caches for {} positions (one each, at least one)",
            caches.len(),
            positions.len()
        ));
    }
    let mut words = Vec::with_capacity(2 * caches.len());
    for (row, (cache, &position)) in caches.iter().zip(positions).enumerate() {
        if !cache.same_pool(caches[0]) {
            return Err(format!("row {row}'s cache is not in row 0's pool"));
        }
        if position >= cache.max_ctx {
            return Err(format!(
                "row {row} at position {position} beyond its cache's {} positions",
                cache.max_ctx
            ));
        }
        words.extend([position, cache.row_region()]);
    }
    Ok(words)
}

/// Whether the rows kernel runs this shape on this device (with room for a paged cache's
/// key rows).
pub fn decode_rows_supported(gpu: &crate::gpu::Gpu, p: &AttentionParams) -> bool {
    decode_gpu::supported_with(gpu, p, MAX_KEYS_PER_SPLIT * 4)
}

/// out[r, h*hd..] = softmax(q_r·K_r^T * scale, causal (+window)) V_r over keys 0..=position_r
/// of row r's slot in `layer`. `q` and `out` are [rows, heads * head_dim] f32; every row's
/// cache must already hold its keys and values up to its position.
///
/// Panics when shapes disagree or the table is shorter than the rows: the model code builds
/// both from `row_table`.
pub fn attention_decode_rows(
    rec: &mut Recorder,
    q: &wgpu::Buffer,
    rows: &DecodeRows,
    layer: u32,
    out: &wgpu::Buffer,
    p: &AttentionParams,
) {
    let count = rows.positions.len() as u32;
    if count == 0 {
        return;
    }
    check_rows(rows, layer, q, out, p);
    assert!(
        decode_rows_supported(rec.gpu(), p),
        "batched decode attention cannot hold head_dim {}",
        p.head_dim
    );
    let splits = row_splits(rec.gpu(), rows, p);
    let pipeline = rec.pipeline(&DECODE_ROWS, &rows_constants(p, rows.cache));
    let call = RowsCall {
        rows,
        layer,
        q,
        out,
        params: KernelParams::new(p, 0, count, splits),
    };
    call.dispatch(rec, &pipeline, p, bytemuck::bytes_of(&call.params), &[]);
}

/// The constants of a rows kernel: the decode kernels' for `p.head_dim`, then the row table's
/// (`attention_rows_table.wgsl`): whether the pool is paged, its page size, and the key rows a
/// workgroup looks up (a paged pool's).
pub(super) fn rows_constants(p: &AttentionParams, cache: &KvCache) -> Vec<(&'static str, u32)> {
    let paged = cache.paged_constant();
    let held = if paged == 1 { MAX_KEYS_PER_SPLIT } else { 1 };
    let table = [("PAGED", paged), ("PAGE", PAGE_TOKENS), ("ROWS_HELD", held)];
    decode_gpu::constants(p.head_dim)
        .into_iter()
        .chain(table)
        .collect()
}

/// One dispatch of a rows kernel (`attention_decode_rows`, or the fused one of `decode_rope`)
/// over grid (split, head, row), its splits merged after it.
pub(super) struct RowsCall<'a> {
    pub rows: &'a DecodeRows<'a>,
    pub layer: u32,
    /// The queries (or the step's q/k/v, for the fused kernel).
    pub q: &'a wgpu::Buffer,
    pub out: &'a wgpu::Buffer,
    /// The rows' attention parameters: `tokens` rows, `splits` key splits.
    pub params: KernelParams,
}

impl RowsCall<'_> {
    /// Binds `q`, the pool's `layer`, `out`, the partials, then `extra` and the row table, with
    /// `uniform` (which begins with `params`) at binding 0.
    pub(super) fn dispatch(
        &self,
        rec: &mut Recorder,
        pipeline: &wgpu::ComputePipeline,
        p: &AttentionParams,
        uniform: &[u8],
        extra: &[wgpu::BindingResource<'_>],
    ) {
        let (count, splits) = (self.params.tokens, self.params.splits);
        let partial_rows = if splits > 1 { count } else { 1 };
        let (acc, stats) = partials(rec, self.rows.cache, partial_rows, p, splits);
        let mut bindings = vec![
            self.q.as_entire_binding(),
            self.rows.cache.pooled_k_layer(self.layer),
            self.rows.cache.pooled_v_layer(self.layer),
            self.out.as_entire_binding(),
            acc.as_entire_binding(),
            stats.as_entire_binding(),
        ];
        bindings.extend(extra.iter().cloned());
        bindings.push(self.rows.table.as_entire_binding());
        rec.dispatch_bytes(pipeline, uniform, &bindings, [splits, p.heads, count]);
        if splits > 1 {
            combine(rec, &self.params, p.head_dim, &acc, &stats, self.out);
        }
    }
}

/// Key splits for a batched step's rows: as many as its row with the most visible keys needs.
pub(super) fn row_splits(gpu: &crate::gpu::Gpu, rows: &DecodeRows, p: &AttentionParams) -> u32 {
    let visible = rows
        .positions
        .iter()
        .map(|&pos| pos - first_visible(pos, p.window) + 1)
        .max()
        .unwrap_or(1);
    decode_gpu::splits(gpu, p, rows.positions.len() as u32, visible)
}

pub(super) fn check_rows(
    rows: &DecodeRows,
    layer: u32,
    q: &wgpu::Buffer,
    out: &wgpu::Buffer,
    p: &AttentionParams,
) {
    let cache = rows.cache;
    p.check_cache(cache, layer);
    let count = rows.positions.len() as u64;
    assert!(
        rows.positions.iter().all(|&pos| pos < cache.max_ctx) && rows.table.size() >= count * 8,
        "batched attention rows beyond the cache or the row table"
    );
    p.check_buffers(q, out, count);
}

/// One row of the CPU reference: the sequence's keys and values ([pos][kv_head][head_dim],
/// at least position + 1 of them) and its position.
pub struct ReferenceRow<'a> {
    pub k: &'a [f32],
    pub v: &'a [f32],
    pub position: u32,
}

/// `attention_decode_rows` on the CPU: each row of `q` through `attention_reference` over
/// its own keys and values.
pub fn attention_rows_reference(q: &[f32], rows: &[ReferenceRow], p: &AttentionParams) -> Vec<f32> {
    let width = (p.heads * p.head_dim) as usize;
    rows.iter()
        .enumerate()
        .flat_map(|(r, row)| {
            let query = &q[r * width..(r + 1) * width];
            attention_reference(query, row.k, row.v, row.position, 1, p)
        })
        .collect()
}
