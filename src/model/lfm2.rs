//! LFM2 (Liquid AI): a hybrid of gated short-convolution blocks and grouped-query attention
//! blocks with per-head q/k norms, in the layer pattern `lfm2.attention.head_count_kv` states
//! (0 KV heads marks a convolution block); every block then runs the SwiGLU feed-forward.
//! Facts from llama.cpp's `src/models/lfm2.cpp`.
//!
//! ```text
//! convolution:  [B, C, x'] = Win · rms_norm(x)      x += Wout · (C ⊙ conv_L(B ⊙ x'))
//! attention:    x += Wo · attention(rope(norm_q(Wq·n)), rope(norm_k(Wk·n)), Wv·n)
//! both:         x += Wdown · (silu(Wgate·n) ⊙ Wup·n)                    n = rms_norm(x)
//! ```
//!
//! `conv_L` is causal and depthwise over the last L positions (`ops::short_conv`), its state
//! kept per sequence beside the KV cache. The final norm is `token_embd_norm.weight`.

use crate::gguf::Metadata;
use crate::gpu::Recorder;
use crate::ops::elementwise::Activation;
use crate::ops::quant::Fusion;
use crate::ops::short_conv::{self, ShortConvCall, MAX_KERNEL_LEN};
use crate::ops::{norm, quant};

use super::arch::{unscaled_embedding, Architecture, BlockTensors, RopeLayout};
use super::block::{feed_forward, project_into_residual, qk_normed_attention, FeedForwardOut};
use super::config::{ConfigError, ModelConfig, ShortConvLayout};
use super::LayerStep;

pub const LFM2: Architecture = Architecture {
    name: "lfm2",
    rope_layout: RopeLayout::Neox,
    configure,
    embed_scale: unscaled_embedding,
    block_tensors: BlockTensors {
        qkv_bias: false,
        qk_norm: true,
        post_norms: false,
    },
    forward_layer,
};

const KV_HEADS_KEY: &str = "lfm2.attention.head_count_kv";
const KERNEL_KEY: &str = "lfm2.shortconv.l_cache";

/// The layer pattern from the per-layer KV head counts, and the convolution's length.
fn configure(meta: &Metadata, mut cfg: ModelConfig) -> Result<ModelConfig, ConfigError> {
    let invalid = |key: &str, message: String| ConfigError::Invalid {
        key: key.into(),
        message,
    };
    if meta.get(KV_HEADS_KEY).and_then(|v| v.as_array()).is_none() {
        let message = "must list the KV heads of every layer (0 for a convolution block)";
        return Err(invalid(KV_HEADS_KEY, message.into()));
    }
    let kv_heads = meta.get_u32_array(KV_HEADS_KEY)?;
    if kv_heads.len() != cfg.n_layers as usize {
        let message = format!("{} entries for {} layers", kv_heads.len(), cfg.n_layers);
        return Err(invalid(KV_HEADS_KEY, message));
    }
    if let Some(other) = kv_heads.iter().find(|&&h| h != 0 && h != cfg.n_kv_heads) {
        let message = format!(
            "attention blocks with {other} and {} KV heads",
            cfg.n_kv_heads
        );
        return Err(invalid(KV_HEADS_KEY, message));
    }
    let kernel_len = meta.get_u32(KERNEL_KEY)?;
    if !(2..=MAX_KERNEL_LEN).contains(&kernel_len) {
        let message = format!("{kernel_len} taps (2..={MAX_KERNEL_LEN})");
        return Err(invalid(KERNEL_KEY, message));
    }
    cfg.short_conv = Some(ShortConvLayout {
        kernel_len,
        conv: kv_heads.iter().map(|&heads| heads == 0).collect(),
    });
    cfg.output_norm = "token_embd_norm.weight";
    Ok(cfg)
}

fn forward_layer(rec: &mut Recorder, step: &LayerStep) {
    match &step.cfg.short_conv {
        Some(layout) if layout.is_conv(step.layer) => short_conv_block(rec, step, layout),
        _ => qk_normed_attention(rec, step),
    }
    feed_forward(rec, step, Activation::Silu, FeedForwardOut::Residual);
}

/// `x += Wout · (C ⊙ conv(B ⊙ x'))`: in_proj into `mixer` (the norm fused for one token),
/// the convolution into `normed` (free once in_proj has read it), out_proj into the stream.
fn short_conv_block(rec: &mut Recorder, step: &LayerStep, layout: &ShortConvLayout) {
    let (cfg, w, s, tokens) = (step.cfg, step.weights, step.scratch, step.tokens);
    let conv = w
        .short_conv
        .as_ref()
        .expect("a convolution block's weights hold its convolution");
    let d = cfg.d_model;
    if tokens == 1 {
        let fusion = Fusion {
            norm: Some((&w.attn_norm.buffer, cfg.rms_eps)),
            ..Fusion::default()
        };
        quant::matvec(rec, &conv.in_proj.view(), &s.hidden, &s.mixer, &fusion);
    } else {
        let norm_weight = &w.attn_norm.buffer;
        norm::rms_norm(
            rec,
            &s.hidden,
            norm_weight,
            &s.normed,
            tokens,
            d,
            cfg.rms_eps,
        );
        quant::matmul(rec, &conv.in_proj.view(), &s.normed, &s.mixer, tokens);
    }
    let state = step
        .cache
        .short_conv
        .as_ref()
        .expect("the stage's cache holds the convolution state of a model with such blocks");
    // The state holds the stage's convolution blocks in order, from its first layer on.
    let stage_start = step.layer - step.cache_layer;
    let slot = layout.count(stage_start..step.layer) as usize;
    let call = ShortConvCall {
        bcx: &s.mixer,
        weight: &conv.conv.buffer,
        history: &state.layers[slot],
        tokens,
        channels: d,
        kernel_len: layout.kernel_len,
        start_pos: step.start_pos,
    };
    short_conv::short_conv(rec, &call, &s.normed);
    project_into_residual(rec, step, &conv.out_proj, &s.normed);
}
