//! `runner generate` (`runner chat` is in chat.rs).

use std::io::Write;
use std::ops::ControlFlow;

use anyhow::anyhow;
use serde_json::json;
use webshard::front::{GenerateOptions, GenerateRequest, Generated, Generator, Prompt, TokenEvent};
use webshard::sample::SamplerConfig;
use webshard::tokenizer::ChatMessage;

use crate::chat::announce_format;
use crate::constraint_args::ConstraintArgs;
use crate::model_args::ModelArgs;
use crate::progress;
use crate::sampling_args::{parse_max_tokens, SamplerArgs};
use crate::spec_args::SpecArgs;

#[derive(clap::Args, Debug)]
pub struct GenerateArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The prompt; special-token text (e.g. `<|im_start|>`) becomes special tokens.
    #[arg(short = 'p', long)]
    pub prompt: String,
    /// Most tokens to generate.
    #[arg(short = 'n', long, default_value = "128", value_parser = parse_max_tokens, allow_hyphen_values = true)]
    pub n: u32,
    #[command(flatten)]
    pub sampler: SamplerArgs,
    /// Apply the model's chat template to the prompt as a user message.
    #[arg(long)]
    pub chat: bool,
    /// Stop when this text is produced (repeatable).
    #[arg(long)]
    pub stop: Vec<String>,
    /// Print `{"prompt_ids", "ids", "text", "finish_reason"}` instead of streaming text.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub constraint: ConstraintArgs,
    #[command(flatten)]
    pub spec: SpecArgs,
}

pub async fn generate(args: &GenerateArgs) -> anyhow::Result<()> {
    let constraint = args.constraint.spec()?;
    let (mut engine, load) = args.model.load().await?;
    let prompt = match args.chat {
        true => {
            announce_format(&engine, &args.model.model);
            Prompt::Chat(vec![ChatMessage::new("user", args.prompt.as_str())])
        }
        false => Prompt::Text(args.prompt.clone()),
    };
    let prompt_ids = engine.prompt_ids(&prompt)?;
    engine
        .check_fits(prompt_ids.len(), args.n)
        .map_err(|err| anyhow!("{err} (raise --ctx or lower -n)"))?;
    if let Some(bar) = progress::prefill_bar(args.model.quiet) {
        engine.set_prefill_progress(bar);
    }
    let options = GenerateOptions {
        max_tokens: args.n,
        sampler: args.sampler.config(),
        stop: args.stop.clone(),
        constraint,
        logprobs: None,
        speculation: args.spec.config(),
    };
    let stream = !args.json;
    let request = GenerateRequest::new(Prompt::Ids(prompt_ids), options.clone());
    let out = engine
        .generate_one(&request, &mut |event| {
            if stream {
                print_piece(event);
            }
            ControlFlow::Continue(())
        })
        .await?;
    if args.json {
        let value = json!({
            "prompt_ids": out.prompt_ids, "ids": out.ids, "text": out.text,
            "finish_reason": out.finish_reason,
            "drafted": out.timings.drafted, "accepted": out.timings.accepted,
        });
        println!("{value}");
    } else {
        println!();
    }
    eprintln!("{}", timings(Some(load.seconds), &out, &options.sampler));
    Ok(())
}

/// Prints a token's text as it comes.
pub(crate) fn print_piece(event: TokenEvent<'_>) {
    print!("{}", event.text);
    let _ = std::io::stdout().flush();
}

/// One line of timings for stderr: the load (once per run), both phases' rates, and the seed
/// of a sampled run so it can be repeated with `--seed`.
pub(crate) fn timings(
    load_seconds: Option<f64>,
    out: &Generated,
    sampler: &SamplerConfig,
) -> String {
    let rate = |tokens: f64, seconds: f64| if seconds > 0.0 { tokens / seconds } else { 0.0 };
    let mut line = load_seconds.map_or_else(String::new, |s| format!("load {s:.2} s | "));
    let prefill_tokens = out.prefill_tokens();
    line.push_str(&format!(
        "prefill {} tokens {:.1} tok/s | decode {} tokens {:.1} tok/s",
        prefill_tokens,
        rate(f64::from(prefill_tokens), out.timings.prefill_seconds),
        out.ids.len(),
        rate(out.ids.len() as f64, out.timings.decode_seconds),
    ));
    if !sampler.is_greedy() {
        line.push_str(&format!(" | seed {}", sampler.seed));
    }
    if out.timings.drafted > 0 {
        let (drafted, accepted) = (out.timings.drafted, out.timings.accepted);
        let share = f64::from(accepted) * 100.0 / f64::from(drafted);
        line.push_str(&format!(
            " | drafted {drafted} accepted {accepted} ({share:.0}%)"
        ));
    }
    if out.timings.mask_seconds > 0.0 {
        let per_token = out.timings.mask_seconds * 1e6 / out.ids.len().max(1) as f64;
        line.push_str(&format!(" | mask {per_token:.0} us/token"));
    }
    line
}
