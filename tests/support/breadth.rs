//! The fidelity check of `tests/fidelity.rs` over a chosen subset of a model's golden records,
//! for goldens kept in the repository (tests/goldens).

use serde_json::Value;
use std::ops::ControlFlow;

use webshard::engine::Engine;
use webshard::front::{GenerateOptions, GenerateRequest, Generator, Prompt};
use webshard::gpu::GpuOptions;
use webshard::sample::SamplerConfig;

const MARGIN: f64 = 0.5;
const MEAN_LIMIT: f64 = 0.35;
const MAX_LIMIT: f64 = 2.0;

/// Which records are checked, and how much of them runs free.
pub struct Coverage {
    /// Records compared teacher-forced over every golden step.
    pub records: &'static [usize],
    /// Free-running steps of each of the first `free_records` of `records`.
    pub free_steps: usize,
    pub free_records: usize,
}

struct Step {
    id: u32,
    top5: Vec<(u32, f64)>,
}

fn steps(record: &Value) -> Vec<Step> {
    let pair = |p: &Value| {
        let id = p[0].as_u64().expect("id") as u32;
        (id, p[1].as_f64().expect("logit"))
    };
    record["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .map(|s| Step {
            id: s["id"].as_u64().expect("id") as u32,
            top5: s["top5"]
                .as_array()
                .expect("top5")
                .iter()
                .map(pair)
                .collect(),
        })
        .collect()
}

fn ids(value: &Value) -> Vec<u32> {
    let array = value.as_array().expect("ids");
    array
        .iter()
        .map(|v| v.as_u64().expect("id") as u32)
        .collect()
}

fn margin(step: &Step) -> f64 {
    step.top5[0].1 - step.top5[1].1
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

/// The goldens of `model` in tests/goldens.
pub fn read_repo_goldens(model: &str) -> Value {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/goldens")
        .join(format!("{model}.generate.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).expect("goldens are JSON")
}

/// Teacher-forced comparison of one record: top-1 where the margin exceeds 0.5; returns the
/// absolute errors of the golden top-5 logits and the golden margins.
async fn teacher_forced(engine: &mut Engine, record: &Value, label: &str) -> (Vec<f64>, Vec<f64>) {
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
        let row = &logits[i];
        let ours = argmax(row);
        if margin(step) > MARGIN {
            assert_eq!(
                ours,
                step.top5[0].0,
                "{label} step {i}: top-1 {ours} vs golden {} (margin {:.3})",
                step.top5[0].0,
                margin(step)
            );
        }
        let error = |(id, logit): &(u32, f64)| (f64::from(row[*id as usize]) - logit).abs();
        errors.extend(step.top5.iter().map(error));
    }
    (errors, steps.iter().map(margin).collect())
}

/// Free-running greedy: identical ids up to the first golden step with margin <= 0.5. Runs
/// right after `teacher_forced` on the same record.
async fn free_running(engine: &mut Engine, record: &Value, max_steps: usize, label: &str) {
    let prompt = ids(&record["prompt_ids"]);
    let mut steps = steps(record);
    steps.truncate(max_steps);
    let options = GenerateOptions {
        max_tokens: steps.len() as u32,
        sampler: SamplerConfig::greedy(),
        stop: Vec::new(),
        constraint: None,
        ..GenerateOptions::default()
    };
    // No reset: the teacher-forced pass left this prompt's keys and values in the cache
    // (same prefill kernels), so only the prompt's last token and the decode steps run.
    let request = GenerateRequest::new(Prompt::Ids(prompt), options);
    let out = engine
        .generate_one(&request, &mut |_| ControlFlow::Continue(()))
        .await
        .expect("generate");
    let trusted = steps.iter().take_while(|s| margin(s) > MARGIN).count();
    let golden: Vec<u32> = steps.iter().map(|s| s.id).collect();
    let n = trusted.min(out.ids.len());
    assert!(
        out.ids.len() >= trusted.min(golden.len()),
        "{label}: stopped early"
    );
    assert_eq!(
        &out.ids[..n],
        &golden[..n],
        "{label}: greedy ids diverge (step {trusted})"
    );
}

/// Checks `coverage` of the goldens of `model` (in file `file`) on every backend.
pub async fn check_model(model: &str, file: &str, coverage: &Coverage) {
    let goldens = read_repo_goldens(model);
    let records = goldens["records"].as_array().expect("records");
    for backend in crate::support::backends() {
        let options = GpuOptions {
            backend,
            ..Default::default()
        };
        let mut engine = crate::support::load_engine(file, options).await;
        let adapter = engine.stage.gpu.caps.adapter.clone();
        let (mut errors, mut margins) = (Vec::new(), Vec::new());
        for (n, &r) in coverage.records.iter().enumerate() {
            let record = &records[r];
            let label = format!("{model} on {adapter} ({backend:?}) record {r}");
            let prompt = record["prompt"].as_str().expect("prompt");
            let want = ids(&record["prompt_ids"]);
            assert_eq!(engine.tokenize_prompt(prompt), want, "{label}: prompt ids");
            let (e, m) = teacher_forced(&mut engine, record, &label).await;
            errors.extend(e);
            margins.extend(m);
            if n < coverage.free_records {
                free_running(&mut engine, record, coverage.free_steps, &label).await;
            }
        }
        let mean = errors.iter().sum::<f64>() / errors.len() as f64;
        let max = errors.iter().cloned().fold(0.0, f64::max);
        margins.sort_by(f64::total_cmp);
        let median_margin = margins[margins.len() / 2];
        println!("fidelity {model} on {adapter} ({backend:?}): top-5 logit error mean {mean:.4} max {max:.4} over {} values; median golden margin {median_margin:.3}", errors.len());
        assert!(
            mean <= MEAN_LIMIT,
            "{model}: mean error {mean} > {MEAN_LIMIT}"
        );
        assert!(max <= MAX_LIMIT, "{model}: max error {max} > {MAX_LIMIT}");
    }
}
