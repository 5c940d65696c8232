//! `runner bench`: prompt processing and generation throughput, as llama-bench measures them
//! (pp: one batch of random tokens, logits for the last only; tg: tokens one at a time from an
//! empty cache), plus load time and peak host memory.

use std::time::Instant;

use serde_json::json;
use webshard::engine::Engine;
use webshard::model::StageInput;

use crate::bench_batch::{batch_rates, profile_batch};
use crate::bench_embed::{bench_embed, EmbedBench};
use crate::bench_mask::{mask_cost, MaskCost};
use crate::bench_spec::{spec_bench, SpecBench};
use crate::bench_stage::{bench_stage, parse_layer_range, StageReport};
use crate::constraint_args::ConstraintArgs;
use crate::info::{model_label, parameter_count, quantization};
use crate::memory;
use crate::model_args::ModelArgs;
use crate::profile::{profile_decode, profile_prefill, DecodeProfile, KernelTable};
use crate::spec_args::SpecArgs;

#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Prompt tokens (0 skips the test).
    #[arg(short = 'p', long, default_value_t = 512)]
    pub prompt: u32,
    /// Generated tokens (0 skips the test).
    #[arg(short = 'n', long, default_value_t = 128)]
    pub n: u32,
    /// Repetitions of each test.
    #[arg(short = 'r', long, default_value_t = 5)]
    pub repetitions: u32,
    /// Also time decode without the output head, to report the head's share of a token.
    #[arg(long)]
    pub head_share: bool,
    /// Also print, per token, GPU time by kernel family (timestamp queries), dispatches,
    /// submits, host syncs and host time.
    #[arg(long)]
    pub profile: bool,
    #[arg(long)]
    pub json: bool,
    /// Also measure a constraint's mask cost per token over `-n` constrained tokens.
    #[command(flatten)]
    pub constraint: ConstraintArgs,
    /// Also time `-n` greedy tokens after this file's text (as a user message), plain and,
    /// with --spec, speculative: decode rates, acceptance, and whether the ids agree.
    #[arg(long)]
    pub prompt_file: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub spec: SpecArgs,
    /// Measure embedding throughput instead (sequences/s at each `--embed-batch`, inputs of
    /// `--embed-tokens` random ids): an encoder (bert) or a decoder's pooled hidden states.
    #[arg(long)]
    pub embed: bool,
    /// Tokens per input for `--embed`.
    #[arg(long, default_value_t = 128, value_parser = clap::value_parser!(u32).range(1..))]
    pub embed_tokens: u32,
    /// Batch sizes for `--embed`, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = [1, 8, 64])]
    pub embed_batch: Vec<u32>,
    /// Also time `-n` decode steps of a donor's stage over layers `A..B` (its step path in
    /// this process, with 1 and 4 requests in KV slots), split into host phases, beside the
    /// engine's decode of the same model.
    #[arg(long, value_parser = parse_layer_range)]
    pub stage_steps: Option<std::ops::Range<u32>>,
    /// Also time `-n` batched greedy steps of this many sequences at once (comma-separated),
    /// as `runner serve` runs them: aggregate tok/s per count (with --profile, GPU time per
    /// kernel family of one step at each count).
    #[arg(long, value_delimiter = ',', value_parser = clap::value_parser!(u32).range(1..=256))]
    pub batch_rows: Vec<u32>,
}

/// Mean and sample standard deviation.
pub(crate) fn mean_sd(values: &[f64]) -> (f64, f64) {
    let n = values.len() as f64;
    let mean = values.iter().sum::<f64>() / n;
    let var = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0).max(1.0);
    (mean, var.sqrt())
}

pub(crate) fn random_ids(count: u32, vocab: u32, seed: u64) -> Vec<u32> {
    let mut state = seed | 1;
    (0..count)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % u64::from(vocab)) as u32
        })
        .collect()
}

pub(crate) async fn prompt_rate(
    engine: &mut Engine,
    tokens: u32,
    seed: u64,
) -> anyhow::Result<f64> {
    let ids = random_ids(tokens, engine.model.cfg.vocab, seed);
    let started = Instant::now();
    engine.evaluate(&ids).await?;
    Ok(f64::from(tokens) / started.elapsed().as_secs_f64())
}

/// Greedy decode from an empty cache, each token fed back on the GPU as `runner generate
/// --temp 0` does.
pub(crate) async fn generation_rate(engine: &mut Engine, tokens: u32) -> anyhow::Result<f64> {
    engine.reset();
    let token = engine.text.tokenizer.bos_id().unwrap_or(0);
    let started = Instant::now();
    let mut decoder = engine
        .stage
        .greedy_decoder(token, 0, engine.decode_depth())?;
    for _ in 0..tokens {
        decoder.next().await?;
    }
    Ok(f64::from(tokens) / started.elapsed().as_secs_f64())
}

/// Decode rate of the layers alone: the same steps as `generation_rate`, stopping before the
/// final norm, head and argmax (the residual stream is read back instead, d_model floats).
async fn layers_only_rate(engine: &mut Engine, tokens: u32) -> anyhow::Result<f64> {
    engine.reset();
    let token = engine.text.tokenizer.bos_id().unwrap_or(0);
    let started = Instant::now();
    for position in 0..tokens {
        let input = [token];
        engine
            .stage
            .forward_hidden(&StageInput::Tokens(&input), position)
            .await?;
    }
    Ok(f64::from(tokens) / started.elapsed().as_secs_f64())
}

pub async fn bench(args: &BenchArgs) -> anyhow::Result<()> {
    if args.embed {
        let embed = EmbedBench {
            model: &args.model,
            tokens: args.embed_tokens,
            batches: &args.embed_batch,
            repetitions: args.repetitions,
            json: args.json,
        };
        return bench_embed(&embed).await;
    }
    let constraint = args.constraint.spec()?;
    let (mut engine, load) = args.model.load().await?;
    // One warm-up of each test compiles every pipeline before timing.
    if args.prompt > 0 {
        let tokens = args.prompt.min(engine.stage.spec.max_context);
        prompt_rate(&mut engine, tokens, 7).await?;
    }
    if args.n > 0 {
        generation_rate(&mut engine, 4).await?;
    }
    let mut tests = Vec::new();
    if args.prompt > 0 {
        let mut rates = Vec::new();
        for r in 0..args.repetitions {
            rates.push(prompt_rate(&mut engine, args.prompt, u64::from(r) + 11).await?);
        }
        tests.push((format!("pp{}", args.prompt), mean_sd(&rates)));
    }
    if args.n > 0 {
        let mut rates = Vec::new();
        for _ in 0..args.repetitions {
            rates.push(generation_rate(&mut engine, args.n).await?);
        }
        tests.push((format!("tg{}", args.n), mean_sd(&rates)));
    }
    if args.head_share && args.n > 0 {
        let mut rates = Vec::new();
        for _ in 0..args.repetitions {
            rates.push(layers_only_rate(&mut engine, args.n).await?);
        }
        tests.push((format!("tg{}-layers-only", args.n), mean_sd(&rates)));
    }
    if args.n > 0 && !args.batch_rows.is_empty() {
        tests.extend(batch_rates(&engine, &args.batch_rows, args.n, args.repetitions).await?);
    }
    let mut batch_profiles = Vec::new();
    if args.profile && args.n > 0 {
        for &rows in &args.batch_rows {
            batch_profiles.push((rows, profile_batch(&engine, rows, args.n).await?));
        }
    }
    let profile = match (args.profile, args.n) {
        (true, n) if n > 0 => Some(profile_decode(&mut engine, n).await?),
        _ => None,
    };
    let prefill_profile = match (args.profile, args.prompt) {
        (true, p) if p > 0 => Some(profile_prefill(&mut engine, p).await?),
        _ => None,
    };
    let mask = match (&constraint, args.n) {
        (Some(spec), n) if n > 0 => Some(mask_cost(&mut engine, spec, n, args.repetitions).await?),
        _ => None,
    };
    let spec = match (&args.prompt_file, args.n) {
        (Some(path), n) if n > 0 => {
            let text = std::fs::read_to_string(path)
                .map_err(|err| anyhow::anyhow!("--prompt-file {}: {err}", path.display()))?;
            let config = args.spec.config();
            Some(spec_bench(&mut engine, &text, n, args.repetitions, config).await?)
        }
        _ => None,
    };
    if let Some(spec) = &spec {
        let name = format!("tg{}-file", args.n);
        tests.push((name.clone(), mean_sd(&spec.plain)));
        if !spec.spec.is_empty() {
            tests.push((format!("{name}-spec"), mean_sd(&spec.spec)));
        }
    }
    let stage = match (&args.stage_steps, args.n) {
        (Some(layers), n) if n > 0 => {
            Some(bench_stage(&mut engine, &args.model.model, layers.clone(), n).await?)
        }
        _ => None,
    };
    let caps = &engine.stage.gpu.caps;
    let variant = engine.stage.gpu.variant();
    let resident = memory::resident_peak().unwrap_or(0);
    let parameters = parameter_count(&engine.model.header);
    let weight_bytes: u64 = engine.model.header.tensors.iter().map(|t| t.bytes).sum();
    let model_type = model_label(
        engine.model.cfg.arch.name(),
        parameters,
        &quantization(&engine.model.header)?,
    );
    if args.json {
        let rows: Vec<_> = tests
            .iter()
            .map(|(name, (mean, sd))| json!({ "test": name, "tok_s": mean, "sd": sd }))
            .collect();
        let value = json!({
            "model": args.model.model, "architecture": engine.model.cfg.arch.name(),
            "model_type": model_type, "model_size": weight_bytes, "model_n_params": parameters,
            "adapter": caps.adapter, "backend": caps.backend, "variant": variant.to_string(),
            "load_seconds": load.seconds, "load_bytes": load.bytes,
            "peak_heap_bytes_during_load": load.peak_heap_bytes, "peak_resident_bytes": resident,
            "repetitions": args.repetitions, "tests": rows,
            "profile": profile.as_ref().map(DecodeProfile::to_json),
            "prefill_profile": prefill_profile.as_ref().map(KernelTable::to_json),
            "prefill_grids": prefill_profile.as_ref().map(KernelTable::grids_json),
            "mask": mask.map(MaskCost::to_json),
            "spec": spec.as_ref().map(SpecBench::to_json),
            "stage_steps": stage.as_ref().map(StageReport::to_json),
            "batch_profiles": batch_profiles
                .iter()
                .map(|(rows, table)| json!({ "rows": rows, "kernels": table.to_json(),
                                             "grids": table.grids_json() }))
                .collect::<Vec<_>>(),
        });
        println!("{value}");
        return Ok(());
    }
    println!("| model | size | params | adapter | backend | variant | test | t/s |");
    println!("| --- | ---: | ---: | --- | --- | --- | --- | ---: |");
    for (name, (mean, sd)) in &tests {
        println!(
            "| {model_type} | {:.2} MiB | {:.2} M | {} | {} | {variant} | {name} | {mean:.2} ± {sd:.2} |",
            weight_bytes as f64 / f64::from(1 << 20),
            parameters as f64 / 1e6,
            caps.adapter,
            caps.backend
        );
    }
    if let [.., (_, (full, _)), (_, (layers, _))] = tests.as_slice() {
        if args.head_share {
            let share = 1.0 - full / layers;
            println!("output head + argmax: {:.1}% of decode time", share * 100.0);
        }
    }
    if let Some(mask) = mask {
        println!(
            "constraint mask: {:.0} us/token, {:.1}% of a {:.1} ms constrained decode step ({} tokens)",
            mask.mask_us,
            mask.fraction() * 100.0,
            mask.step_ms,
            mask.tokens
        );
    }
    if let Some(spec) = spec.as_ref().filter(|s| !s.spec.is_empty()) {
        println!(
            "speculative: {:.2}x plain, drafted {} accepted {} ({:.0}%) over {} tokens, ids {}",
            mean_sd(&spec.spec).0 / mean_sd(&spec.plain).0,
            spec.spec_totals.drafted,
            spec.spec_totals.accepted,
            spec.acceptance() * 100.0,
            spec.tokens,
            if spec.identical {
                "identical"
            } else {
                "DIFFER"
            }
        );
        println!(
            "speculative runs: {} verification steps of {:.2} ms ({:.0}% of decode time), the pipelined decoder started {} times",
            spec.spec_totals.verifications,
            spec.verify_ms(),
            spec.verify_share() * 100.0,
            spec.spec_totals.decoder_starts
        );
    }
    if let Some(profile) = &profile {
        profile.print();
    }
    if let Some(stage) = &stage {
        stage.print();
    }
    for (rows, table) in &batch_profiles {
        println!("batched step profile, {rows} rows (per step):");
        table.print();
    }
    if let Some(table) = &prefill_profile {
        println!("prefill profile over {} tokens:", table.tokens);
        table.print();
    }
    println!(
        "load {:.2} s, {:.1} MB; peak host heap during load {:.1} MB; peak resident {:.1} MB",
        load.seconds,
        load.bytes as f64 / 1e6,
        load.peak_heap_bytes as f64 / 1e6,
        resident as f64 / 1e6
    );
    Ok(())
}
