//! `runner serve -m MODEL --fleet TOKEN --donors N`: the API's model runs on a fleet, donors
//! (`runner donor`, browser tabs) that meet in this server's own signaling room, through the
//! same front door (`Generator`) as on this machine's GPU.
//!
//! The coordinator keeps its own micro-batching: the jobs waiting when a run starts, up to
//! `--parallel` (the chain's KV slots), go through the chain together; jobs that arrive during
//! a run wait for the next one. Log-probabilities need the whole vocabulary's logits, and the
//! last donor sends back only its best candidates, so a request for them gets a 400
//! (`PromptFront::check_logprobs`).

use std::ops::ControlFlow;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, TryRecvError};
use std::time::Duration;

use anyhow::Context;
use webshard::front::{GenerateRequest, Generated, Generator, TextFront};
use webshard::shard::roles::{Coordinator, CoordinatorConfig, RoleError};
use webshard::shard::{WebRtcConfig, WebRtcTransport};

use super::errors::ApiError;
use super::worker::{finished, guarded, stream_event, Event, Job, ModelHandle, Started};

/// How long the server waits for `--donors` donors before it gives up (and exits, saying how
/// many came): a server is started before its donors, so the wait is long.
const JOIN_WAIT: Duration = Duration::from_secs(24 * 3600);

/// Requests in the chain at once when `--parallel` is not given (`runner coordinate`'s
/// `--kv-slots` default).
pub const DEFAULT_KV_SLOTS: u32 = 4;

/// Where the fleet meets and what it runs.
#[derive(Debug, Clone)]
pub struct FleetTarget {
    /// The model as donors fetch it (http(s), with Range support).
    pub model_url: String,
    /// This server's signaling endpoint, `ws://HOST:PORT/signal`.
    pub signal: String,
    pub token: String,
    pub donors: usize,
    /// Positions per sequence every stage caches.
    pub ctx: u32,
    /// Requests in the chain at once.
    pub kv_slots: u32,
    /// STUN/TURN servers for links beyond the LAN; none: host candidates only.
    pub ice_urls: Vec<String>,
}

/// Starts the thread that coordinates the fleet and runs the model's jobs on it.
pub fn start(
    name: String,
    target: FleetTarget,
    queue: usize,
    failed: tokio::sync::mpsc::UnboundedSender<String>,
) -> std::io::Result<ModelHandle> {
    ModelHandle::spawn(name, queue, failed, move |started, queued| {
        run(&target, &started, &queued)
    })
}

fn run(target: &FleetTarget, started: &Started, queued: &Receiver<Job>) -> anyhow::Result<()> {
    // Worker threads keep the WebRTC links and the signaling going while this thread waits
    // for jobs; the coordinator itself runs here, in `block_on`.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let text = runtime.block_on(read_text_front(&target.model_url))?;
    let mut coordinator = runtime.block_on(connect(target))?;
    started.ready(text, coordinator.vocab(), coordinator.max_context(), false);
    let metrics = &started.metrics;
    while let Some(jobs) = next_jobs(queued, started, target.kv_slots as usize) {
        metrics.running.store(jobs.len() as u64, Ordering::SeqCst);
        let requests: Vec<GenerateRequest> = jobs.iter().map(|job| job.request.clone()).collect();
        let outcome = guarded(|| {
            runtime.block_on(coordinator.generate(&requests, &mut |event| {
                jobs.get(event.request)
                    .map_or(ControlFlow::Break(()), |job| stream_event(job, event))
            }))
        });
        answer(jobs, outcome);
        metrics.running.store(0, Ordering::SeqCst);
    }
    runtime.block_on(coordinator.shutdown("the server stopped"));
    Ok(())
}

/// The tokenizer and chat template, read from the model's header as the donors will see it.
async fn read_text_front(model_url: &str) -> anyhow::Result<TextFront> {
    let file = webshard::gguf::open_source(model_url)
        .await
        .with_context(|| format!("opening {model_url}"))?;
    let header = webshard::gguf::read_header(file.as_ref())
        .await
        .with_context(|| format!("reading the header of {model_url}"))?;
    Ok(TextFront::from_header(&header)?)
}

/// Joins the room, waits for the donors, plans and loads the chain.
async fn connect(target: &FleetTarget) -> anyhow::Result<Coordinator<WebRtcTransport>> {
    let webrtc = WebRtcConfig {
        ice_urls: target.ice_urls.clone(),
        ..WebRtcConfig::default()
    };
    let transport = WebRtcTransport::join_fleet(&target.signal, &target.token, webrtc)
        .await
        .with_context(|| format!("joining the fleet's room at {}", target.signal))?;
    let mut config = CoordinatorConfig::new(&target.model_url, &target.token, target.donors);
    config.runtime.max_context = target.ctx;
    config.runtime.kv_slots = target.kv_slots;
    config.join_timeout = JOIN_WAIT;
    tracing::info!("waiting for {} donor(s)", target.donors);
    Ok(Coordinator::connect(transport, config).await?)
}

/// The jobs for the next run: blocks for the first, then takes those already waiting, up to
/// `most`; jobs whose client left are dropped. `None` once the queue is closed.
fn next_jobs(queued: &Receiver<Job>, started: &Started, most: usize) -> Option<Vec<Job>> {
    let mut jobs = Vec::new();
    while jobs.len() < most {
        let job = match jobs.is_empty() {
            true => queued.recv().ok()?,
            false => match queued.try_recv() {
                Ok(job) => job,
                Err(TryRecvError::Empty | TryRecvError::Disconnected) => break,
            },
        };
        started.metrics.queued.fetch_sub(1, Ordering::SeqCst);
        if job.events.is_closed() {
            continue;
        }
        jobs.push(job);
    }
    Some(jobs)
}

/// Sends each job its result, or the run's error.
fn answer(jobs: Vec<Job>, outcome: Result<Result<Vec<Generated>, RoleError>, ApiError>) {
    let error = match outcome {
        Ok(Ok(outputs)) => {
            for (job, output) in jobs.into_iter().zip(outputs) {
                let _ = job.events.send(Event::Done(finished(output, None)));
            }
            return;
        }
        Ok(Err(err)) => ApiError::unavailable("fleet_failed", format!("The fleet failed: {err}")),
        Err(panic) => panic,
    };
    for job in jobs {
        let _ = job.events.send(Event::Failed(error.clone()));
    }
}
