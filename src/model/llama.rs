//! The llama block (SmolLM2, Llama 2/3) and, with q/k/v biases, Qwen2's.
//!
//! ```text
//! x += Wo · attention(rope(Wq·n + bq), rope(Wk·n + bk), Wv·n + bv)    n = rms_norm(x)
//! x += Wdown · (silu(Wgate·n) ⊙ Wup·n)                                 n = rms_norm(x)
//! ```
//!
//! Decode (one token) fuses each norm into the products that read it, the bias and the gate
//! activation into the products' epilogues, and the residual add into the output products.

use crate::gpu::Recorder;
use crate::ops::attention::{self, AttentionParams};
use crate::ops::elementwise::{self, Activation};
use crate::ops::quant::{Epilogue, Fusion};
use crate::ops::{norm, quant, rope};

use super::loader::{Matrix, Vector};
use super::LayerStep;

pub fn forward_layer(rec: &mut Recorder, step: &LayerStep) {
    let LayerStep {
        cfg,
        weights: w,
        scratch: s,
        tokens,
        ..
    } = *step;
    normed_projections(
        rec,
        step,
        &w.attn_norm,
        &[
            (&w.wq, w.bq.as_ref(), &s.q),
            (&w.wk, w.bk.as_ref(), &s.k),
            (&w.wv, w.bv.as_ref(), &s.v),
        ],
    );
    rope::rope(rec, &s.q, tokens, cfg.n_heads, step.start_pos, &cfg.rope);
    rope::rope(rec, &s.k, tokens, cfg.n_kv_heads, step.start_pos, &cfg.rope);
    attend(rec, step, None);
    project_into_residual(rec, step, &w.wo, &s.attn);
    feed_forward(rec, step, Activation::Silu, FeedForwardOut::Residual);
}

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
fn project_into_residual(rec: &mut Recorder, step: &LayerStep, matrix: &Matrix, input: &wgpu::Buffer) {
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

/// Writes this step's k and v into the cache and attends from q, leaving the result in `attn`.
pub(super) fn attend(rec: &mut Recorder, step: &LayerStep, window: Option<u32>) {
    let (cfg, s) = (step.cfg, step.scratch);
    attention::kv_write(
        rec,
        step.cache,
        step.cache_layer,
        &s.k,
        &s.v,
        step.start_pos,
        step.tokens,
    );
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
        step.tokens,
        &params,
    );
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
