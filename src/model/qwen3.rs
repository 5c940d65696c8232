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
use super::block::{feed_forward, qk_normed_attention, FeedForwardOut};
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
    qk_normed_attention(rec, step);
    feed_forward(rec, step, Activation::Silu, FeedForwardOut::Residual);
}
