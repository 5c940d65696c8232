//! `runner bench --prompt-file F [--spec lookup --draft-max K]`: greedy decode rate on a real
//! prompt (the file's text as a user message in the model's chat template), with and without
//! speculative decoding in the same process, the drafts' acceptance, and whether both
//! produced the same ids (they must).

use std::ops::ControlFlow;

use serde_json::json;
use webshard::engine::Engine;
use webshard::front::{GenerateOptions, GenerateRequest, Generated, Generator, Prompt, Timings};
use webshard::sample::{SamplerConfig, SpecConfig};
use webshard::tokenizer::ChatMessage;

/// Decode rates on one prompt, plain and (if asked) speculative.
pub struct SpecBench {
    pub plain: Vec<f64>,
    pub spec: Vec<f64>,
    pub tokens: usize,
    /// The speculative runs' timings added up: decode time, drafts, verification steps and
    /// their time, the pipelined decoder's starts (where the time went beside plain tokens).
    pub spec_totals: Timings,
    /// Every speculative run gave the plain run's ids.
    pub identical: bool,
}

impl SpecBench {
    pub fn acceptance(&self) -> f64 {
        let t = &self.spec_totals;
        f64::from(t.accepted) / f64::from(t.drafted.max(1))
    }

    /// Milliseconds a verification step took, on average.
    pub fn verify_ms(&self) -> f64 {
        let t = &self.spec_totals;
        t.verify_seconds * 1e3 / f64::from(t.verifications.max(1))
    }

    /// Share of the speculative runs' decode time spent in verification steps.
    pub fn verify_share(&self) -> f64 {
        let t = &self.spec_totals;
        t.verify_seconds / t.decode_seconds.max(1e-9)
    }

    pub fn to_json(&self) -> serde_json::Value {
        let t = &self.spec_totals;
        json!({
            "plain_tok_s": self.plain, "spec_tok_s": self.spec, "tokens": self.tokens,
            "drafted": t.drafted, "accepted": t.accepted,
            "acceptance": self.acceptance(), "identical": self.identical,
            "spec_seconds": t.decode_seconds, "verifications": t.verifications,
            "verify_seconds": t.verify_seconds, "decoder_starts": t.decoder_starts,
        })
    }
}

async fn run_once(
    engine: &mut Engine,
    request: &GenerateRequest,
    spec: Option<SpecConfig>,
) -> anyhow::Result<Generated> {
    engine.reset();
    let mut request = request.clone();
    request.options.speculation = spec;
    let mut go_on = |_: webshard::front::TokenEvent<'_>| ControlFlow::Continue(());
    Ok(engine.generate_one(&request, &mut go_on).await?)
}

fn decode_rate(out: &Generated) -> f64 {
    out.ids.len() as f64 / out.timings.decode_seconds.max(1e-9)
}

/// `repetitions` greedy generations of up to `tokens` tokens after `prompt`, alternating plain
/// and speculative (when `spec` is given) so load changes hit both alike.
pub async fn spec_bench(
    engine: &mut Engine,
    prompt: &str,
    tokens: u32,
    repetitions: u32,
    spec: Option<SpecConfig>,
) -> anyhow::Result<SpecBench> {
    let options = GenerateOptions {
        max_tokens: tokens,
        sampler: SamplerConfig::greedy(),
        ..GenerateOptions::default()
    };
    let prompt = Prompt::Chat(vec![ChatMessage::new("user", prompt)]);
    let request = GenerateRequest::new(prompt, options);
    // Warm-ups compile the pipelines of every step shape either way can use.
    let reference = run_once(engine, &request, None).await?;
    if spec.is_some() {
        run_once(engine, &request, spec).await?;
    }
    let mut bench = SpecBench {
        plain: Vec::new(),
        spec: Vec::new(),
        tokens: reference.ids.len(),
        spec_totals: Timings::default(),
        identical: true,
    };
    for _ in 0..repetitions.max(1) {
        bench
            .plain
            .push(decode_rate(&run_once(engine, &request, None).await?));
        if spec.is_some() {
            let out = run_once(engine, &request, spec).await?;
            bench.spec.push(decode_rate(&out));
            bench.spec_totals.add(&out.timings);
            bench.identical &= out.ids == reference.ids;
        }
    }
    Ok(bench)
}
