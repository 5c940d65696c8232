//! `runner bench --stage-steps A..B`: a donor's step path over layers `A..B` beside the
//! engine's decode of the same model on the same device, so that what a fleet stage costs
//! beyond its layers' GPU time is attributable without a fleet (`shard::roles::stage_bench`).

use std::ops::Range;
use std::time::Instant;

use serde_json::json;
use webshard::engine::Engine;
use webshard::model::StageInput;
use webshard::shard::roles::{time_stage_steps, StageBench, StageStepTimes};

use crate::bench::generation_rate;

/// Requests in flight for the second stage row: each step swaps another KV slot in.
const SLOTS_REQUESTS: u32 = 4;

/// Parses `A..B`.
pub fn parse_layer_range(text: &str) -> Result<Range<u32>, String> {
    let (start, end) = text
        .split_once("..")
        .ok_or_else(|| format!("`{text}`: expected START..END, e.g. 10..30"))?;
    let number = |s: &str| {
        s.trim()
            .parse::<u32>()
            .map_err(|e| format!("`{text}`: {s:?} is not a layer number ({e})"))
    };
    let (start, end) = (number(start)?, number(end)?);
    if start >= end {
        return Err(format!("`{text}`: the range holds no layer"));
    }
    Ok(start..end)
}

/// What `--stage-steps` measured.
pub struct StageReport {
    layers: Range<u32>,
    n_layers: u32,
    /// ms per token of the engine's greedy decode, 2 steps in flight.
    engine_pipelined_ms: f64,
    /// ms per token of the engine's decode one step at a time (submit, wait, read back).
    engine_serial_ms: f64,
    /// The stage with one request, then with `SLOTS_REQUESTS` taking turns.
    rows: Vec<(u32, StageStepTimes)>,
}

pub async fn bench_stage(
    engine: &mut Engine,
    model_url: &str,
    layers: Range<u32>,
    steps: u32,
) -> anyhow::Result<StageReport> {
    let n_layers = engine.model.cfg.n_layers;
    if layers.end > n_layers {
        anyhow::bail!("--stage-steps {layers:?}: the model has {n_layers} layers");
    }
    let engine_pipelined_ms = 1e3 / generation_rate(engine, steps).await?;
    let engine_serial_ms = serial_step_ms(engine, steps).await?;
    let gpu = engine.stage.gpu.clone();
    let mut rows = Vec::new();
    for requests in [1, SLOTS_REQUESTS] {
        let bench = StageBench {
            model_url: model_url.to_string(),
            layers: layers.clone(),
            requests,
            steps,
        };
        rows.push((requests, time_stage_steps(gpu.clone(), &bench).await?));
    }
    Ok(StageReport {
        layers,
        n_layers,
        engine_pipelined_ms,
        engine_serial_ms,
        rows,
    })
}

/// The engine's greedy decode without pipelining: each step's argmax read back before the
/// next is recorded, as a stage must wait for its next input.
async fn serial_step_ms(engine: &mut Engine, steps: u32) -> anyhow::Result<f64> {
    engine.reset();
    let mut token = engine.text.tokenizer.bos_id().unwrap_or(0);
    let started = Instant::now();
    for position in 0..steps {
        let input = [token];
        token = engine
            .stage
            .forward_argmax(&StageInput::Tokens(&input), position)
            .await?;
    }
    Ok(started.elapsed().as_secs_f64() * 1e3 / f64::from(steps.max(1)))
}

impl StageReport {
    /// The engine's decode time of this stage's share of the layers (head included).
    fn share(&self) -> f64 {
        f64::from(self.layers.len() as u32) / f64::from(self.n_layers)
    }

    pub fn print(&self) {
        let share = self.share();
        println!(
            "engine decode: {:.3} ms/token with 2 steps in flight, {:.3} ms one step at a time; \
             layers {:?} are {:.0}% of the model: {:.3} / {:.3} ms",
            self.engine_pipelined_ms,
            self.engine_serial_ms,
            self.layers,
            share * 100.0,
            self.engine_pipelined_ms * share,
            self.engine_serial_ms * share,
        );
        println!("| stage {:?} | requests | select | decode f16 | record | submit | wait | encode f16 | step | on worker | bind groups | read buffers | submits |", self.layers);
        println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
        for (requests, t) in &self.rows {
            println!(
                "| µs per step | {requests} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.2} | {:.2} | {:.2} |",
                t.select_us, t.decode_us, t.record_us, t.submit_us, t.wait_us, t.encode_us,
                t.step_us(), t.offloaded_us, t.bind_groups, t.read_buffers, t.submits
            );
        }
    }

    pub fn to_json(&self) -> serde_json::Value {
        let rows: Vec<_> = self
            .rows
            .iter()
            .map(|(requests, t)| {
                json!({
                    "requests": requests, "select_us": t.select_us, "decode_us": t.decode_us,
                    "record_us": t.record_us, "submit_us": t.submit_us, "wait_us": t.wait_us,
                    "encode_us": t.encode_us, "step_us": t.step_us(),
                    "offloaded_us": t.offloaded_us, "bind_groups": t.bind_groups,
                    "read_buffers": t.read_buffers, "submits": t.submits,
                })
            })
            .collect();
        json!({
            "layers": [self.layers.start, self.layers.end], "n_layers": self.n_layers,
            "engine_pipelined_ms": self.engine_pipelined_ms,
            "engine_serial_ms": self.engine_serial_ms, "stage": rows,
        })
    }
}
