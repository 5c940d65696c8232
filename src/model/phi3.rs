//! Phi-3 (Phi-3.5-mini, Phi-4-mini): the llama block with NeoX RoPE, read from fused tensors:
//! q, k and v in one `attn_qkv`, gate and up in one `ffn_up` (the weights loader splits both by
//! rows), and long/short RoPE factors with a cos/sin magnitude (`rope.scaling.attn_factor`)
//! where the file has them (the stage loads the factors its context calls for). llama.cpp
//! turns Phi-3's sliding window off, and so does this: every layer attends globally.

use super::arch::{common_keys_only, unscaled_embedding, Architecture, BlockTensors, RopeLayout};
use super::llama::forward_layer;

pub const PHI3: Architecture = Architecture {
    name: "phi3",
    rope_layout: RopeLayout::Neox,
    configure: common_keys_only,
    embed_scale: unscaled_embedding,
    block_tensors: BlockTensors {
        qkv_bias: false,
        qk_norm: false,
        post_norms: false,
    },
    forward_layer,
};
