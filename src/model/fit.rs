//! Fit before fetch: from the header alone, whether a stage's weights, its KV cache at the
//! requested context and its scratch fit the device, so a model too big fails before a byte of
//! weights moves, saying what does not fit, instead of midway through a download.
//!
//! WebGPU (and wgpu natively) reports binding and buffer limits, not memory, so the memory
//! check needs a budget: the user's (`--gpu-mem-mib`, the page's `gpu_mem`). The limits are
//! checked always: every row of a matrix must fit one binding (a matrix is split by rows
//! across buffers), and so must one layer's keys.

use crate::gguf::Header;
use crate::gpu::Caps;

use super::config::ModelConfig;
use super::scratch::Scratch;
use super::stage::StageSpec;

/// What a stage needs on the device, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Footprint {
    pub weights: u64,
    /// Keys and values of every layer of the stage at `StageSpec::max_context`.
    pub kv_cache: u64,
    pub scratch: u64,
}

impl Footprint {
    pub fn total(&self) -> u64 {
        self.weights + self.kv_cache + self.scratch
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FitError {
    #[error(
        "the model does not fit: it needs {need} MiB of GPU memory (weights {weights} MiB + KV \
         cache {kv} MiB at context {ctx} + scratch {scratch} MiB), more than the budget of \
         {budget} MiB; nothing was downloaded. A shorter context shrinks the KV cache; a fleet \
         of donors (`runner fleet`, or the fleet page) can run it, each holding some layers",
        need = mib(.footprint.total()),
        weights = mib(.footprint.weights),
        kv = mib(.footprint.kv_cache),
        scratch = mib(.footprint.scratch),
        budget = mib(*.budget)
    )]
    OverBudget {
        footprint: Footprint,
        ctx: u32,
        budget: u64,
    },
    #[error(
        "the model does not fit this device: {what} needs {bytes} bytes in one binding, more \
         than the device's limit of {limit} bytes; nothing was downloaded"
    )]
    OverBinding {
        what: String,
        bytes: u64,
        limit: u64,
    },
}

fn mib(bytes: u64) -> u64 {
    bytes.div_ceil(1 << 20)
}

/// What `spec`'s stage of the model needs, from the header.
pub fn footprint(header: &Header, cfg: &ModelConfig, spec: &StageSpec) -> Footprint {
    let weights = header
        .tensors
        .iter()
        .filter(|t| loads(spec, cfg, header, &t.name))
        .map(|t| t.bytes)
        .sum();
    let layers = u64::from(spec.layers.end.saturating_sub(spec.layers.start));
    Footprint {
        weights,
        kv_cache: layers * 2 * layer_kv_bytes(cfg, spec) + short_conv_state_bytes(cfg, spec),
        scratch: Scratch::bytes(cfg, spec.max_batch),
    }
}

/// Checks `spec`'s stage against the device's limits and, when given, a memory budget.
pub fn check(
    header: &Header,
    cfg: &ModelConfig,
    spec: &StageSpec,
    caps: &Caps,
    budget: Option<u64>,
) -> Result<Footprint, FitError> {
    let limit = caps.max_binding.min(caps.max_buffer);
    for tensor in header
        .tensors
        .iter()
        .filter(|t| loads(spec, cfg, header, &t.name))
    {
        if tensor.row_bytes() > limit.saturating_sub(4) {
            return Err(FitError::OverBinding {
                what: format!("one row of tensor `{}`", tensor.name),
                bytes: tensor.row_bytes(),
                limit,
            });
        }
    }
    if layer_kv_bytes(cfg, spec) > limit {
        return Err(FitError::OverBinding {
            what: format!("one layer's keys at context {}", spec.max_context),
            bytes: layer_kv_bytes(cfg, spec),
            limit,
        });
    }
    let footprint = footprint(header, cfg, spec);
    match budget {
        Some(budget) if footprint.total() > budget => Err(FitError::OverBudget {
            footprint,
            ctx: spec.max_context,
            budget,
        }),
        _ => Ok(footprint),
    }
}

/// The stage's short-convolution state (LFM2): d f32 per position and convolution block.
fn short_conv_state_bytes(cfg: &ModelConfig, spec: &StageSpec) -> u64 {
    let blocks = cfg
        .short_conv
        .as_ref()
        .map_or(0, |layout| layout.count(spec.layers.clone()));
    u64::from(blocks) * u64::from(spec.max_context) * u64::from(cfg.d_model) * 4
}

/// One layer's keys (or values), f32.
fn layer_kv_bytes(cfg: &ModelConfig, spec: &StageSpec) -> u64 {
    u64::from(spec.max_context) * u64::from(cfg.kv_dim()) * 4
}

/// Whether the stage loads tensor `name`: its layers' `blk.N.*`, the embedding on the first
/// stage, the head (and a tied embedding) on the last.
fn loads(spec: &StageSpec, cfg: &ModelConfig, header: &Header, name: &str) -> bool {
    if let Some(rest) = name.strip_prefix("blk.") {
        let layer = rest.split('.').next().and_then(|n| n.parse::<u32>().ok());
        return layer.is_some_and(|l| spec.layers.contains(&l) && l < cfg.n_layers);
    }
    match name {
        "token_embd.weight" => {
            spec.embedding || (spec.head && header.tensor("output.weight").is_none())
        }
        "output.weight" => spec.head,
        _ => spec.head && name == cfg.output_norm,
    }
}
