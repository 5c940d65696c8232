//! Epochs: assigning a plan and waiting until every stage is loaded, and re-planning when a
//! donor is lost (it left, stopped answering heartbeats, or failed to load) or joins.
//!
//! Every re-plan that changes the stages starts a new epoch and every stage is assigned
//! again, even one whose layers did not change: it keeps its weights but forgets all keys and
//! values, and the coordinator replays each request in flight from position 0 with exactly
//! the spans it fed before (the same prefill chunks, then one decode token at a time).
//! Replaying the same spans runs the same kernels on the same inputs, so the next token is the
//! one an uninterrupted run would have produced (bit for bit with f32 activations; f16 rounds
//! at the new stage boundaries).
//!
//! A loss re-plans at once: steps in the chain are lost anyway. A join waits until no step is
//! in the chain (new steps are held back meanwhile), so nothing computed is thrown away.

use std::collections::HashSet;

use web_time::Instant;

use super::super::frame::{Assign, ErrorCode, Message};
use super::super::plan::{plan, replan, FleetChange, Plan};
use super::super::transport::{send_message, PeerId, Transport, TransportError, TransportEvent};
use super::coordinator::Coordinator;
use super::session::Session;
use super::timer::with_timeout;
use super::RoleError;

/// Times one run joins the room again after its transport closed before it gives up.
const MAX_RECONNECTS: u32 = 3;

/// An event after the checks every phase shares.
pub(super) enum Incoming {
    Nothing,
    /// A stage's donor is gone: it left, said Leave, or could not load.
    Lost(PeerId),
    Message(PeerId, Message),
}

impl<T: Transport> Coordinator<T> {
    /// Starts a new epoch on `plan`: assigns every stage and waits until each is Ready. A
    /// donor lost meanwhile is planned out and the next epoch starts.
    pub(super) async fn establish(&mut self, mut plan: Plan) -> Result<(), RoleError> {
        loop {
            self.epoch += 1;
            self.validator.begin_epoch(self.epoch);
            self.plan = plan;
            let mut lost = self.send_assigns().await;
            if lost.is_empty() {
                lost = self.wait_ready().await?;
            }
            if lost.is_empty() {
                break;
            }
            plan = self.plan_after_loss(&lost).await?;
        }
        self.report.plan = self.plan_entries();
        let stages: Vec<String> = (self.plan.stages.iter())
            .map(|s| format!("{}:{}..{}", s.donor, s.layers.start, s.layers.end))
            .collect();
        // Read by `.ci/churn_soak.py` to kill only donors that hold a stage.
        tracing::info!(epoch = self.epoch, stages = %stages.join(" "), "stages ready");
        if let Some(verifier) = self.verifier.as_mut() {
            verifier
                .prepare(
                    &self.config.model_url,
                    &self.model,
                    &self.plan,
                    &self.config.runtime,
                )
                .await?;
        }
        // Silence is counted from here: nobody was sent heartbeats while the stages loaded.
        let now = Instant::now();
        self.last_seen = self.plan.stages.iter().map(|s| (s.donor, now)).collect();
        Ok(())
    }

    /// Re-plans without `lost`, reloads, and replays every request in flight.
    pub(super) async fn recover(
        &mut self,
        session: &mut Session,
        lost: &[PeerId],
    ) -> Result<(), RoleError> {
        let started = Instant::now();
        tracing::warn!(?lost, "donor lost; re-planning");
        let plan = self.plan_after_loss(lost).await?;
        let planned = started.elapsed();
        self.establish(plan).await?;
        let ready = started.elapsed();
        tracing::info!(
            plan_ms = planned.as_secs_f64() * 1000.0,
            stages_ready_ms = ready.as_secs_f64() * 1000.0,
            "recovered: replaying"
        );
        session.rewind();
        for position in 0..session.active.len() {
            self.send_next(session, position).await?;
        }
        self.report.recoveries += 1;
        self.report
            .recovery_ms
            .push(started.elapsed().as_secs_f64() * 1000.0);
        Ok(())
    }

    /// Plans the standby donors in once no step is in the chain: a new epoch and a replay of
    /// every request if the stages change, otherwise the requests simply go on.
    pub(super) async fn admit_joiners(&mut self, session: &mut Session) -> Result<(), RoleError> {
        let started = Instant::now();
        let plan = self.join_standby(self.plan.clone())?;
        if plan.stages == self.plan.stages {
            // Not an error: by their measured speed the chain is as fast without them.
            tracing::info!("the joined donor(s) get no stage: the plan is no faster with them");
            self.plan = plan;
            return self.resume(session).await;
        }
        tracing::info!(stages = plan.stages.len(), "donor joined; re-planning");
        self.establish(plan).await?;
        session.rewind();
        self.resume(session).await?;
        self.report.joins += 1;
        self.report
            .join_ms
            .push(started.elapsed().as_secs_f64() * 1000.0);
        Ok(())
    }

    /// Sends the next span of every request that has none in the chain.
    pub(super) async fn resume(&mut self, session: &mut Session) -> Result<(), RoleError> {
        for position in 0..session.active.len() {
            if !session.in_chain(position) {
                self.send_next(session, position).await?;
            }
        }
        Ok(())
    }

    /// The plan after `lost` leave, admitted standby donors joining first so they can take
    /// over. When the donors left cannot hold the model, waits up to `join_timeout` for more
    /// to join instead of giving up: a donor whose link to the next stage never worked
    /// leaves and joins again under a new id (`link.rs`), and the plan needs it back.
    pub(super) async fn plan_after_loss(&mut self, lost: &[PeerId]) -> Result<Plan, RoleError> {
        let stage_donors = lost.iter().filter(|id| self.is_stage_donor(**id)).count();
        self.report.stage_donors_lost += stage_donors as u32;
        for id in lost {
            self.donors.remove(id);
        }
        self.plan.donors.retain(|d| !lost.contains(&d.id));
        let started = Instant::now();
        let limit = self.config.join_timeout;
        loop {
            let mut donors = self.plan.donors.clone();
            for joined in &self.standby {
                if donors.iter().all(|d| d.id != joined.id) {
                    donors.push(*joined);
                }
            }
            let error = match plan(&self.sizes, &donors) {
                Ok(plan) => {
                    self.standby.clear();
                    return Ok(plan);
                }
                Err(error) => error,
            };
            let left = limit.saturating_sub(started.elapsed());
            if !error.is_shortage() || left.is_zero() {
                return Err(error.into());
            }
            if !self.plan.stages.is_empty() {
                tracing::warn!(%error, "the donors left cannot hold the model; waiting for more to join");
                self.transport.hear_newcomers();
                // No stage runs now: a donor leaving meanwhile is simply taken off the order.
                self.plan.stages.clear();
            }
            match with_timeout(left, self.next_incoming()).await {
                Ok(incoming) => {
                    incoming?;
                }
                Err(_) => return Err(error.into()),
            }
        }
    }

    /// The transport closed under a run (matchbox ends a whole socket when one peer's
    /// handshake panics): joins the room again and recovers as if every donor were lost.
    /// The donors stay in the room, greet the new id and keep the layers they hold.
    pub(super) async fn reconnect(&mut self, session: &mut Session) -> Result<(), RoleError> {
        if self.report.reconnects >= MAX_RECONNECTS {
            return Err(TransportError::Closed.into());
        }
        tracing::warn!("the transport closed under the run; joining the room again");
        self.transport.rejoin().await?;
        self.report.reconnects += 1;
        let lost: Vec<PeerId> = self.plan.donors.iter().map(|d| d.id).collect();
        self.standby.clear();
        self.absent.clear();
        self.recover(session, &lost).await
    }

    /// `plan` with the standby donors joined, at the end of the order.
    fn join_standby(&mut self, mut plan: Plan) -> Result<Plan, RoleError> {
        for donor in std::mem::take(&mut self.standby) {
            if plan.donors.iter().all(|d| d.id != donor.id) {
                plan = replan(&self.sizes, &plan, FleetChange::Join(donor))?;
            }
        }
        Ok(plan)
    }

    /// Sends every stage its Assign; returns the donors that could not be reached.
    async fn send_assigns(&mut self) -> Vec<PeerId> {
        let me = self.transport.local_id();
        let stages = &self.plan.stages;
        let mut assigns = Vec::with_capacity(stages.len());
        for (index, stage) in stages.iter().enumerate() {
            let upstream = index.checked_sub(1).map_or(me, |i| stages[i].donor);
            let downstream = stages.get(index + 1).map_or(me, |s| s.donor);
            assigns.push((
                stage.donor,
                Message::Assign(Assign {
                    epoch: self.epoch,
                    stage_id: stage.stage_id,
                    n_stages: stages.len() as u16,
                    model_url: self.config.model_url.clone(),
                    layer_start: stage.layers.start,
                    layer_end: stage.layers.end,
                    n_layers: self.model.cfg.n_layers,
                    embedding: stage.embedding,
                    head: stage.head,
                    d_model: self.model.cfg.d_model,
                    upstream,
                    downstream,
                    vocab: self.vocab_blob.clone(),
                    runtime: self.config.runtime,
                }),
            ));
        }
        let mut lost = Vec::new();
        for (donor, assign) in assigns {
            if let Err(error) = send_message(&self.transport, donor, &assign).await {
                tracing::warn!(%donor, %error, "could not assign a stage");
                lost.push(donor);
            }
        }
        lost
    }

    /// Waits for every stage's Ready of this epoch; returns the donors lost meanwhile.
    async fn wait_ready(&mut self) -> Result<Vec<PeerId>, RoleError> {
        let mut waiting: HashSet<PeerId> = self.plan.stages.iter().map(|s| s.donor).collect();
        let limit = self.config.load_timeout;
        let epoch = self.epoch;
        let outcome = with_timeout(limit, async {
            while !waiting.is_empty() {
                match self.next_incoming().await? {
                    Incoming::Lost(peer) => return Ok(vec![peer]),
                    Incoming::Message(from, Message::Ready(ready)) if ready.epoch == epoch => {
                        // What a recovery's time is made of (`.ci/fleet_perf.py` keeps these).
                        tracing::info!(%from, load_ms = ready.load_ms,
                            bytes = ready.bytes_downloaded, "stage ready");
                        waiting.remove(&from);
                    }
                    Incoming::Message(from, other) => {
                        tracing::debug!(%from, kind = ?other.kind(), "ignored while stages load")
                    }
                    Incoming::Nothing => {}
                }
            }
            Ok::<Vec<PeerId>, RoleError>(Vec::new())
        })
        .await;
        outcome.map_err(|_| RoleError::Timeout {
            what: format!("{} stage(s) to load", waiting.len()),
            seconds: limit.as_secs_f64(),
        })?
    }

    /// Receives one event and applies what every phase does the same way: admitting or
    /// refusing Hellos, refusing bad frames, noticing lost stage donors.
    pub(super) async fn next_incoming(&mut self) -> Result<Incoming, RoleError> {
        let event = self.transport.recv().await?;
        Ok(self.classify(event).await)
    }

    pub(super) async fn classify(&mut self, event: TransportEvent) -> Incoming {
        match event {
            TransportEvent::PeerJoined(_) => Incoming::Nothing,
            TransportEvent::PeerLeft(peer) => self.on_peer_left(peer),
            TransportEvent::BadChunk { from, error } => {
                tracing::warn!(%from, %error, "bad chunk");
                Incoming::Nothing
            }
            TransportEvent::Frame { from, frame } => {
                if let Some(seen) = self.last_seen.get_mut(&from) {
                    *seen = Instant::now();
                }
                self.on_frame(from, &frame).await
            }
        }
    }

    fn on_peer_left(&mut self, peer: PeerId) -> Incoming {
        self.absent.remove(&peer);
        if self.is_stage_donor(peer) {
            return Incoming::Lost(peer);
        }
        self.donors.remove(&peer);
        self.standby.retain(|d| d.id != peer);
        // A donor without a stage stays in the plan's order; a departed one must not.
        self.plan.donors.retain(|d| d.id != peer);
        Incoming::Nothing
    }

    async fn on_frame(&mut self, from: PeerId, frame: &[u8]) -> Incoming {
        let message = super::super::frame::decode_frame(frame)
            .and_then(|m| m.check(&self.config.limits, Some(self.shape())).map(|()| m));
        let message = match message {
            Ok(message) => message,
            Err(error) => {
                tracing::warn!(%from, %error, "refused a frame");
                let report =
                    super::donor::error_report(ErrorCode::BadFrame, None, &error.to_string());
                let _ = send_message(&self.transport, from, &report).await;
                return Incoming::Nothing;
            }
        };
        // A donor planned out for silence is back: it joins again at the next re-plan.
        if let Some(donor) = self.absent.remove(&from) {
            self.admit(from, donor);
        }
        let stage_donor = self.is_stage_donor(from);
        match message {
            Message::Hello(hello) => {
                self.on_hello(from, hello).await;
                Incoming::Nothing
            }
            Message::Leave(_) if stage_donor => Incoming::Lost(from),
            Message::Error(report) if stage_donor && report.code == ErrorCode::LoadFailed => {
                tracing::warn!(%from, message = %report.message, "a stage failed to load");
                Incoming::Lost(from)
            }
            other => Incoming::Message(from, other),
        }
    }

    pub(super) fn is_stage_donor(&self, peer: PeerId) -> bool {
        self.plan.stages.iter().any(|s| s.donor == peer)
    }
}
