//! `runner coordinate` and `runner donor`: the shard chain's roles on this machine, over
//! any `Transport`. `connect` is the one place the network transport is chosen: WebRTC, meeting
//! in the fleet's room of a signaling server (`runner serve --fleet TOKEN` serves one).

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use anyhow::bail;
use webshard::gpu::{BackendChoice, Gpu, GpuOptions};
use webshard::shard::roles::verify::DEFAULT_TOLERANCE;
use webshard::shard::roles::{
    Coordinator, CoordinatorConfig, Donor, DonorConfig, DonorExit, GenerationRequest, VerifyConfig,
};
use webshard::shard::{Encoding, FrameLimits, Transport, WebRtcConfig, WebRtcTransport};
use webshard::tokenizer::ChatMessage;

use crate::model_args::SamplerArgs;

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
    #[arg(short = 'p', long)]
    pub prompt: String,
    #[arg(short = 'n', long, default_value_t = 128)]
    pub n: u32,
    #[command(flatten)]
    pub sampler: SamplerArgs,
    /// Apply the model's chat template to the prompt as a user message.
    #[arg(long)]
    pub chat: bool,
    #[arg(long)]
    pub stop: Vec<String>,
    /// Longest sequence every stage caches.
    #[arg(long, default_value_t = 2048)]
    pub ctx: u32,
    /// Send activations between stages as f32 instead of f16.
    #[arg(long)]
    pub f32_activations: bool,
    /// Re-run this fraction of steps on this machine's GPU and flag donors that differ.
    #[arg(long, default_value_t = 0.0)]
    pub verify: f64,
    /// GPU backend for `--verify`: auto, vulkan, gl, metal, dx12.
    #[arg(long, default_value = "auto")]
    pub backend: String,
    /// Print `{"ids", "text", "plan", "hops", ...}` instead of streaming text.
    #[arg(long)]
    pub json: bool,
    /// STUN/TURN server for WebRTC (repeatable); none on a LAN or loopback.
    #[arg(long)]
    pub ice: Vec<String>,
    /// Seconds a stage donor may stay silent before it is taken as lost. A donor answers
    /// heartbeats between steps, so this must exceed its slowest step (a prefill chunk on a
    /// CPU-emulated WebGPU adapter can take tens of seconds).
    #[arg(long, default_value_t = 10.0)]
    pub heartbeat_timeout: f64,
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
}

/// Joins the room of the fleet with this token on the signaling server (`ws://HOST:PORT/signal`).
async fn connect(signal: &str, fleet: &str, ice: &[String]) -> anyhow::Result<WebRtcTransport> {
    let config = WebRtcConfig {
        ice_urls: ice.to_vec(),
        ..WebRtcConfig::default()
    };
    Ok(WebRtcTransport::join_fleet(signal, fleet, config).await?)
}

pub async fn coordinate(args: &CoordinateArgs) -> anyhow::Result<()> {
    let transport = connect(&args.signal, &args.fleet, &args.ice).await?;
    run_coordinator(transport, args).await
}

pub async fn donor(args: &DonorArgs) -> anyhow::Result<()> {
    let transport = connect(&args.signal, &args.fleet, &args.ice).await?;
    run_donor(transport, args).await
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

pub async fn run_coordinator<T: Transport>(
    transport: T,
    args: &CoordinateArgs,
) -> anyhow::Result<()> {
    let mut config = CoordinatorConfig::new(&args.model, &args.fleet, args.donors);
    config.runtime.max_context = args.ctx;
    if !(args.heartbeat_timeout > 0.0 && args.heartbeat_timeout <= 86_400.0) {
        bail!("--heartbeat-timeout must be more than 0 and at most 86400 seconds");
    }
    config.heartbeat_timeout = Duration::from_secs_f64(args.heartbeat_timeout);
    if args.f32_activations {
        config.runtime.hidden = Encoding::F32;
    }
    if args.verify > 0.0 {
        config.verify = Some(VerifyConfig {
            fraction: args.verify.min(1.0),
            tolerance: DEFAULT_TOLERANCE,
            seed: args.sampler.seed,
            gpu: Gpu::new(&gpu_options(&args.backend)?).await?,
        });
    }
    eprintln!("waiting for {} donor(s)…", args.donors);
    let mut coordinator = Coordinator::connect(transport, config).await?;
    let prompt = match args.chat {
        true => coordinator
            .template
            .render_prompt(&[ChatMessage::new("user", args.prompt.as_str())], true)?,
        false => args.prompt.clone(),
    };
    let request = GenerationRequest {
        prompt_ids: coordinator.tokenizer.encode(&prompt, true, true),
        max_tokens: args.n,
        sampler: args.sampler.config(),
        stop: args.stop.clone(),
    };
    let stream = !args.json;
    let outputs = coordinator
        .generate(std::slice::from_ref(&request), &mut |update| {
            if stream {
                print!("{}", update.text);
                let _ = std::io::stdout().flush();
            }
        })
        .await?;
    let output = outputs.into_iter().next().unwrap_or_default();
    let report = coordinator.report().clone();
    coordinator.shutdown("generation finished").await;
    if args.json {
        let mut value = serde_json::to_value(&report)?;
        value["ids"] = serde_json::json!(output.ids);
        value["text"] = serde_json::json!(output.text);
        println!("{}", serde_json::to_string_pretty(&value)?);
    } else {
        println!();
        eprintln!(
            "{} tokens, {:.2} tok/s decode, {} stage(s), {} recover(ies), {} flag(s)",
            output.ids.len(),
            report.decode_tokens_per_s,
            report.plan.len(),
            report.recoveries,
            report.flags.len()
        );
    }
    Ok(())
}

pub async fn run_donor<T: Transport>(transport: T, args: &DonorArgs) -> anyhow::Result<()> {
    let gpu: Arc<Gpu> = Gpu::new(&gpu_options(&args.backend)?).await?;
    let config = DonorConfig {
        fleet_token: args.fleet.clone(),
        gpu,
        usable_gpu_bytes: args.gpu_mem_mib << 20,
        limits: FrameLimits::default(),
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
    match donor.run().await? {
        DonorExit::Dismissed(reason) => eprintln!("dismissed: {reason}"),
        DonorExit::CoordinatorLeft => eprintln!("the coordinator left"),
        DonorExit::Closed => eprintln!("connection closed"),
    }
    // Give the last frames time to leave before the process ends.
    tokio::time::sleep(Duration::from_millis(100)).await;
    Ok(())
}
