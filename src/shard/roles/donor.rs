//! The donor role: joins a fleet, loads the layers it is assigned over ranged reads, and
//! serves `Forward` steps (`step.rs`), passing activations down the chain.
//!
//! Every frame from a peer is untrusted: it goes through `FrameValidator`, and a refused
//! frame is answered with `Error(BadFrame)` and otherwise dropped. The coordinator is the
//! peer whose `Assign` this donor accepted first; only it may re-assign, dismiss or feed
//! `Token`s and heartbeats, and only the assigned upstream peer may send `Forward`s.

use std::collections::{HashSet, VecDeque};
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use web_time::Instant;

use serde::Serialize;

use super::super::frame::{
    Assign, DonorInfo, ErrorCode, ErrorReport, Hello, Message, Ready, TokenEvent,
};
use super::super::transport::{send_message, PeerId, Transport, TransportError, TransportEvent};
use super::super::validate::{FrameLimits, FrameValidator, InputKind, ModelShape};
use super::super::vocab::ByteVocab;
use super::host::StageHost;
use super::offload::StepRunner;
use super::timer::with_timeout;
use super::{probe, RoleError};
use crate::gpu::Gpu;

/// Longest message this role puts in an `Error` (the validator's text limit is larger).
const MAX_ERROR_TEXT: usize = 1024;
/// Longest a leaving donor waits for its last frames to reach the coordinator.
const EXIT_FLUSH: Duration = Duration::from_secs(5);
/// How often an unassigned donor repeats its Hello to every peer.
const REGREET: Duration = Duration::from_secs(2);

pub struct DonorConfig {
    /// Must match the coordinator's, or the Hello is refused.
    pub fleet_token: String,
    pub gpu: Arc<Gpu>,
    /// GPU memory offered for weights, KV caches and scratch (WebGPU does not report it).
    pub usable_gpu_bytes: u64,
    pub limits: FrameLimits,
    /// Speed to report instead of probing (ms per reference layer). The plan follows the
    /// donors' speeds, and a probe on a shared, loaded CPU can be off by 2x: tests pin it so
    /// that their plans do not depend on the machine's load. `None`: probe the GPU.
    pub pinned_ms_per_layer: Option<f32>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub enum DonorPhase {
    #[default]
    Joining,
    Loading,
    Serving,
    Left,
}

/// What a donor page or CLI shows; handed to the status callback after every change.
#[derive(Clone, Debug, Default, Serialize)]
pub struct DonorStatus {
    pub phase: DonorPhase,
    pub adapter: String,
    pub ms_per_layer: f32,
    pub coordinator: Option<String>,
    pub epoch: Option<u32>,
    pub stage_id: Option<u16>,
    pub layers: Option<Range<u32>>,
    pub bytes_downloaded: u64,
    pub load_ms: u32,
    pub steps: u64,
    /// Time of the last step in this stage (per token while decoding).
    pub last_step_ms: f32,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub refused_frames: u64,
    /// Text generated so far for the latest request, decoded with the ByteVocab.
    pub text: String,
    pub last_error: Option<String>,
}

/// Why `Donor::run` returned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DonorExit {
    /// The coordinator sent `Leave`.
    Dismissed(String),
    /// The coordinator's connection went away.
    CoordinatorLeft,
    /// The transport closed.
    Closed,
}

type StatusCallback = Box<dyn FnMut(&DonorStatus)>;

pub struct Donor<T: Transport> {
    pub(super) transport: T,
    config: DonorConfig,
    pub(super) validator: FrameValidator,
    /// The loaded stage; `None` before the first Assign and while a step has it.
    pub(super) host: Option<StageHost>,
    vocab: Option<ByteVocab>,
    pub(super) coordinator: Option<PeerId>,
    /// Peers greeted already: a peer present at start is also announced by `PeerJoined`.
    greeted: HashSet<PeerId>,
    /// When the unassigned donor greets every peer again, however busy the room is.
    next_regreet: Instant,
    /// The request whose text is shown, and its tokens so far.
    shown: Option<(u64, Vec<u32>)>,
    pub(super) status: DonorStatus,
    on_status: Option<StatusCallback>,
    pub(super) steps: StepRunner,
    /// Events that arrived while a step computed, handled after it in arrival order.
    pub(super) deferred: VecDeque<TransportEvent>,
    pub(super) deferred_bytes: usize,
    /// The transport said `Closed` while a step computed.
    pub(super) closed: bool,
}

impl<T: Transport> Donor<T> {
    pub fn new(transport: T, config: DonorConfig) -> Donor<T> {
        let validator = FrameValidator::new(config.limits);
        let status = DonorStatus {
            adapter: config.gpu.caps.adapter.clone(),
            ..DonorStatus::default()
        };
        Donor {
            transport,
            config,
            validator,
            host: None,
            vocab: None,
            coordinator: None,
            greeted: HashSet::new(),
            next_regreet: Instant::now() + REGREET,
            shown: None,
            status,
            on_status: None,
            steps: StepRunner::default(),
            deferred: VecDeque::new(),
            deferred_bytes: 0,
            closed: false,
        }
    }

    /// Called with the status after every change (phase, step, token).
    pub fn on_status(&mut self, callback: impl FnMut(&DonorStatus) + 'static) {
        self.on_status = Some(Box::new(callback));
    }

    pub fn status(&self) -> &DonorStatus {
        &self.status
    }

    /// Probes the GPU, says Hello to every peer, and serves until dismissed or disconnected.
    pub async fn run(mut self) -> Result<DonorExit, RoleError> {
        self.start().await?;
        let exit = self.serve().await;
        self.leave().await;
        exit
    }

    /// Serves one coordinator after another until the transport closes or a coordinator
    /// refuses this donor: after a dismissal or a coordinator's departure the donor greets the
    /// room again and waits for the next one, keeping the layers it holds for the next plan
    /// (`StageHost::for_assign` loads only those it lacks). `on_exit` hears each
    /// coordinator's end.
    pub async fn run_staying(
        mut self,
        mut on_exit: impl FnMut(&DonorExit),
    ) -> Result<(), RoleError> {
        self.start().await?;
        loop {
            let exit = self.serve().await;
            self.flush_to_coordinator().await;
            let exit = match exit {
                Ok(exit) => exit,
                Err(error) => {
                    self.leave().await;
                    return Err(error);
                }
            };
            on_exit(&exit);
            if exit == DonorExit::Closed {
                self.leave().await;
                return Ok(());
            }
            self.return_to_room().await;
        }
    }

    async fn start(&mut self) -> Result<(), RoleError> {
        self.status.ms_per_layer = match self.config.pinned_ms_per_layer {
            Some(ms) => ms,
            None => probe::probe_ms_per_layer(&self.config.gpu).await?,
        };
        self.publish();
        for peer in self.transport.peers() {
            self.hello(peer).await;
        }
        Ok(())
    }

    async fn leave(&mut self) {
        self.status.phase = DonorPhase::Left;
        self.publish();
        self.flush_to_coordinator().await;
    }

    /// Dropping the transport discards what it still queues (an answer, an error report).
    async fn flush_to_coordinator(&mut self) {
        if let Some(coordinator) = self.coordinator {
            let _ = with_timeout(EXIT_FLUSH, self.transport.flush(coordinator)).await;
        }
    }

    /// Forgets the coordinator (not the stage it loaded) and greets every peer again.
    pub(super) async fn return_to_room(&mut self) {
        self.coordinator = None;
        self.status.coordinator = None;
        self.status.epoch = None;
        self.status.stage_id = None;
        self.status.phase = DonorPhase::Joining;
        self.validator = FrameValidator::new(self.config.limits);
        self.publish();
        self.greeted.clear();
        self.next_regreet = Instant::now() + REGREET;
        for peer in self.transport.peers() {
            self.hello(peer).await;
        }
    }

    async fn serve(&mut self) -> Result<DonorExit, RoleError> {
        loop {
            let event = match self.next_event().await {
                Ok(event) => event,
                Err(TransportError::Closed) => return Ok(DonorExit::Closed),
                Err(error) => return Err(error.into()),
            };
            match event {
                // The coordinator may arrive after us: greet every newcomer until assigned.
                TransportEvent::PeerJoined(peer) if self.coordinator.is_none() => {
                    self.hello(peer).await
                }
                TransportEvent::PeerJoined(_) => {}
                TransportEvent::PeerLeft(peer) if Some(peer) == self.coordinator => {
                    return Ok(DonorExit::CoordinatorLeft)
                }
                TransportEvent::PeerLeft(peer) => {
                    self.greeted.remove(&peer);
                }
                TransportEvent::BadChunk { from, error } => {
                    self.note_refused(&format!("bad chunk from {from}: {error}"))
                }
                TransportEvent::Frame { from, frame } => {
                    if let Some(exit) = self.handle_frame(from, &frame).await? {
                        return Ok(exit);
                    }
                }
            }
        }
    }

    /// The next event: first those kept while a step computed. Until a coordinator has
    /// assigned a stage, the Hello is sent again to every peer each `REGREET`: a frame sent as
    /// a new WebRTC link opens can be lost (`docs/protocol.md`, Joining), and a coordinator
    /// ignores a Hello from a donor it knows.
    async fn next_event(&mut self) -> Result<TransportEvent, TransportError> {
        if let Some(event) = self.next_deferred() {
            return Ok(event);
        }
        loop {
            if self.coordinator.is_some() {
                return self.transport.recv().await;
            }
            let wait = self.next_regreet.saturating_duration_since(Instant::now());
            if let Ok(event) = with_timeout(wait, self.transport.recv()).await {
                return event;
            }
            self.next_regreet = Instant::now() + REGREET;
            self.greeted.clear();
            for peer in self.transport.peers() {
                self.hello(peer).await;
            }
        }
    }

    async fn hello(&mut self, peer: PeerId) {
        if !self.greeted.insert(peer) {
            return;
        }
        let hello = Message::Hello(Hello {
            fleet_token: self.config.fleet_token.clone(),
            donor: DonorInfo {
                adapter: self.status.adapter.chars().take(256).collect(),
                usable_gpu_bytes: self.config.usable_gpu_bytes,
                ms_per_layer: self.status.ms_per_layer,
            },
        });
        self.send_or_log(peer, &hello).await;
    }

    async fn handle_frame(
        &mut self,
        from: PeerId,
        frame: &[u8],
    ) -> Result<Option<DonorExit>, RoleError> {
        let message = match self.validator.decode(frame) {
            Ok(message) => message,
            Err(error) => {
                self.refuse(from, None, &error.to_string()).await;
                return Ok(None);
            }
        };
        let from_coordinator = self.coordinator == Some(from);
        match message {
            Message::Assign(assign) if self.coordinator.is_none() || from_coordinator => {
                self.on_assign(from, assign).await
            }
            Message::Forward(forward) => self.on_forward(from, forward).await,
            Message::Token(token) if from_coordinator => self.show_token(token),
            Message::Heartbeat(beat) if from_coordinator => {
                self.send_or_log(from, &Message::Heartbeat(beat)).await
            }
            Message::Leave(leave) if from_coordinator => {
                return Ok(Some(DonorExit::Dismissed(leave.reason)))
            }
            Message::Error(report) => return self.on_error(from, report),
            // Other donors greet everyone in the room; only the coordinator answers.
            Message::Hello(_) => {}
            other => {
                let reason = format!("{:?} from {from} is not expected by a donor", other.kind());
                self.refuse(from, None, &reason).await;
            }
        }
        Ok(None)
    }

    fn on_error(
        &mut self,
        from: PeerId,
        report: ErrorReport,
    ) -> Result<Option<DonorExit>, RoleError> {
        tracing::warn!(%from, code = ?report.code, message = %report.message, "peer reported an error");
        if report.code == ErrorCode::Refused && self.coordinator.is_none() {
            return Err(RoleError::Peer {
                peer: from,
                code: report.code,
                message: report.message,
            });
        }
        self.status.last_error = Some(report.message);
        self.publish();
        Ok(None)
    }

    async fn on_assign(&mut self, from: PeerId, assign: Assign) {
        self.coordinator = Some(from);
        self.status.coordinator = Some(from.to_string());
        self.status.phase = DonorPhase::Loading;
        // The page shows which layers are loading, not only which are served.
        self.status.epoch = Some(assign.epoch);
        self.status.stage_id = Some(assign.stage_id);
        self.status.layers = Some(assign.layer_start..assign.layer_end);
        self.publish();
        let started = web_time::Instant::now();
        let gpu = Arc::clone(&self.config.gpu);
        let loaded = StageHost::for_assign(self.host.take(), gpu, &assign).await;
        let load_ms = started.elapsed().as_millis().min(u32::MAX as u128) as u32;
        match loaded {
            Ok(host) => self.serve_stage(from, host, &assign, load_ms).await,
            Err(error) => {
                self.drop_stage(&error.to_string());
                let report = error_report(ErrorCode::LoadFailed, None, &error.to_string());
                self.send_or_log(from, &report).await;
            }
        }
    }

    /// Forgets the stage (it failed to load, or a step took it down): the donor waits for
    /// its coordinator to assign it again.
    pub(super) fn drop_stage(&mut self, reason: &str) {
        self.host = None;
        self.validator = FrameValidator::new(self.config.limits);
        self.status.phase = DonorPhase::Joining;
        self.status.last_error = Some(reason.to_string());
        self.publish();
    }

    async fn serve_stage(&mut self, from: PeerId, host: StageHost, assign: &Assign, load_ms: u32) {
        // Ready promises a working chain: the first Forward must find the next stage.
        if !self.reach(assign.downstream).await {
            self.host = Some(host);
            if !self.closed {
                self.rejoin_for_link(assign.downstream).await;
            }
            return;
        }
        let input = if assign.embedding {
            InputKind::Tokens
        } else {
            InputKind::Hidden
        };
        self.validator.begin_epoch(assign.epoch);
        self.validator.set_model(ModelShape {
            vocab_size: host.stage.cfg.vocab,
            d_model: assign.d_model,
        });
        self.validator.expect_stage(assign.stage_id, input);
        // The Assign's vocabulary already parsed during validation.
        self.vocab = ByteVocab::from_bytes(&assign.vocab).ok();
        let ready = Message::Ready(Ready {
            epoch: assign.epoch,
            stage_id: assign.stage_id,
            bytes_downloaded: host.bytes_downloaded,
            load_ms,
        });
        self.status.phase = DonorPhase::Serving;
        self.status.epoch = Some(assign.epoch);
        self.status.stage_id = Some(assign.stage_id);
        self.status.layers = Some(assign.layer_start..assign.layer_end);
        self.status.bytes_downloaded += host.bytes_downloaded;
        self.status.load_ms = load_ms;
        self.host = Some(host);
        self.publish();
        self.send_or_log(from, &ready).await;
    }

    fn show_token(&mut self, token: TokenEvent) {
        let Some(vocab) = self.vocab.as_ref() else {
            return;
        };
        let shown = match self.shown.take() {
            Some((request, ids)) if request == token.request_id => (request, ids),
            _ => (token.request_id, Vec::new()),
        };
        let (request, mut ids) = shown;
        // Tokens arrive in order; a repeated index (after a recovery) is not shown twice.
        if token.index as usize == ids.len() {
            ids.push(token.id);
        }
        let mut decoder = vocab.stream();
        let mut text = String::new();
        for &id in &ids {
            text.push_str(&decoder.push(id).unwrap_or_default());
        }
        text.push_str(&decoder.finish());
        self.status.text = text;
        self.shown = Some((request, ids));
        self.publish();
    }

    pub(super) async fn refuse(&mut self, to: PeerId, request_id: Option<u64>, reason: &str) {
        self.note_refused(reason);
        let report = error_report(ErrorCode::BadFrame, request_id, reason);
        self.send_or_log(to, &report).await;
    }

    fn note_refused(&mut self, reason: &str) {
        tracing::warn!(reason, "refused a frame");
        self.status.refused_frames += 1;
        self.status.last_error = Some(reason.to_string());
    }

    /// A peer that went away is the coordinator's to handle (it re-plans); the donor goes on.
    pub(super) async fn send_or_log(&mut self, to: PeerId, message: &Message) {
        if let Err(error) = send_message(&self.transport, to, message).await {
            tracing::warn!(%to, %error, kind = ?message.kind(), "send failed");
        }
    }

    pub(super) fn publish(&mut self) {
        let stats = self.transport.stats();
        self.status.bytes_in = stats.bytes_received;
        self.status.bytes_out = stats.bytes_sent;
        if let Some(callback) = self.on_status.as_mut() {
            callback(&self.status);
        }
    }
}

pub(super) fn error_report(code: ErrorCode, request_id: Option<u64>, message: &str) -> Message {
    let mut end = message.len().min(MAX_ERROR_TEXT);
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    Message::Error(ErrorReport {
        code,
        request_id,
        message: message[..end].to_string(),
    })
}
