//! The model worker: the one place the API drives a generator, through the front door
//! (`webshard::front::Generator`).
//!
//! Each served model gets a thread that owns its engine (the front door asks for no `Send`)
//! and its KV pool, and runs queued jobs together through the scheduler (`batch`): up to
//! `--parallel` sequences decode in one GPU step. Handlers talk to it through a bounded queue (full: 503)
//! and get each job's text back on a channel; a dropped receiver (the client went away)
//! cancels that job at its next token (`ControlFlow::Break`). Once loaded, the worker also
//! hands out a `PromptFront` (the generator's `TextFront`, vocabulary and context) so that
//! prompts are rendered, counted and checked against the context before they are queued.

use std::ops::ControlFlow;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, OnceLock};

use tokio::sync::mpsc::UnboundedSender;
use webshard::engine::Engine;
use webshard::front::{
    FinishReason, GenerateRequest, Generated, Generator, Prompt, RequestError, TextFront,
    TokenEvent, TokenLogprobs, Usage,
};
use webshard::sample::{log_sum_exp, SpecConfig};
use webshard::tokenizer::{Tokenizer, ToolSupport};

use super::batch::Scheduler;
use super::errors::ApiError;
use super::metrics::ModelMetrics;
use super::pool::default_slots;
use crate::model_args::ModelArgs;

/// One generated token's log-probability and its most likely alternatives.
#[derive(Debug, Clone)]
pub struct TokenChoice {
    pub bytes: Vec<u8>,
    pub logprob: f32,
    /// Best first.
    pub top: Vec<(Vec<u8>, f32)>,
}

/// The end of a job.
#[derive(Debug, Clone)]
pub struct Finished {
    pub text: String,
    /// Prompt, completion and cached prompt tokens, as the generator counted them.
    pub usage: Usage,
    pub finish: FinishReason,
    pub logprobs: Option<Vec<TokenChoice>>,
    /// Draft tokens verified and kept (speculative decoding; 0 without it).
    pub drafted: u32,
    pub accepted: u32,
}

/// What a job sends back, in order: text pieces, then `Done` or `Failed`.
#[derive(Debug)]
pub enum Event {
    Text(String),
    Done(Finished),
    Failed(ApiError),
}

/// A validated request, ready to run.
pub struct Job {
    /// Prompt and options (`options.logprobs` among them), checked against the context before
    /// queueing.
    pub request: GenerateRequest,
    pub events: UnboundedSender<Event>,
}

/// What the handlers need of a loaded generator to check a prompt before queueing it.
pub struct PromptFront {
    text: TextFront,
    vocab: u32,
    /// Positions one request can use: prompt plus completion must fit.
    pub max_context: u32,
}

impl PromptFront {
    /// The checked ids of `prompt`, as the generator will see them (`Generator::prompt_ids`).
    pub fn prompt_ids(&self, prompt: &Prompt) -> Result<Vec<u32>, RequestError> {
        self.text.prompt_ids(prompt, self.vocab)
    }

    /// Whether (and how) the model's chat template shows tools.
    pub fn tool_support(&self) -> ToolSupport {
        self.text.template.tool_support()
    }
}

/// How a model on this machine's GPU serves: the jobs that may wait, `--parallel` if given,
/// and the speculation of requests that do not ask for their own (`--spec`).
#[derive(Debug, Clone, Copy)]
pub struct Serving {
    pub queue: usize,
    pub parallel: Option<u32>,
    pub speculation: Option<SpecConfig>,
}

/// A served model as the handlers see it.
pub struct ModelHandle {
    pub name: String,
    pub metrics: Arc<ModelMetrics>,
    front: Arc<OnceLock<PromptFront>>,
    jobs: SyncSender<Job>,
}

impl ModelHandle {
    /// Starts the worker thread; it loads the model, then serves with `serving` (at most
    /// `serving.queue` jobs waiting). A load failure is sent on `failed`.
    pub fn start(
        name: String,
        load: ModelArgs,
        serving: Serving,
        failed: tokio::sync::mpsc::UnboundedSender<String>,
    ) -> std::io::Result<ModelHandle> {
        ModelHandle::spawn(name, serving.queue, failed, move |started, queued| {
            Worker { started, serving }.run(&load, queued)
        })
    }

    /// Starts a thread that runs `body` with what it publishes (`Started`) and the queue of
    /// at most `queue` waiting jobs; its error is sent on `failed`.
    pub(super) fn spawn(
        name: String,
        queue: usize,
        failed: tokio::sync::mpsc::UnboundedSender<String>,
        body: impl FnOnce(Started, Receiver<Job>) -> anyhow::Result<()> + Send + 'static,
    ) -> std::io::Result<ModelHandle> {
        let (jobs, queued) = sync_channel(queue);
        let started = Started {
            front: Arc::new(OnceLock::new()),
            metrics: Arc::new(ModelMetrics::default()),
        };
        let (front, metrics) = (Arc::clone(&started.front), Arc::clone(&started.metrics));
        let label = name.clone();
        std::thread::Builder::new()
            .name(format!("model {name}"))
            .spawn(move || {
                if let Err(err) = body(started, queued) {
                    let _ = failed.send(format!("model {label}: {err:#}"));
                }
            })?;
        Ok(ModelHandle {
            name,
            metrics,
            front,
            jobs,
        })
    }

    /// The text front once the model is loaded; 503 before.
    pub fn front(&self) -> Result<&PromptFront, ApiError> {
        self.front.get().ok_or_else(|| {
            ApiError::unavailable(
                "model_loading",
                format!("The model `{}` is still loading", self.name),
            )
        })
    }

    pub fn is_ready(&self) -> bool {
        self.front.get().is_some()
    }

    /// Queues a job; 503 when the queue is full.
    pub fn submit(&self, job: Job) -> Result<(), ApiError> {
        self.metrics.queued.fetch_add(1, Ordering::SeqCst);
        let refused = match self.jobs.try_send(job) {
            Ok(()) => return Ok(()),
            Err(TrySendError::Full(_)) => ApiError::unavailable(
                "queue_full",
                format!(
                    "The queue of `{}` is full; retry later (raise --queue to wait longer)",
                    self.name
                ),
            ),
            Err(TrySendError::Disconnected(_)) => ApiError::unavailable(
                "worker_stopped",
                format!("The worker of `{}` has stopped", self.name),
            ),
        };
        self.metrics.queued.fetch_sub(1, Ordering::SeqCst);
        Err(refused)
    }
}

/// What a model's thread publishes to the handlers: its prompt front once loaded, and its
/// gauges.
pub(super) struct Started {
    front: Arc<OnceLock<PromptFront>>,
    pub(super) metrics: Arc<ModelMetrics>,
}

impl Started {
    /// The model is loaded: prompts can be checked and `/health` turns 200.
    pub(super) fn ready(&self, text: TextFront, vocab: u32, max_context: u32) {
        let _ = self.front.set(PromptFront {
            text,
            vocab,
            max_context,
        });
        self.metrics.ready.store(1, Ordering::SeqCst);
    }

    /// The model's tokenizer, once `ready`.
    pub(super) fn tokenizer(&self) -> Option<&Tokenizer> {
        self.front.get().map(|front| &front.text.tokenizer)
    }
}

/// The thread's side of a model on this machine's GPU.
struct Worker {
    started: Started,
    serving: Serving,
}

impl Worker {
    fn run(self, load: &ModelArgs, queued: Receiver<Job>) -> anyhow::Result<()> {
        // A current-thread runtime polls the engine's futures; loading from a URL needs a
        // Tokio reactor, so plain `pollster` would not do.
        let mut runtime = runtime()?;
        let (engine, _) = runtime.block_on(load.load())?;
        // The handlers' own copy: the engine stays on this thread.
        let text = TextFront::from_header(&engine.model.header)?;
        let (vocab, max_context) = (engine.vocab(), engine.max_context());
        let slots = self.serving.parallel.map(|n| n as usize);
        let slots = slots.unwrap_or_else(|| default_parallel(&engine));
        let slots = slots.min(engine.stage.spec.max_batch as usize);
        let metrics = Arc::clone(&self.started.metrics);
        let mut scheduler = Scheduler::new(engine, slots, metrics)?;
        scheduler.speculation = self.serving.speculation;
        self.started.ready(text, vocab, max_context);
        let mut held = None;
        while scheduler.admit_from(&queued, &mut held) {
            match guarded(|| runtime.block_on(scheduler.step())) {
                Ok(Ok(())) => {}
                Ok(Err(err)) => {
                    scheduler.fail_all(ApiError::internal(format!("Generation failed: {err}")))
                }
                Err(panic) => {
                    scheduler.fail_all(panic);
                    runtime = self::runtime()?;
                }
            }
        }
        Ok(())
    }
}

/// `--parallel` when not given: as many slots of `--ctx` as a KV budget holds (a fixed
/// budget: wgpu does not tell how much memory an adapter has).
fn default_parallel(engine: &Engine) -> usize {
    let stage = &engine.stage;
    let cfg = &stage.cfg;
    let layers = stage.spec.layers.len() as u64;
    let per_token = 2 * layers * u64::from(cfg.n_kv_heads) * u64::from(cfg.head_dim) * 4;
    let slot_bytes = per_token * u64::from(stage.spec.max_context);
    let (budget, most) = match stage.gpu.caps.cpu_work_split {
        true => (KV_BUDGET_ON_CPU, MOST_SLOTS_ON_CPU),
        false => (KV_BUDGET_ON_GPU, MOST_SLOTS_ON_GPU),
    };
    default_slots(slot_bytes, budget, most)
}

/// The default KV budgets and slot counts. On a CPU adapter one slot: a lone request there
/// decodes fastest alone (lavapipe, SmolLM2: 2.5 tok/s alone, 4 rows 4.3 in all but 1.1 each;
/// docs/perf.md, session 17). On a GPU up to 16, the rows the fused batched path takes: on the H200 (docs/perf.md, session
/// 16) 4 streams gave 1,800 / 1,269 tok/s in all (SmolLM2 / Qwen2.5) and 16 gave 3,292 /
/// 1,823, where one slot gives one stream's 809 / 676. The budget is modest because wgpu does
/// not say how much memory the adapter has: 2 GiB is 16 slots of 4,096 positions of
/// Qwen2.5-0.5B, 2 of a 7B model's; `--parallel N` sets any other count.
const KV_BUDGET_ON_CPU: u64 = 1 << 30;
const MOST_SLOTS_ON_CPU: usize = 1;
const KV_BUDGET_ON_GPU: u64 = 2 << 30;
const MOST_SLOTS_ON_GPU: usize = 16;

fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
}

/// Runs `work`, turning a panic into a 500 so the worker keeps serving.
pub fn guarded<T>(work: impl FnOnce() -> T) -> Result<T, ApiError> {
    catch_unwind(AssertUnwindSafe(work)).map_err(|panic| {
        let what = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".to_string());
        tracing::error!(%what, "a generation panicked");
        ApiError::internal(format!("Internal error while generating: {what}"))
    })
}

/// Sends a token's text to the client; a closed channel (the client left) cancels the job.
pub(super) fn stream_event(job: &Job, event: TokenEvent<'_>) -> ControlFlow<()> {
    let delivered = match event.text {
        "" => !job.events.is_closed(),
        text => job.events.send(Event::Text(text.to_string())).is_ok(),
    };
    match delivered {
        true => ControlFlow::Continue(()),
        false => ControlFlow::Break(()),
    }
}

pub(super) fn finished(out: Generated, logprobs: Option<Vec<TokenChoice>>) -> Finished {
    Finished {
        usage: out.usage(),
        text: out.text,
        finish: out.finish_reason,
        logprobs,
        drafted: out.timings.drafted,
        accepted: out.timings.accepted,
    }
}

/// A generator's log-probabilities as the API reports them: each token's bytes.
pub(super) fn choices_of(tokenizer: &Tokenizer, logprobs: &[TokenLogprobs]) -> Vec<TokenChoice> {
    let bytes = |id: u32| tokenizer.token_bytes(id);
    logprobs
        .iter()
        .map(|token| TokenChoice {
            bytes: bytes(token.id),
            logprob: token.logprob,
            top: token.top.iter().map(|&(id, l)| (bytes(id), l)).collect(),
        })
        .collect()
}

pub(super) fn choice_of(tokenizer: &Tokenizer, logits: &[f32], id: u32, top: usize) -> TokenChoice {
    let log_norm = log_sum_exp(logits);
    let logprob = |l: f32| l - log_norm;
    let mut order: Vec<u32> = (0..logits.len() as u32).collect();
    let top = top.min(order.len());
    let by_logit = |a: &u32, b: &u32| logits[*b as usize].total_cmp(&logits[*a as usize]);
    if top > 0 && top < order.len() {
        order.select_nth_unstable_by(top - 1, by_logit);
    }
    order.truncate(top);
    order.sort_unstable_by(by_logit);
    TokenChoice {
        bytes: tokenizer.token_bytes(id),
        logprob: logits
            .get(id as usize)
            .map_or(f32::NEG_INFINITY, |&l| logprob(l)),
        top: order
            .into_iter()
            .map(|t| (tokenizer.token_bytes(t), logprob(logits[t as usize])))
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_becomes_a_500_and_the_caller_goes_on() {
        let err = guarded(|| -> u32 { panic!("boom") }).unwrap_err();
        assert_eq!(err.status, axum::http::StatusCode::INTERNAL_SERVER_ERROR);
        assert!(err.message.contains("boom"), "{}", err.message);
        assert_eq!(guarded(|| 7).unwrap(), 7);
    }
}
