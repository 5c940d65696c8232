//! Arguments shared by the commands that run a model, and loading it with a progress bar.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{anyhow, Context};
use indicatif::{ProgressBar, ProgressStyle};
use webshard::engine::{Engine, EngineOptions};
use webshard::gguf::open_source;
use webshard::gpu::{BackendChoice, Gpu, GpuOptions};
use webshard::ops::quant::MatmulTile;

use crate::memory;

#[derive(clap::Args, Debug, Clone)]
pub struct ModelArgs {
    /// GGUF model: a file path or an http(s):// URL.
    #[arg(short = 'm', long)]
    pub model: String,
    /// GPU backend: auto, vulkan, gl, metal, dx12.
    #[arg(long, default_value = "auto")]
    pub backend: String,
    /// Use the f32 kernels even where the device has shader-f16.
    #[arg(long)]
    pub no_f16: bool,
    /// Do not use subgroup operations.
    #[arg(long)]
    pub no_subgroups: bool,
    /// Longest context the KV cache holds.
    #[arg(long, default_value_t = 4096)]
    pub ctx: u32,
    /// Cap storage bindings at this many bytes (tensors larger are split).
    #[arg(long)]
    pub max_binding: Option<u64>,
    /// Matvec work split `LANES,LANES_PER_ROW,ROWS_PER_LANE` instead of the built-in one
    /// (for measuring splits; powers of two, LANES_PER_ROW <= LANES <= 256).
    #[arg(long, value_parser = parse_matvec_split, hide = true)]
    pub matvec_split: Option<[u32; 3]>,
    /// Matvec work split of batched steps (several tokens) `LANES,LANES_PER_ROW,ROWS_PER_LANE,
    /// TOKENS` (tokens per workgroup, 1 to 8) instead of the built-in one (for measuring it).
    #[arg(long, value_parser = parse_matvec_batch_split, hide = true)]
    pub matvec_batch_split: Option<[u32; 4]>,
    /// Prefill tile `ROWS,TOKENS,STAGED_COLS[,LANE]` instead of the built-in one (for measuring
    /// tiles; LANE outputs each way per lane, 4 or 8, default 4; a tile the device cannot hold
    /// falls back).
    #[arg(long, value_parser = parse_matmul_tile, hide = true)]
    pub matmul_tile: Option<[u32; 4]>,
    /// `TOKENS,MIB`: products of at least TOKENS tokens (a batched step's rows) with matrices
    /// of at least MIB MiB read the weights once, through the prefill product, instead of once
    /// per token (for measuring the crossover; built in: 12 tokens, 16 MiB).
    #[arg(long, value_parser = parse_streamed_products, hide = true)]
    pub streamed_products: Option<[u64; 2]>,
    /// Most workgroups along K of a cooperative-matrix product (1: never split) instead of the
    /// built-in rule (for measuring it).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=64), hide = true)]
    pub coop_k_splits: Option<u32>,
    /// Most tokens multiplied one product per token (a batched step's rows) instead of the
    /// built-in crossover; more read the weights once (for measuring it; 1: always once).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=64), hide = true)]
    pub per_token_products: Option<u32>,
    /// Decode products on 8-bit integers: `off`, `batched` (steps of several tokens only) or
    /// `decode` (every step, one token's too), instead of the built-in choice (for measuring it).
    #[arg(long, value_parser = parse_int8_products, hide = true)]
    pub int8_products: Option<webshard::gpu::Int8Products>,
    /// Work split of the integer products `LANES,LANES_PER_ROW,TOKENS` (tokens per workgroup
    /// at most, 4 to 16) instead of the built-in one (for measuring it).
    #[arg(long, value_parser = parse_int8_split, hide = true)]
    pub int8_split: Option<[u32; 3]>,
    /// Feed prompt chunks shorter than this one token at a time instead of the built-in
    /// crossover (for measuring it; 0 always batches).
    #[arg(long, hide = true)]
    pub per_token_prefill_below: Option<usize>,
    /// Greedy decoding steps kept in flight instead of the built-in 2 (for measuring it).
    #[arg(long, value_parser = clap::value_parser!(u8).range(1..=webshard::model::decode::MAX_DEPTH as i64), hide = true)]
    pub decode_depth: Option<u8>,
    /// No progress bar while loading or processing the prompt.
    #[arg(long)]
    pub quiet: bool,
    /// GPU memory the model may use, MiB (wgpu does not report memory): a model whose
    /// weights, KV cache at --ctx and scratch need more is refused before any download.
    #[arg(long)]
    pub gpu_mem_mib: Option<u64>,
}

/// How a load went, for timings and `runner bench`.
#[derive(Debug, Clone, Copy)]
pub struct LoadReport {
    pub seconds: f64,
    pub bytes: u64,
    pub peak_heap_bytes: u64,
}

impl ModelArgs {
    pub fn gpu_options(&self) -> anyhow::Result<GpuOptions> {
        let backend = BackendChoice::parse(&self.backend).ok_or_else(|| {
            anyhow!(
                "unknown backend `{}` (auto, vulkan, gl, metal, dx12)",
                self.backend
            )
        })?;
        Ok(GpuOptions {
            backend,
            disable_f16: self.no_f16,
            disable_subgroups: self.no_subgroups,
            max_binding_override: self.max_binding,
            gpu_work_split: false,
            matvec_split: self.matvec_split,
            matvec_batch_split: self.matvec_batch_split,
            matmul_tile: self.matmul_tile,
            streamed_products: self.streamed_products,
            coop_k_splits: self.coop_k_splits,
            per_token_products: self.per_token_products,
            int8_products: self.int8_products,
            int8_split: self.int8_split,
            storage_bindings_limit: None,
        })
    }

    /// Opens the model, streams it into the GPU with a progress bar on stderr.
    pub async fn load(&self) -> anyhow::Result<(Engine, LoadReport)> {
        let started = Instant::now();
        memory::reset_peak();
        let gpu = Gpu::new(&self.gpu_options()?).await?;
        let source = open_source(&self.model)
            .await
            .with_context(|| format!("opening {}", self.model))?;
        let bar = self.progress_bar();
        let mut bytes = 0;
        let options = EngineOptions {
            max_context: self.ctx,
            gpu_budget_bytes: self.gpu_mem_mib.map(|mib| mib.saturating_mul(1 << 20)),
            ..Default::default()
        };
        let mut engine = Engine::load(Arc::clone(&gpu), source.as_ref(), &options, &mut |p| {
            bar.set_length(p.bytes_total);
            bar.set_position(p.bytes_done);
            bar.set_message(p.tensor.to_string());
            bytes = p.bytes_done;
        })
        .await
        .with_context(|| format!("loading {}", self.model))?;
        bar.finish_and_clear();
        if let Some(tokens) = self.per_token_prefill_below {
            engine.set_per_token_prefill_below(tokens);
        }
        if let Some(depth) = self.decode_depth {
            engine.set_decode_depth(depth.into());
        }
        let report = LoadReport {
            seconds: started.elapsed().as_secs_f64(),
            bytes,
            peak_heap_bytes: memory::peak(),
        };
        tracing::info!(
            adapter = %gpu.caps.adapter, variant = %gpu.variant(), seconds = report.seconds,
            bytes, peak_heap = report.peak_heap_bytes, "model loaded"
        );
        Ok((engine, report))
    }

    fn progress_bar(&self) -> ProgressBar {
        if self.quiet {
            return ProgressBar::hidden();
        }
        let bar = ProgressBar::new(0);
        bar.set_style(
            ProgressStyle::with_template(
                "{bar:30} {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta} {wide_msg}",
            )
            .expect("valid progress template"),
        );
        bar
    }
}

/// Comma-separated numbers.
fn parse_numbers(text: &str) -> Result<Vec<u32>, String> {
    text.split(',')
        .map(|part| part.trim().parse::<u32>())
        .collect::<Result<_, _>>()
        .map_err(|err| format!("`{text}`: {err}"))
}

/// Three comma-separated numbers, named by `names` in the error.
fn parse_three(text: &str, names: &str) -> Result<[u32; 3], String> {
    <[u32; 3]>::try_from(parse_numbers(text)?)
        .map_err(|_| format!("`{text}`: want three numbers {names}"))
}

/// `LANES,LANES_PER_ROW,ROWS_PER_LANE`, each a power of two, lanes per row at most the lanes,
/// at most 256 lanes and 8 rows per lane.
fn parse_matvec_split(text: &str) -> Result<[u32; 3], String> {
    let [lanes, per_row, rows] = parse_three(text, "LANES,LANES_PER_ROW,ROWS_PER_LANE")?;
    let valid = [lanes, per_row, rows].iter().all(|n| n.is_power_of_two())
        && per_row <= lanes
        && lanes <= 256
        && rows <= 8;
    if !valid {
        return Err(format!(
            "`{text}`: each must be a power of two, LANES_PER_ROW <= LANES <= 256, ROWS_PER_LANE <= 8"
        ));
    }
    Ok([lanes, per_row, rows])
}

/// `TOKENS,MIB` as `[tokens, bytes]`.
pub(crate) fn parse_streamed_products(text: &str) -> Result<[u64; 2], String> {
    let numbers: Vec<u64> = text
        .split(',')
        .map(|n| n.trim().parse::<u64>())
        .collect::<Result<_, _>>()
        .map_err(|_| format!("`{text}` is not TOKENS,MIB (two whole numbers)"))?;
    match numbers[..] {
        [tokens, mib] if (1..=4096).contains(&tokens) && mib <= 1 << 20 => Ok([tokens, mib << 20]),
        [_, _] => Err(format!(
            "`{text}`: TOKENS is 1..=4096 and MIB at most 1048576"
        )),
        _ => Err(format!("`{text}` is not TOKENS,MIB (two whole numbers)")),
    }
}

pub(crate) fn parse_matvec_batch_split(text: &str) -> Result<[u32; 4], String> {
    let (split, tokens) = text
        .rsplit_once(',')
        .filter(|(split, _)| split.matches(',').count() == 2)
        .ok_or_else(|| {
            format!("`{text}`: want four numbers LANES,LANES_PER_ROW,ROWS_PER_LANE,TOKENS")
        })?;
    let [lanes, per_row, rows] = parse_matvec_split(split)?;
    match tokens.trim().parse::<u32>() {
        Ok(tokens) if (1..=8).contains(&tokens) && tokens.is_power_of_two() => {
            Ok([lanes, per_row, rows, tokens])
        }
        _ => Err(format!("`{text}`: TOKENS must be 1, 2, 4 or 8")),
    }
}

pub(crate) fn parse_int8_products(text: &str) -> Result<webshard::gpu::Int8Products, String> {
    use webshard::gpu::Int8Products;
    match text {
        "off" => Ok(Int8Products::Off),
        "batched" => Ok(Int8Products::Batched),
        "decode" => Ok(Int8Products::Decode),
        _ => Err(format!("`{text}`: want `off`, `batched` or `decode`")),
    }
}

/// `LANES,LANES_PER_ROW,TOKENS`, a split the integer products can run.
pub(crate) fn parse_int8_split(text: &str) -> Result<[u32; 3], String> {
    match parse_numbers(text)?[..] {
        [lanes, per_row, tokens]
            if webshard::ops::quant::valid_int8_split([lanes, per_row, tokens]) =>
        {
            Ok([lanes, per_row, tokens])
        }
        _ => Err(format!(
            "`{text}`: want LANES,LANES_PER_ROW,TOKENS: powers of two, LANES at most 256, \
             LANES_PER_ROW at most LANES and at least TOKENS / 4, TOKENS 4, 8, 12 or 16"
        )),
    }
}

/// `ROWS,TOKENS,STAGED_COLS[,LANE]`, a tile the kernel can run.
fn parse_matmul_tile(text: &str) -> Result<[u32; 4], String> {
    let numbers = match parse_numbers(text)?[..] {
        [rows, tokens, staged] => [rows, tokens, staged, 4],
        [rows, tokens, staged, lane] => [rows, tokens, staged, lane],
        _ => return Err(format!("`{text}`: want ROWS,TOKENS,STAGED_COLS[,LANE]")),
    };
    MatmulTile::new(numbers)
        .check()
        .map_err(|why| format!("`{text}`: {why}"))?;
    Ok(numbers)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matmul_tiles_take_three_or_four_numbers_and_must_run() {
        assert_eq!(parse_matmul_tile("32,64,32"), Ok([32, 64, 32, 4]));
        assert_eq!(parse_matmul_tile("32, 32, 32, 8"), Ok([32, 32, 32, 8]));
        let wrong_lane = parse_matmul_tile("32,32,32,6").unwrap_err();
        assert!(wrong_lane.contains("4 or 8"), "{wrong_lane}");
        let not_a_multiple = parse_matmul_tile("16,12,32,8").unwrap_err();
        assert!(
            not_a_multiple.contains("multiples of 8"),
            "{not_a_multiple}"
        );
        assert!(parse_matmul_tile("32,32").is_err());
        assert!(parse_matmul_tile("32,32,32,8,1").is_err());
        assert!(parse_matmul_tile("32,x,32").is_err());
    }

    #[test]
    fn batch_splits_take_four_numbers_with_a_power_of_two_tokens() {
        assert_eq!(parse_streamed_products("16,0"), Ok([16, 0]));
        assert_eq!(parse_streamed_products("12, 16"), Ok([12, 16 << 20]));
        assert!(parse_streamed_products("0,16").is_err());
        assert!(parse_streamed_products("16").is_err());
        assert!(parse_streamed_products("16,x").is_err());
        assert_eq!(parse_matvec_batch_split("128,16,1,4"), Ok([128, 16, 1, 4]));
        let three = parse_matvec_batch_split("128,16,1").unwrap_err();
        assert!(three.contains("four numbers"), "{three}");
        let tokens = parse_matvec_batch_split("128,16,1,3").unwrap_err();
        assert!(tokens.contains("1, 2, 4 or 8"), "{tokens}");
        assert!(parse_matvec_batch_split("128,256,1,2").is_err());
        assert!(parse_matvec_batch_split("128,16,1,16").is_err());
    }
}
