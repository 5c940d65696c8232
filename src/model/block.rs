//! The pieces every architecture's block is built from. Each has one path for prefill (many
//! tokens: tiled products, separate norms and adds) and a fused one for decode (one token, or
//! a few: a batched step's rows, a speculative draft; each its own product): norms folded into the
//! products that read them; bias, gate activation and residual add folded into the products'
//! epilogues; rope, per-head norms and the cache write in one dispatch. Decode is bound by
//! dispatch count, so every dispatch spared is time saved.

use crate::gpu::Recorder;
use crate::ops::attention::{self, AttentionParams, KvCache};
use crate::ops::elementwise::{self, Activation};
use crate::ops::quant::{Epilogue, Fusion, QuantMatrix, Residual};
use crate::ops::rope::{HeadNorms, RopeParams, Section, StoreTarget};
use crate::ops::{norm, quant, rope};

use super::loader::{Matrix, Vector};
use super::weights::LayerWeights;
use super::LayerStep;

/// Where a block's products read the residual stream: `base` as it is (`hidden`, usually), or,
/// for one token, with a post-norm folded in (`fold`: the products read `base + rms_norm(delta)
/// · weight` and write it into `fold.out`), which spares Gemma 3 the post-norms' own
/// dispatches, two a layer (see `quant::Residual`).
#[derive(Clone, Copy)]
pub(super) struct Stream<'a> {
    pub base: &'a wgpu::Buffer,
    pub fold: Option<Residual<'a>>,
}

impl<'a> Stream<'a> {
    pub fn hidden(step: &LayerStep<'a>) -> Stream<'a> {
        Stream {
            base: &step.scratch.hidden,
            fold: None,
        }
    }

    /// Plain streams are `hidden` itself: only one token's fused products take a fold.
    fn check(&self, step: &LayerStep) {
        assert!(
            self.fold.is_none() || step.tokens == 1,
            "a folded residual stream is for one token's products"
        );
    }
}

/// Whether one token's products can fold `upper`'s feed-forward post-norm into `lower`'s q/k/v
/// products and `upper`'s attention post-norm into its own gate and up products (`Stream`):
/// the device stages every one of those products' rows. One answer for both blocks of a pair,
/// so that the block leaving a norm behind and the one taking it up agree.
pub(super) fn post_norms_fold(rec: &Recorder, upper: &LayerWeights, lower: &LayerWeights) -> bool {
    let a = lower.attention();
    let qkv = runs(&[&a.wq, &a.wk, &a.wv])
        .iter()
        .all(|run| quant::residual_fold_supported(rec, run, &Epilogue::Store));
    let (gate, up) = (upper.w_gate.view(), upper.w_up.view());
    let glu = match quant::shares_part(&gate, &up) {
        true => {
            let epilogue = Epilogue::Glu(up, Activation::GeluTanh);
            quant::residual_fold_supported(rec, &gate, &epilogue)
        }
        false => [gate, up]
            .iter()
            .all(|m| quant::residual_fold_supported(rec, m, &Epilogue::Store)),
    };
    qkv && glu
}

/// Whether the step's products take the fused matrix-vector path: one token, or as many as
/// the device multiplies one product per token (a batched step's rows, a speculative step's
/// draft, a short prompt), whose unfused path would add a norm and an add or bias per product.
fn fused(rec: &Recorder, step: &LayerStep) -> bool {
    step.tokens == 1 || quant::per_token_products(rec.gpu(), step.tokens)
}

/// q, k and v = W · rms_norm(hidden) (+ bias), with the block's attention norm. One token
/// computes them one after another into `qkv`, a single product for each run of them sharing
/// a tensor, with the norm and bias fused; a batched step's rows likewise into `q`, `k` and
/// `v` (where its attention reads them); more normalise once into `normed` for the tiled
/// products into `q`, `k` and `v`.
pub(super) fn qkv_projections(rec: &mut Recorder, step: &LayerStep) {
    qkv_projections_from(rec, step, Stream::hidden(step));
}

/// `qkv_projections` reading the residual stream from `stream`.
pub(super) fn qkv_projections_from(rec: &mut Recorder, step: &LayerStep, stream: Stream) {
    let (cfg, w, s, tokens) = (step.cfg, step.weights, step.scratch, step.tokens);
    stream.check(step);
    if tokens > 1 && fused(rec, step) {
        for (matrix, bias, out) in separate_projections(step) {
            let fusion = Fusion {
                norm: Some((&w.attn_norm.buffer, cfg.rms_eps)),
                epilogue: bias
                    .as_ref()
                    .map_or(Epilogue::Store, |b| Epilogue::Bias(&b.buffer)),
                ..Fusion::default()
            };
            quant::matvec_tokens(rec, &matrix.view(), &s.hidden, out, &fusion, tokens);
        }
        return;
    }
    if tokens == 1 {
        let epilogue = w
            .qkv_bias
            .as_ref()
            .map_or(Epilogue::Store, |b| Epilogue::Bias(&b.buffer));
        let mut out_offset = 0;
        let a = w.attention();
        for run in runs(&[&a.wq, &a.wk, &a.wv]) {
            let fusion = Fusion {
                residual: stream.fold,
                norm: Some((&w.attn_norm.buffer, cfg.rms_eps)),
                epilogue,
                out_offset,
            };
            quant::matvec(rec, &run, stream.base, &s.qkv, &fusion);
            out_offset += run.rows;
        }
        return;
    }
    norm::rms_norm(
        rec,
        &s.hidden,
        &w.attn_norm.buffer,
        &s.normed,
        tokens,
        cfg.d_model,
        cfg.rms_eps,
    );
    for (matrix, bias, out) in separate_projections(step) {
        quant::matmul(rec, &matrix.view(), &s.normed, out, tokens);
        if let Some(bias) = bias {
            elementwise::add_bias(rec, out, &bias.buffer, tokens, bias.len);
        }
    }
}

/// q, k and v each as its own product: matrix, bias if any, and the buffer it goes to.
fn separate_projections<'a>(
    step: &LayerStep<'a>,
) -> [(&'a Matrix, &'a Option<Vector>, &'a wgpu::Buffer); 3] {
    let (w, s) = (step.weights, step.scratch);
    let a = w.attention();
    [
        (&a.wq, &w.bq, &s.q),
        (&a.wk, &w.bk, &s.k),
        (&a.wv, &w.bv, &s.v),
    ]
}

/// The matrices as few products as their tensors allow: each run of neighbours whose rows
/// follow one another in one tensor as a single matrix.
fn runs<'a>(matrices: &[&'a Matrix]) -> Vec<QuantMatrix<'a>> {
    let mut runs: Vec<QuantMatrix<'a>> = Vec::new();
    for (i, matrix) in matrices.iter().enumerate() {
        match runs.last_mut() {
            Some(run) if i > 0 && matrices[i - 1].followed_by(matrix) => run.rows += matrix.rows,
            _ => runs.push(matrix.view()),
        }
    }
    runs
}

/// `hidden += W · input`: accumulated by the product itself for one token.
pub(super) fn project_into_residual(
    rec: &mut Recorder,
    step: &LayerStep,
    matrix: &Matrix,
    input: &wgpu::Buffer,
) {
    let (s, tokens) = (step.scratch, step.tokens);
    if fused(rec, step) {
        let fusion = Fusion {
            epilogue: Epilogue::Accumulate,
            ..Fusion::default()
        };
        quant::matvec_tokens(rec, &matrix.view(), input, &s.hidden, &fusion, tokens);
        return;
    }
    quant::matmul(rec, &matrix.view(), input, &s.delta, tokens);
    elementwise::add_in_place(rec, &s.hidden, &s.delta, tokens * step.cfg.d_model);
}

/// Per-head norms of q and k (Gemma 3) with their weights.
pub(super) struct QkNorms<'a> {
    pub q: &'a Vector,
    pub k: &'a Vector,
}

/// Rotates q and k (after their per-head norms, if any), writes k and v into the cache and
/// attends from q, leaving the result in `attn`. One token does all of it in the attention
/// dispatch where the GPU kernels run, else everything before the attention in one dispatch.
pub(super) fn rotate_and_attend(
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
        attend_rows(rec, step, rows, rope_params, norms.as_ref(), &params);
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
    // token too (it and the rows kernels read pages), its q, k and v moved out of `qkv` first.
    if tokens > 1 || step.cache.pages().is_some() {
        if tokens == 1 {
            unpack_qkv(rec, step);
        }
        rotate_prompt(rec, step, rope_params, norms);
        attention::attention(
            rec,
            &s.q,
            step.cache,
            step.cache_layer,
            &s.attn,
            step.start_pos,
            tokens,
            &params,
        );
        return;
    }
    let target = one.target(step);
    let head_norms = one.head_norms(step);
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
    attention::attention(
        rec,
        &s.qkv,
        step.cache,
        step.cache_layer,
        &s.attn,
        start,
        1,
        &params,
    );
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
        let (cfg, qkv) = (step.cfg, &step.scratch.qkv);
        let section = |offset| Section {
            buffer: qkv,
            offset,
        };
        StoreTarget {
            q: section(0),
            k: section(cfg.q_dim()),
            v: section(cfg.q_dim() + cfg.kv_dim()),
            cache: self.cache,
            cache_layer: step.cache_layer,
            heads: cfg.n_heads,
            kv_heads: cfg.n_kv_heads,
        }
    }

    fn head_norms(&self, step: &LayerStep) -> Option<HeadNorms<'_>> {
        self.norms.map(|n| HeadNorms {
            q: &n.q.buffer,
            k: &n.k.buffer,
            eps: step.cfg.rms_eps,
        })
    }

    /// Norms, rope, the cache write and attention in one dispatch where the fused kernel runs
    /// (it has no binding left for frequency factors: scaled RoPE takes `rope_store`); whether
    /// it ran.
    fn fused(&self, rec: &mut Recorder, step: &LayerStep) -> bool {
        let runs = step.rope_scaling.is_none()
            && attention::rope_attention_supported(rec.gpu(), self.params);
        if runs {
            let (target, norms) = (self.target(step), self.head_norms(step));
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

/// A batched decode step's attention (`model::batch`): q, k and v of row `i` (from the tiled
/// products, in `q`, `k` and `v`) are normalised, rotated and stored at row `i`'s position in
/// its own cache, and row `i` attends over that cache alone: all rows in one dispatch where
/// their caches are one pool's (`attention_decode_rows`, reading the row table the step
/// wrote: `StepRows::table`), else row by row. A paged seat alone in its step takes the fused
/// one-token kernel.
fn attend_rows(
    rec: &mut Recorder,
    step: &LayerStep,
    step_rows: super::batch::StepRows,
    rope_params: &RopeParams,
    norms: Option<&QkNorms>,
    params: &AttentionParams,
) {
    let rows = step_rows.rows;
    // A paged pool's seat alone in its step: the one-token kernel, through its pages.
    if let [row] = rows {
        let one = OneToken {
            cache: row.cache,
            position: row.position,
            rope: rope_params,
            norms,
            params,
        };
        if one.fused(rec, step) {
            return;
        }
    }
    let (cfg, s) = (step.cfg, step.scratch);
    let head_norms = norms.map(|n| HeadNorms {
        q: &n.q.buffer,
        k: &n.k.buffer,
        eps: cfg.rms_eps,
    });
    let scaling = step.rope_scaling.as_ref();
    // One row (a paged pool's seat alone in its step) has its q, k and v packed in `qkv`, as
    // every one-token step does.
    let (q, k, v) = match rows.len() {
        1 => (
            Section::from(&s.qkv),
            Section {
                buffer: &s.qkv,
                offset: cfg.q_dim(),
            },
            Section {
                buffer: &s.qkv,
                offset: cfg.q_dim() + cfg.kv_dim(),
            },
        ),
        _ => (
            Section::from(&s.q),
            Section::from(&s.k),
            Section::from(&s.v),
        ),
    };
    let table = step_rows.table;
    if let Some(row_table) = table.filter(|_| rope::rope_store_rows_supported(rec.gpu())) {
        let target = StoreTarget {
            q,
            k,
            v,
            cache: rows[0].cache,
            cache_layer: step.cache_layer,
            heads: cfg.n_heads,
            kv_heads: cfg.n_kv_heads,
        };
        let count = rows.len() as u32;
        let norms = head_norms.as_ref();
        rope::rope_store_rows(rec, &target, norms, scaling, count, row_table, rope_params);
    } else {
        store_rows_one_by_one(rec, step, rows, rope_params, head_norms.as_ref());
    }
    if let Some(row_table) = table.filter(|_| attention::decode_rows_supported(rec.gpu(), params)) {
        let positions: Vec<u32> = rows.iter().map(|row| row.position).collect();
        let table = attention::DecodeRows {
            cache: rows[0].cache,
            table: row_table,
            positions: &positions,
        };
        let layer = step.cache_layer;
        attention::attention_decode_rows(rec, q.buffer, &table, layer, &s.attn, params);
        return;
    }
    attend_rows_one_by_one(rec, step, rows, params);
}

/// Each row's rope and cache write in turn, into its own cache (rows not of one pool, or a
/// device without the storage bindings `rope_store_rows` needs).
fn store_rows_one_by_one(
    rec: &mut Recorder,
    step: &LayerStep,
    rows: &[super::batch::BatchRow],
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
    rows: &[super::batch::BatchRow],
    params: &AttentionParams,
) {
    let s = step.scratch;
    let q_bytes = u64::from(step.cfg.q_dim()) * 4;
    for (index, row) in rows.iter().enumerate() {
        let offset = index as u64 * q_bytes;
        rec.copy(&s.q, offset, &s.qkv, 0, q_bytes);
        let (cache, layer) = (row.cache, step.cache_layer);
        attention::attention(rec, &s.qkv, cache, layer, &s.gate, row.position, 1, params);
        rec.copy(&s.gate, 0, &s.attn, offset, q_bytes);
    }
}

/// Copies one token's q, k and v from `qkv` (where its products put them) into `q`, `k` and
/// `v` (where the prompt path reads them).
fn unpack_qkv(rec: &mut Recorder, step: &LayerStep) {
    let (cfg, s) = (step.cfg, step.scratch);
    let (q_bytes, kv_bytes) = (u64::from(cfg.q_dim()) * 4, u64::from(cfg.kv_dim()) * 4);
    rec.copy(&s.qkv, 0, &s.q, 0, q_bytes);
    rec.copy(&s.qkv, q_bytes, &s.k, 0, kv_bytes);
    rec.copy(&s.qkv, q_bytes + kv_bytes, &s.v, 0, kv_bytes);
}

/// A prompt's q/k epilogue: per-head norms, rope, and the cache write of k and v.
fn rotate_prompt(
    rec: &mut Recorder,
    step: &LayerStep,
    rope_params: &RopeParams,
    norms: Option<QkNorms>,
) {
    let (cfg, s, tokens) = (step.cfg, step.scratch, step.tokens);
    if let Some(norms) = &norms {
        head_norm(rec, &s.q, norms.q, tokens * cfg.n_heads, step);
        head_norm(rec, &s.k, norms.k, tokens * cfg.n_kv_heads, step);
    }
    let scaling = step.rope_scaling.as_ref();
    let start = step.start_pos;
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
}

/// RMSNorm of each head's vector in `x` (rows of head_dim), through `attn`, back into `x`.
fn head_norm(rec: &mut Recorder, x: &wgpu::Buffer, weight: &Vector, rows: u32, step: &LayerStep) {
    let (head_dim, eps, tmp) = (step.cfg.head_dim, step.cfg.rms_eps, &step.scratch.attn);
    norm::rms_norm(rec, x, &weight.buffer, tmp, rows, head_dim, eps);
    rec.copy(tmp, 0, x, 0, u64::from(rows * head_dim) * 4);
}

/// Where the MLP's output goes.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum FeedForwardOut {
    /// Added to the residual stream.
    Residual,
    /// Into `delta`, for a post-norm before it joins the stream.
    Delta,
}

/// The gated MLP over `rms_norm(hidden)` with the block's ffn norm. The fused path fuses the norm
/// into the gate and up products, and computes both with the activation in one product where
/// they share a tensor (else the activation goes into the up product).
pub(super) fn feed_forward(
    rec: &mut Recorder,
    step: &LayerStep,
    activation: Activation,
    out: FeedForwardOut,
) {
    feed_forward_from(rec, step, activation, out, Stream::hidden(step));
}

/// `feed_forward` reading the residual stream from `stream`.
pub(super) fn feed_forward_from(
    rec: &mut Recorder,
    step: &LayerStep,
    activation: Activation,
    out: FeedForwardOut,
    stream: Stream,
) {
    let (cfg, w, s, tokens) = (step.cfg, step.weights, step.scratch, step.tokens);
    stream.check(step);
    if fused(rec, step) {
        let norm = Some((&w.ffn_norm.buffer, cfg.rms_eps));
        let (gate, up) = (w.w_gate.view(), w.w_up.view());
        let x = stream.base;
        if quant::shares_part(&gate, &up) {
            let glu = Fusion {
                residual: stream.fold,
                norm,
                epilogue: Epilogue::Glu(up, activation),
                out_offset: 0,
            };
            quant::matvec_tokens(rec, &gate, x, &s.act, &glu, tokens);
        } else {
            let gate_fusion = Fusion {
                residual: stream.fold,
                norm,
                ..Fusion::default()
            };
            quant::matvec_tokens(rec, &gate, x, &s.gate, &gate_fusion, tokens);
            let up_fusion = Fusion {
                residual: stream.fold,
                norm,
                epilogue: Epilogue::Gated(&s.gate, activation),
                out_offset: 0,
            };
            quant::matvec_tokens(rec, &up, x, &s.act, &up_fusion, tokens);
        }
        let (target, epilogue) = match out {
            FeedForwardOut::Residual => (&s.hidden, Epilogue::Accumulate),
            FeedForwardOut::Delta => (&s.delta, Epilogue::Store),
        };
        let down = Fusion {
            epilogue,
            ..Fusion::default()
        };
        quant::matvec_tokens(rec, &w.w_down.view(), &s.act, target, &down, tokens);
        return;
    }
    norm::rms_norm(
        rec,
        &s.hidden,
        &w.ffn_norm.buffer,
        &s.normed,
        tokens,
        cfg.d_model,
        cfg.rms_eps,
    );
    quant::matmul(rec, &w.w_gate.view(), &s.normed, &s.gate, tokens);
    quant::matmul(rec, &w.w_up.view(), &s.normed, &s.up, tokens);
    elementwise::gated_activation(rec, &s.gate, &s.up, &s.act, tokens * cfg.ff_dim, activation);
    quant::matmul(rec, &w.w_down.view(), &s.act, &s.delta, tokens);
    if out == FeedForwardOut::Residual {
        elementwise::add_in_place(rec, &s.hidden, &s.delta, tokens * cfg.d_model);
    }
}

/// Attention with per-head q and k RMSNorms before rope where the layer has them (qwen3,
/// lfm2's attention blocks), into the residual.
pub(super) fn qk_normed_attention(rec: &mut Recorder, step: &LayerStep) {
    let LayerStep {
        cfg,
        weights: w,
        scratch: s,
        ..
    } = *step;
    qkv_projections(rec, step);
    let norms = match (&w.q_norm, &w.k_norm) {
        (Some(q), Some(k)) => Some(QkNorms { q, k }),
        _ => None,
    };
    rotate_and_attend(rec, step, &cfg.rope, norms, None);
    project_into_residual(rec, step, &w.attention().wo, &s.attn);
}
