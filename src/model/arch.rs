//! What an architecture is to the engine: one descriptor per `model/<arch>.rs`, listed in
//! `model::ARCHITECTURES`. Everything that differs between architectures is a field here, so
//! the shared code (config, weights, stage) never names one.

use std::fmt;

use crate::gguf::Metadata;
use crate::gpu::Recorder;

use super::config::{ConfigError, ModelConfig};
use super::LayerStep;

/// One architecture: how its metadata and tensors are read and how one block runs.
pub struct Architecture {
    /// `general.architecture` in the file, and the prefix of its metadata keys
    /// (`<name>.block_count`, ...), which `ModelConfig::from_header` reads for every one.
    pub(crate) name: &'static str,
    pub(crate) rope_layout: RopeLayout,
    /// Adds what only this architecture's metadata says to the common configuration.
    pub(crate) configure: fn(&Metadata, ModelConfig) -> Result<ModelConfig, ConfigError>,
    /// The factor every embedding row is multiplied by.
    pub(crate) embed_scale: fn(&ModelConfig) -> f32,
    /// The optional tensors of a block it reads, beyond those every block has.
    pub(crate) block_tensors: BlockTensors,
    /// The forward of one block over the residual stream.
    pub(crate) forward_layer: fn(&mut Recorder, &LayerStep),
}

impl Architecture {
    /// `general.architecture` as the file spells it.
    pub fn name(&self) -> &'static str {
        self.name
    }
}

impl fmt::Debug for Architecture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name)
    }
}

/// Which dimensions of a head RoPE rotates together (llama.cpp's rope type of the arch).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeLayout {
    /// Neighbours (2i, 2i + 1): llama.cpp's `LLAMA_ROPE_TYPE_NORM`.
    Adjacent,
    /// Halves (i, i + rope_dims / 2): `LLAMA_ROPE_TYPE_NEOX`.
    Neox,
}

/// The optional tensor groups of a block an architecture reads where the file holds them.
/// Each group is one kind of weight a building block of `block.rs` knows how to use.
#[derive(Debug, Clone, Copy, Default)]
pub struct BlockTensors {
    /// `attn_{q,k,v}.bias` (Qwen2).
    pub qkv_bias: bool,
    /// `attn_q_norm`, `attn_k_norm`: per-head RMSNorm of q and k before RoPE (Gemma 3).
    pub qk_norm: bool,
    /// `post_attention_norm`, `post_ffw_norm`: RMSNorm of each sublayer's output (Gemma 3).
    pub post_norms: bool,
}

/// `configure` for architectures whose metadata holds nothing beyond the common keys.
pub(crate) fn common_keys_only(
    _meta: &Metadata,
    cfg: ModelConfig,
) -> Result<ModelConfig, ConfigError> {
    Ok(cfg)
}

/// `embed_scale` for architectures that use the embedding rows as they are.
pub(crate) fn unscaled_embedding(_cfg: &ModelConfig) -> f32 {
    1.0
}
