//! A block's attention: rope (after per-head norms, where the model has them), the KV cache
//! write and attention, for a prompt, one token, or a batched step's rows, each by the fewest
//! dispatches the device allows.

use crate::gpu::Recorder;
use crate::ops::attention::{self, AttentionCall, AttentionParams, KvCache};
use crate::ops::rope::{HeadNorms, RopeParams, Section, StoreTarget};
use crate::ops::{norm, rope};

use crate::model::batch::StepRows;
use crate::model::loader::Vector;
use crate::model::LayerStep;

/// Per-head norms of q and k (Gemma 3) with their weights.
pub(in crate::model) struct QkNorms<'a> {
    pub q: &'a Vector,
    pub k: &'a Vector,
}

/// Rotates q and k (after their per-head norms, if any), writes k and v into the cache and
/// attends from q, leaving the result in `attn`. One token does all of it in the attention
/// dispatch where the GPU kernels run, else everything before the attention in one dispatch.
pub(in crate::model) fn rotate_and_attend(
    rec: &mut Recorder,
    step: &LayerStep,
    rope_params: &RopeParams,
    norms: Option<QkNorms>,
    window: Option<u32>,
) {
    let (cfg, s, tokens) = (step.cfg, step.scratch, step.tokens);
    let params = AttentionParams {
        heads: cfg.n_heads,
        kv_heads: cfg.n_kv_heads,
        head_dim: cfg.head_dim,
        scale: cfg.attention_scale,
        window,
        softcap: None,
    };
    if let Some(rows) = step.rows {
        let rows = Rows {
            rows,
            rope: rope_params,
            norms: norms.as_ref(),
            params: &params,
        };
        rows.attend(rec, step);
        return;
    }
    let one = OneToken {
        cache: step.cache,
        position: step.start_pos,
        rope: rope_params,
        norms: norms.as_ref(),
        params: &params,
    };
    if tokens == 1 && one.fused(rec, step) {
        return;
    }
    // A seat of a paged pool that the fused kernel cannot serve takes the prompt path for one
    // token too (it and the rows kernels read pages).
    if tokens > 1 || step.cache.pages().is_some() {
        let q = rotate_prompt(rec, step, rope_params, norms);
        let call = AttentionCall {
            q,
            cache: step.cache,
            layer: step.cache_layer,
            out: &s.attn,
            start_pos: step.start_pos,
            tokens,
        };
        attention::attention(rec, &call, &params);
        return;
    }
    let target = one.target(step);
    let head_norms = head_norms(one.norms, step);
    let scaling = step.rope_scaling.as_ref();
    let start = step.start_pos;
    rope::rope_store_scaled(
        rec,
        &target,
        head_norms.as_ref(),
        scaling,
        1,
        start,
        rope_params,
    );
    let call = AttentionCall {
        q: &s.qkv,
        cache: step.cache,
        layer: step.cache_layer,
        out: &s.attn,
        start_pos: start,
        tokens: 1,
    };
    attention::attention(rec, &call, &params);
}

/// One token's attention at `position` of `cache`, its q, k and v packed in the step's `qkv`.
struct OneToken<'a> {
    cache: &'a KvCache,
    position: u32,
    rope: &'a RopeParams,
    norms: Option<&'a QkNorms<'a>>,
    params: &'a AttentionParams,
}

impl OneToken<'_> {
    fn target<'s>(&'s self, step: &'s LayerStep) -> StoreTarget<'s> {
        let heads = step.cfg.n_heads;
        StoreTarget::packed(&step.scratch.qkv, heads, self.cache, step.cache_layer)
    }

    /// Norms, rope, the cache write and attention in one dispatch where the fused kernel runs
    /// (it has no binding left for frequency factors: scaled RoPE takes `rope_store`); whether
    /// it ran.
    fn fused(&self, rec: &mut Recorder, step: &LayerStep) -> bool {
        let runs = step.rope_scaling.is_none()
            && attention::rope_attention_supported(rec.gpu(), self.params, self.cache.is_paged());
        if runs {
            let (target, norms) = (self.target(step), head_norms(self.norms, step));
            let out = &step.scratch.attn;
            let (position, rope, params) = (self.position, self.rope, self.params);
            attention::rope_attention_decode(
                rec,
                &target,
                norms.as_ref(),
                position,
                rope,
                params,
                out,
            );
        }
        runs
    }
}

/// The per-head norms' weights as the rope kernels take them.
fn head_norms<'a>(norms: Option<&'a QkNorms>, step: &LayerStep) -> Option<HeadNorms<'a>> {
    norms.map(|n| HeadNorms {
        q: &n.q.buffer,
        k: &n.k.buffer,
        eps: step.cfg.rms_eps,
    })
}

/// A batched decode step's attention (`model::batch`): q, k and v of row `i` (from the tiled
/// products, in `q`, `k` and `v`) are normalised, rotated and stored at row `i`'s position in
/// its own cache, and row `i` attends over that cache alone.
struct Rows<'a> {
    rows: &'a StepRows<'a>,
    rope: &'a RopeParams,
    norms: Option<&'a QkNorms<'a>>,
    params: &'a AttentionParams,
}

impl Rows<'_> {
    /// All of it in one dispatch where the fused rows kernel runs (`fused`), else the rope and
    /// cache writes in one and the attention in another where their caches are one pool's
    /// (`rope_store_rows` and `attention_decode_rows`, reading the row table the step wrote:
    /// `StepRows::table`), else row by row. A paged seat alone in its step takes the fused
    /// one-token kernel.
    fn attend(&self, rec: &mut Recorder, step: &LayerStep) {
        let (rows, params) = (self.rows.rows, self.params);
        if let [row] = rows {
            let one = OneToken {
                cache: row.cache,
                position: row.position,
                rope: self.rope,
                norms: self.norms,
                params,
            };
            if one.fused(rec, step) {
                return;
            }
        }
        if self.fused(rec, step) {
            return;
        }
        let head_norms = head_norms(self.norms, step);
        let scaling = step.rope_scaling.as_ref();
        let (layer, cache) = (step.cache_layer, rows[0].cache);
        let gpu = rec.gpu();
        let table = self.rows.table;
        let store_table = table.filter(|_| rope::rope_store_rows_supported(gpu));
        let attend_table = table.filter(|_| attention::decode_rows_supported(gpu, params));
        // The kernels row by row read `q`, `k` and `v` (`qkv` holds the rows they take one by
        // one).
        let one_dispatch = store_table.is_some() && attend_table.is_some();
        if !one_dispatch {
            unpack_sections(rec, step);
        }
        let target = step_target(step, cache, one_dispatch && step.qkv_in_sections);
        if let Some(row_table) = store_table {
            let (count, norms) = (rows.len() as u32, head_norms.as_ref());
            rope::rope_store_rows(rec, &target, norms, scaling, count, row_table, self.rope);
        } else {
            store_rows_one_by_one(rec, step, rows, self.rope, head_norms.as_ref());
        }
        if let Some(row_table) = attend_table {
            let table = attention::DecodeRows {
                cache,
                table: row_table,
                positions: &self.rows.positions,
            };
            let (q, out) = (target.q.buffer, &step.scratch.attn);
            attention::attention_decode_rows(rec, q, &table, layer, out, params);
            return;
        }
        attend_rows_one_by_one(rec, step, rows, params);
    }

    /// Norms, rope, the cache writes and attention of every row in one dispatch where the fused
    /// rows kernel runs: the rows' table written, their q/k/v in `qkv`'s sections, no frequency
    /// factors (as `OneToken::fused`), and rows of distinct sequences (a seat's few tokens are
    /// rows of one: each must see the keys the others write); whether it ran.
    fn fused(&self, rec: &mut Recorder, step: &LayerStep) -> bool {
        let cache = self.rows.rows[0].cache;
        let Some(table) = self.rows.table else {
            return false;
        };
        let runs = step.rope_scaling.is_none()
            && self.rows.distinct_sequences
            && step.qkv_in_sections
            && attention::rope_attention_rows_supported(rec.gpu(), self.params, cache.is_paged());
        if runs {
            let decode_rows = attention::DecodeRows {
                cache,
                table,
                positions: &self.rows.positions,
            };
            let target = step_target(step, cache, true);
            let norms = head_norms(self.norms, step);
            let (rope, params, out) = (self.rope, self.params, &step.scratch.attn);
            attention::rope_attention_decode_rows(
                rec,
                &target,
                norms.as_ref(),
                &decode_rows,
                rope,
                params,
                out,
            );
        }
        runs
    }
}

/// Each row's rope and cache write in turn, into its own cache (rows not of one pool, or a
/// device without the storage bindings `rope_store_rows` needs).
fn store_rows_one_by_one(
    rec: &mut Recorder,
    step: &LayerStep,
    rows: &[crate::model::batch::BatchRow],
    rope_params: &RopeParams,
    head_norms: Option<&HeadNorms>,
) {
    let (cfg, s) = (step.cfg, step.scratch);
    let scaling = step.rope_scaling.as_ref();
    for (index, row) in rows.iter().enumerate() {
        let index = index as u32;
        let target = StoreTarget {
            q: Section {
                buffer: &s.q,
                offset: index * cfg.q_dim(),
            },
            k: Section {
                buffer: &s.k,
                offset: index * cfg.kv_dim(),
            },
            v: Section {
                buffer: &s.v,
                offset: index * cfg.kv_dim(),
            },
            cache: row.cache,
            cache_layer: step.cache_layer,
            heads: cfg.n_heads,
            kv_heads: cfg.n_kv_heads,
        };
        rope::rope_store_scaled(
            rec,
            &target,
            head_norms,
            scaling,
            1,
            row.position,
            rope_params,
        );
    }
}

/// Each row's attention over its own cache in turn. The attention kernels read their query
/// from row 0 and write row 0, so each row's q goes through `qkv` and its result through
/// `gate` (both free until the MLP) on its way into `attn`.
fn attend_rows_one_by_one(
    rec: &mut Recorder,
    step: &LayerStep,
    rows: &[crate::model::batch::BatchRow],
    params: &AttentionParams,
) {
    let s = step.scratch;
    let q_bytes = u64::from(step.cfg.q_dim()) * 4;
    for (index, row) in rows.iter().enumerate() {
        let offset = index as u64 * q_bytes;
        rec.copy(&s.q, offset, &s.qkv, 0, q_bytes);
        let call = AttentionCall {
            q: &s.qkv,
            cache: row.cache,
            layer: step.cache_layer,
            out: &s.gate,
            start_pos: row.position,
            tokens: 1,
        };
        attention::attention(rec, &call, params);
        rec.copy(&s.gate, 0, &s.attn, offset, q_bytes);
    }
}

/// The step's q, k and v for `cache`: in `qkv`'s sections, or in `q`, `k` and `v`.
fn step_target<'a>(step: &LayerStep<'a>, cache: &'a KvCache, sections: bool) -> StoreTarget<'a> {
    let (cfg, s) = (step.cfg, step.scratch);
    if sections {
        return StoreTarget::sections(&s.qkv, step.tokens, cfg.n_heads, cache, step.cache_layer);
    }
    StoreTarget {
        q: Section::from(&s.q),
        k: Section::from(&s.k),
        v: Section::from(&s.v),
        cache,
        cache_layer: step.cache_layer,
        heads: cfg.n_heads,
        kv_heads: cfg.n_kv_heads,
    }
}

/// Copies the step's q, k and v from `qkv`'s sections (where its products put them) into `q`,
/// `k` and `v`, for the kernels that read them there (the separate rope and cache write on a
/// paged seat, the rows one by one); nothing where they are there already.
fn unpack_sections(rec: &mut Recorder, step: &LayerStep) {
    if !step.qkv_in_sections {
        return;
    }
    let (cfg, s, tokens) = (step.cfg, step.scratch, step.tokens);
    let q_bytes = u64::from(tokens * cfg.q_dim()) * 4;
    let kv_bytes = u64::from(tokens * cfg.kv_dim()) * 4;
    rec.copy(&s.qkv, 0, &s.q, 0, q_bytes);
    rec.copy(&s.qkv, q_bytes, &s.k, 0, kv_bytes);
    rec.copy(&s.qkv, q_bytes + kv_bytes, &s.v, 0, kv_bytes);
}

/// A prompt's q/k epilogue: per-head norms, rope, and the cache write of k and v; returns the
/// buffer its rotated q is in (from row 0). One `rope_store` dispatch does all of it, through
/// the pages on a seat of a paged pool where the device has a ninth storage binding; else the
/// separate kernels. Three dispatches a layer (seven with per-head norms) were a third of a
/// few-token step's, which a speculative verification waits on (docs/perf.md, session 36),
/// and of the HTTP API's prompt chunks before session 37.
fn rotate_prompt<'a>(
    rec: &mut Recorder,
    step: &LayerStep<'a>,
    rope_params: &RopeParams,
    norms: Option<QkNorms>,
) -> &'a wgpu::Buffer {
    let (cfg, s, tokens) = (step.cfg, step.scratch, step.tokens);
    let scaling = step.rope_scaling.as_ref();
    let start = step.start_pos;
    if step.cache.pages().is_none() || rope::rope_store_rows_supported(rec.gpu()) {
        let target = step_target(step, step.cache, step.qkv_in_sections);
        let head_norms = head_norms(norms.as_ref(), step);
        let (norms, params) = (head_norms.as_ref(), rope_params);
        rope::rope_store_scaled(rec, &target, norms, scaling, tokens, start, params);
        return target.q.buffer;
    }
    unpack_sections(rec, step);
    if let Some(norms) = &norms {
        head_norm(rec, &s.q, norms.q, tokens * cfg.n_heads, step);
        head_norm(rec, &s.k, norms.k, tokens * cfg.n_kv_heads, step);
    }
    rope::rope_scaled(rec, &s.q, tokens, cfg.n_heads, start, rope_params, scaling);
    rope::rope_scaled(
        rec,
        &s.k,
        tokens,
        cfg.n_kv_heads,
        start,
        rope_params,
        scaling,
    );
    attention::kv_write(
        rec,
        step.cache,
        step.cache_layer,
        &s.k,
        &s.v,
        step.start_pos,
        tokens,
    );
    &s.q
}

/// RMSNorm of each head's vector in `x` (rows of head_dim), through `attn`, back into `x`.
fn head_norm(rec: &mut Recorder, x: &wgpu::Buffer, weight: &Vector, rows: u32, step: &LayerStep) {
    let (head_dim, eps, tmp) = (step.cfg.head_dim, step.cfg.rms_eps, &step.scratch.attn);
    norm::rms_norm(rec, x, &weight.buffer, tmp, rows, head_dim, eps);
    rec.copy(tmp, 0, x, 0, u64::from(rows * head_dim) * 4);
}
