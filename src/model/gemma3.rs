//! The Gemma 3 block.
//!
//! Differs from llama in: the embedding scaled by sqrt(d_model); per-head RMSNorm on q and k;
//! RMSNorm on the attention and feed-forward outputs before they join the residual stream;
//! GELU (tanh) gating; sliding-window attention on local layers (every sixth layer is global)
//! with RoPE base 10 000 there and the file's base on global layers.

use crate::gguf::Metadata;
use crate::gpu::Recorder;
use crate::ops::elementwise::{self, Activation};
use crate::ops::rope::RopeParams;
use crate::ops::{norm, quant, rope};

use super::config::{ConfigError, ModelConfig, SlidingWindow};
use super::llama::{attend, feed_forward, normed_projections, FeedForwardOut};
use super::loader::Vector;
use super::LayerStep;

/// Every sixth layer attends globally (llama.cpp's gemma3 swa pattern).
const GLOBAL_LAYER_PERIOD: u32 = 6;
/// RoPE base of the sliding-window layers, fixed by the architecture rather than the file.
const LOCAL_ROPE_BASE: f32 = 10_000.0;

/// Adds what only Gemma 3's metadata says: the sliding window and the local layers' RoPE.
pub fn configure(meta: &Metadata, mut cfg: ModelConfig) -> Result<ModelConfig, ConfigError> {
    let window = meta.get_u32("gemma3.attention.sliding_window")?;
    cfg.sliding_window = Some(SlidingWindow {
        window,
        period: GLOBAL_LAYER_PERIOD,
    });
    cfg.rope_local = Some(RopeParams {
        freq_base: LOCAL_ROPE_BASE,
        freq_scale: 1.0,
        ..cfg.rope
    });
    Ok(cfg)
}

pub fn forward_layer(rec: &mut Recorder, step: &LayerStep) {
    let LayerStep {
        cfg,
        weights: w,
        scratch: s,
        tokens,
        layer,
        ..
    } = *step;
    let local = cfg.is_local_layer(layer);
    let rope_params = match (local, &cfg.rope_local) {
        (true, Some(local_rope)) => local_rope,
        _ => &cfg.rope,
    };
    normed_projections(
        rec,
        step,
        &w.attn_norm,
        &[(&w.wq, None, &s.q), (&w.wk, None, &s.k), (&w.wv, None, &s.v)],
    );
    head_norm(
        rec,
        &s.q,
        w.q_norm.as_ref(),
        &s.attn,
        tokens * cfg.n_heads,
        step,
    );
    head_norm(
        rec,
        &s.k,
        w.k_norm.as_ref(),
        &s.attn,
        tokens * cfg.n_kv_heads,
        step,
    );
    rope::rope(rec, &s.q, tokens, cfg.n_heads, step.start_pos, rope_params);
    rope::rope(
        rec,
        &s.k,
        tokens,
        cfg.n_kv_heads,
        step.start_pos,
        rope_params,
    );
    let window = cfg.sliding_window.filter(|_| local).map(|sw| sw.window);
    attend(rec, step, window);
    quant::matmul(rec, &w.wo.view(), &s.attn, &s.normed, tokens);
    post_norm(rec, w.post_attn_norm.as_ref(), &s.normed, &s.delta, step);
    feed_forward(rec, step, Activation::GeluTanh, FeedForwardOut::Delta);
    post_norm(rec, w.post_ffn_norm.as_ref(), &s.delta, &s.normed, step);
}

/// RMSNorm of each head's vector in `x` (rows of head_dim), through `tmp`, back into `x`.
fn head_norm(
    rec: &mut Recorder,
    x: &wgpu::Buffer,
    weight: Option<&Vector>,
    tmp: &wgpu::Buffer,
    rows: u32,
    step: &LayerStep,
) {
    let Some(weight) = weight else { return };
    let (head_dim, eps) = (step.cfg.head_dim, step.cfg.rms_eps);
    norm::rms_norm(rec, x, &weight.buffer, tmp, rows, head_dim, eps);
    rec.copy(tmp, 0, x, 0, u64::from(rows * head_dim) * 4);
}

/// `hidden += rms_norm(output)`, normed through `tmp`, with the block's post-norm weight.
fn post_norm(
    rec: &mut Recorder,
    weight: Option<&Vector>,
    output: &wgpu::Buffer,
    tmp: &wgpu::Buffer,
    step: &LayerStep,
) {
    let (cfg, s, tokens) = (step.cfg, step.scratch, step.tokens);
    let n = tokens * cfg.d_model;
    match weight {
        Some(weight) => {
            norm::rms_norm(
                rec,
                output,
                &weight.buffer,
                tmp,
                tokens,
                cfg.d_model,
                cfg.rms_eps,
            );
            elementwise::add_in_place(rec, &s.hidden, tmp, n);
        }
        None => elementwise::add_in_place(rec, &s.hidden, output, n),
    }
}
