//! `runner score` (teacher-forced top-k per position) and `runner tokenize` (header only).

use anyhow::{bail, Context};
use serde_json::json;
use webshard::gguf::{open_source, read_header};
use webshard::tokenizer::Tokenizer;

use crate::model_args::ModelArgs;

#[derive(clap::Args, Debug)]
pub struct ScoreArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Comma-separated token ids.
    #[arg(long, value_delimiter = ',', required = true)]
    pub ids: Vec<u32>,
    /// How many of the highest logits to print per position.
    #[arg(long, default_value_t = 5)]
    pub top: usize,
    #[arg(long)]
    pub json: bool,
}

pub async fn score(args: &ScoreArgs) -> anyhow::Result<()> {
    let (mut engine, _) = args.model.load().await?;
    let logits = engine.score(&args.ids).await?;
    let positions: Vec<_> = logits.iter().map(|row| top_k(row, args.top)).collect();
    if args.json {
        let rows: Vec<_> = positions.iter().map(|top| json!({ "top": top })).collect();
        println!("{}", json!({ "positions": rows }));
        return Ok(());
    }
    for (i, top) in positions.iter().enumerate() {
        let cells: Vec<String> = top
            .iter()
            .map(|(id, logit)| {
                format!("{id}:{:?} {logit:.4}", engine.text.tokenizer.decode(&[*id]))
            })
            .collect();
        println!("{i:>4} {:>8} -> {}", args.ids[i], cells.join("  "));
    }
    Ok(())
}

/// The `k` largest `(id, logit)` pairs, highest first, ties by lower id.
fn top_k(row: &[f32], k: usize) -> Vec<(u32, f32)> {
    let mut indexed: Vec<(u32, f32)> = row
        .iter()
        .enumerate()
        .map(|(i, v)| (i as u32, *v))
        .collect();
    indexed.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    indexed.truncate(k);
    indexed
}

#[derive(clap::Args, Debug)]
pub struct TokenizeArgs {
    /// GGUF model: a file path or an http(s):// URL (only its header is read).
    #[arg(short = 'm', long)]
    pub model: String,
    /// Turn special-token text into special tokens (the `generate` convention).
    #[arg(long)]
    pub parse_special: bool,
    #[arg(long)]
    pub json: bool,
    /// Read the text from this file instead.
    #[arg(long)]
    pub file: Option<std::path::PathBuf>,
    /// The text to tokenize.
    pub text: Option<String>,
}

pub async fn tokenize(args: &TokenizeArgs) -> anyhow::Result<()> {
    let text = match (&args.text, &args.file) {
        (Some(text), None) => text.clone(),
        (None, Some(path)) => {
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?
        }
        _ => bail!("give the text either as an argument or with --file, not both"),
    };
    let source = open_source(&args.model).await?;
    let header = read_header(source.as_ref()).await?;
    let tokenizer = Tokenizer::from_metadata(&header.metadata)?;
    let ids = tokenizer.encode(&text, true, args.parse_special);
    if args.json {
        println!("{}", json!({ "ids": ids }));
    } else {
        for id in &ids {
            println!("{id:>8} {:?}", tokenizer.decode(&[*id]));
        }
    }
    Ok(())
}
