//! `runner bench --profile`: where a token's time goes. Counters over an unprofiled decode run
//! (dispatches, submits, host syncs, host time), the dispatch floor of the device, and GPU
//! time per kernel family from timestamp queries over a second, profiled run of decode and of
//! prefill.

use std::collections::BTreeMap;
use std::time::Instant;

use serde_json::json;
use webshard::engine::Engine;
use webshard::gpu::{CounterSnapshot, DispatchKey, Gpu, KernelTimes, Recorder};
use webshard::ops::elementwise;

use crate::bench::{generation_rate, prompt_rate};

/// What one dispatch costs on this device and stack, whatever it computes: `DISPATCHES`
/// dispatches of a 64-float add, each on the buffer the one before wrote (a dependency, so a
/// barrier between them) or each on its own buffer (no barrier needed), in one submit.
async fn dispatch_floor_us(gpu: &Gpu, dependent: bool) -> anyhow::Result<f64> {
    const DISPATCHES: usize = 512;
    let addend = webshard::gpu::storage_buffer(gpu, "floor addend", 256);
    let targets: Vec<_> = (0..if dependent { 1 } else { DISPATCHES })
        .map(|_| webshard::gpu::storage_buffer(gpu, "floor target", 256))
        .collect();
    let mut best = f64::MAX;
    for _ in 0..5 {
        let mut rec = Recorder::new(gpu);
        for i in 0..DISPATCHES {
            elementwise::add_in_place(&mut rec, &targets[i % targets.len()], &addend, 64);
        }
        let started = Instant::now();
        rec.submit_and_read(&addend, 0, 4).await?;
        best = best.min(started.elapsed().as_secs_f64());
    }
    Ok(best * 1e6 / DISPATCHES as f64)
}

/// GPU time by kernel family over `tokens` tokens.
pub struct KernelTable {
    pub tokens: u32,
    kernels: KernelTimes,
}

/// Where a decode token's time goes.
pub struct DecodeProfile {
    tokens: u32,
    /// µs per dispatch of a trivial kernel: dependent chain, independent.
    floor_us: (f64, f64),
    /// Counters over an unprofiled run.
    counts: CounterSnapshot,
    wall_seconds: f64,
    /// GPU time by kernel family over a second, profiled run.
    kernels: KernelTable,
}

/// Runs `run` once with every dispatch timed.
pub(crate) async fn timed_kernels(
    gpu: &Gpu,
    tokens: u32,
    run: impl std::future::Future<Output = anyhow::Result<f64>>,
) -> anyhow::Result<KernelTable> {
    if !gpu.caps.timestamps {
        return Ok(KernelTable {
            tokens,
            kernels: KernelTimes::new(),
        });
    }
    gpu.start_profiling()?;
    let outcome = run.await;
    gpu.collect_profile().await?;
    let kernels = gpu.finish_profiling();
    outcome?;
    Ok(KernelTable { tokens, kernels })
}

/// GPU time by kernel family of one prompt of `tokens` random tokens.
pub async fn profile_prefill(engine: &mut Engine, tokens: u32) -> anyhow::Result<KernelTable> {
    let gpu = engine.stage.gpu.clone();
    timed_kernels(&gpu, tokens, prompt_rate(engine, tokens, 3)).await
}

pub async fn profile_decode(engine: &mut Engine, tokens: u32) -> anyhow::Result<DecodeProfile> {
    let gpu = engine.stage.gpu.clone();
    let before = gpu.counters.snapshot();
    let started = Instant::now();
    generation_rate(engine, tokens).await?;
    let wall_seconds = started.elapsed().as_secs_f64();
    let counts = gpu.counters.snapshot() - before;
    let floor_us = (
        dispatch_floor_us(&gpu, true).await?,
        dispatch_floor_us(&gpu, false).await?,
    );
    let kernels = timed_kernels(&gpu, tokens, generation_rate(engine, tokens)).await?;
    Ok(DecodeProfile {
        tokens,
        floor_us,
        counts,
        wall_seconds,
        kernels,
    })
}

impl DecodeProfile {
    fn per_token(&self, value: u64) -> f64 {
        value as f64 / f64::from(self.tokens)
    }

    /// Host time per token not spent blocked on the GPU, in µs.
    fn host_us(&self) -> f64 {
        (self.wall_seconds * 1e9 - self.counts.wait_ns as f64) / 1e3 / f64::from(self.tokens)
    }

    pub fn to_json(&self) -> serde_json::Value {
        json!({
            "tokens": self.tokens,
            "us_per_token": self.wall_seconds * 1e6 / f64::from(self.tokens),
            "host_us_per_token": self.host_us(),
            "dispatches_per_token": self.per_token(self.counts.dispatches),
            "submits_per_token": self.per_token(self.counts.submits),
            "syncs_per_token": self.per_token(self.counts.syncs),
            "dispatch_floor_us": { "dependent": self.floor_us.0, "independent": self.floor_us.1 },
            "kernels": self.kernels.to_json(),
            "grids": self.kernels.grids_json(),
        })
    }

    pub fn print(&self) {
        println!(
            "decode profile over {} tokens: {:.0} µs/token wall, {:.0} µs host (not waiting), \
             {:.1} dispatches, {:.2} submits, {:.2} host syncs per token",
            self.tokens,
            self.wall_seconds * 1e6 / f64::from(self.tokens),
            self.host_us(),
            self.per_token(self.counts.dispatches),
            self.per_token(self.counts.submits),
            self.per_token(self.counts.syncs),
        );
        println!(
            "a trivial dispatch costs {:.1} µs after a dependent one, {:.1} µs after an \
             independent one",
            self.floor_us.0, self.floor_us.1
        );
        self.kernels.print();
    }
}

/// Rows of the grid table that `print` shows (the JSON has every grid).
const GRIDS_PRINTED: usize = 12;

impl KernelTable {
    fn per_token(&self, value: f64) -> f64 {
        value / f64::from(self.tokens)
    }

    /// GPU time and dispatch count per kernel family, all grids together.
    fn families(&self) -> BTreeMap<&'static str, (f64, u64)> {
        let mut families = BTreeMap::<&'static str, (f64, u64)>::new();
        for ((family, _), (ns, count)) in &self.kernels {
            let entry = families.entry(family).or_default();
            entry.0 += ns;
            entry.1 += count;
        }
        families
    }

    /// Family and grid rows, most GPU time first.
    fn grids_by_time(&self) -> Vec<(&DispatchKey, &(f64, u64))> {
        let mut rows: Vec<_> = self.kernels.iter().collect();
        rows.sort_by(|a, b| b.1 .0.total_cmp(&a.1 .0));
        rows
    }

    fn row_json(&self, ns: f64, count: u64) -> serde_json::Value {
        json!({ "us_per_token": self.per_token(ns / 1e3),
                "dispatches_per_token": self.per_token(count as f64),
                "us_per_dispatch": ns / 1e3 / count.max(1) as f64 })
    }

    pub fn to_json(&self) -> serde_json::Value {
        let rows: Vec<_> = self
            .families()
            .into_iter()
            .map(|(family, (ns, count))| {
                let mut row = self.row_json(ns, count);
                row["kernel"] = json!(family);
                row
            })
            .collect();
        json!(rows)
    }

    /// Every family and grid, most GPU time first.
    pub fn grids_json(&self) -> serde_json::Value {
        let rows: Vec<_> = self
            .grids_by_time()
            .into_iter()
            .map(|((family, grid), (ns, count))| {
                let mut row = self.row_json(*ns, *count);
                row["kernel"] = json!(family);
                row["grid"] = json!(grid);
                row
            })
            .collect();
        json!(rows)
    }

    pub fn print(&self) {
        if self.kernels.is_empty() {
            println!("(no timestamp queries on this adapter: no per-kernel GPU times)");
            return;
        }
        let total: f64 = self.kernels.values().map(|(ns, _)| ns).sum();
        println!("| kernel | GPU µs/token | share | dispatches/token |");
        println!("| --- | ---: | ---: | ---: |");
        let mut rows: Vec<_> = self.families().into_iter().collect();
        rows.sort_by(|a, b| b.1 .0.total_cmp(&a.1 .0));
        for (family, (ns, count)) in rows {
            println!(
                "| {family} | {:.1} | {:.1}% | {:.2} |",
                self.per_token(ns / 1e3),
                100.0 * ns / total,
                self.per_token(count as f64)
            );
        }
        println!(
            "| total (profiled, one pass per dispatch) | {:.1} | | |",
            self.per_token(total / 1e3)
        );
        println!("| kernel | grid | GPU µs/token | µs/dispatch | dispatches/token |");
        println!("| --- | --- | ---: | ---: | ---: |");
        for ((family, grid), (ns, count)) in self.grids_by_time().into_iter().take(GRIDS_PRINTED) {
            println!(
                "| {family} | {}×{}×{} | {:.1} | {:.2} | {:.2} |",
                grid[0],
                grid[1],
                grid[2],
                self.per_token(ns / 1e3),
                ns / 1e3 / (*count).max(1) as f64,
                self.per_token(*count as f64)
            );
        }
    }
}
