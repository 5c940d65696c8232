//! Generation through the chain: several requests in flight at once (micro-batching), each
//! with one span of positions in the chain at a time, so while one request's step is in
//! stage 2 another's is in stage 1 and every donor has work on every tick.
//!
//! A request's spans are kept (prefill chunks, then one position per decode step) so that a
//! re-plan can replay it exactly (`recovery.rs`). Request ids are `round * kv_slots + slot`:
//! a donor keeps request `id`'s keys and values in slot `id % kv_slots`, and no two
//! requests in flight share a slot.

use std::collections::{HashMap, VecDeque};
use std::ops::Range;

use futures::FutureExt;
use web_time::Instant;

use super::super::frame::{
    ErrorCode, Forward, Message, Reply, StageInput, StageOutput, StageResult, TokenEvent,
};
use super::super::transport::{send_message, PeerId, Transport, TransportError};
use super::constrain::Constrained;
use super::coordinator::Coordinator;
mod logprobs;
mod stats;

use super::feed::{report_finished, Feed};
use super::recovery::Incoming;
use super::timer::sleep;
use super::verify::PendingCheck;
use super::RoleError;
use crate::front::{
    Decoding, GenerateOptions, GenerateRequest, Generated, Generator, OnEvent, RequestError,
    TextFront, Timings, TokenLogprobs,
};
use logprobs::record_logprobs;

pub(super) struct Active {
    request_id: u64,
    slot: usize,
    /// Sampler, stop rules, and the prompt with the tokens accepted so far.
    decoding: Decoding,
    /// The request's constraint, if it has one.
    constrained: Option<Constrained>,
    /// Alternatives per token and each completion token's log-probabilities so far, when
    /// the request asked for them.
    logprobs: Option<(u32, Vec<TokenLogprobs>)>,
    /// Positions fed, in the order fed; the last one is the step awaited.
    spans: Vec<Range<u32>>,
    /// The next span to send (spans before it are in the chain's caches or on their way).
    next_span: usize,
    /// Forward frames sent into stage 0 this epoch.
    seq: u64,
    sent_at: Option<Instant>,
    started_at: Instant,
    first_token_at: Option<Instant>,
}

pub(super) struct Session {
    /// Each request's options, by index (the order requests came in).
    options: Vec<GenerateOptions>,
    /// Each request's checked prompt ids and compiled constraint, taken when it starts.
    prompts: Vec<(Vec<u32>, Option<Constrained>)>,
    queued: VecDeque<usize>,
    pub(super) active: Vec<Active>,
    free_slots: Vec<usize>,
    outputs: Vec<Option<Generated>>,
    /// Requests ended since a feed last heard of them (`feed.rs`).
    pub(super) finished: Vec<usize>,
    pub(super) checks: HashMap<(u64, u32), PendingCheck>,
    first_token_at: Option<Instant>,
    decode_tokens: u64,
    step_ms_total: f64,
    transfer_ms_total: f64,
    steps: u64,
}

impl Session {
    pub(super) fn new(kv_slots: u32) -> Session {
        Session {
            options: Vec::new(),
            prompts: Vec::new(),
            queued: VecDeque::new(),
            active: Vec::new(),
            free_slots: (0..kv_slots as usize).rev().collect(),
            outputs: Vec::new(),
            finished: Vec::new(),
            checks: HashMap::new(),
            first_token_at: None,
            decode_tokens: 0,
            step_ms_total: 0.0,
            transfer_ms_total: 0.0,
            steps: 0,
        }
    }

    /// Queues a checked request; returns its index.
    pub(super) fn push(
        &mut self,
        options: GenerateOptions,
        prompt: (Vec<u32>, Option<Constrained>),
    ) -> usize {
        let index = self.options.len();
        self.options.push(options);
        self.prompts.push(prompt);
        self.outputs.push(None);
        self.queued.push_back(index);
        index
    }

    /// Counts a request that could not start, so that the feed's indices stay in step.
    pub(super) fn push_refused(&mut self) -> usize {
        self.options.push(GenerateOptions::default());
        self.prompts.push((Vec::new(), None));
        self.outputs.push(None);
        self.options.len() - 1
    }

    /// Slots no request in flight or queued will take.
    pub(super) fn open_slots(&self) -> usize {
        self.free_slots.len().saturating_sub(self.queued.len())
    }

    /// Takes request `index`'s result once it has ended.
    pub(super) fn take_output(&mut self, index: usize) -> Generated {
        self.outputs[index].take().unwrap_or_default()
    }

    /// Whether the request at `position` has a span in the chain.
    pub(super) fn in_chain(&self, position: usize) -> bool {
        self.active[position].sent_at.is_some()
    }

    fn drained(&self) -> bool {
        (0..self.active.len()).all(|position| !self.in_chain(position))
    }

    /// Sends every active request back to its first span (after a re-plan).
    pub(super) fn rewind(&mut self) {
        self.checks.clear();
        for active in &mut self.active {
            active.next_span = 0;
            active.seq = 0;
            active.sent_at = None;
        }
    }
}

#[async_trait::async_trait(?Send)]
impl<T: Transport> Generator for Coordinator<T> {
    type Error = RoleError;

    fn text(&self) -> &TextFront {
        &self.text
    }

    fn vocab(&self) -> u32 {
        self.model.cfg.vocab
    }

    fn max_context(&self) -> u32 {
        self.config.runtime.max_context
    }

    /// Generates every request, up to `kv_slots` at a time through the chain.
    async fn generate(
        &mut self,
        requests: &[GenerateRequest],
        on_event: &mut OnEvent<'_>,
    ) -> Result<Vec<Generated>, RoleError> {
        let mut session = Session::new(self.config.runtime.kv_slots);
        for request in requests {
            let ids = self.check_request(request)?;
            let constrained = self.compile_constraint(request)?;
            session.push(request.options.clone(), (ids, constrained));
        }
        self.run_session(session, None, on_event).await
    }
}

impl<T: Transport> Coordinator<T> {
    /// Runs the session's requests, and with a `feed`, the feed's too as slots free up, until
    /// none is left.
    pub(super) async fn run_session(
        &mut self,
        mut session: Session,
        mut feed: Option<&mut dyn Feed>,
        on_event: &mut OnEvent<'_>,
    ) -> Result<Vec<Generated>, RoleError> {
        let started = Instant::now();
        // Nobody heartbeats the stages between generations, so their silence then says
        // nothing: a page that generates once per chat turn would find them all lost.
        self.last_seen.values_mut().for_each(|seen| *seen = started);
        let mut next_tick = Instant::now() + self.config.heartbeat_interval;
        loop {
            if !self.standby.is_empty() && session.drained() {
                self.admit_joiners(&mut session).await?;
            }
            if let Some(feed) = feed.as_deref_mut() {
                self.take_fed(&mut session, feed);
            }
            self.start_queued(&mut session).await?;
            if let Some(feed) = feed.as_deref_mut() {
                report_finished(&mut session, feed);
            }
            if session.active.is_empty() && session.queued.is_empty() {
                break;
            }
            let wait = next_tick.saturating_duration_since(Instant::now());
            let event = {
                let recv = self.transport.recv().fuse();
                let tick = sleep(wait).fuse();
                futures::pin_mut!(recv, tick);
                futures::select_biased! {
                    event = recv => Some(event),
                    () = tick => None,
                }
            };
            let lost = match event {
                Some(Err(TransportError::Closed)) => {
                    self.reconnect(&mut session).await?;
                    continue;
                }
                Some(event) => match self.classify(event?).await {
                    Incoming::Nothing => Vec::new(),
                    Incoming::Lost(peer) => vec![peer],
                    Incoming::Message(from, message) => {
                        self.on_message(&mut session, from, message, on_event)
                            .await?;
                        Vec::new()
                    }
                },
                None => {
                    next_tick = Instant::now() + self.config.heartbeat_interval;
                    self.heartbeat(&session).await?
                }
            };
            if !lost.is_empty() {
                self.recover(&mut session, &lost).await?;
            }
        }
        self.finish_report(&session, started);
        Ok(session
            .outputs
            .into_iter()
            .map(Option::unwrap_or_default)
            .collect())
    }

    /// The request's prompt ids, if the chain can hold them and the whole generation.
    pub(super) fn check_request(&self, request: &GenerateRequest) -> Result<Vec<u32>, RoleError> {
        let ids = self.prompt_ids(&request.prompt)?;
        let needed = ids.len() as u64 + u64::from(request.options.max_tokens);
        let max = self.config.runtime.max_context;
        if needed > u64::from(max) {
            return Err(RequestError::ContextLength { needed, max }.into());
        }
        Ok(ids)
    }

    async fn start_queued(&mut self, session: &mut Session) -> Result<(), RoleError> {
        while let Some(slot) = session.free_slots.last().copied() {
            let Some(index) = session.queued.pop_front() else {
                break;
            };
            session.free_slots.pop();
            let (prompt, constrained) = std::mem::take(&mut session.prompts[index]);
            let options = &session.options[index];
            let kv_slots = u64::from(self.config.runtime.kv_slots);
            let request_id = self.next_request_round * kv_slots + slot as u64;
            self.next_request_round += 1;
            let chunk = self.config.runtime.max_batch as usize;
            let spans = (0..prompt.len())
                .step_by(chunk)
                .map(|start| start as u32..(start + chunk).min(prompt.len()) as u32)
                .collect();
            let active = Active {
                request_id,
                slot,
                decoding: Decoding::new(index, prompt, options),
                constrained,
                logprobs: options.logprobs.map(|top| (top, Vec::new())),
                spans,
                next_span: 0,
                seq: 0,
                sent_at: None,
                started_at: Instant::now(),
                first_token_at: None,
            };
            if active.decoding.finished().is_some() {
                self.finish(session, active);
                continue;
            }
            session.active.push(active);
            let position = session.active.len() - 1;
            self.report.max_in_flight = self.report.max_in_flight.max(session.active.len());
            self.send_next(session, position).await?;
        }
        Ok(())
    }

    /// Sends the request's next span into stage 0, unless a donor waits to join: the chain
    /// then drains first (`admit_joiners` resumes the request).
    pub(super) async fn send_next(
        &mut self,
        session: &mut Session,
        position: usize,
    ) -> Result<(), RoleError> {
        if !self.standby.is_empty() {
            return Ok(());
        }
        let active = &mut session.active[position];
        let span_index = active.next_span;
        let span = active.spans[span_index].clone();
        let is_final = span_index + 1 == active.spans.len();
        let verify = is_final && self.verifier.as_mut().is_some_and(|v| v.pick());
        let most = self.config.limits.max_top_k.min(self.model.cfg.vocab);
        let reply = match is_final {
            false => Reply::Greedy,
            true if verify || !greedy_suffices(active) => Reply::TopK {
                k: candidates(active, self.config.top_k, most),
                normalised: active.logprobs.is_some(),
            },
            true => Reply::Greedy,
        };
        let vocab_size = self.model.cfg.vocab;
        let allowed = match (&mut active.constrained, is_final) {
            (Some(constrained), true) => Some(constrained.allowed(vocab_size)?),
            _ => None,
        };
        let forward = Forward {
            epoch: self.epoch,
            request_id: active.request_id,
            seq: active.seq,
            stage_id: 0,
            start_pos: span.start,
            n_tokens: span.len() as u32,
            input: StageInput::Tokens(
                active.decoding.tokens()[span.start as usize..span.end as usize].to_vec(),
            ),
            reply,
            tap: verify,
            trace: Vec::new(),
            allowed,
        };
        active.next_span += 1;
        active.seq += 1;
        active.sent_at = Some(Instant::now());
        if verify {
            let tokens = active.decoding.tokens()[..span.end as usize].to_vec();
            let check = PendingCheck::new(tokens, self.plan.stages.len());
            session
                .checks
                .insert((active.request_id, span.start), check);
        }
        let first = self.plan.stages[0].donor;
        // A failed send means the first stage is gone; its PeerLeft triggers the re-plan.
        if let Err(error) = send_message(&self.transport, first, &Message::Forward(forward)).await {
            tracing::warn!(%error, "could not send a step to the first stage");
        }
        Ok(())
    }

    async fn on_message(
        &mut self,
        session: &mut Session,
        from: PeerId,
        message: Message,
        on_event: &mut OnEvent<'_>,
    ) -> Result<(), RoleError> {
        match message {
            Message::Result(result) => self.on_result(session, from, result, on_event).await,
            Message::Error(report)
                if report.code == ErrorCode::Compute && self.is_stage_donor(from) =>
            {
                let ours = report
                    .request_id
                    .is_some_and(|id| session.active.iter().any(|a| a.request_id == id));
                if !ours {
                    return Ok(());
                }
                Err(RoleError::Peer {
                    peer: from,
                    code: report.code,
                    message: report.message,
                })
            }
            Message::Error(report) => {
                tracing::debug!(%from, code = ?report.code, message = %report.message, "peer error");
                Ok(())
            }
            _ => Ok(()),
        }
    }

    async fn on_result(
        &mut self,
        session: &mut Session,
        from: PeerId,
        result: StageResult,
        on_event: &mut OnEvent<'_>,
    ) -> Result<(), RoleError> {
        let stage = self
            .plan
            .stages
            .iter()
            .find(|s| s.stage_id == result.stage_id);
        if stage.is_none_or(|s| s.donor != from) {
            tracing::warn!(%from, stage = result.stage_id, "result from a peer that does not hold that stage");
            return Ok(());
        }
        if self.plan.stages.last().is_none_or(|s| s.donor != from) {
            self.on_tap(session, result).await;
            return Ok(());
        }
        let message = Message::Result(result);
        if let Err(error) = self.validator.check(&message) {
            tracing::debug!(%from, %error, "refused a result");
            return Ok(());
        }
        let Message::Result(result) = message else {
            return Ok(());
        };
        let Some(position) = session
            .active
            .iter()
            .position(|a| a.request_id == result.request_id)
        else {
            return Ok(());
        };
        let active = &session.active[position];
        let awaited = active
            .next_span
            .checked_sub(1)
            .map(|i| active.spans[i].clone());
        if awaited != Some(result.start_pos..result.start_pos + result.n_tokens) {
            tracing::warn!(
                request = result.request_id,
                "result for a span that is not awaited"
            );
            return Ok(());
        }
        self.record_step(session, position, &result);
        if session.active[position].next_span < session.active[position].spans.len() {
            return self.send_next(session, position).await;
        }
        let id = self.token_from(session, position, &result).await?;
        record_logprobs(&mut session.active[position], &result.output, id)?;
        self.accept(session, position, id, on_event).await
    }

    /// The next token from the last stage's reply (sampled here from its top-k).
    async fn token_from(
        &mut self,
        session: &mut Session,
        position: usize,
        result: &StageResult,
    ) -> Result<u32, RoleError> {
        let key = (result.request_id, result.start_pos);
        if let Some(check) = session.checks.get_mut(&key) {
            check.set_final(&result.output);
            if check.is_complete() {
                let check = session.checks.remove(&key).expect("present");
                self.run_check(check, result.request_id).await?;
            }
        }
        let active = &mut session.active[position];
        match &result.output {
            StageOutput::Sampled(id) => Ok(*id),
            StageOutput::TopK { ids, .. } if active.decoding.sampler().argmax_suffices() => {
                Ok(ids[0])
            }
            StageOutput::TopK { ids, logits, .. } => {
                let mut sparse = vec![f32::NEG_INFINITY; self.model.cfg.vocab as usize];
                for (&id, &logit) in ids.iter().zip(logits) {
                    sparse[id as usize] = logit;
                }
                Ok(active.decoding.sample(&sparse))
            }
            StageOutput::Hidden(_) => Err(RoleError::Invalid(
                "the last stage returned activations instead of a token".into(),
            )),
        }
    }

    /// Takes a token as the engine does (the text front's stop rules and max tokens, or the
    /// consumer cancelling), tells the donors, and sends the next step or finishes the
    /// request.
    async fn accept(
        &mut self,
        session: &mut Session,
        position: usize,
        id: u32,
        on_event: &mut OnEvent<'_>,
    ) -> Result<(), RoleError> {
        session.first_token_at.get_or_insert_with(Instant::now);
        let active = &mut session.active[position];
        active.first_token_at.get_or_insert_with(Instant::now);
        let index = active.decoding.completion_len();
        // As the engine: the constraint consumes the token first, then the stop rules see it.
        let complete = match &mut active.constrained {
            Some(constrained) => constrained.commit(id)?,
            None => false,
        };
        let mut finish = active.decoding.accept(&self.text, id, on_event);
        if finish.is_none() && complete {
            active.decoding.stop();
            finish = active.decoding.finished();
        }
        let request_id = active.request_id;
        if finish.is_none() {
            let position_of_id = active.decoding.tokens().len() as u32 - 1;
            active.spans.push(position_of_id..position_of_id + 1);
            session.decode_tokens += 1;
        }
        self.broadcast_token(request_id, index, id).await;
        if finish.is_some() {
            let active = session.active.swap_remove(position);
            self.finish(session, active);
            return Ok(());
        }
        self.send_next(session, position).await
    }

    fn finish(&mut self, session: &mut Session, active: Active) {
        self.validator.forget_request(active.request_id);
        session.checks.retain(|&(id, _), _| id != active.request_id);
        session.free_slots.push(active.slot);
        let first_token_at = active.first_token_at.unwrap_or_else(Instant::now);
        let timings = Timings {
            prefill_seconds: (first_token_at - active.started_at).as_secs_f64(),
            decode_seconds: first_token_at.elapsed().as_secs_f64(),
            mask_seconds: active.constrained.as_ref().map_or(0.0, |c| c.mask_seconds),
            ..Timings::default()
        };
        let index = active.decoding.request();
        let mut generated = active.decoding.into_generated(0, timings);
        // The token that stopped the request (end of generation) is not in the completion.
        generated.logprobs = active.logprobs.map(|(_, mut choices)| {
            choices.truncate(generated.ids.len());
            choices
        });
        session.outputs[index] = Some(generated);
        session.finished.push(index);
    }

    async fn broadcast_token(&mut self, request_id: u64, index: u32, id: u32) {
        let token = Message::Token(TokenEvent {
            request_id,
            index,
            id,
        });
        let donors: Vec<PeerId> = self.plan.stages.iter().map(|s| s.donor).collect();
        for donor in donors {
            let _ = send_message(&self.transport, donor, &token).await;
        }
    }
}

/// Greedy sampling without a penalty and without log-probabilities needs only the id;
/// anything else samples from the last stage's top-k.
fn greedy_suffices(active: &Active) -> bool {
    active.logprobs.is_none() && active.decoding.sampler().argmax_suffices()
}

/// How many candidates the last stage returns: the configured top-k, or as many alternatives
/// as the request asks for if more, within what a frame may carry (`most`).
fn candidates(active: &Active, top_k: u32, most: u32) -> u32 {
    let asked = active.logprobs.as_ref().map_or(0, |(top, _)| *top);
    top_k.max(asked).clamp(1, most.max(1))
}
