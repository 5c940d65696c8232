//! `--verify R`: a random fraction R of steps is re-run on the coordinator's own GPU and
//! every stage's output compared with the reference, so a donor that returns wrong
//! activations (broken GPU, driver bug, or on purpose) is flagged.
//!
//! A verified step is sent with `tap` set: each stage but the last also sends its output
//! activations to the coordinator, and the last stage returns top-k logits. The reference
//! then replays the request's tokens up to that step from position 0 through stages with
//! the plan's layer ranges (so every boundary is comparable), rounding activations between
//! them as the wire does. Stage outputs depend on the stages before them, so the first stage
//! in chain order whose output is off is the one flagged.
//!
//! The reference computes the step as a prefill while the chain computed it as a decode
//! step over cached keys; the two differ by rounding only. `tests/shard_roles.rs` measures
//! that difference on honest runs, which sets the default tolerance.

use std::ops::Range;
use std::sync::Arc;

use serde::Serialize;

use super::super::activations::{Activations, Encoding};
use super::super::frame::{StageOutput, StageResult, StageRuntime};
use super::super::plan::Plan;
use super::super::transport::Transport;
use super::coordinator::Coordinator;
use super::session::Session;
use super::RoleError;
use crate::gguf::open_source;
use crate::gpu::Gpu;
use crate::model::{LoadOptions, OpenModel, Stage, StageInput, StageSpec};
use crate::sample::Rng;

/// Relative RMS difference above which a stage is flagged. Honest SmolLM2 runs with f16
/// activations measured 3.6e-4 on activations and 9e-5 on logits
/// (`verify_flags_a_donor_with_wrong_activations`), so this leaves a margin of ~30x while a
/// perturbation of a few percent of the RMS lands far above.
pub const DEFAULT_TOLERANCE: f32 = 1e-2;

#[derive(Clone)]
pub struct VerifyConfig {
    /// Fraction of steps checked, 0..=1.
    pub fraction: f64,
    pub tolerance: f32,
    pub seed: u64,
    /// Where the reference runs (the coordinator's GPU).
    pub gpu: Arc<Gpu>,
}

/// A stage whose output differed from the reference.
#[derive(Clone, Debug, Serialize)]
pub struct VerifyFlag {
    pub stage_id: u16,
    pub donor: String,
    pub request_id: u64,
    pub position: u32,
    /// RMS of the difference over the RMS of the reference.
    pub error: f32,
}

/// A verified step's outputs as they arrive.
pub(super) struct PendingCheck {
    tokens: Vec<u32>,
    /// Last row of each non-last stage's tapped output.
    taps: Vec<Option<Vec<f32>>>,
    top_k: Option<(Vec<u32>, Vec<f32>)>,
}

impl PendingCheck {
    pub fn new(tokens: Vec<u32>, n_stages: usize) -> PendingCheck {
        PendingCheck {
            tokens,
            taps: vec![None; n_stages.saturating_sub(1)],
            top_k: None,
        }
    }

    fn set_tap(&mut self, stage: usize, hidden: &Activations) {
        let values = hidden.to_f32();
        let d_model = hidden.d_model as usize;
        if let Some(slot) = self.taps.get_mut(stage) {
            *slot = Some(values[values.len().saturating_sub(d_model)..].to_vec());
        }
    }

    pub fn set_final(&mut self, output: &StageOutput) {
        if let StageOutput::TopK { ids, logits, .. } = output {
            self.top_k = Some((ids.clone(), logits.clone()));
        }
    }

    pub fn is_complete(&self) -> bool {
        self.top_k.is_some() && self.taps.iter().all(Option::is_some)
    }
}

pub(super) struct Verifier {
    config: VerifyConfig,
    rng: Rng,
    stages: Vec<Stage>,
    encoding: Encoding,
}

impl Verifier {
    pub fn new(config: VerifyConfig) -> Verifier {
        Verifier {
            rng: Rng::new(config.seed),
            config,
            stages: Vec::new(),
            encoding: Encoding::F16,
        }
    }

    pub fn tolerance(&self) -> f32 {
        self.config.tolerance
    }

    /// Whether to check the next step.
    pub fn pick(&mut self) -> bool {
        self.rng.next_f64() < self.config.fraction
    }

    /// Loads reference stages with the plan's layer ranges (kept when they did not change).
    pub async fn prepare(
        &mut self,
        model_url: &str,
        model: &OpenModel,
        plan: &Plan,
        runtime: &StageRuntime,
    ) -> Result<(), RoleError> {
        self.encoding = runtime.hidden;
        let wanted: Vec<Range<u32>> = plan.stages.iter().map(|s| s.layers.clone()).collect();
        let loaded: Vec<Range<u32>> = self.stages.iter().map(|s| s.spec.layers.clone()).collect();
        if wanted == loaded {
            return Ok(());
        }
        self.stages.clear();
        let source = open_source(model_url)
            .await
            .map_err(|e| RoleError::Source(e.to_string()))?;
        for stage in &plan.stages {
            let spec = StageSpec {
                layers: stage.layers.clone(),
                embedding: stage.embedding,
                head: stage.head,
                max_context: runtime.max_context,
                max_batch: runtime.max_batch,
            };
            let gpu = Arc::clone(&self.config.gpu);
            let loaded = Stage::load(
                gpu,
                source.as_ref(),
                model,
                spec,
                LoadOptions::default(),
                &mut |_| {},
            )
            .await?;
            self.stages.push(loaded);
        }
        Ok(())
    }

    /// Each stage's relative error against the reference: its tapped output, then the last
    /// stage's top-k logits.
    async fn errors(&self, check: &PendingCheck) -> Result<Vec<f32>, RoleError> {
        let (reference_rows, reference_logits) = self.reference(&check.tokens).await?;
        let mut errors = Vec::with_capacity(self.stages.len());
        for (tap, reference) in check.taps.iter().zip(&reference_rows) {
            errors.push(relative_error(
                tap.as_deref().unwrap_or_default(),
                reference,
            ));
        }
        if let Some((ids, logits)) = &check.top_k {
            let expected: Vec<f32> = ids
                .iter()
                .map(|&id| {
                    reference_logits
                        .get(id as usize)
                        .copied()
                        .unwrap_or(f32::NAN)
                })
                .collect();
            errors.push(relative_error(logits, &expected));
        }
        Ok(errors)
    }

    /// The last row after every stage but the last, and the last position's logits.
    async fn reference(&self, tokens: &[u32]) -> Result<(Vec<Vec<f32>>, Vec<f32>), RoleError> {
        let Some((last, middle)) = self.stages.split_last() else {
            return Err(RoleError::Invalid("no reference stages are loaded".into()));
        };
        let chunk = middle.first().unwrap_or(last).spec.max_batch as usize;
        let mut rows = vec![Vec::new(); middle.len()];
        let mut logits = Vec::new();
        for (index, ids) in tokens.chunks(chunk).enumerate() {
            let start = (index * chunk) as u32;
            let is_final = (index + 1) * chunk >= tokens.len();
            let mut hidden: Option<Vec<f32>> = None;
            for (stage_index, stage) in middle.iter().enumerate() {
                let input = match &hidden {
                    None => StageInput::Tokens(ids),
                    Some(values) => StageInput::Hidden(values),
                };
                let output = self.round_trip(
                    stage.forward_hidden(&input, start).await?,
                    stage.cfg.d_model,
                )?;
                rows[stage_index] = last_row(&output, stage.cfg.d_model);
                hidden = Some(output);
            }
            let input = match &hidden {
                None => StageInput::Tokens(ids),
                Some(values) => StageInput::Hidden(values),
            };
            if is_final {
                logits = last
                    .forward_logits(&input, start, 1)
                    .await?
                    .pop()
                    .unwrap_or_default();
            } else {
                last.forward(&input, start)?;
            }
        }
        Ok((rows, logits))
    }

    /// What the wire does to activations between stages.
    fn round_trip(&self, values: Vec<f32>, d_model: u32) -> Result<Vec<f32>, RoleError> {
        match Activations::encode(&values, d_model, self.encoding) {
            Ok(encoded) => Ok(encoded.to_f32()),
            Err(_) => Ok(values),
        }
    }
}

fn last_row(values: &[f32], d_model: u32) -> Vec<f32> {
    values[values.len().saturating_sub(d_model as usize)..].to_vec()
}

/// RMS of the difference over the RMS of the reference; infinite when the shapes differ.
pub fn relative_error(found: &[f32], reference: &[f32]) -> f32 {
    if found.len() != reference.len() || found.is_empty() {
        return f32::INFINITY;
    }
    let (mut diff, mut norm) = (0f64, 0f64);
    for (&a, &b) in found.iter().zip(reference) {
        diff += f64::from(a - b).powi(2);
        norm += f64::from(b).powi(2);
    }
    let error = (diff / norm.max(f64::MIN_POSITIVE)).sqrt() as f32;
    if error.is_nan() {
        f32::INFINITY
    } else {
        error
    }
}

impl<T: Transport> Coordinator<T> {
    /// A non-last stage's tapped output of a verified step.
    pub(super) async fn on_tap(&mut self, session: &mut Session, result: StageResult) {
        if result.epoch != self.epoch {
            return;
        }
        let key = (result.request_id, result.start_pos);
        let StageOutput::Hidden(hidden) = &result.output else {
            return;
        };
        let Some(check) = session.checks.get_mut(&key) else {
            return;
        };
        check.set_tap(result.stage_id as usize, hidden);
        if check.is_complete() {
            let check = session.checks.remove(&key).expect("present");
            if let Err(error) = self.run_check(check, result.request_id).await {
                tracing::warn!(%error, "verification failed to run");
            }
        }
    }

    /// Compares a complete step with the reference and flags the first stage that is off.
    pub(super) async fn run_check(
        &mut self,
        check: PendingCheck,
        request_id: u64,
    ) -> Result<(), RoleError> {
        let Some(verifier) = self.verifier.as_ref() else {
            return Ok(());
        };
        let errors = verifier.errors(&check).await?;
        let tolerance = verifier.tolerance();
        let report = &mut self.report;
        report.verified_steps += 1;
        report.verify_max_error.resize(errors.len(), 0.0);
        for (max, &error) in report.verify_max_error.iter_mut().zip(&errors) {
            *max = max.max(error);
        }
        if let Some(stage_index) = errors.iter().position(|&e| e > tolerance) {
            let stage = &self.plan.stages[stage_index];
            report.flags.push(VerifyFlag {
                stage_id: stage.stage_id,
                donor: stage.donor.to_string(),
                request_id,
                position: check.tokens.len().saturating_sub(1) as u32,
                error: errors[stage_index],
            });
        }
        Ok(())
    }
}
