//! `runner coordinate` and `runner donor`: the shard chain's roles on this machine, over
//! any `Transport`. `connect` is the one place the network transport is chosen: WebRTC, meeting
//! in the fleet's room of a signaling server (`runner serve --fleet TOKEN` serves one).

use std::io::Write;
use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Duration;

use anyhow::bail;
use webshard::front::{GenerateOptions, GenerateRequest, Generated, Generator, OnEvent, Prompt};
use webshard::gpu::{BackendChoice, Gpu, GpuOptions};
use webshard::shard::fault::Perturbing;
use webshard::shard::fleet_room;
use webshard::shard::plan::MAX_DONORS;
use webshard::shard::roles::coordinator::RunReport;
use webshard::shard::roles::verify::DEFAULT_TOLERANCE;
use webshard::shard::roles::{
    ChainCount, Coordinator, CoordinatorConfig, Donor, DonorConfig, DonorExit, Feed, ReplicaReport,
    Replicas as ReplicaFleet, RoleError, VerifyConfig,
};
use webshard::shard::{Encoding, FrameLimits, MaybeSync, Transport, WebRtcConfig, WebRtcTransport};
use webshard::tokenizer::ChatMessage;

use crate::constraint_args::ConstraintArgs;
use crate::sampling_args::SamplerArgs;

#[derive(clap::Args, Debug, Clone)]
pub struct CoordinateArgs {
    /// GGUF model URL every donor can fetch (http(s)://, with Range support).
    #[arg(short = 'm', long)]
    pub model: String,
    /// Signalling server URL.
    #[arg(long)]
    pub signal: String,
    /// Fleet token: donors presenting another one are refused. Also the signalling room.
    #[arg(long)]
    pub fleet: String,
    /// Donors to wait for before planning.
    #[arg(long)]
    pub donors: usize,
    /// The prompt; repeat it to generate for several prompts at once (up to `--kv-slots` in
    /// the chain at a time).
    #[arg(short = 'p', long, required = true)]
    pub prompt: Vec<String>,
    #[arg(short = 'n', long, default_value_t = 128)]
    pub n: u32,
    #[command(flatten)]
    pub sampler: SamplerArgs,
    /// The output's form (JSON Schema, regex, grammar, any JSON), for every prompt.
    #[command(flatten)]
    pub constraint: ConstraintArgs,
    /// Apply the model's chat template to the prompt as a user message.
    #[arg(long)]
    pub chat: bool,
    #[arg(long)]
    pub stop: Vec<String>,
    /// Longest sequence every stage caches.
    #[arg(long, default_value_t = 2048)]
    pub ctx: u32,
    /// Requests in the chain at once (micro-batching); every stage keeps a KV cache of
    /// `--ctx` positions per slot.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub kv_slots: u32,
    /// Send activations between stages as f32 instead of f16.
    #[arg(long)]
    pub f32_activations: bool,
    /// Re-run this fraction of steps on this machine's GPU and flag donors that differ.
    #[arg(long, default_value_t = 0.0)]
    pub verify: f64,
    /// GPU backend for `--verify`: auto, vulkan, gl, metal, dx12.
    #[arg(long, default_value = "auto")]
    pub backend: String,
    /// Print `{"ids", "text", "outputs", "plan", "hops", ...}` instead of streaming text
    /// (`ids` and `text` are the first prompt's, `outputs` every prompt's).
    #[arg(long)]
    pub json: bool,
    /// Print `token REQUEST INDEX ID` on stderr as each token is accepted.
    #[arg(long)]
    pub progress: bool,
    /// STUN/TURN server URL for peers beyond the LAN (repeatable; none: host addresses only).
    #[arg(long)]
    pub ice: Vec<String>,
    /// Seconds a stage's donor may stay silent before it is taken as lost and planned out
    /// (donors answer heartbeats while they compute, too). A donor that answers again is
    /// planned back in; one whose process ends is noticed at once, through the signaling
    /// server.
    #[arg(long, default_value_t = 10.0)]
    pub heartbeat_timeout: f64,
    /// Seconds to wait for `--donors` donors before giving up with "K of N donors joined".
    #[arg(long, default_value_t = 60.0)]
    pub join_timeout: f64,
    /// Chains to run: 1 (one chain over every donor), a number N (the donors dealt into N
    /// chains, each holding the whole model), or `auto` (one longer chain or several, whichever
    /// the planner estimates faster for the prompts given, from the donors' memory and speed).
    /// With several, the prompts are spread over them and `--json` adds `chains` and
    /// `served_by`.
    #[arg(long, default_value = "1", value_parser = parse_replicas)]
    pub replicas: Replicas,
}

/// `--replicas`: how many chains the donors form.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Replicas {
    Auto,
    Count(usize),
}

pub fn parse_replicas(text: &str) -> Result<Replicas, String> {
    match text {
        "auto" => Ok(Replicas::Auto),
        _ => match text.parse::<usize>() {
            Ok(count) if (1..=MAX_DONORS).contains(&count) => Ok(Replicas::Count(count)),
            _ => Err(format!(
                "{text:?} is neither `auto` nor a number of chains from 1 to {MAX_DONORS}"
            )),
        },
    }
}

#[derive(clap::Args, Debug, Clone)]
pub struct DonorArgs {
    #[arg(long)]
    pub signal: String,
    #[arg(long)]
    pub fleet: String,
    /// GPU memory to offer, in MiB.
    #[arg(long, default_value_t = 4096)]
    pub gpu_mem_mib: u64,
    /// GPU backend: auto, vulkan, gl, metal, dx12.
    #[arg(long, default_value = "auto")]
    pub backend: String,
    /// STUN/TURN server for WebRTC (repeatable); none on a LAN or loopback.
    #[arg(long)]
    pub ice: Vec<String>,
    /// Tests only: perturb every activation and logit this donor sends by this fraction of
    /// its RMS, so that `coordinate --verify` has a faulty donor to flag. Hidden from --help.
    #[arg(long, hide = true, value_name = "FRACTION")]
    pub fault_perturb: Option<f32>,
    /// Tests only: report this speed (ms per reference layer) instead of probing the GPU, so
    /// that a test's plan does not depend on how loaded the machine is. Hidden from --help.
    #[arg(long, hide = true, value_name = "MS", value_parser = positive_ms)]
    pub ms_per_layer: Option<f32>,
    /// Serve one coordinator, then exit (by default a donor serves one coordinator after
    /// another until stopped).
    #[arg(long)]
    pub once: bool,
}

/// Joins the room of the fleet with this token on the signaling server (`ws://HOST:PORT/signal`).
async fn connect(signal: &str, fleet: &str, ice: &[String]) -> anyhow::Result<WebRtcTransport> {
    // `runner serve` prints its room's URL; one of another fleet means another token.
    let last = signal
        .trim_end_matches('/')
        .rsplit('/')
        .next()
        .unwrap_or("");
    if last.starts_with("fleet-") && last != fleet_room(fleet) {
        bail!(
            "--signal names another fleet's room ({last}): is the fleet token right? \
             (or give the server's ws://HOST:PORT/signal)"
        );
    }
    let config = WebRtcConfig {
        ice_urls: ice.to_vec(),
        ..WebRtcConfig::default()
    };
    WebRtcTransport::join_fleet(signal, fleet, config)
        .await
        .map_err(|error| {
            let text = error.to_string();
            let hint = if text.contains("403") {
                "the signaling server admits only its own fleet's room: is the fleet token right?"
            } else if text.contains("404") {
                "no such signaling room: --signal should be ws://HOST:PORT/signal"
            } else {
                return anyhow::Error::new(error);
            };
            anyhow::Error::new(error).context(hint)
        })
}

pub async fn coordinate(args: &CoordinateArgs) -> anyhow::Result<()> {
    let transport = connect(&args.signal, &args.fleet, &args.ice).await?;
    run_coordinator(transport, args).await
}

/// Lends the GPU until stopped: serves one coordinator after another, and joins the room
/// again when the connection to it closes (`--once`: one coordinator, then exit).
pub async fn donor(args: &DonorArgs) -> anyhow::Result<()> {
    let gpu: Arc<Gpu> = Gpu::new(&gpu_options(&args.backend)?).await?;
    loop {
        let transport = connect(&args.signal, &args.fleet, &args.ice).await?;
        eprintln!("joined the fleet as {}", transport.local_id());
        let closed = match args.fault_perturb {
            Some(scale) => {
                eprintln!("fault injection: perturbing every result by {scale} of its RMS");
                let transport = Perturbing {
                    inner: transport,
                    scale,
                };
                run_donor(transport, args, Arc::clone(&gpu)).await?
            }
            None => run_donor(transport, args, Arc::clone(&gpu)).await?,
        };
        if !closed || args.once {
            return Ok(());
        }
        eprintln!("joining the room again");
    }
}

fn gpu_options(backend: &str) -> anyhow::Result<GpuOptions> {
    let Some(backend) = BackendChoice::parse(backend) else {
        bail!("unknown backend `{backend}` (auto, vulkan, gl, metal, dx12)");
    };
    Ok(GpuOptions {
        backend,
        ..GpuOptions::default()
    })
}

pub async fn run_coordinator<T: Transport + MaybeSync>(
    transport: T,
    args: &CoordinateArgs,
) -> anyhow::Result<()> {
    let requests = requests(args)?;
    let config = coordinator_config(args).await?;
    eprintln!("waiting for {} donor(s)…", args.donors);
    let mut fleet = Fleet::connect(transport, config, args.replicas, requests.len()).await?;
    // Text streams only for one prompt: several would interleave.
    let stream = !args.json && requests.len() == 1;
    let progress = args.progress;
    let outputs = fleet
        .generate(&requests, &mut |update| {
            if progress {
                eprintln!("token {} {} {}", update.request, update.index, update.id);
            }
            if stream {
                print!("{}", update.text);
                let _ = std::io::stdout().flush();
            }
            ControlFlow::Continue(())
        })
        .await?;
    let report = fleet.report_json()?;
    let summary = fleet.summary();
    fleet.shutdown("generation finished").await;
    let first = outputs.first().cloned().unwrap_or_default();
    if args.json {
        let mut value = report;
        value["ids"] = serde_json::json!(first.ids);
        value["text"] = serde_json::json!(first.text);
        value["outputs"] = serde_json::to_value(&outputs)?;
        println!("{}", serde_json::to_string_pretty(&value)?);
    } else {
        if stream {
            println!();
        } else {
            for (prompt, output) in args.prompt.iter().zip(&outputs) {
                println!("--- {prompt}\n{}", output.text);
            }
        }
        let tokens: usize = outputs.iter().map(|o| o.ids.len()).sum();
        eprintln!("{tokens} tokens, {summary}");
    }
    Ok(())
}

/// The coordinator's settings from the flags (the verifier's GPU opened here).
async fn coordinator_config(args: &CoordinateArgs) -> anyhow::Result<CoordinatorConfig> {
    let mut config = CoordinatorConfig::new(&args.model, &args.fleet, args.donors);
    config.runtime.max_context = args.ctx;
    config.runtime.kv_slots = args.kv_slots;
    if !(args.heartbeat_timeout > 0.0 && args.heartbeat_timeout <= 86_400.0) {
        bail!("--heartbeat-timeout must be more than 0 and at most 86400 seconds");
    }
    config.heartbeat_timeout = Duration::from_secs_f64(args.heartbeat_timeout);
    if !(args.join_timeout > 0.0 && args.join_timeout <= 86_400.0) {
        bail!("--join-timeout must be more than 0 and at most 86400 seconds");
    }
    config.join_timeout = Duration::from_secs_f64(args.join_timeout);
    if args.f32_activations {
        config.runtime.hidden = Encoding::F32;
    }
    if let Replicas::Count(count) = args.replicas {
        if count > args.donors {
            bail!(
                "--replicas {count} needs at least {count} donors (--donors {})",
                args.donors
            );
        }
    }
    if args.verify > 0.0 {
        config.verify = Some(VerifyConfig {
            fraction: args.verify.min(1.0),
            tolerance: DEFAULT_TOLERANCE,
            seed: args.sampler.config().seed,
            gpu: Gpu::new(&gpu_options(&args.backend)?).await?,
        });
    }
    Ok(config)
}

/// One request per `--prompt`, with the sampling flags; checked before any donor is waited
/// for, so a bad schema fails at once.
fn requests(args: &CoordinateArgs) -> anyhow::Result<Vec<GenerateRequest>> {
    let options = GenerateOptions {
        max_tokens: args.n,
        sampler: args.sampler.config(),
        stop: args.stop.clone(),
        constraint: args.constraint.spec()?,
        ..GenerateOptions::default()
    };
    let requests = args.prompt.iter().map(|prompt| {
        let prompt = match args.chat {
            true => Prompt::Chat(vec![ChatMessage::new("user", prompt.as_str())]),
            false => Prompt::Text(prompt.clone()),
        };
        GenerateRequest::new(prompt, options.clone())
    });
    Ok(requests.collect())
}

/// One chain, or several: the same front door, reported apart.
pub enum Fleet<T: Transport + MaybeSync> {
    Chain(Box<Coordinator<T>>),
    Replicas(ReplicaFleet<T>),
}

impl<T: Transport + MaybeSync> Fleet<T> {
    /// Waits for the donors and loads one chain, or `replicas` chains (`Auto`: as many as the
    /// planner finds fastest for `requests` in flight).
    pub async fn connect(
        transport: T,
        config: CoordinatorConfig,
        replicas: Replicas,
        requests: usize,
    ) -> Result<Fleet<T>, RoleError> {
        let chains = match replicas {
            Replicas::Count(1) => {
                let chain = Coordinator::connect(transport, config).await?;
                return Ok(Fleet::Chain(Box::new(chain)));
            }
            Replicas::Count(count) => ChainCount::Exactly(count),
            Replicas::Auto => ChainCount::Auto { requests },
        };
        Ok(Fleet::Replicas(
            ReplicaFleet::connect(transport, config, chains).await?,
        ))
    }

    /// Serves `feed`'s requests as they come (`Coordinator::generate_fed`, or every chain at
    /// once: `Replicas::generate_fed`).
    pub async fn generate_fed(
        &mut self,
        feed: &mut dyn Feed,
        on_event: &mut OnEvent<'_>,
    ) -> Result<(), RoleError> {
        match self {
            Fleet::Chain(chain) => chain.generate_fed(feed, on_event).await,
            Fleet::Replicas(replicas) => replicas.generate_fed(feed, on_event).await,
        }
    }

    pub fn vocab(&self) -> u32 {
        match self {
            Fleet::Chain(chain) => chain.vocab(),
            Fleet::Replicas(replicas) => replicas.vocab(),
        }
    }

    pub fn max_context(&self) -> u32 {
        match self {
            Fleet::Chain(chain) => chain.max_context(),
            Fleet::Replicas(replicas) => replicas.max_context(),
        }
    }

    async fn generate(
        &mut self,
        requests: &[GenerateRequest],
        on_event: &mut OnEvent<'_>,
    ) -> Result<Vec<Generated>, RoleError> {
        match self {
            Fleet::Chain(chain) => chain.generate(requests, on_event).await,
            Fleet::Replicas(replicas) => replicas.generate(requests, on_event).await,
        }
    }

    /// One chain's report as it always was; several chains' with `chains` and `served_by`.
    fn report_json(&self) -> anyhow::Result<serde_json::Value> {
        Ok(match self {
            Fleet::Chain(chain) => serde_json::to_value(chain.report())?,
            Fleet::Replicas(replicas) => serde_json::to_value(replicas.report())?,
        })
    }

    fn summary(&self) -> String {
        match self {
            Fleet::Chain(chain) => chain_summary(chain.report()),
            Fleet::Replicas(replicas) => replicas_summary(&replicas.report()),
        }
    }

    pub async fn shutdown(self, reason: &str) {
        match self {
            Fleet::Chain(chain) => chain.shutdown(reason).await,
            Fleet::Replicas(replicas) => replicas.shutdown(reason).await,
        }
    }
}

fn chain_summary(report: &RunReport) -> String {
    format!(
        "{:.2} tok/s decode, {} stage(s), {} recover(ies), {} join(s), {} flag(s)",
        report.decode_tokens_per_s,
        report.plan.len(),
        report.recoveries,
        report.joins,
        report.flags.len()
    )
}

fn replicas_summary(report: &ReplicaReport) -> String {
    let stages: Vec<String> = (report.chains.iter())
        .map(|c| c.run.plan.len().to_string())
        .collect();
    format!(
        "{:.2} tok/s decode, {} chain(s) of {} stage(s), {} recover(ies), {} join(s), {} moved",
        report.decode_tokens_per_s,
        report.chains.len(),
        stages.join("/"),
        report.recoveries,
        report.joins,
        report.moved
    )
}

/// Serves coordinators over `transport`; true when it ended because the transport closed.
pub async fn run_donor<T: Transport>(
    transport: T,
    args: &DonorArgs,
    gpu: Arc<Gpu>,
) -> anyhow::Result<bool> {
    let config = DonorConfig {
        fleet_token: args.fleet.clone(),
        gpu,
        usable_gpu_bytes: args.gpu_mem_mib << 20,
        limits: FrameLimits::default(),
        pinned_ms_per_layer: args.ms_per_layer,
    };
    let mut donor = Donor::new(transport, config);
    let mut last_phase = None;
    donor.on_status(move |status| {
        if last_phase != Some(status.phase) {
            last_phase = Some(status.phase);
            eprintln!(
                "{:?}: layers {:?}, {} bytes downloaded, {:.1} ms per layer probe",
                status.phase, status.layers, status.bytes_downloaded, status.ms_per_layer
            );
        }
    });
    let report = |exit: &DonorExit| match exit {
        DonorExit::Dismissed(reason) => eprintln!("dismissed: {reason}"),
        DonorExit::CoordinatorLeft => eprintln!("the coordinator left"),
        DonorExit::Closed => eprintln!("connection closed"),
    };
    if args.once {
        let exit = donor.run().await?;
        report(&exit);
        return Ok(exit == DonorExit::Closed);
    }
    let mut closed = false;
    donor
        .run_staying(|exit| {
            report(exit);
            closed = *exit == DonorExit::Closed;
            if !closed {
                eprintln!("back in the room, waiting for the next coordinator");
            }
        })
        .await?;
    Ok(closed)
}

/// A speed the planner can use: finite and above zero (`plan::check_inputs` refuses others).
fn positive_ms(text: &str) -> Result<f32, String> {
    match text.parse::<f32>() {
        Ok(ms) if ms.is_finite() && ms > 0.0 => Ok(ms),
        _ => Err(format!("{text:?} is not a positive number of milliseconds")),
    }
}
