//! The comparison against llama.cpp's goldens that `../shared/goldens/README.md` defines, shared
//! by `fidelity` and `fidelity_breadth`: teacher-forced top-1 agreement where the golden margin
//! exceeds 0.5, mean and max error of the golden top-5 logits, and free-running greedy output
//! identical up to the first near-tie.

use serde_json::Value;
use std::ops::ControlFlow;

use webshard::engine::Engine;
use webshard::front::{GenerateOptions, GenerateRequest, Generator, Prompt};
use webshard::sample::SamplerConfig;

pub const MARGIN: f64 = 0.5;
pub const MEAN_LIMIT: f64 = 0.35;
pub const MAX_LIMIT: f64 = 2.0;

/// One golden step: the token llama.cpp chose and its top-5 (id, logit).
pub struct Step {
    pub id: u32,
    pub top5: Vec<(u32, f64)>,
}

impl Step {
    /// The golden top-1's lead over its top-2.
    pub fn margin(&self) -> f64 {
        self.top5[0].1 - self.top5[1].1
    }
}

pub fn steps(record: &Value) -> Vec<Step> {
    let pair = |p: &Value| {
        let id = p[0].as_u64().expect("id") as u32;
        (id, p[1].as_f64().expect("logit"))
    };
    let step = |s: &Value| Step {
        id: s["id"].as_u64().expect("id") as u32,
        top5: s["top5"]
            .as_array()
            .expect("top5")
            .iter()
            .map(pair)
            .collect(),
    };
    record["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .map(step)
        .collect()
}

pub fn ids(value: &Value) -> Vec<u32> {
    let array = value.as_array().expect("ids");
    array
        .iter()
        .map(|v| v.as_u64().expect("id") as u32)
        .collect()
}

fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, v) in row.iter().enumerate() {
        if *v > row[best] {
            best = i;
        }
    }
    best as u32
}

/// Asserts that `engine` tokenizes `record`'s prompt text to the golden prompt ids.
pub fn check_prompt_ids(engine: &Engine, record: &Value, label: &str) {
    let prompt = record["prompt"].as_str().expect("prompt");
    let want = ids(&record["prompt_ids"]);
    assert_eq!(engine.tokenize_prompt(prompt), want, "{label}: prompt ids");
}

/// One step's logits against its golden: the top-1 where the golden margin exceeds `MARGIN`
/// (asserted); returns the absolute errors of the golden top-5 logits.
pub fn compare_step(row: &[f32], step: &Step, label: &str) -> Vec<f64> {
    let ours = argmax(row);
    if step.margin() > MARGIN {
        assert_eq!(
            ours,
            step.top5[0].0,
            "{label}: top-1 {ours} vs golden {} (margin {:.3})",
            step.top5[0].0,
            step.margin()
        );
    }
    step.top5
        .iter()
        .map(|(id, logit)| (f64::from(row[*id as usize]) - logit).abs())
        .collect()
}

/// Teacher-forced comparison of one record, its golden steps scored as one prompt (through the
/// prefill products); returns the absolute errors of the golden top-5 logits.
pub async fn teacher_forced(engine: &mut Engine, record: &Value, label: &str) -> Vec<f64> {
    let prompt = ids(&record["prompt_ids"]);
    let steps = steps(record);
    let mut sequence = prompt.clone();
    sequence.extend(steps.iter().take(steps.len() - 1).map(|s| s.id));
    // Logits of the golden steps' positions only: the prompt's earlier positions need none.
    let logits = engine
        .score_from(&sequence, prompt.len() - 1)
        .await
        .expect("score");
    let mut errors = Vec::new();
    for (i, step) in steps.iter().enumerate() {
        errors.extend(compare_step(&logits[i], step, &format!("{label} step {i}")));
    }
    errors
}

/// Free-running greedy: identical ids up to the first golden step with margin <= `MARGIN`, over
/// the first `max_steps` steps. Runs right after `teacher_forced` on the same record.
pub async fn free_running(engine: &mut Engine, record: &Value, max_steps: usize, label: &str) {
    let prompt = ids(&record["prompt_ids"]);
    let mut steps = steps(record);
    steps.truncate(max_steps);
    let options = GenerateOptions {
        max_tokens: steps.len() as u32,
        sampler: SamplerConfig::greedy(),
        ..GenerateOptions::default()
    };
    // No reset: the teacher-forced pass just left this prompt's keys and values in the
    // cache, computed by the same prefill kernels, so the engine reuses all but the prompt's
    // last token (its prefix cache) instead of recomputing them. On CPU adapters the prompt
    // was a third of a fidelity test's time; the decode steps are what the free run proves.
    let request = GenerateRequest::new(Prompt::Ids(prompt), options);
    let out = engine
        .generate_one(&request, &mut |_| ControlFlow::Continue(()))
        .await
        .expect("generate");
    let trusted = steps.iter().take_while(|s| s.margin() > MARGIN).count();
    let golden: Vec<u32> = steps.iter().map(|s| s.id).collect();
    let n = trusted.min(out.ids.len());
    assert!(
        out.ids.len() >= trusted.min(golden.len()),
        "{label}: stopped early: {:?}",
        out.ids
    );
    assert_eq!(
        &out.ids[..n],
        &golden[..n],
        "{label}: greedy ids diverge before the first near-tie (step {trusted})"
    );
}

/// Prints the mean and max of `errors` (absolute top-5 logit errors) and asserts both within
/// the README's limits.
pub fn check_errors(errors: &[f64], label: &str) {
    assert!(!errors.is_empty(), "{label}: nothing compared");
    let mean = errors.iter().sum::<f64>() / errors.len() as f64;
    let max = errors.iter().cloned().fold(0.0, f64::max);
    println!(
        "fidelity {label}: top-5 logit error mean {mean:.4} max {max:.4} over {} values",
        errors.len()
    );
    assert!(
        mean <= MEAN_LIMIT,
        "{label}: mean error {mean} > {MEAN_LIMIT}"
    );
    assert!(max <= MAX_LIMIT, "{label}: max error {max} > {MAX_LIMIT}");
}
