//! `runner bench --json-schema FILE` (or `--regex`, `--grammar`, `--json-mode`): what a
//! constraint costs per token. The mask is computed on the CPU while the GPU runs the step,
//! so two figures matter: the CPU time per mask, and that time as a share of the step.

use serde_json::{json, Value};
use std::ops::ControlFlow;

use webshard::engine::Engine;
use webshard::front::{GenerateOptions, GenerateRequest, Generator, Prompt};
use webshard::sample::{ConstraintSpec, SamplerConfig};
use webshard::tokenizer::ChatMessage;

/// The mask's cost over some constrained generations.
#[derive(Debug, Clone, Copy)]
pub struct MaskCost {
    /// CPU microseconds per mask, mean over all tokens.
    pub mask_us: f64,
    /// Milliseconds per constrained decode step (GPU step, readback, mask, sampling).
    pub step_ms: f64,
    pub tokens: usize,
}

impl MaskCost {
    /// The mask's CPU time as a share of a decode step.
    pub fn fraction(&self) -> f64 {
        self.mask_us / (self.step_ms * 1e3)
    }

    pub fn to_json(self) -> Value {
        json!({
            "mask_us_per_token": self.mask_us, "step_ms": self.step_ms,
            "fraction_of_step": self.fraction(), "tokens": self.tokens,
        })
    }
}

/// Greedy constrained generations of up to `tokens` tokens each, `repetitions` times.
pub async fn mask_cost(
    engine: &mut Engine,
    spec: &ConstraintSpec,
    tokens: u32,
    repetitions: u32,
) -> anyhow::Result<MaskCost> {
    let ask = ChatMessage::new("user", "Answer with one example, in the required format.");
    let options = GenerateOptions {
        max_tokens: tokens,
        sampler: SamplerConfig::greedy(),
        stop: Vec::new(),
        constraint: Some(spec.clone()),
        ..GenerateOptions::default()
    };
    let request = GenerateRequest::new(Prompt::Chat(vec![ask]), options);
    let mut go_on = |_: webshard::front::TokenEvent<'_>| ControlFlow::Continue(());
    // One warm-up builds the token view and compiles the constraint's lexer states.
    engine.generate_one(&request, &mut go_on).await?;
    let (mut mask_seconds, mut decode_seconds, mut count) = (0.0, 0.0, 0);
    for _ in 0..repetitions.max(1) {
        engine.reset();
        let out = engine.generate_one(&request, &mut go_on).await?;
        mask_seconds += out.timings.mask_seconds;
        decode_seconds += out.timings.decode_seconds;
        count += out.ids.len();
    }
    let per_token = |seconds: f64| seconds / count.max(1) as f64;
    Ok(MaskCost {
        mask_us: per_token(mask_seconds) * 1e6,
        step_ms: per_token(decode_seconds) * 1e3,
        tokens: count,
    })
}
