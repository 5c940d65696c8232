//! `runner generate` and `runner chat`.

use std::io::{BufRead, Write};
use std::ops::ControlFlow;

use anyhow::Context;
use serde_json::json;
use webshard::engine::Engine;
use webshard::front::{GenerateOptions, GenerateRequest, Generated, Generator, Prompt, TokenEvent};
use webshard::sample::ConstraintSpec;
use webshard::tokenizer::ChatMessage;

use crate::constraint_args::ConstraintArgs;
use crate::model_args::{ModelArgs, SamplerArgs};

#[derive(clap::Args, Debug)]
pub struct GenerateArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The prompt; special-token text (e.g. `<|im_start|>`) becomes special tokens.
    #[arg(short = 'p', long)]
    pub prompt: String,
    /// Most tokens to generate.
    #[arg(short = 'n', long, default_value_t = 128)]
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
}

pub async fn generate(args: &GenerateArgs) -> anyhow::Result<()> {
    let constraint = args.constraint.spec()?;
    let (mut engine, load) = args.model.load().await?;
    let prompt = match args.chat {
        true => Prompt::Chat(vec![ChatMessage::new("user", args.prompt.as_str())]),
        false => Prompt::Text(args.prompt.clone()),
    };
    let options = GenerateOptions {
        max_tokens: args.n,
        sampler: args.sampler.config(),
        stop: args.stop.clone(),
        constraint,
    };
    let stream = !args.json;
    let request = GenerateRequest::new(prompt, options);
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
        });
        println!("{value}");
    } else {
        println!();
    }
    eprintln!("{}", timings(load.seconds, &out));
    Ok(())
}

/// Prints a token's text as it comes.
fn print_piece(event: TokenEvent<'_>) {
    print!("{}", event.text);
    let _ = std::io::stdout().flush();
}

/// One line of timings for stderr.
fn timings(load_seconds: f64, out: &Generated) -> String {
    let rate = |tokens: f64, seconds: f64| if seconds > 0.0 { tokens / seconds } else { 0.0 };
    let prefill_tokens = out.prefill_tokens();
    let line = format!(
        "load {load_seconds:.2} s | prefill {} tokens {:.1} tok/s | decode {} tokens {:.1} tok/s",
        prefill_tokens,
        rate(f64::from(prefill_tokens), out.timings.prefill_seconds),
        out.ids.len(),
        rate(out.ids.len() as f64, out.timings.decode_seconds),
    );
    match out.timings.mask_seconds > 0.0 {
        true => format!(
            "{line} | mask {:.0} us/token",
            out.timings.mask_seconds * 1e6 / out.ids.len().max(1) as f64
        ),
        false => line,
    }
}

#[derive(clap::Args, Debug)]
pub struct ChatArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Most tokens per reply.
    #[arg(short = 'n', long, default_value_t = 512)]
    pub n: u32,
    #[command(flatten)]
    pub sampler: SamplerArgs,
    /// A system message to start the conversation with.
    #[arg(long)]
    pub system: Option<String>,
    /// Every reply is constrained.
    #[command(flatten)]
    pub constraint: ConstraintArgs,
}

/// An interactive conversation; the KV cache keeps the conversation so far, so each turn only
/// prefills what is new.
pub async fn chat(args: &ChatArgs) -> anyhow::Result<()> {
    let constraint = args.constraint.spec()?;
    let (mut engine, _) = args.model.load().await?;
    let mut messages = Vec::new();
    if let Some(system) = &args.system {
        messages.push(ChatMessage::new("system", system.as_str()));
    }
    eprintln!(
        "chatting with {} (empty line or Ctrl-D ends)",
        args.model.model
    );
    let stdin = std::io::stdin();
    loop {
        eprint!("> ");
        let mut line = String::new();
        if stdin.lock().read_line(&mut line).context("reading stdin")? == 0
            || line.trim().is_empty()
        {
            return Ok(());
        }
        messages.push(ChatMessage::new("user", line.trim_end()));
        let reply = reply(&mut engine, &messages, args, &constraint).await?;
        messages.push(ChatMessage::new("assistant", reply));
    }
}

async fn reply(
    engine: &mut Engine,
    messages: &[ChatMessage],
    args: &ChatArgs,
    constraint: &Option<ConstraintSpec>,
) -> anyhow::Result<String> {
    let options = GenerateOptions {
        max_tokens: args.n,
        sampler: args.sampler.config(),
        stop: Vec::new(),
        constraint: constraint.clone(),
    };
    let request = GenerateRequest::new(Prompt::Chat(messages.to_vec()), options);
    let out = engine
        .generate_one(&request, &mut |event| {
            print_piece(event);
            ControlFlow::Continue(())
        })
        .await?;
    println!();
    eprintln!("{}", timings(0.0, &out));
    Ok(out.text)
}
