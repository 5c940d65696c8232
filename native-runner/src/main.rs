//! `runner`: the native command-line face of webshard.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use native_runner::api::{self, ApiArgs};
use native_runner::bench::{bench, BenchArgs};
use native_runner::chat::{chat, ChatArgs};
use native_runner::embed::{embed, EmbedArgs};
use native_runner::fleet::{coordinate, donor, CoordinateArgs, DonorArgs};
use native_runner::generate::{generate, GenerateArgs};
use native_runner::info::{inspect, render_text};
use native_runner::score::{score, tokenize, ScoreArgs, TokenizeArgs};
use native_runner::serve::{serve, ServeOptions};
use tracing_subscriber::EnvFilter;
use webshard::gguf::GgufError;

#[derive(Parser)]
#[command(name = "runner", version, about = "webshard native runner")]
struct Cli {
    /// Debug logging on stderr (otherwise RUST_LOG, default warn).
    #[arg(short, long, global = true)]
    verbose: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve web/ at /, models/ at /models/ and pkg/ at /pkg/ with Range and COOP/COEP support,
    /// and WebRTC signaling for shard fleets at ws://HOST:PORT/signal/ROOM; with -m, also an
    /// OpenAI-compatible API at /v1/ (and /health, /metrics).
    Serve {
        /// Repository root holding web/, pkg/ and models/.
        #[arg(long, default_value = ".")]
        root: PathBuf,
        /// Directory served at /models/ (default: ROOT/models).
        #[arg(long)]
        models: Option<PathBuf>,
        #[arg(long, default_value = "127.0.0.1")]
        host: String,
        /// 0 picks a free port.
        #[arg(long, default_value_t = 8000)]
        port: u16,
        /// Append one JSON line per request (method, path, range, status) to this file.
        #[arg(long)]
        request_log: Option<PathBuf>,
        /// Admit only this fleet's signaling room (derived from the token) at /signal.
        #[arg(long, value_name = "TOKEN")]
        fleet: Option<String>,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// Describe a GGUF model (path or http(s) URL), reading only its header.
    Info {
        /// A file path or an http(s):// URL.
        source: String,
        /// Print one JSON object instead of tables.
        #[arg(long)]
        json: bool,
        /// Also list every tensor (name, type, shape, offset, bytes).
        #[arg(long)]
        tensors: bool,
    },
    /// Generate text after a prompt, streaming it to stdout (timings on stderr).
    Generate(GenerateArgs),
    /// An interactive multi-turn chat in the terminal.
    Chat(ChatArgs),
    /// Token ids of a text, read from the model's header alone.
    Tokenize(TokenizeArgs),
    /// Teacher-forced top-k logits after every prefix of the given ids.
    Score(ScoreArgs),
    /// Embeddings of texts from an embedding model (BERT family), one line (or JSON) each.
    Embed(EmbedArgs),
    /// Prompt-processing and generation throughput, load time, peak host memory.
    Bench(BenchArgs),
    /// Split a model over donors in a fleet room and generate through the chain.
    Coordinate(CoordinateArgs),
    /// Offer this GPU to a fleet: load the layers assigned and serve them.
    Donor(DonorArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Before the runtime's threads exist: this may set an environment variable.
    native_runner::runtime_dir::ensure_runtime_dir();
    init_logging(cli.verbose);
    report_webrtc_panics_in_one_line();
    match run(cli.command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {}", one_line(&err));
            ExitCode::FAILURE
        }
    }
}

/// A panic inside matchbox is contained (`shard::webrtc` turns it into a closed socket), so
/// it gets one warning line instead of the default hook's report; other panics keep it.
fn report_webrtc_panics_in_one_line() {
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let location = info.location();
        if !location.is_some_and(|l| l.file().contains("matchbox_socket")) {
            return default_hook(info);
        }
        let message = info
            .payload()
            .downcast_ref::<&str>()
            .copied()
            .or_else(|| info.payload().downcast_ref::<String>().map(String::as_str))
            .unwrap_or("(no message)");
        let at = location.map(|l| format!("{}:{}", l.file(), l.line()));
        tracing::warn!(
            "the WebRTC library failed ({message} at {}); that connection is closed",
            at.unwrap_or_default()
        );
    }));
}

/// The error and its causes on one line, skipping causes a message already quotes.
fn one_line(err: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in err.chain() {
        let text = cause.to_string();
        if !line.contains(&text) {
            if !line.is_empty() {
                line.push_str(": ");
            }
            line.push_str(&text);
        }
    }
    line.replace('\n', " ")
}

fn init_logging(verbose: bool) {
    let filter = if verbose {
        EnvFilter::new("debug")
    } else {
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn"))
    };
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
}

/// Source errors already name the path or URL; parse errors get it prefixed.
fn located(source: &str, err: GgufError) -> anyhow::Error {
    match err {
        GgufError::Source(_) => err.into(),
        _ => anyhow::Error::new(err).context(source.to_string()),
    }
}

fn run(command: Command) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Runtime::new()?;
    match command {
        Command::Serve {
            root,
            models,
            host,
            port,
            request_log,
            fleet,
            api,
        } => {
            let opts = ServeOptions {
                root,
                models_dir: models,
                host,
                port,
                request_log,
                fleet_token: fleet,
            };
            if api.wanted()? {
                runtime.block_on(api::serve(&opts, &api))?;
            } else {
                runtime.block_on(serve(&opts))?;
            }
        }
        Command::Info {
            source,
            json,
            tensors,
        } => {
            let info = runtime
                .block_on(inspect(&source))
                .map_err(|err| located(&source, err))?;
            if json {
                println!("{}", serde_json::to_string_pretty(&info)?);
            } else {
                print!("{}", render_text(&info, tensors));
            }
        }
        Command::Generate(args) => runtime.block_on(generate(&args))?,
        Command::Chat(args) => runtime.block_on(chat(&args))?,
        Command::Tokenize(args) => runtime.block_on(tokenize(&args))?,
        Command::Score(args) => runtime.block_on(score(&args))?,
        Command::Embed(args) => runtime.block_on(embed(&args))?,
        Command::Bench(args) => runtime.block_on(bench(&args))?,
        Command::Coordinate(args) => runtime.block_on(coordinate(&args))?,
        Command::Donor(args) => runtime.block_on(donor(&args))?,
    }
    Ok(())
}
