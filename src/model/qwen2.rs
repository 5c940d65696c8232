//! Qwen2: the llama block with biases on the q, k and v projections, NeoX-style RoPE and an
//! untied output head. The weights loader picks up the biases and the head from the file, and
//! `config` sets NeoX RoPE for every architecture but llama, so the forward is llama's.

pub use super::llama::forward_layer;
