//! A donor's steps: a validated `Forward` runs in its request's KV slot, off the message
//! loop so that heartbeats are answered while it computes, and its output goes on down the
//! chain (activations) or back to the coordinator (the last stage's reply, a tap).

use futures::FutureExt;

use super::super::activations::{Activations, Encoding};
use super::super::frame::{
    Assign, ErrorCode, Forward, FrameError, HopTrace, Kind, Message, StageInput as WireInput,
    StageOutput, StageResult, FRAME_HEADER_LEN,
};
use super::super::transport::{PeerId, Transport, TransportEvent};
use super::donor::{error_report, Donor};
use super::host::{StageHost, StepOutput};
use super::offload::StepDone;

/// Bytes of events a donor keeps while a step computes before it stops reading.
const MAX_DEFERRED_BYTES: usize = 16 << 20;
/// What an event counts for besides its frame, so that a flood of tiny ones is bounded too.
const EVENT_OVERHEAD: usize = 64;

impl<T: Transport> Donor<T> {
    pub(super) async fn on_forward(&mut self, from: PeerId, forward: Forward) {
        // The validator refuses a Forward before any stage is assigned.
        let Some(host) = self.host.as_mut() else {
            return;
        };
        if from != host.assign.upstream {
            let reason = format!(
                "Forward from {from}, but this stage's upstream is {}",
                host.assign.upstream
            );
            self.refuse(from, Some(forward.request_id), &reason).await;
            return;
        }
        let coordinator = host.assign.downstream_coordinator(self.coordinator);
        match host.select_slot(forward.request_id, forward.start_pos) {
            Ok(Some(evicted)) => self.validator.forget_request(evicted),
            Ok(None) => {}
            Err(message) => {
                let report = error_report(ErrorCode::Compute, Some(forward.request_id), &message);
                self.send_or_log(coordinator, &report).await;
                return;
            }
        }
        let Some(host) = self.host.take() else {
            return;
        };
        let started = web_time::Instant::now();
        let done = self.compute(host, &forward).await;
        let compute_us = started.elapsed().as_micros().min(u32::MAX as u128) as u32;
        self.status.steps += 1;
        self.status.last_step_ms = compute_us as f32 / 1000.0;
        let failure = match done {
            Some((host, output)) => {
                self.host = Some(host);
                match output {
                    Ok(output) => {
                        self.send_output(&forward, output, compute_us, coordinator)
                            .await;
                        None
                    }
                    Err(error) => Some(error.to_string()),
                }
            }
            None => {
                self.drop_stage("the step panicked; the stage is gone");
                Some("the step panicked; this donor must be assigned again".to_string())
            }
        };
        if let Some(message) = failure {
            let report = error_report(ErrorCode::Compute, Some(forward.request_id), &message);
            self.send_or_log(coordinator, &report).await;
        }
        self.publish();
    }

    /// Runs the step off the message loop (`offload`). Meanwhile the coordinator's heartbeats
    /// are answered at once and every other event is kept for after the step, in arrival
    /// order; past `MAX_DEFERRED_BYTES` the transport is left unread, which holds its senders
    /// back.
    async fn compute(&mut self, host: StageHost, forward: &Forward) -> StepDone {
        let step = self.steps.start(host, forward.clone()).fuse();
        futures::pin_mut!(step);
        loop {
            if self.deferred_bytes >= MAX_DEFERRED_BYTES || self.closed {
                return step.await;
            }
            let event = {
                let recv = self.transport.recv().fuse();
                futures::pin_mut!(recv);
                futures::select_biased! {
                    done = step => return done,
                    event = recv => event,
                }
            };
            match event {
                Ok(event) => self.during_step(event).await,
                // Nothing more can arrive; the loop learns it after the step.
                Err(_) => self.closed = true,
            }
        }
    }

    async fn during_step(&mut self, event: TransportEvent) {
        if let TransportEvent::Frame { from, frame } = &event {
            if Some(*from) == self.coordinator && is_heartbeat(frame) {
                match self.validator.decode(frame) {
                    Ok(beat) => self.send_or_log(*from, &beat).await,
                    Err(error) => self.refuse(*from, None, &error.to_string()).await,
                }
                return;
            }
        }
        self.keep_for_later(event);
    }

    /// The next event kept while a step computed, if any.
    pub(super) fn next_deferred(&mut self) -> Option<TransportEvent> {
        let event = self.deferred.pop_front()?;
        self.deferred_bytes -= deferred_size(&event);
        Some(event)
    }

    /// Passes the step on: activations to the next stage (and to the coordinator when
    /// tapped), or the last stage's reply to the coordinator.
    async fn send_output(
        &mut self,
        forward: &Forward,
        output: StepOutput,
        compute_us: u32,
        coordinator: PeerId,
    ) {
        let Some(host) = self.host.as_ref() else {
            return;
        };
        let assign = host.assign.clone();
        let output = match to_wire(output, &assign) {
            Ok(output) => output,
            Err(message) => {
                let report = error_report(ErrorCode::Compute, Some(forward.request_id), &message);
                self.send_or_log(coordinator, &report).await;
                return;
            }
        };
        let mut trace = forward.trace.clone();
        trace.push(HopTrace {
            compute_us,
            payload_bytes: payload_bytes(&output),
        });
        let result = |output: StageOutput, trace: Vec<HopTrace>| {
            Message::Result(StageResult {
                epoch: forward.epoch,
                request_id: forward.request_id,
                seq: forward.seq,
                stage_id: forward.stage_id,
                start_pos: forward.start_pos,
                n_tokens: forward.n_tokens,
                output,
                trace,
            })
        };
        match output {
            StageOutput::Hidden(hidden) if !assign.head => {
                if forward.tap {
                    let tapped = result(StageOutput::Hidden(hidden.clone()), trace.clone());
                    self.send_or_log(coordinator, &tapped).await;
                }
                let next = Message::Forward(Forward {
                    stage_id: forward.stage_id + 1,
                    input: WireInput::Hidden(hidden),
                    trace,
                    ..forward.clone()
                });
                self.send_or_log(assign.downstream, &next).await;
            }
            output => {
                self.send_or_log(assign.downstream, &result(output, trace))
                    .await
            }
        }
    }
}

/// Whether a frame's header names a heartbeat (the kind byte follows magic and version): the
/// only frames decoded while a step computes.
fn is_heartbeat(frame: &[u8]) -> bool {
    frame.len() >= FRAME_HEADER_LEN && frame[3] == Kind::Heartbeat as u8
}

pub(super) fn deferred_size(event: &TransportEvent) -> usize {
    match event {
        TransportEvent::Frame { frame, .. } => EVENT_OVERHEAD + frame.len(),
        _ => EVENT_OVERHEAD,
    }
}

impl Assign {
    /// Where results and errors about a step go: the coordinator (the last stage's
    /// downstream is the coordinator too).
    fn downstream_coordinator(&self, coordinator: Option<PeerId>) -> PeerId {
        coordinator.unwrap_or(self.downstream)
    }
}

fn to_wire(output: StepOutput, assign: &Assign) -> Result<StageOutput, String> {
    Ok(match output {
        StepOutput::Hidden(values) => StageOutput::Hidden(encode_hidden(&values, assign)?),
        StepOutput::Sampled(id) => StageOutput::Sampled(id),
        StepOutput::TopK {
            ids,
            logits,
            log_norm,
        } => {
            if logits.iter().any(|v| !v.is_finite()) || log_norm.is_some_and(|n| !n.is_finite()) {
                return Err("the stage produced non-finite logits".into());
            }
            StageOutput::TopK {
                ids,
                logits,
                log_norm,
            }
        }
    })
}

/// Encodes in the epoch's encoding, falling back to f32 when a value overflows f16.
pub(super) fn encode_hidden(values: &[f32], assign: &Assign) -> Result<Activations, String> {
    if let Some(index) = values.iter().position(|v| !v.is_finite()) {
        return Err(format!(
            "the stage produced a non-finite activation at {index}"
        ));
    }
    match Activations::encode(values, assign.d_model, assign.runtime.hidden) {
        Err(FrameError::F16Overflow { .. }) => {
            Activations::encode(values, assign.d_model, Encoding::F32)
        }
        other => other,
    }
    .map_err(|error| error.to_string())
}

fn payload_bytes(output: &StageOutput) -> u32 {
    let bytes = match output {
        StageOutput::Hidden(hidden) => hidden.data.len(),
        StageOutput::TopK { ids, .. } => ids.len() * 8,
        StageOutput::Sampled(_) => 4,
    };
    bytes.min(u32::MAX as usize) as u32
}
