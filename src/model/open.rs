//! A model opened once: its header, its configuration and the plan of which tensors a stage
//! reads. Everything that loads or drives a model (the single-device engine, the fleet
//! coordinator, a donor's stage host, the verifier) starts from one `OpenModel`, so the
//! configuration is derived from the metadata in exactly one place.

use std::ops::Range;

use crate::gguf::{read_header, Header, RangeSource};

use super::config::ModelConfig;
use super::stage::StageSpec;
use super::weights::stage_tensor_names;
use super::ModelError;

/// A model's header and configuration, read once.
#[derive(Debug, Clone)]
pub struct OpenModel {
    pub header: Header,
    pub cfg: ModelConfig,
}

/// The tensors a stage reads, and their bytes in all (for progress and downloads).
#[derive(Debug, Clone)]
pub struct TensorPlan {
    pub names: Vec<String>,
    pub bytes: u64,
}

impl OpenModel {
    /// Reads the header from `source` and derives the configuration.
    pub async fn read(source: &dyn RangeSource) -> Result<OpenModel, ModelError> {
        OpenModel::from_header(read_header(source).await?)
    }

    /// The configuration of the model in `header`, with its architecture's own additions.
    pub fn from_header(header: Header) -> Result<OpenModel, ModelError> {
        let cfg = super::config_for(&header)?;
        Ok(OpenModel { header, cfg })
    }

    /// Checks that `layers` is a non-empty range of this model's layers.
    pub fn check_layers(&self, layers: &Range<u32>) -> Result<(), ModelError> {
        if layers.end > self.cfg.n_layers || layers.is_empty() {
            return Err(ModelError::Plan(format!(
                "layers {layers:?} outside the model's 0..{}",
                self.cfg.n_layers
            )));
        }
        Ok(())
    }

    /// The tensors a stage of `spec` needs: only its layers, plus the edges it holds.
    pub fn tensor_plan(&self, spec: &StageSpec) -> TensorPlan {
        let names = stage_tensor_names(
            &self.header,
            &self.cfg,
            spec.layers.clone(),
            spec.embedding,
            spec.head,
        );
        let bytes = names
            .iter()
            .filter_map(|name| self.header.tensor(name))
            .map(|tensor| tensor.bytes)
            .sum();
        TensorPlan { names, bytes }
    }
}
