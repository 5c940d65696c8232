//! `runner`: the native command-line face of webshard.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use native_runner::serve::{serve, ServeOptions};
use tracing_subscriber::EnvFilter;

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
    /// Serve web/ at /, models/ at /models/ and pkg/ at /pkg/ with Range and COOP/COEP support.
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
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.verbose);
    match run(cli.command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {}", format!("{err:#}").replace('\n', " "));
            ExitCode::FAILURE
        }
    }
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
        .init();
}

fn run(command: Command) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Runtime::new()?;
    match command {
        Command::Serve {
            root,
            models,
            host,
            port,
        } => {
            let opts = ServeOptions {
                root,
                models_dir: models,
                host,
                port,
            };
            runtime.block_on(serve(&opts))?;
        }
    }
    Ok(())
}
