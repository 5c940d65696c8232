//! `runner chat`: a conversation in the terminal through rustyline (history, editing), with
//! slash commands that never reach the model, Ctrl-C stopping the reply rather than the
//! program, and a marker on a reply cut off by the token limit.

use std::io::Write;
use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use rustyline::error::ReadlineError;
use rustyline::DefaultEditor;
use webshard::engine::Engine;
use webshard::front::{GenerateOptions, GenerateRequest, Generated, Generator, Prompt};
use webshard::sample::{ConstraintSpec, SamplerConfig, SpecConfig};
use webshard::tokenizer::ChatMessage;

use crate::constraint_args::ConstraintArgs;
use crate::generate::timings;
use crate::model_args::ModelArgs;
use crate::progress;
use crate::sampling_args::{parse_max_tokens, SamplerArgs};
use crate::spec_args::SpecArgs;

#[derive(clap::Args, Debug)]
pub struct ChatArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Most tokens per reply.
    #[arg(short = 'n', long, default_value = "512", value_parser = parse_max_tokens, allow_hyphen_values = true)]
    pub n: u32,
    #[command(flatten)]
    pub sampler: SamplerArgs,
    /// A system message to start the conversation with (`/system TEXT` changes it).
    #[arg(long)]
    pub system: Option<String>,
    /// Every reply is constrained.
    #[command(flatten)]
    pub constraint: ConstraintArgs,
    #[command(flatten)]
    pub spec: SpecArgs,
}

const HELP: &str = "\
commands (never sent to the model):
  /help         this list
  /clear        forget the conversation (the system message stays)
  /system TEXT  set the system message and start over (/system alone removes it)
  /exit         quit (Ctrl-D does too)
Arrow keys edit the line and walk the history.";

/// What a line typed at the prompt asks for.
#[derive(Debug, PartialEq)]
enum Input<'a> {
    Say(&'a str),
    Help,
    Clear,
    System(&'a str),
    Exit,
    Unknown(&'a str),
    Nothing,
}

fn parse_input(line: &str) -> Input<'_> {
    let line = line.trim();
    let Some(command) = line.strip_prefix('/') else {
        return if line.is_empty() {
            Input::Nothing
        } else {
            Input::Say(line)
        };
    };
    let (name, rest) = command
        .split_once(char::is_whitespace)
        .unwrap_or((command, ""));
    match name {
        "help" | "?" => Input::Help,
        "clear" => Input::Clear,
        "system" => Input::System(rest.trim()),
        "exit" | "quit" => Input::Exit,
        _ => Input::Unknown(line),
    }
}

/// The messages so far, after an optional system message.
struct Conversation {
    system: Option<String>,
    turns: Vec<ChatMessage>,
}

impl Conversation {
    fn messages(&self) -> Vec<ChatMessage> {
        let system = self
            .system
            .iter()
            .map(|s| ChatMessage::new("system", s.as_str()));
        system.chain(self.turns.iter().cloned()).collect()
    }
}

/// Set by Ctrl-C while a reply streams. The handler replaces SIGINT's default (ending the
/// process) and runs on ctrlc's own thread: the runtime's signal driver would not run while
/// the main thread blocks on the GPU. At the prompt the terminal is in raw mode and rustyline
/// reads Ctrl-C as a key.
fn interrupt_flag() -> anyhow::Result<Arc<AtomicBool>> {
    let flag = Arc::new(AtomicBool::new(false));
    let setter = Arc::clone(&flag);
    ctrlc::set_handler(move || setter.store(true, Ordering::SeqCst))?;
    Ok(flag)
}

/// Says on stderr which chat format renders the conversation when the model has no template.
pub fn announce_format(engine: &Engine, model: &str) {
    if let Some(format) = engine.text.template.builtin_format() {
        eprintln!("{model} has no chat template: using {format}");
    }
}

/// An interactive conversation; the KV cache keeps the conversation so far, so each turn only
/// prefills what is new.
pub async fn chat(args: &ChatArgs) -> anyhow::Result<()> {
    let constraint = args.constraint.spec()?;
    let (mut engine, load) = args.model.load().await?;
    announce_format(&engine, &args.model.model);
    if let Some(bar) = progress::prefill_bar(args.model.quiet) {
        engine.set_prefill_progress(bar);
    }
    let sampler = args.sampler.config();
    // The editor first: rustyline (without its `signal-hook` feature, whose reader waited on
    // the terminal with keys in its buffer, so a pasted line hung) takes SIGINT when an editor
    // is made; ctrlc's handler, installed after, takes it back for the replies.
    let mut editor = DefaultEditor::new()?;
    let interrupted = interrupt_flag()?;
    let mut conversation = Conversation {
        system: args.system.clone(),
        turns: Vec::new(),
    };
    eprintln!(
        "loaded {} in {:.2} s; /help lists commands, Ctrl-D or /exit quits",
        args.model.model, load.seconds
    );
    loop {
        let line = match editor.readline("> ") {
            Ok(line) => line,
            Err(ReadlineError::Interrupted) => {
                eprintln!("(Ctrl-D or /exit quits)");
                continue;
            }
            Err(ReadlineError::Eof) => return Ok(()),
            Err(err) => return Err(err.into()),
        };
        let input = parse_input(&line);
        if input != Input::Nothing {
            let _ = editor.add_history_entry(line.trim());
        }
        match input {
            Input::Nothing => {}
            Input::Help => eprintln!("{HELP}"),
            Input::Exit => return Ok(()),
            Input::Clear => {
                conversation.turns.clear();
                engine.reset();
                eprintln!("(conversation cleared)");
            }
            Input::System(text) => {
                conversation.system = (!text.is_empty()).then(|| text.to_string());
                conversation.turns.clear();
                engine.reset();
                eprintln!("(system message set; conversation cleared)");
            }
            Input::Unknown(command) => eprintln!("unknown command {command}; /help lists them"),
            Input::Say(text) => {
                conversation.turns.push(ChatMessage::new("user", text));
                interrupted.store(false, Ordering::SeqCst);
                let turn = Turn {
                    max_tokens: args.n,
                    sampler: &sampler,
                    constraint: &constraint,
                    speculation: args.spec.config(),
                    interrupted: &interrupted,
                };
                match reply(&mut engine, &conversation.messages(), &turn).await? {
                    Some(text) => conversation.turns.push(ChatMessage::new("assistant", text)),
                    None => {
                        conversation.turns.pop();
                    }
                }
            }
        }
    }
}

/// One reply's settings.
struct Turn<'a> {
    max_tokens: u32,
    sampler: &'a SamplerConfig,
    constraint: &'a Option<ConstraintSpec>,
    speculation: Option<SpecConfig>,
    interrupted: &'a AtomicBool,
}

/// Streams a reply to stdout and returns its text; None when the conversation no longer fits
/// the context (said on stderr, nothing generated).
async fn reply(
    engine: &mut Engine,
    messages: &[ChatMessage],
    turn: &Turn<'_>,
) -> anyhow::Result<Option<String>> {
    let prompt_ids = engine.prompt_ids(&Prompt::Chat(messages.to_vec()))?;
    let room = (engine.context_length() as usize).saturating_sub(prompt_ids.len());
    if room == 0 {
        eprintln!(
            "[the conversation is {} tokens and the context holds {}: /clear to start over, or a larger --ctx]",
            prompt_ids.len(),
            engine.context_length()
        );
        return Ok(None);
    }
    let options = GenerateOptions {
        max_tokens: turn.max_tokens.min(room as u32),
        sampler: turn.sampler.clone(),
        stop: Vec::new(),
        constraint: turn.constraint.clone(),
        logprobs: None,
        speculation: turn.speculation,
    };
    let request = GenerateRequest::new(Prompt::Ids(prompt_ids), options.clone());
    let out = engine
        .generate_one(&request, &mut |event| {
            print!("{}", event.text);
            let _ = std::io::stdout().flush();
            match turn.interrupted.load(Ordering::SeqCst) {
                true => ControlFlow::Break(()),
                false => ControlFlow::Continue(()),
            }
        })
        .await?;
    println!();
    if let Some(marker) = end_marker(&out, &options, turn) {
        eprintln!("{marker}");
    }
    eprintln!("{}", timings(None, &out, turn.sampler));
    Ok(Some(out.text))
}

/// A line saying why a reply ended early, if it did: Ctrl-C, `-n`, or a full context.
fn end_marker(out: &Generated, options: &GenerateOptions, turn: &Turn<'_>) -> Option<String> {
    if turn.interrupted.load(Ordering::SeqCst) {
        return Some("[stopped]".to_string());
    }
    if (out.ids.len() as u32) < options.max_tokens {
        return None;
    }
    Some(match options.max_tokens < turn.max_tokens {
        true => "[reply cut off: the context is full; /clear to start over]".to_string(),
        false => format!(
            "[reply cut off at the limit of {} tokens (-n)]",
            turn.max_tokens
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slash_commands_are_told_from_text() {
        assert_eq!(parse_input("  hello  "), Input::Say("hello"));
        assert_eq!(parse_input(""), Input::Nothing);
        assert_eq!(parse_input("/help"), Input::Help);
        assert_eq!(parse_input("/clear"), Input::Clear);
        assert_eq!(parse_input("/exit"), Input::Exit);
        assert_eq!(
            parse_input("/system Be brief. "),
            Input::System("Be brief.")
        );
        assert_eq!(parse_input("/system"), Input::System(""));
        assert_eq!(
            parse_input("/frobnicate x"),
            Input::Unknown("/frobnicate x")
        );
    }
}
