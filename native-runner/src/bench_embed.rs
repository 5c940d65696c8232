//! `runner bench --embed`: embedding throughput, sequences per second at several batch sizes
//! of equal-length inputs of random token ids (as `llama-embedding` timed over the same
//! batches; docs/perf.md has the commands side by side).

use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use serde_json::json;
use webshard::embed::{EmbedOptions, Embedder};
use webshard::gguf::open_source;
use webshard::gpu::Gpu;

use crate::bench::{mean_sd, random_ids};
use crate::model_args::ModelArgs;

/// What `--embed` measures.
pub struct EmbedBench<'a> {
    pub model: &'a ModelArgs,
    pub tokens: u32,
    pub batches: &'a [u32],
    pub repetitions: u32,
    pub json: bool,
}

/// Sequences per second for one batch of `batch` inputs.
async fn batch_rate(
    embedder: &Embedder,
    batch: u32,
    tokens: u32,
    seed: u64,
) -> anyhow::Result<f64> {
    let inputs: Vec<Vec<u32>> = (0..u64::from(batch))
        .map(|i| random_ids(tokens, embedder.vocab(), seed * 1000 + i))
        .collect();
    let options = EmbedOptions {
        pooling: None,
        normalize: true,
    };
    let started = Instant::now();
    embedder.embed_ids(&inputs, options).await?;
    Ok(f64::from(batch) / started.elapsed().as_secs_f64())
}

pub async fn bench_embed(bench: &EmbedBench<'_>) -> anyhow::Result<()> {
    let gpu = Gpu::new(&bench.model.gpu_options()?).await?;
    let source = open_source(&bench.model.model)
        .await
        .with_context(|| format!("opening {}", bench.model.model))?;
    let started = Instant::now();
    let embedder = Embedder::load(
        Arc::clone(&gpu),
        source.as_ref(),
        bench.model.ctx,
        &mut |_| {},
    )
    .await
    .with_context(|| format!("loading {}", bench.model.model))?;
    let load_seconds = started.elapsed().as_secs_f64();
    let tokens = bench.tokens.min(embedder.context_length());
    // One warm-up compiles every pipeline before timing.
    batch_rate(&embedder, 1, tokens, 1).await?;
    let mut rows = Vec::new();
    for &batch in bench.batches {
        let mut rates = Vec::new();
        for r in 0..bench.repetitions {
            rates.push(batch_rate(&embedder, batch, tokens, u64::from(r) + 2).await?);
        }
        rows.push((batch, mean_sd(&rates)));
    }
    let caps = &gpu.caps;
    let variant = gpu.variant();
    if bench.json {
        let tests: Vec<_> = rows
            .iter()
            .map(|(batch, (mean, sd))| json!({ "batch": batch, "tokens": tokens, "seq_s": mean, "sd": sd }))
            .collect();
        let value = json!({
            "model": bench.model.model, "adapter": caps.adapter, "backend": caps.backend,
            "variant": variant.to_string(), "dimensions": embedder.dimensions(),
            "load_seconds": load_seconds, "repetitions": bench.repetitions, "tests": tests,
        });
        println!("{value}");
        return Ok(());
    }
    println!("| model | adapter | backend | variant | batch | tokens | seq/s |");
    println!("| --- | --- | --- | --- | ---: | ---: | ---: |");
    for (batch, (mean, sd)) in &rows {
        println!(
            "| {} | {} | {} | {variant} | {batch} | {tokens} | {mean:.2} ± {sd:.2} |",
            bench.model.model, caps.adapter, caps.backend
        );
    }
    println!("load {load_seconds:.2} s");
    Ok(())
}
