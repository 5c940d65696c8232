//! The coordinator role: holds the text front (tokenizer, chat template, samplers); admits
//! donors with the fleet token, plans the layers over them, assigns stages, then drives
//! generation as a `front::Generator` (`session.rs`), re-planning when a donor joins or is lost (`recovery.rs`) and
//! spot-checking stages against a local reference when asked (`verify.rs`).

use std::collections::HashMap;

use std::time::Duration;
use web_time::Instant;

use serde::Serialize;

use super::super::activations::Encoding;
use super::super::frame::{
    decode_frame, DonorInfo, ErrorCode, Hello, HopTrace, Leave, Message, StageRuntime,
};
use super::super::plan::{DonorCapacity, ModelSizes, Plan};
use super::super::transport::{send_message, PeerId, Transport, TransportEvent};
use super::super::validate::{FrameLimits, FrameValidator, ModelShape};
use super::super::vocab::ByteVocab;
use super::donor::error_report;
use super::timer::with_timeout;
use super::verify::{Verifier, VerifyConfig, VerifyFlag};
use super::RoleError;
use crate::front::TextFront;
use crate::gguf::open_source;
use crate::model::{ModelConfig, OpenModel};
use crate::sample::TokenView;

/// Longest `shutdown` waits for its last frames to reach the donors.
const SHUTDOWN_FLUSH: Duration = Duration::from_secs(5);

#[derive(Clone)]
pub struct CoordinatorConfig {
    /// Where donors fetch the model from (a URL they can reach, or a path for local donors).
    pub model_url: String,
    pub fleet_token: String,
    /// Donors to wait for before planning.
    pub donors: usize,
    pub runtime: StageRuntime,
    /// Logits the last stage returns when the coordinator samples.
    pub top_k: u32,
    pub heartbeat_interval: Duration,
    /// A donor silent for this long (no frame at all) is taken as lost.
    pub heartbeat_timeout: Duration,
    /// Longest the coordinator gathers donors before it gives up (`RoleError::TooFewDonors`).
    pub join_timeout: Duration,
    /// While gathering donors, after this long without admitting one the coordinator joins the
    /// room again (`Transport::rejoin`): a link whose handshake failed is never retried
    /// otherwise, and its donor would never be heard. The wait doubles after each rejoin:
    /// a donor that is simply not there is not worth a new set of links every few seconds.
    pub rejoin_after: Duration,
    /// Longest a stage may take to load before the plan is given up.
    pub load_timeout: Duration,
    /// Longest one step may stay unanswered while every donor still answers heartbeats.
    pub step_timeout: Duration,
    pub limits: FrameLimits,
    pub verify: Option<VerifyConfig>,
}

impl CoordinatorConfig {
    /// Defaults: 2048 context, prefill chunks of 128, 4 requests in flight, f16 activations.
    pub fn new(model_url: &str, fleet_token: &str, donors: usize) -> CoordinatorConfig {
        CoordinatorConfig {
            model_url: model_url.to_string(),
            fleet_token: fleet_token.to_string(),
            donors,
            runtime: StageRuntime {
                max_context: 2048,
                max_batch: 128,
                kv_slots: 4,
                hidden: Encoding::F16,
            },
            top_k: 64,
            heartbeat_interval: Duration::from_secs(1),
            heartbeat_timeout: Duration::from_secs(10),
            join_timeout: Duration::from_secs(60),
            rejoin_after: Duration::from_secs(10),
            load_timeout: Duration::from_secs(600),
            step_timeout: Duration::from_secs(300),
            limits: FrameLimits::default(),
            verify: None,
        }
    }
}

/// One stage's share of the work of a generation.
#[derive(Clone, Debug, Default, Serialize)]
pub struct HopReport {
    pub stage_id: u16,
    pub donor: String,
    pub layers: [u32; 2],
    pub steps: u64,
    /// Mean time in the stage's forward per step.
    pub compute_ms_mean: f64,
    /// Longest step in the stage's forward.
    pub compute_ms_max: f64,
    /// Payload bytes this stage sent on (activations, or the reply for the last stage).
    pub bytes_out: u64,
}

/// What the whole run did, for `--json`.
#[derive(Clone, Debug, Default, Serialize)]
pub struct RunReport {
    pub plan: Vec<PlanEntry>,
    pub hops: Vec<HopReport>,
    /// Round trip of a decode step (coordinator → every stage → coordinator), mean.
    pub step_ms_mean: f64,
    /// Of which not in any stage's forward: transfers, queueing, encoding.
    pub transfer_ms_mean: f64,
    pub decode_tokens_per_s: f64,
    /// Most requests in the chain at once (micro-batching).
    pub max_in_flight: usize,
    pub recoveries: u32,
    /// Donors lost while they held a stage (they left, fell silent or failed to load), each
    /// planned out: one recovery covers every loss it sees, a loss while stages load included.
    pub stage_donors_lost: u32,
    /// Each recovery's re-plan, reload and replay start.
    pub recovery_ms: Vec<f64>,
    /// Re-plans that gave a donor that joined mid-run a stage.
    pub joins: u32,
    /// Each of those re-plans, from the chain drained to the replay started.
    pub join_ms: Vec<f64>,
    /// Times the coordinator joined the room again while gathering donors (`rejoin_after`).
    pub rejoins: u32,
    /// Times the transport closed under a run and the coordinator joined the room again
    /// (each also a recovery).
    pub reconnects: u32,
    pub verified_steps: u64,
    /// Largest relative error seen per stage on verified steps.
    pub verify_max_error: Vec<f32>,
    pub flags: Vec<VerifyFlag>,
}

#[derive(Clone, Debug, Serialize)]
pub struct PlanEntry {
    pub stage_id: u16,
    pub donor: String,
    pub layers: [u32; 2],
    pub embedding: bool,
    pub head: bool,
}

pub struct Coordinator<T: Transport> {
    pub(super) transport: T,
    pub(super) config: CoordinatorConfig,
    /// Header and configuration, read once.
    pub model: OpenModel,
    pub text: TextFront,
    pub(super) sizes: ModelSizes,
    pub(super) vocab_blob: Vec<u8>,
    /// Donors admitted, with what they said in Hello.
    pub(super) donors: HashMap<PeerId, DonorInfo>,
    /// Admitted donors outside the plan, joined at the next re-plan: at once while stages
    /// load, at the next point where no step is in the chain while generating.
    pub(super) standby: Vec<DonorCapacity>,
    /// Donors planned out because they fell silent, while still connected: they are still
    /// sent heartbeats, and their next frame admits them again.
    pub(super) absent: HashMap<PeerId, DonorInfo>,
    pub(super) plan: Plan,
    pub(super) epoch: u32,
    pub(super) validator: FrameValidator,
    /// When each stage's donor was last heard from (any frame).
    pub(super) last_seen: HashMap<PeerId, Instant>,
    pub(super) verifier: Option<Verifier>,
    pub(super) next_request_round: u64,
    /// The vocabulary as constraints see it, built at the first constrained request.
    pub(super) token_view: Option<TokenView>,
    pub(super) report: RunReport,
    pub refused_hellos: u32,
}

impl<T: Transport> Coordinator<T> {
    /// Reads the model's header, waits for `config.donors` donors, plans and loads the chain.
    pub async fn connect(
        transport: T,
        config: CoordinatorConfig,
    ) -> Result<Coordinator<T>, RoleError> {
        let mut coordinator = Coordinator::open(transport, config).await?;
        coordinator.gather_donors().await?;
        let donors = std::mem::take(&mut coordinator.standby);
        let plan = super::super::plan::plan(&coordinator.sizes, &donors)?;
        coordinator.establish(plan).await?;
        Ok(coordinator)
    }

    /// Reads the model's header: a coordinator with no donors yet.
    pub(super) async fn open(
        transport: T,
        config: CoordinatorConfig,
    ) -> Result<Coordinator<T>, RoleError> {
        let source = open_source(&config.model_url)
            .await
            .map_err(|e| RoleError::Source(e.to_string()))?;
        let model = OpenModel::read(source.as_ref()).await?;
        let mut sizes = ModelSizes::from_header(&model.header)?;
        sizes.runtime_bytes_per_layer = kv_bytes_per_layer(&model.cfg, &config.runtime);
        Coordinator::with_model(transport, config, model, sizes)
    }

    /// A coordinator of `model` with no donors yet (the text front is built here).
    pub(super) fn with_model(
        transport: T,
        config: CoordinatorConfig,
        model: OpenModel,
        sizes: ModelSizes,
    ) -> Result<Coordinator<T>, RoleError> {
        let text = TextFront::from_header(&model.header)
            .map_err(|e| RoleError::Tokenizer(e.to_string()))?;
        let vocab_blob = ByteVocab::from_tokenizer(&text.tokenizer)
            .map_err(|e| RoleError::Tokenizer(e.to_string()))?
            .to_bytes();
        let mut validator = FrameValidator::new(config.limits);
        validator.set_model(ModelShape {
            vocab_size: model.cfg.vocab,
            d_model: model.cfg.d_model,
        });
        let verifier = config.verify.clone().map(Verifier::new);
        Ok(Coordinator {
            transport,
            config,
            model,
            text,
            sizes,
            vocab_blob,
            donors: HashMap::new(),
            standby: Vec::new(),
            absent: HashMap::new(),
            plan: Plan {
                stages: Vec::new(),
                donors: Vec::new(),
            },
            epoch: 0,
            validator,
            last_seen: HashMap::new(),
            verifier,
            next_request_round: 0,
            token_view: None,
            report: RunReport::default(),
            refused_hellos: 0,
        })
    }

    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    pub fn epoch(&self) -> u32 {
        self.epoch
    }

    /// The run's figures so far: plan, hops, recoveries, verification.
    pub fn report(&self) -> &RunReport {
        &self.report
    }

    /// Dismisses every donor (they return `DonorExit::Dismissed`).
    pub async fn shutdown(self, reason: &str) {
        let leave = Message::Leave(Leave {
            reason: reason.to_string(),
        });
        let peers: Vec<PeerId> = self
            .donors
            .keys()
            .chain(self.absent.keys())
            .copied()
            .collect();
        for peer in &peers {
            let _ = send_message(&self.transport, *peer, &leave).await;
        }
        // Dropping the transport discards what its connections still queue (the last Token,
        // the Leave): wait until every donor's transport has them.
        let flushes = peers.iter().map(|peer| self.transport.flush(*peer));
        if with_timeout(SHUTDOWN_FLUSH, futures::future::join_all(flushes))
            .await
            .is_err()
        {
            tracing::warn!("some donors did not confirm the last frames before shutdown");
        }
    }

    /// Admits donors (in the order their Hello arrives) until there are enough, joining the
    /// room again whenever the rejoin wait passes without an admission (the wait doubling
    /// each time), and giving up after `join_timeout`.
    pub(super) async fn gather_donors(&mut self) -> Result<(), RoleError> {
        let wanted = self.config.donors.max(1);
        let limit = self.config.join_timeout;
        let mut rejoin_after = self.config.rejoin_after;
        with_timeout(limit, async {
            let mut progress = (0, Instant::now());
            while self.standby.len() < wanted {
                if self.standby.len() > progress.0 {
                    progress = (self.standby.len(), Instant::now());
                }
                let wait = (progress.1 + rejoin_after).saturating_duration_since(Instant::now());
                match with_timeout(wait, self.transport.recv()).await {
                    Ok(event) => self.on_gathering_event(event?).await,
                    Err(_) => {
                        self.rejoin(wanted, rejoin_after).await?;
                        rejoin_after = rejoin_after.saturating_mul(2);
                        progress = (0, Instant::now());
                    }
                }
            }
            Ok::<(), RoleError>(())
        })
        .await
        .map_err(|_| RoleError::TooFewDonors {
            joined: self.standby.len(),
            wanted,
            seconds: limit.as_secs_f64(),
        })?
    }

    async fn on_gathering_event(&mut self, event: TransportEvent) {
        match event {
            TransportEvent::Frame { from, frame } => self.on_join_frame(from, &frame).await,
            TransportEvent::PeerLeft(peer) => {
                self.donors.remove(&peer);
                self.standby.retain(|d| d.id != peer);
            }
            TransportEvent::PeerJoined(_) | TransportEvent::BadChunk { .. } => {}
        }
    }

    /// Joins the room again; the donors greet the new peer, and each is admitted anew.
    async fn rejoin(&mut self, wanted: usize, waited: Duration) -> Result<(), RoleError> {
        tracing::warn!(
            have = self.standby.len(),
            wanted,
            "no donor admitted for {waited:?}: joining the room again so that every link is made anew",
        );
        self.transport.rejoin().await?;
        self.report.rejoins += 1;
        self.donors.clear();
        self.standby.clear();
        Ok(())
    }

    async fn on_join_frame(&mut self, from: PeerId, frame: &[u8]) {
        let message =
            decode_frame(frame).and_then(|m| m.check(&self.config.limits, None).map(|()| m));
        match message {
            Ok(Message::Hello(hello)) => self.on_hello(from, hello).await,
            Ok(other) => {
                tracing::debug!(%from, kind = ?other.kind(), "ignored while gathering donors")
            }
            Err(error) => tracing::warn!(%from, %error, "refused a frame"),
        }
    }

    /// Admits a donor with the right fleet token (to the standby list); refuses the others.
    pub(super) async fn on_hello(&mut self, from: PeerId, hello: Hello) {
        if hello.fleet_token != self.config.fleet_token {
            self.refused_hellos += 1;
            let refusal = error_report(ErrorCode::Refused, None, "wrong fleet token");
            let _ = send_message(&self.transport, from, &refusal).await;
            return;
        }
        if self.donors.contains_key(&from) || self.absent.contains_key(&from) {
            return;
        }
        self.admit(from, hello.donor);
    }

    /// Puts a donor on standby for the next re-plan.
    pub(super) fn admit(&mut self, id: PeerId, donor: DonorInfo) {
        tracing::info!(%id, "donor admitted");
        self.standby.push(DonorCapacity {
            id,
            usable_bytes: donor.usable_gpu_bytes,
            ms_per_layer: donor.ms_per_layer,
        });
        self.donors.insert(id, donor);
    }

    pub(super) fn shape(&self) -> ModelShape {
        ModelShape {
            vocab_size: self.model.cfg.vocab,
            d_model: self.model.cfg.d_model,
        }
    }

    /// Adds a step's trace (one entry per stage, in chain order) to the per-stage figures of
    /// the plan now (a re-plan starts them over).
    pub(super) fn record_hops(&mut self, trace: &[HopTrace]) {
        let current = self.report.hops.len() == self.plan.stages.len()
            && self
                .report
                .hops
                .iter()
                .zip(&self.plan.stages)
                .all(|(hop, stage)| {
                    hop.layers == [stage.layers.start, stage.layers.end]
                        && hop.donor == stage.donor.to_string()
                });
        if !current {
            self.report.hops = self
                .plan
                .stages
                .iter()
                .map(|stage| HopReport {
                    stage_id: stage.stage_id,
                    donor: stage.donor.to_string(),
                    layers: [stage.layers.start, stage.layers.end],
                    ..HopReport::default()
                })
                .collect();
        }
        for (hop, step) in self.report.hops.iter_mut().zip(trace) {
            let compute_ms = f64::from(step.compute_us) / 1000.0;
            let total = hop.compute_ms_mean * hop.steps as f64 + compute_ms;
            hop.steps += 1;
            hop.compute_ms_mean = total / hop.steps as f64;
            hop.compute_ms_max = hop.compute_ms_max.max(compute_ms);
            hop.bytes_out += u64::from(step.payload_bytes);
        }
    }

    pub(super) fn plan_entries(&self) -> Vec<PlanEntry> {
        self.plan
            .stages
            .iter()
            .map(|stage| PlanEntry {
                stage_id: stage.stage_id,
                donor: stage.donor.to_string(),
                layers: [stage.layers.start, stage.layers.end],
                embedding: stage.embedding,
                head: stage.head,
            })
            .collect()
    }
}

/// KV cache bytes one layer needs on its stage for every slot (keys and values, f32).
fn kv_bytes_per_layer(cfg: &ModelConfig, runtime: &StageRuntime) -> u64 {
    u64::from(runtime.max_context) * u64::from(cfg.kv_dim()) * 4 * 2 * u64::from(runtime.kv_slots)
}
