//! Hyperparameters read from GGUF metadata alone.

use crate::gguf::{GgufError, Header, Metadata};
use crate::ops::rope::RopeParams;

use super::arch::{Architecture, RopeLayout};

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error(
        "architecture `{0}` is not supported (supported: {supported})",
        supported = super::supported_architectures()
    )]
    UnsupportedArch(String),
    #[error("metadata key {key}: {message}")]
    Invalid { key: String, message: String },
}

/// Everything a forward pass needs to know about the network's shape.
#[derive(Debug, Clone)]
pub struct ModelConfig {
    pub arch: &'static Architecture,
    pub n_layers: u32,
    pub d_model: u32,
    pub n_heads: u32,
    pub n_kv_heads: u32,
    pub head_dim: u32,
    pub ff_dim: u32,
    pub vocab: u32,
    pub context_length: u32,
    pub rms_eps: f32,
    pub rope: RopeParams,
    /// RoPE for sliding-window layers where it differs (Gemma 3's local layers).
    pub rope_local: Option<RopeParams>,
    /// Sliding window for local layers, with the period of global layers (Gemma 3: 6).
    pub sliding_window: Option<SlidingWindow>,
    pub attention_scale: f32,
    /// Which blocks are gated short convolutions instead of attention (LFM2), if any.
    pub short_conv: Option<ShortConvLayout>,
    /// The final norm's tensor (LFM2 names it `token_embd_norm.weight`).
    pub output_norm: &'static str,
    /// `rope.scaling.attn_factor`: the magnitude of RoPE's cos and sin (Phi-3 long context).
    pub rope_attn_factor: f32,
    /// `rope.scaling.original_context_length`: the context the model was trained for, past
    /// which Phi-3 takes its long rope factors (`weights::rope_factors_tensor`).
    pub rope_original_context: Option<u32>,
}

/// The layer pattern of a hybrid of short-convolution and attention blocks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShortConvLayout {
    /// Taps of the causal convolution (`shortconv.l_cache`).
    pub kernel_len: u32,
    /// `conv[layer]`: whether block `layer` is a convolution.
    pub conv: Vec<bool>,
}

impl ShortConvLayout {
    pub fn is_conv(&self, layer: u32) -> bool {
        self.conv.get(layer as usize).copied().unwrap_or(false)
    }

    /// Convolution blocks among `layers`: the size of a stage's convolution state.
    pub fn count(&self, layers: std::ops::Range<u32>) -> u32 {
        layers.filter(|&layer| self.is_conv(layer)).count() as u32
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlidingWindow {
    pub window: u32,
    /// Every `period`-th layer (1-based) attends globally.
    pub period: u32,
}

impl ModelConfig {
    pub fn from_header(header: &Header) -> Result<ModelConfig, ConfigError> {
        let name = header.architecture()?;
        let arch =
            super::architecture(name).ok_or_else(|| ConfigError::UnsupportedArch(name.into()))?;
        let meta = &header.metadata;
        let key = |suffix: &str| format!("{name}.{suffix}");
        let n_heads = positive(meta, &key("attention.head_count"))?;
        let d_model = positive(meta, &key("embedding_length"))?;
        let head_dim = match meta.opt_u32(&key("attention.key_length"))? {
            Some(dim) => dim,
            None => d_model / n_heads,
        };
        let vocab = vocab_size(header)?;
        let rope = RopeParams {
            head_dim,
            rope_dims: meta
                .opt_u32(&key("rope.dimension_count"))?
                .unwrap_or(head_dim),
            freq_base: meta.opt_f32(&key("rope.freq_base"))?.unwrap_or(10_000.0),
            freq_scale: rope_freq_scale(meta, name)?,
            neox: arch.rope_layout == RopeLayout::Neox,
        };
        let config = ModelConfig {
            arch,
            n_layers: positive(meta, &key("block_count"))?,
            d_model,
            n_heads,
            n_kv_heads: kv_head_count(meta, &key("attention.head_count_kv"))?.unwrap_or(n_heads),
            head_dim,
            ff_dim: positive(meta, &key("feed_forward_length"))?,
            vocab,
            context_length: meta.opt_u32(&key("context_length"))?.unwrap_or(2048),
            rms_eps: meta.get_f32(&key("attention.layer_norm_rms_epsilon"))?,
            rope,
            rope_local: None,
            sliding_window: None,
            attention_scale: 1.0 / (head_dim as f32).sqrt(),
            short_conv: None,
            output_norm: "output_norm.weight",
            rope_attn_factor: meta
                .opt_f32(&key("rope.scaling.attn_factor"))?
                .unwrap_or(1.0),
            rope_original_context: meta.opt_u32(&key("rope.scaling.original_context_length"))?,
        };
        (arch.configure)(meta, config)?.validate()
    }

    fn validate(self) -> Result<ModelConfig, ConfigError> {
        let invalid = |key: &str, message: String| ConfigError::Invalid {
            key: format!("{}.{key}", self.arch.name),
            message,
        };
        if self.n_kv_heads == 0 || !self.n_heads.is_multiple_of(self.n_kv_heads) {
            return Err(invalid(
                "attention.head_count_kv",
                format!(
                    "{} does not divide head_count {}",
                    self.n_kv_heads, self.n_heads
                ),
            ));
        }
        if self.head_dim == 0 || !self.head_dim.is_multiple_of(2) || self.head_dim > 1024 {
            return Err(invalid(
                "attention.key_length",
                format!(
                    "head dimension {} must be even and at most 1024",
                    self.head_dim
                ),
            ));
        }
        if !(self.rope_attn_factor.is_finite() && self.rope_attn_factor > 0.0) {
            return Err(invalid(
                "rope.scaling.attn_factor",
                format!("{} is not a positive factor", self.rope_attn_factor),
            ));
        }
        if self.rope.rope_dims > self.head_dim || !self.rope.rope_dims.is_multiple_of(2) {
            return Err(invalid(
                "rope.dimension_count",
                format!(
                    "{} must be even and at most the head dimension",
                    self.rope.rope_dims
                ),
            ));
        }
        Ok(self)
    }

    pub fn q_dim(&self) -> u32 {
        self.n_heads * self.head_dim
    }

    pub fn kv_dim(&self) -> u32 {
        self.n_kv_heads * self.head_dim
    }

    /// Whether layer `layer` attends through the sliding window.
    pub fn is_local_layer(&self, layer: u32) -> bool {
        self.sliding_window
            .is_some_and(|sw| !(layer + 1).is_multiple_of(sw.period))
    }
}

fn positive(meta: &Metadata, key: &str) -> Result<u32, ConfigError> {
    let value = meta.get_u32(key)?;
    if value == 0 {
        return Err(ConfigError::Invalid {
            key: key.into(),
            message: "must be positive".into(),
        });
    }
    Ok(value)
}

/// KV heads: one count, or one per layer (LFM2: 0 for its convolution blocks), of which the
/// attention blocks' (the largest) is the cache's; the architecture checks the pattern.
fn kv_head_count(meta: &Metadata, key: &str) -> Result<Option<u32>, ConfigError> {
    match meta.get(key).and_then(|value| value.as_array()) {
        Some(_) => Ok(meta.get_u32_array(key)?.into_iter().max()),
        None => Ok(meta.opt_u32(key)?),
    }
}

/// Linear RoPE scaling where the file asks for it; `longrope` (Phi-3) scales by its factor
/// tensors instead (`weights::rope_factors_tensor`); other scaling types are refused.
pub(crate) fn rope_freq_scale(meta: &Metadata, arch: &str) -> Result<f32, ConfigError> {
    let scaling_key = format!("{arch}.rope.scaling.type");
    match meta.opt_str(&scaling_key)? {
        None | Some("none" | "longrope") => Ok(1.0),
        Some("linear") => {
            let factor_key = format!("{arch}.rope.scaling.factor");
            let factor = meta.get_f32(&factor_key)?;
            if !(factor.is_finite() && factor > 0.0) {
                return Err(ConfigError::Invalid {
                    key: factor_key,
                    message: format!("{factor} is not a positive scaling factor"),
                });
            }
            Ok(1.0 / factor)
        }
        Some(other) => Err(ConfigError::Invalid {
            key: scaling_key,
            message: format!("RoPE scaling `{other}` is not supported (none, linear, longrope)"),
        }),
    }
}

/// The vocabulary size: the embedding's row count, which must agree with the tokenizer's list.
fn vocab_size(header: &Header) -> Result<u32, ConfigError> {
    let embedding = header
        .tensor("token_embd.weight")
        .ok_or_else(|| ConfigError::Invalid {
            key: "token_embd.weight".into(),
            message: "tensor missing".into(),
        })?;
    let rows = embedding.shape.get(1).copied().unwrap_or(1);
    u32::try_from(rows).map_err(|_| ConfigError::Invalid {
        key: "token_embd.weight".into(),
        message: format!("{rows} rows is too many"),
    })
}
