//! Qwen3: the llama block without q/k/v biases, with a per-head RMSNorm of q and of k before
//! NeoX-style RoPE (llama.cpp's `qwen3.cpp`). The head is tied (0.6B–4B) or the file's own
//! `output.weight` (8B); the weights loader takes whichever the file has.
//!
//! ```text
//! x += Wo · attention(rope(norm_q(Wq·n)), rope(norm_k(Wk·n)), Wv·n)    n = rms_norm(x)
//! x += Wdown · (silu(Wgate·n) ⊙ Wup·n)                                 n = rms_norm(x)
//! ```

use crate::gpu::Recorder;
use crate::ops::elementwise::Activation;

use super::arch::{common_keys_only, unscaled_embedding, Architecture, BlockTensors, RopeLayout};
use super::block::{
    feed_forward, project_into_residual, qkv_projections, rotate_and_attend, FeedForwardOut,
    QkNorms,
};
use super::LayerStep;

pub const QWEN3: Architecture = Architecture {
    name: "qwen3",
    rope_layout: RopeLayout::Neox,
    configure: common_keys_only,
    embed_scale: unscaled_embedding,
    block_tensors: BlockTensors {
        qkv_bias: false,
        qk_norm: true,
        post_norms: false,
    },
    forward_layer,
};

fn forward_layer(rec: &mut Recorder, step: &LayerStep) {
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
    feed_forward(rec, step, Activation::Silu, FeedForwardOut::Residual);
}
