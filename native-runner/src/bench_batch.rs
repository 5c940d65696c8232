//! `runner bench --batch-rows 1,4,16`: the serving scheduler's greedy step without HTTP. `R`
//! sequences in the seats of the KV pool `runner serve` builds (`api::pool`) decode together for `-n` steps, each step's argmax
//! fed to the next on the device and the next step submitted before this one is read (what
//! `runner serve` does while every running request is greedy): aggregate tok/s per `R`, and
//! with `--profile` the GPU time per kernel family of one such step.

use std::time::Instant;

use webshard::engine::Engine;
use webshard::model::batch::{BatchRow, RowTokens};
use webshard::model::Stage;
use webshard::ops::attention::KvCache;

use crate::api::pool::KvPool;
use crate::bench::mean_sd;
use crate::profile::{timed_kernels, KernelTable};

/// Seconds for `steps` chained greedy steps over one row per cache, from position 0.
async fn chained_steps<'a>(
    stage: &Stage,
    caches: &[&'a KvCache],
    steps: u32,
) -> anyhow::Result<f64> {
    let vocab = stage.cfg.vocab;
    let rows_at = |position: u32| -> Vec<BatchRow> {
        let row = |(index, &cache): (usize, &&'a KvCache)| BatchRow {
            token: (index as u32 * 7919 + 13) % vocab,
            position,
            cache,
        };
        caches.iter().enumerate().map(row).collect()
    };
    let started = Instant::now();
    let mut pending = stage.submit_batch_argmax(&rows_at(0), RowTokens::Given)?;
    for position in 1..steps {
        let next = stage.submit_batch_argmax(&rows_at(position), RowTokens::FedBack)?;
        pending.wait(stage).await?;
        pending = next;
    }
    pending.wait(stage).await?;
    Ok(started.elapsed().as_secs_f64())
}

/// Aggregate decode tok/s (mean, sd over `repetitions`) of `steps` chained steps at each row
/// count, after one unmeasured run of each (pipelines are built on a shape's first step).
pub async fn batch_rates(
    engine: &Engine,
    row_counts: &[u32],
    steps: u32,
    repetitions: u32,
) -> anyhow::Result<Vec<(String, (f64, f64))>> {
    let stage = &engine.stage;
    let steps = steps.min(stage.spec.max_context);
    let mut tests = Vec::new();
    for &rows in row_counts {
        let pool = serving_pool(stage, rows, steps)?;
        let caches = seats(&pool, rows);
        chained_steps(stage, &caches, steps.min(4)).await?;
        let mut rates = Vec::new();
        for _ in 0..repetitions {
            let seconds = chained_steps(stage, &caches, steps).await?;
            rates.push(f64::from(rows * steps) / seconds);
        }
        tests.push((format!("tg{steps}-rows{rows}"), mean_sd(&rates)));
    }
    Ok(tests)
}

/// GPU time by kernel family of `steps` chained steps of `rows` rows (per step).
pub async fn profile_batch(engine: &Engine, rows: u32, steps: u32) -> anyhow::Result<KernelTable> {
    let stage = &engine.stage;
    let steps = steps.min(stage.spec.max_context);
    let pool = serving_pool(stage, rows, steps)?;
    let caches = seats(&pool, rows);
    let run = async {
        chained_steps(stage, &caches, steps).await?;
        Ok(0.0)
    };
    timed_kernels(&stage.gpu, steps, run).await
}

/// The KV pool `runner serve` would build for `rows` sequences, every seat claimed with room
/// for `steps` positions.
fn serving_pool(stage: &Stage, rows: u32, steps: u32) -> anyhow::Result<KvPool> {
    let mut pool = KvPool::new(stage, rows as usize)?;
    for index in 0..rows {
        let claimed = pool.claim(&stage.gpu, &[index], steps as usize + 1);
        claimed.ok_or_else(|| anyhow::anyhow!("the pool has no room for row {index}"))?;
    }
    Ok(pool)
}

fn seats(pool: &KvPool, rows: u32) -> Vec<&KvCache> {
    (0..rows as usize).map(|seat| pool.cache(seat)).collect()
}
