//! Model architectures: one file per architecture, each declaring its `Architecture` (how its
//! metadata and tensors are read, and the forward of one block) and listed in `ARCHITECTURES`;
//! `Stage` runs a range of blocks on one device, with the embedding and head where it holds them.

pub mod arch;
pub mod batch;
pub mod bert;
mod block;
pub mod config;
pub mod decode;
pub mod fit;
pub mod gemma3;
mod graphs;
pub mod lfm2;
pub mod llama;
pub mod loader;
mod masked;
pub mod open;
pub mod phi3;
pub mod qwen2;
pub mod qwen3;
mod scratch;
pub mod stage;
pub mod weights;

pub use arch::Architecture;
pub use config::{ConfigError, ModelConfig};
pub use decode::GreedyDecoder;
pub use loader::{LoadOptions, LoadProgress};
pub use open::{OpenModel, TensorPlan};
pub use stage::{Stage, StageInput, StageSpec};

use crate::gguf::{GgmlType, GgufError, Header, SourceError};
use crate::gpu::GpuError;
use crate::ops::attention::KvCache;

/// Every architecture the engine computes. Adding one is its file, its `mod` line above and
/// its entry here (docs/ARCHITECTURE.md, "Adding an architecture").
pub const ARCHITECTURES: &[&Architecture] = &[
    &llama::LLAMA,
    &qwen2::QWEN2,
    &gemma3::GEMMA3,
    &qwen3::QWEN3,
    &lfm2::LFM2,
    &phi3::PHI3,
];

/// The architecture `general.architecture` names, if the engine computes it.
pub fn architecture(name: &str) -> Option<&'static Architecture> {
    ARCHITECTURES.iter().copied().find(|arch| arch.name == name)
}

/// The names of `ARCHITECTURES`, for messages: "llama, qwen2, gemma3".
pub fn supported_architectures() -> String {
    let names: Vec<&str> = ARCHITECTURES.iter().map(|arch| arch.name).collect();
    names.join(", ")
}

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error(transparent)]
    Source(#[from] SourceError),
    #[error(transparent)]
    Gpu(#[from] GpuError),
    #[error("tensor {tensor}: {message}")]
    Tensor { tensor: String, message: String },
    #[error("context full: {needed} positions needed, the cache holds {max}")]
    ContextFull { needed: u32, max: u32 },
    #[error("{0}")]
    Plan(String),
}

impl ModelError {
    pub(crate) fn unsupported(tensor: &str, ggml_type: GgmlType) -> ModelError {
        ModelError::Tensor {
            tensor: tensor.into(),
            message: format!(
                "type {} cannot be computed by this engine yet",
                ggml_type.name()
            ),
        }
    }
}

/// The configuration of the model in `header`, with its architecture's own additions.
pub fn config_for(header: &Header) -> Result<ModelConfig, ModelError> {
    Ok(ModelConfig::from_header(header)?)
}

/// Everything one block's forward needs.
#[derive(Clone, Copy)]
pub struct LayerStep<'a> {
    pub cfg: &'a ModelConfig,
    pub weights: &'a weights::LayerWeights,
    scratch: &'a scratch::Scratch,
    pub cache: &'a KvCache,
    /// The block's index inside this stage's cache.
    pub cache_layer: u32,
    /// The block's index in the model.
    pub layer: u32,
    pub start_pos: u32,
    pub tokens: u32,
    /// `Some`: the tokens are one decode step of as many sequences, row `i` at its own
    /// position in its own cache (`batch`); `cache` and `start_pos` are then unused.
    pub rows: Option<&'a batch::StepRows<'a>>,
    /// Whether the step's q, k and v are in sections of the scratch's `qkv` (one token's always
    /// are; a few tokens' where `block::qkv_in_sections` says so), else in `q`, `k` and `v`:
    /// decided once, where the step is made (`Stage::layer_step`), for the products that write
    /// them and the attention that reads them.
    pub qkv_in_sections: bool,
    /// The model's RoPE frequency factors and magnitude, where it has them (Llama 3, Phi-3).
    pub rope_scaling: Option<crate::ops::rope::RopeScaling<'a>>,
    /// The blocks before and after this one in this stage, if any: a block may leave work to
    /// the next one's products (Gemma 3's post-norm, see `block::Stream`).
    pub previous: Option<&'a weights::LayerWeights>,
    pub next: Option<&'a weights::LayerWeights>,
}
