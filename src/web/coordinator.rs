//! The `Coordinator` class JavaScript sees: this page coordinates a fleet of donors instead
//! of generating on its own GPU.
//!
//! `Coordinator.connect({ signal, fleet, donors, model, maxContext, joinTimeoutS,
//! heartbeatTimeoutS, onEvent, abortSignal })` joins the fleet's signaling room, reads the
//! model's header from `model` (tokenizer and chat template stay here; donors fetch their
//! layers from the same URL, so it must be absolute), waits for `donors` donors, plans the
//! layers over them and waits until every stage has loaded. `onEvent` gets what happens in
//! the fleet as it happens (`fleet_watch::FleetEvent`: donors, plan, stages ready, each
//! step's hops, donors lost).
//!
//! Then `generate(prompt, options, onToken)` and `chat(messages, options, onToken)` run
//! through the chain with `Engine`'s options; `onToken({ index, id, text })` gets each token.
//! They resolve to `{ promptIds, ids, text, aborted, decodeTokS, stepMsMean, recoveries,
//! report }`, `report` as `runner coordinate --json` prints it. A lost donor is planned
//! out and the request replayed, so the output does not change. `stop()` ends a generation
//! early: a request cannot be taken out of the chain midway, so that dismisses the fleet, as
//! `close()` does.
//!
//! It runs on the page, not in the engine's worker: Chromium has no `RTCPeerConnection` in
//! workers.

use std::cell::RefCell;
use std::ops::ControlFlow;
use std::rc::Rc;
use std::time::Duration;

use futures::channel::oneshot;
use futures::FutureExt;
use js_sys::Function;
use serde::{Deserialize, Serialize};
use wasm_bindgen::prelude::*;
use web_sys::AbortSignal;

use super::engine::member;
use super::error::WebError;
use super::fleet_watch::Watched;
use super::options::{self, to_js, GenerateSettings};
use super::stop::{aborted, race};
use crate::front::{
    FinishReason, GenerateRequest, Generated, Generator, Prompt, RequestError, TokenEvent, Usage,
};
use crate::shard::roles::coordinator::RunReport;
use crate::shard::roles::{Coordinator, CoordinatorConfig, RoleError};
use crate::shard::transport::TransportError;
use crate::shard::webrtc::{WebRtcConfig, WebRtcTransport};
use crate::tokenizer::ChatMessage;

/// Most donors one page waits for (a sanity bound on a typed-in number).
const MAX_DONORS: usize = 64;
/// Longest a timeout may be set to: a day.
const MAX_TIMEOUT_S: f64 = 86_400.0;

type FleetCoordinator = Coordinator<Watched<WebRtcTransport>>;

/// The plain-data part of `Coordinator.connect`'s options (callbacks and the abort signal
/// are read apart).
#[derive(Debug, Clone, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct FleetSettings {
    /// Signaling server, `ws://HOST:PORT/signal`.
    signal: String,
    /// Fleet token: donors must present the same one; it also names the signaling room.
    fleet: String,
    donors: usize,
    /// Absolute `http(s)://` URL of the GGUF, which every donor fetches its layers from.
    model: String,
    max_context: u32,
    join_timeout_s: f64,
    /// A stage silent this long is taken as lost. A SwiftShader stage answers nothing for
    /// seconds while it compiles its kernels, hence the runner's generous default.
    heartbeat_timeout_s: f64,
}

impl Default for FleetSettings {
    fn default() -> FleetSettings {
        FleetSettings {
            signal: String::new(),
            fleet: String::new(),
            donors: 1,
            model: String::new(),
            max_context: 2048,
            join_timeout_s: 300.0,
            heartbeat_timeout_s: 30.0,
        }
    }
}

impl FleetSettings {
    fn check(&self) -> Result<(), WebError> {
        let fail = |message: String| Err(WebError::Options(message));
        if !(self.signal.starts_with("ws://") || self.signal.starts_with("wss://")) {
            return fail(format!(
                "signal must be a ws:// or wss:// URL, not {:?}",
                self.signal
            ));
        }
        if self.fleet.is_empty() {
            return fail("fleet (the fleet token) is empty".into());
        }
        if !(1..=MAX_DONORS).contains(&self.donors) {
            return fail(format!("donors {} must be 1..={MAX_DONORS}", self.donors));
        }
        if !(self.model.starts_with("http://") || self.model.starts_with("https://")) {
            return fail(format!(
                "model must be an absolute http(s):// URL the donors can fetch, not {:?}",
                self.model
            ));
        }
        if self.max_context == 0 {
            return fail("maxContext must be at least 1".into());
        }
        for (name, seconds) in [
            ("joinTimeoutS", self.join_timeout_s),
            ("heartbeatTimeoutS", self.heartbeat_timeout_s),
        ] {
            if !(seconds > 0.0 && seconds <= MAX_TIMEOUT_S) {
                return fail(format!(
                    "{name} {seconds} must be more than 0 and at most {MAX_TIMEOUT_S}"
                ));
            }
        }
        Ok(())
    }

    fn config(&self) -> CoordinatorConfig {
        let mut config = CoordinatorConfig::new(&self.model, &self.fleet, self.donors);
        config.runtime.max_context = self.max_context;
        config.join_timeout = Duration::from_secs_f64(self.join_timeout_s);
        config.heartbeat_timeout = Duration::from_secs_f64(self.heartbeat_timeout_s);
        config
    }
}

/// Where the coordinator is between calls.
enum Slot {
    Idle(Box<FleetCoordinator>),
    /// A generation has it.
    Busy,
    /// Dismissed, with why.
    Closed(String),
}

/// What a page shows about the fleet once connected.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct FleetInfo {
    model: String,
    arch: String,
    n_layers: u32,
    vocab: u32,
    max_context: u32,
    /// Stages of the plan the chain was loaded with.
    stages: usize,
}

/// A connected fleet, ready to generate.
#[wasm_bindgen(js_name = Coordinator)]
pub struct WebCoordinator {
    slot: Rc<RefCell<Slot>>,
    /// Ends the running generation (`stop`).
    stop: Rc<RefCell<Option<oneshot::Sender<()>>>>,
    info: FleetInfo,
}

#[wasm_bindgen(js_class = Coordinator)]
impl WebCoordinator {
    /// Joins the fleet and waits until its chain is loaded (see the module documentation).
    pub async fn connect(options: JsValue) -> Result<WebCoordinator, JsValue> {
        Ok(connect(options).await?)
    }

    /// `{ model, arch, nLayers, vocab, maxContext, stages }`.
    pub fn info(&self) -> Result<JsValue, JsValue> {
        Ok(to_js(&self.info).map_err(WebError::Options)?)
    }

    /// The figures of the run so far (plan, hops, recoveries), as `runner coordinate
    /// --json` prints them.
    pub fn report(&self) -> Result<JsValue, JsValue> {
        match &*self.slot.borrow() {
            Slot::Idle(coordinator) => Ok(to_js(coordinator.report()).map_err(WebError::Options)?),
            Slot::Busy => Err(WebError::Busy.into()),
            Slot::Closed(reason) => Err(closed(reason).into()),
        }
    }

    /// Token ids of `text` as `runner generate` tokenizes a prompt.
    pub fn tokenize(&self, text: &str) -> Result<Vec<u32>, JsValue> {
        match &*self.slot.borrow() {
            Slot::Idle(coordinator) => Ok(coordinator.text.tokenize_prompt(text)),
            Slot::Busy => Err(WebError::Busy.into()),
            Slot::Closed(reason) => Err(closed(reason).into()),
        }
    }

    /// Generates after `prompt` through the fleet; `onToken({ index, id, text })`.
    pub fn generate(
        &self,
        prompt: String,
        options: JsValue,
        on_token: Option<Function>,
    ) -> js_sys::Promise {
        let run = self.run(options, on_token);
        wasm_bindgen_futures::future_to_promise(async move {
            Ok(run.generate(Prompt::Text(prompt)).await?)
        })
    }

    /// Renders `messages` (`[{ role, content }]`) with the model's chat template, then
    /// generates as `generate` does.
    pub fn chat(
        &self,
        messages: JsValue,
        options: JsValue,
        on_token: Option<Function>,
    ) -> js_sys::Promise {
        let run = self.run(options, on_token);
        wasm_bindgen_futures::future_to_promise(async move {
            let messages: Vec<ChatMessage> = serde_wasm_bindgen::from_value(messages)
                .map_err(|e| WebError::Options(format!("messages: {e}")))?;
            Ok(run.generate(Prompt::Chat(messages)).await?)
        })
    }

    /// Ends the running generation; its promise resolves with `aborted: true` and the fleet
    /// is dismissed.
    pub fn stop(&self) {
        if let Some(sender) = self.stop.borrow_mut().take() {
            let _ = sender.send(());
        }
    }

    /// Dismisses every donor (a running generation is stopped first, and its ending
    /// dismisses them).
    pub async fn close(&self) {
        self.stop();
        if !matches!(&*self.slot.borrow(), Slot::Idle(_)) {
            return;
        }
        let reason = "closed on the coordinator page";
        if let Slot::Idle(coordinator) = self.slot.replace(Slot::Closed(reason.into())) {
            (*coordinator).shutdown(reason).await;
        }
    }

    fn run(&self, options: JsValue, on_token: Option<Function>) -> Run {
        Run {
            slot: self.slot.clone(),
            stop: self.stop.clone(),
            options,
            on_token,
            max_context: self.info.max_context,
        }
    }
}

async fn connect(options: JsValue) -> Result<WebCoordinator, WebError> {
    let settings: FleetSettings = options::parse(&options, "fleet options")?;
    settings.check()?;
    let on_event: Option<Function> = member(&options, "onEvent");
    let abort: Option<AbortSignal> = member(&options, "abortSignal");
    let stopped = abort.as_ref().map(aborted);
    let joined = WebRtcTransport::join_fleet(
        &settings.signal,
        &settings.fleet,
        // Loopback and LAN fleets need no STUN; a public fleet would pass ICE servers here.
        WebRtcConfig {
            ice_urls: Vec::new(),
            ..WebRtcConfig::default()
        },
    );
    let transport = race(joined, stopped.as_ref())
        .await?
        .map_err(explain_join)?;
    let watched = Watched::new(transport, &settings.fleet, on_event);
    let coordinator = race(
        Coordinator::connect(watched, settings.config()),
        stopped.as_ref(),
    )
    .await?
    .map_err(explain_gather)?;
    let info = FleetInfo {
        model: settings.model.clone(),
        arch: coordinator.model.cfg.arch.name().to_string(),
        n_layers: coordinator.model.cfg.n_layers,
        vocab: coordinator.model.cfg.vocab,
        max_context: settings.max_context,
        stages: coordinator.plan().stages.len(),
    };
    Ok(WebCoordinator {
        slot: Rc::new(RefCell::new(Slot::Idle(Box::new(coordinator)))),
        stop: Rc::default(),
        info,
    })
}

/// A refused room looks the same as an unreachable server from a browser (a WebSocket
/// error says nothing more), so the hint names both.
pub(super) fn explain_join(error: TransportError) -> WebError {
    let hint = match error {
        TransportError::Connect { .. } | TransportError::ConnectTimeout { .. } => {
            "is the signaling URL right, and the fleet token? A server started with \
             `runner serve --fleet TOKEN` admits only that fleet's room"
        }
        _ => "",
    };
    WebError::FleetHint {
        error: error.into(),
        hint,
    }
}

fn explain_gather(error: RoleError) -> WebError {
    let hint = match error {
        RoleError::Timeout { .. } | RoleError::TooFewDonors { .. } => {
            "are the donors started with this signaling URL and this fleet token?"
        }
        _ => "",
    };
    WebError::FleetHint { error, hint }
}

fn closed(reason: &str) -> WebError {
    WebError::FleetClosed(reason.to_string())
}

/// One `generate`/`chat` call, owning what its promise needs.
struct Run {
    slot: Rc<RefCell<Slot>>,
    stop: Rc<RefCell<Option<oneshot::Sender<()>>>>,
    options: JsValue,
    on_token: Option<Function>,
    /// Positions every stage caches.
    max_context: u32,
}

/// What `generate` and `chat` resolve to.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct FleetResult {
    prompt_ids: Vec<u32>,
    ids: Vec<u32>,
    text: String,
    aborted: bool,
    decode_tok_s: f64,
    step_ms_mean: f64,
    recoveries: u32,
    report: RunReport,
    finish_reason: FinishReason,
    usage: Usage,
}

/// How a generation ended: stopped (`Err`), or the coordinator's own result.
type Outcome = Result<Result<Vec<Generated>, RoleError>, WebError>;

impl FleetResult {
    fn new(prompt_ids: Vec<u32>, output: Generated, aborted: bool, report: RunReport) -> Self {
        let finish_reason = match aborted {
            true => FinishReason::Cancelled,
            false => output.finish_reason,
        };
        let usage = Usage {
            prompt_tokens: prompt_ids.len() as u32,
            completion_tokens: output.ids.len() as u32,
            cached_tokens: output.cached_tokens,
        };
        FleetResult {
            finish_reason,
            usage,
            prompt_ids,
            ids: output.ids,
            text: output.text,
            aborted,
            decode_tok_s: report.decode_tokens_per_s,
            step_ms_mean: report.step_ms_mean,
            recoveries: report.recoveries,
            report,
        }
    }
}

impl Run {
    async fn generate(self, prompt: Prompt) -> Result<JsValue, WebError> {
        let settings: GenerateSettings = options::parse(&self.options, "generate options")?;
        let mut options = settings.options()?;
        let mut coordinator = self.take()?;
        let prompt_ids = coordinator
            .prompt_ids(&prompt)
            .map_err(request_error)
            .and_then(|ids| {
                options.max_tokens = settings.max_tokens(ids.len(), self.max_context);
                check_fits(&ids, options.max_tokens, self.max_context).map(|()| ids)
            });
        let prompt_ids = match prompt_ids {
            Ok(ids) => ids,
            Err(error) => {
                self.slot.replace(Slot::Idle(coordinator));
                return Err(error);
            }
        };
        let request = GenerateRequest::new(Prompt::Ids(prompt_ids.clone()), options);
        let (outcome, streamed) = self.stream(&mut coordinator, &request).await;
        let report = coordinator.report().clone();
        let (output, aborted) = match outcome {
            Ok(Ok(mut outputs)) => {
                self.slot.replace(Slot::Idle(coordinator));
                (outputs.pop().unwrap_or_default(), false)
            }
            Ok(Err(error)) => {
                self.dismiss(coordinator, format!("generation failed: {error}"))
                    .await;
                return Err(WebError::FleetHint {
                    error,
                    hint: "the fleet was dismissed: connect again",
                });
            }
            Err(_) => {
                self.dismiss(coordinator, "stopped on the coordinator page".into())
                    .await;
                (streamed, true)
            }
        };
        to_js(&FleetResult::new(prompt_ids, output, aborted, report)).map_err(WebError::Options)
    }

    /// Runs `request` until it ends or `stop()` is called, passing each token to `onToken`;
    /// also returns the tokens streamed, the output of a stopped generation.
    async fn stream(
        &self,
        coordinator: &mut FleetCoordinator,
        request: &GenerateRequest,
    ) -> (Outcome, Generated) {
        let (sender, receiver) = oneshot::channel();
        self.stop.replace(Some(sender));
        let stopped = receiver.shared();
        let mut streamed = Generated::default();
        let mut on_update = |update: TokenEvent<'_>| {
            streamed.ids.push(update.id);
            streamed.text.push_str(update.text);
            if let Some(callback) = &self.on_token {
                let token = TokenJs {
                    index: update.index,
                    id: update.id,
                    text: update.text,
                };
                if let Ok(value) = to_js(&token) {
                    let _ = callback.call1(&JsValue::NULL, &value);
                }
            }
            ControlFlow::Continue(())
        };
        let outcome = race(
            coordinator.generate(std::slice::from_ref(request), &mut on_update),
            Some(&stopped),
        )
        .await;
        self.stop.replace(None);
        (outcome, streamed)
    }

    /// The coordinator, unless another call has it or the fleet is closed.
    fn take(&self) -> Result<Box<FleetCoordinator>, WebError> {
        match self.slot.replace(Slot::Busy) {
            Slot::Idle(coordinator) => Ok(coordinator),
            Slot::Busy => Err(WebError::Busy),
            Slot::Closed(reason) => {
                self.slot.replace(Slot::Closed(reason.clone()));
                Err(closed(&reason))
            }
        }
    }

    async fn dismiss(&self, coordinator: Box<FleetCoordinator>, reason: String) {
        self.slot.replace(Slot::Closed(reason.clone()));
        (*coordinator).shutdown(&reason).await;
    }
}

/// `onToken`'s argument.
#[derive(Serialize)]
struct TokenJs<'a> {
    index: u32,
    id: u32,
    text: &'a str,
}

/// A template the page cannot render is the fleet's model's; other bad requests are options.
fn request_error(error: RequestError) -> WebError {
    match error {
        RequestError::Template(_) => WebError::Fleet(error.into()),
        other => WebError::Options(other.to_string()),
    }
}

/// A request the chain cannot hold is the caller's mistake, found before anything is sent:
/// the fleet stays connected (the coordinator would fail the whole generation on it).
fn check_fits(prompt_ids: &[u32], max_tokens: u32, max_context: u32) -> Result<(), WebError> {
    if prompt_ids.is_empty() {
        return Err(WebError::Options("the prompt is empty".into()));
    }
    let needed = prompt_ids.len() as u64 + u64::from(max_tokens);
    if needed > u64::from(max_context) {
        return Err(WebError::Options(format!(
            "the prompt ({} tokens) and n ({max_tokens}) need {needed} positions, more than the \
             fleet's context of {max_context} (maxContext when connecting)",
            prompt_ids.len()
        )));
    }
    Ok(())
}
