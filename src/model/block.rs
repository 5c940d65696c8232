//! The pieces every architecture's block is built from. Each has one path for prefill (many
//! tokens: tiled products, separate norms and adds) and a fused one for decode (one token):
//! norms folded into the products that read them; bias, gate activation and residual add
//! folded into the products' epilogues; rope, per-head norms and the cache write in one
//! dispatch. Decode is bound by dispatch count, so every dispatch spared is time saved.

use crate::gpu::Recorder;
use crate::ops::attention::{self, AttentionParams};
use crate::ops::elementwise::{self, Activation};
use crate::ops::quant::{Epilogue, Fusion};
use crate::ops::rope::{HeadNorms, RopeParams, StoreTarget};
use crate::ops::{norm, quant, rope};

use super::loader::{Matrix, Vector};
use super::LayerStep;

/// `out = W · rms_norm(hidden) (+ bias)` for each (W, bias, out). One token fuses the norm
/// (and bias) into each product; more normalise once into `normed` for the tiled products.
pub(super) fn normed_projections(
    rec: &mut Recorder,
    step: &LayerStep,
    norm_weight: &Vector,
    projections: &[(&Matrix, Option<&Vector>, &wgpu::Buffer)],
) {
    let (cfg, s, tokens) = (step.cfg, step.scratch, step.tokens);
    if tokens == 1 {
        for &(matrix, bias, out) in projections {
            let fusion = Fusion {
                norm: Some((&norm_weight.buffer, cfg.rms_eps)),
                epilogue: bias.map_or(Epilogue::Store, |b| Epilogue::Bias(&b.buffer)),
            };
            quant::matvec(rec, &matrix.view(), &s.hidden, out, &fusion);
        }
        return;
    }
    norm::rms_norm(
        rec,
        &s.hidden,
        &norm_weight.buffer,
        &s.normed,
        tokens,
        cfg.d_model,
        cfg.rms_eps,
    );
    for &(matrix, bias, out) in projections {
        quant::matmul(rec, &matrix.view(), &s.normed, out, tokens);
        if let Some(bias) = bias {
            elementwise::add_bias(rec, out, &bias.buffer, tokens, bias.len);
        }
    }
}

/// `hidden += W · input`: accumulated by the product itself for one token.
pub(super) fn project_into_residual(
    rec: &mut Recorder,
    step: &LayerStep,
    matrix: &Matrix,
    input: &wgpu::Buffer,
) {
    let (s, tokens) = (step.scratch, step.tokens);
    if tokens == 1 {
        let fusion = Fusion {
            norm: None,
            epilogue: Epilogue::Accumulate,
        };
        quant::matvec(rec, &matrix.view(), input, &s.hidden, &fusion);
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
/// attends from q, leaving the result in `attn`. One token does everything before the
/// attention in a single dispatch.
pub(super) fn rotate_and_attend(
    rec: &mut Recorder,
    step: &LayerStep,
    rope_params: &RopeParams,
    norms: Option<QkNorms>,
    window: Option<u32>,
) {
    let (cfg, s, tokens) = (step.cfg, step.scratch, step.tokens);
    if tokens == 1 {
        let target = StoreTarget {
            q: &s.q,
            k: &s.k,
            v: &s.v,
            cache: step.cache,
            cache_layer: step.cache_layer,
            heads: cfg.n_heads,
            kv_heads: cfg.n_kv_heads,
        };
        let head_norms = norms.as_ref().map(|n| HeadNorms {
            q: &n.q.buffer,
            k: &n.k.buffer,
            eps: cfg.rms_eps,
        });
        rope::rope_store(
            rec,
            &target,
            head_norms.as_ref(),
            1,
            step.start_pos,
            rope_params,
        );
    } else {
        if let Some(norms) = &norms {
            head_norm(rec, &s.q, norms.q, tokens * cfg.n_heads, step);
            head_norm(rec, &s.k, norms.k, tokens * cfg.n_kv_heads, step);
        }
        rope::rope(rec, &s.q, tokens, cfg.n_heads, step.start_pos, rope_params);
        rope::rope(
            rec,
            &s.k,
            tokens,
            cfg.n_kv_heads,
            step.start_pos,
            rope_params,
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
    let params = AttentionParams {
        heads: cfg.n_heads,
        kv_heads: cfg.n_kv_heads,
        head_dim: cfg.head_dim,
        scale: cfg.attention_scale,
        window,
        softcap: None,
    };
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

/// The gated MLP over `rms_norm(hidden)` with the block's ffn norm. One token fuses the norm
/// into the gate and up products and the activation into the up product.
pub(super) fn feed_forward(
    rec: &mut Recorder,
    step: &LayerStep,
    activation: Activation,
    out: FeedForwardOut,
) {
    let (cfg, w, s, tokens) = (step.cfg, step.weights, step.scratch, step.tokens);
    if tokens == 1 {
        let norm = Some((&w.ffn_norm.buffer, cfg.rms_eps));
        let gate = Fusion {
            norm,
            epilogue: Epilogue::Store,
        };
        quant::matvec(rec, &w.w_gate.view(), &s.hidden, &s.gate, &gate);
        let up = Fusion {
            norm,
            epilogue: Epilogue::Gated(&s.gate, activation),
        };
        quant::matvec(rec, &w.w_up.view(), &s.hidden, &s.act, &up);
        let (target, epilogue) = match out {
            FeedForwardOut::Residual => (&s.hidden, Epilogue::Accumulate),
            FeedForwardOut::Delta => (&s.delta, Epilogue::Store),
        };
        let down = Fusion {
            norm: None,
            epilogue,
        };
        quant::matvec(rec, &w.w_down.view(), &s.act, target, &down);
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
