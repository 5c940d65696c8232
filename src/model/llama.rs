//! The llama block (SmolLM2, Llama 2/3) and, with q/k/v biases, Qwen2's.
//!
//! ```text
//! x += Wo · attention(rope(Wq·n + bq), rope(Wk·n + bk), Wv·n + bv)    n = rms_norm(x)
//! x += Wdown · (silu(Wgate·n) ⊙ Wup·n)                                 n = rms_norm(x)
//! ```

use crate::gpu::Recorder;
use crate::ops::attention::{self, AttentionParams};
use crate::ops::elementwise::{self, Activation};
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
    norm::rms_norm(
        rec,
        &s.hidden,
        &w.attn_norm.buffer,
        &s.normed,
        tokens,
        cfg.d_model,
        cfg.rms_eps,
    );
    project(rec, &w.wq, w.bq.as_ref(), &s.normed, &s.q, tokens);
    project(rec, &w.wk, w.bk.as_ref(), &s.normed, &s.k, tokens);
    project(rec, &w.wv, w.bv.as_ref(), &s.normed, &s.v, tokens);
    rope::rope(rec, &s.q, tokens, cfg.n_heads, step.start_pos, &cfg.rope);
    rope::rope(rec, &s.k, tokens, cfg.n_kv_heads, step.start_pos, &cfg.rope);
    attend(rec, step, None);
    quant::matmul(rec, &w.wo.view(), &s.attn, &s.delta, tokens);
    elementwise::add_in_place(rec, &s.hidden, &s.delta, tokens * cfg.d_model);
    norm::rms_norm(
        rec,
        &s.hidden,
        &w.ffn_norm.buffer,
        &s.normed,
        tokens,
        cfg.d_model,
        cfg.rms_eps,
    );
    feed_forward(rec, step, Activation::Silu);
    elementwise::add_in_place(rec, &s.hidden, &s.delta, tokens * cfg.d_model);
}

/// `out = W·x (+ bias)` for every token.
pub(super) fn project(
    rec: &mut Recorder,
    matrix: &Matrix,
    bias: Option<&Vector>,
    x: &wgpu::Buffer,
    out: &wgpu::Buffer,
    tokens: u32,
) {
    quant::matmul(rec, &matrix.view(), x, out, tokens);
    if let Some(bias) = bias {
        elementwise::add_bias(rec, out, &bias.buffer, tokens, bias.len);
    }
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

/// The gated MLP from `normed` into `delta`.
pub(super) fn feed_forward(rec: &mut Recorder, step: &LayerStep, activation: Activation) {
    let (w, s, tokens) = (step.weights, step.scratch, step.tokens);
    quant::matmul(rec, &w.w_gate.view(), &s.normed, &s.gate, tokens);
    quant::matmul(rec, &w.w_up.view(), &s.normed, &s.up, tokens);
    elementwise::gated_activation(
        rec,
        &s.gate,
        &s.up,
        &s.act,
        tokens * step.cfg.ff_dim,
        activation,
    );
    quant::matmul(rec, &w.w_down.view(), &s.act, &s.delta, tokens);
}
