//! `runner serve -m MODEL --fleet TOKEN --donors N`: the API's model runs on a fleet, donors
//! (`runner donor`, browser tabs) that meet in this server's own signaling room, through the
//! same front door (`Generator`) as on this machine's GPU.
//!
//! The coordinator keeps its own micro-batching: up to `--parallel` jobs (the chain's KV slots)
//! go through the chain together, a waiting job joins as soon as a slot frees, and each job is
//! answered as soon as its request ends (`Coordinator::generate_fed`). With `--replicas`, the
//! donors form several chains, each holding the whole model, and every chain takes jobs as its
//! slots free (`Replicas::generate_fed`). Log-probabilities come
//! from the last donor's candidates and its log-sum-exp over the whole vocabulary
//! (`StageOutput::TopK`), so they are the same as on one GPU.

use std::cell::RefCell;
use std::ops::ControlFlow;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, TryRecvError};
use std::time::Duration;

use anyhow::Context;
use webshard::front::{GenerateRequest, Generated, TextFront};
use webshard::shard::roles::{CoordinatorConfig, Feed, RoleError};
use webshard::shard::{WebRtcConfig, WebRtcTransport};

use super::errors::ApiError;
use super::worker::{
    choices_of, finished, guarded, stream_event, Event, Job, ModelHandle, Started,
};
use crate::fleet::{Fleet, Replicas};

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
    /// Requests in each chain at once.
    pub kv_slots: u32,
    /// Chains the donors form.
    pub replicas: Replicas,
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
    let mut fleet = runtime.block_on(connect(target))?;
    started.ready(text, fleet.vocab(), fleet.max_context());
    while let Some(first) = next_job(queued, started, true) {
        let jobs = RefCell::new(vec![]);
        let mut feed = QueueFeed {
            queued,
            started,
            first: Some(first),
            jobs: &jobs,
        };
        let outcome = guarded(|| {
            runtime.block_on(fleet.generate_fed(&mut feed, &mut |event| {
                match jobs.borrow().get(event.request) {
                    Some(Some(job)) => stream_event(job, event),
                    _ => ControlFlow::Break(()),
                }
            }))
        });
        let error = match outcome {
            Ok(Ok(())) => ApiError::internal("The fleet ended a request without its result"),
            Ok(Err(err)) => {
                ApiError::unavailable("fleet_failed", format!("The fleet failed: {err}"))
            }
            Err(panic) => panic,
        };
        // Whatever the run did not answer (nothing, when it ended well).
        for job in jobs.into_inner().into_iter().flatten() {
            let _ = job.events.send(Event::Failed(error.clone()));
        }
        started.metrics.running.store(0, Ordering::SeqCst);
    }
    runtime.block_on(fleet.shutdown("the server stopped"));
    Ok(())
}

/// The API's queue as the chain's feed: jobs join the run whenever it has a free slot, and
/// each gets its answer as soon as its request ends.
struct QueueFeed<'a> {
    queued: &'a Receiver<Job>,
    started: &'a Started,
    /// The job that started the run.
    first: Option<Job>,
    /// The run's jobs by feed index; `None` once answered.
    jobs: &'a RefCell<Vec<Option<Job>>>,
}

impl QueueFeed<'_> {
    fn publish_running(&self) {
        let running = self.jobs.borrow().iter().flatten().count();
        (self.started.metrics.running).store(running as u64, Ordering::SeqCst);
    }
}

impl Feed for QueueFeed<'_> {
    fn next(&mut self) -> Option<GenerateRequest> {
        let job = self
            .first
            .take()
            .or_else(|| next_job(self.queued, self.started, false))?;
        let request = job.request.clone();
        self.jobs.borrow_mut().push(Some(job));
        self.publish_running();
        Some(request)
    }

    fn done(&mut self, index: usize, result: Result<Generated, RoleError>) {
        let Some(job) = self.jobs.borrow_mut().get_mut(index).and_then(Option::take) else {
            return;
        };
        let event = match result {
            Ok(output) => {
                let choices = (output.logprobs.as_deref())
                    .zip(self.started.tokenizer())
                    .map(|(logprobs, tokenizer)| choices_of(tokenizer, logprobs));
                Event::Done(finished(output, choices))
            }
            Err(err) => Event::Failed(ApiError::internal(format!("Generation failed: {err}"))),
        };
        let _ = job.events.send(event);
        self.publish_running();
    }
}

/// The next job whose client is still there: waits for one when `block`, else only takes
/// one already queued. `None` once the queue is closed (or, not blocking, empty).
fn next_job(queued: &Receiver<Job>, started: &Started, block: bool) -> Option<Job> {
    loop {
        let job = match block {
            true => queued.recv().ok()?,
            false => match queued.try_recv() {
                Ok(job) => job,
                Err(TryRecvError::Empty | TryRecvError::Disconnected) => return None,
            },
        };
        started.metrics.queued.fetch_sub(1, Ordering::SeqCst);
        if !job.events.is_closed() {
            return Some(job);
        }
    }
}

/// The tokenizer and chat template, read from the model's header as the donors will see it.
async fn read_text_front(model_url: &str) -> anyhow::Result<TextFront> {
    Ok(TextFront::from_header(
        &super::read_model_header(model_url).await?,
    )?)
}

/// Joins the room, waits for the donors, plans and loads the chain (or chains).
async fn connect(target: &FleetTarget) -> anyhow::Result<Fleet<WebRtcTransport>> {
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
    let requests = target.kv_slots as usize;
    Ok(Fleet::connect(transport, config, target.replicas, requests).await?)
}
