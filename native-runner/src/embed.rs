//! `runner embed`: one embedding per text, pooled and optionally normalised as llama.cpp does.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{anyhow, bail, Context};
use serde_json::json;
use webshard::embed::{EmbedOptions, Embedder, Pooling};
use webshard::gguf::open_source;
use webshard::gpu::Gpu;

use crate::model_args::ModelArgs;

/// Largest `--file` accepted: one text per line.
const MAX_FILE_BYTES: u64 = 64 << 20;

#[derive(clap::Args, Debug)]
pub struct EmbedArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// mean, cls or last (default: the model's `*.pooling_type`).
    #[arg(long, value_parser = parse_pooling)]
    pub pooling: Option<Pooling>,
    /// Divide each embedding by its Euclidean norm.
    #[arg(long)]
    pub normalize: bool,
    /// Read the texts from this file, one per line (empty lines skipped).
    #[arg(long, conflicts_with = "texts")]
    pub file: Option<PathBuf>,
    /// One JSON object: {"model", "pooling", "normalize", "dimensions", "data": [{"index",
    /// "tokens", "ids", "embedding"}]}.
    #[arg(long)]
    pub json: bool,
    /// The texts to embed.
    #[arg(required_unless_present = "file")]
    pub texts: Vec<String>,
}

fn parse_pooling(name: &str) -> Result<Pooling, String> {
    Pooling::parse(name).ok_or_else(|| format!("`{name}`: want mean, cls or last"))
}

/// The texts of `--file`, one per non-empty line.
fn read_texts(path: &PathBuf) -> anyhow::Result<Vec<String>> {
    let size = std::fs::metadata(path)
        .with_context(|| format!("reading {}", path.display()))?
        .len();
    if size > MAX_FILE_BYTES {
        bail!(
            "{}: {size} bytes, more than the limit of {MAX_FILE_BYTES}",
            path.display()
        );
    }
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading {} (UTF-8 text expected)", path.display()))?;
    Ok(text
        .lines()
        .filter(|line| !line.trim().is_empty())
        .map(str::to_owned)
        .collect())
}

pub async fn embed(args: &EmbedArgs) -> anyhow::Result<()> {
    let texts = match &args.file {
        Some(path) => read_texts(path)?,
        None => args.texts.clone(),
    };
    if texts.is_empty() {
        bail!("no text to embed");
    }
    let gpu = Gpu::new(&args.model.gpu_options()?).await?;
    let source = open_source(&args.model.model)
        .await
        .with_context(|| format!("opening {}", args.model.model))?;
    let embedder = Embedder::load(
        Arc::clone(&gpu),
        source.as_ref(),
        args.model.ctx,
        &mut |_| {},
    )
    .await
    .with_context(|| format!("loading {}", args.model.model))?;
    let pooling = match args.pooling {
        Some(p) => p,
        None => embedder.default_pooling()?,
    };
    let options = EmbedOptions {
        pooling: Some(pooling),
        normalize: args.normalize,
    };
    let vectors = embedder
        .embed(&texts, options)
        .await
        .map_err(|err| anyhow!(err))?;
    if args.json {
        let data: Vec<_> = vectors
            .iter()
            .enumerate()
            .map(|(index, v)| {
                let ids = embedder.tokenize(&texts[index]);
                json!({ "index": index, "tokens": ids.len(), "ids": ids, "embedding": v })
            })
            .collect();
        let out = json!({
            "model": args.model.model,
            "pooling": pooling.name(),
            "normalize": args.normalize,
            "dimensions": embedder.dimensions(),
            "data": data,
        });
        println!("{out}");
        return Ok(());
    }
    for vector in &vectors {
        let cells: Vec<String> = vector.iter().map(|x| format!("{x:.6}")).collect();
        println!("{}", cells.join(" "));
    }
    Ok(())
}
