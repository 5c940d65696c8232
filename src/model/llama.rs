//! The llama block (SmolLM2, Llama 2/3) and, with q/k/v biases, Qwen2's.
//!
//! ```text
//! x += Wo · attention(rope(Wq·n + bq), rope(Wk·n + bk), Wv·n + bv)    n = rms_norm(x)
//! x += Wdown · (silu(Wgate·n) ⊙ Wup·n)                                 n = rms_norm(x)
//! ```

use crate::gpu::Recorder;
use crate::ops::elementwise::Activation;

use super::arch::{common_keys_only, unscaled_embedding, Architecture, BlockTensors, RopeLayout};
use super::block::{
    feed_forward, project_into_residual, qkv_projections, rotate_and_attend, FeedForwardOut,
};
use super::LayerStep;

/// Adjacent-pair RoPE; q/k/v biases where the file has them (llama.cpp reads them too).
pub const LLAMA: Architecture = Architecture {
    name: "llama",
    rope_layout: RopeLayout::Adjacent,
    configure: common_keys_only,
    embed_scale: unscaled_embedding,
    block_tensors: BlockTensors {
        qkv_bias: true,
        qk_norm: false,
        post_norms: false,
    },
    forward_layer,
};

pub fn forward_layer(rec: &mut Recorder, step: &LayerStep) {
    let LayerStep {
        cfg,
        weights: w,
        scratch: s,
        ..
    } = *step;
    qkv_projections(rec, step);
    rotate_and_attend(rec, step, &cfg.rope, None, None);
    project_into_residual(rec, step, &w.attention().wo, &s.attn);
    feed_forward(rec, step, Activation::Silu, FeedForwardOut::Residual);
}
