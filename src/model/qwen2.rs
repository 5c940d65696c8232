//! Qwen2: the llama block with biases on the q, k and v projections, NeoX-style RoPE and an
//! untied output head (the weights loader takes the head from the file where it has one).

use super::arch::{common_keys_only, unscaled_embedding, Architecture, BlockTensors, RopeLayout};
use super::llama::forward_layer;

pub const QWEN2: Architecture = Architecture {
    name: "qwen2",
    rope_layout: RopeLayout::Neox,
    configure: common_keys_only,
    embed_scale: unscaled_embedding,
    block_tensors: BlockTensors {
        qkv_bias: true,
        qk_norm: false,
        post_norms: false,
    },
    forward_layer,
};
