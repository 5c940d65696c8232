//! A session's bookkeeping beside its generation: heartbeats to the chain (and who fell
//! silent), and the step and decode timings of the run report.

use web_time::Instant;

use super::super::super::frame::{Heartbeat, Message, StageResult};
use super::super::super::transport::{send_message, PeerId, Transport};
use super::super::coordinator::Coordinator;
use super::super::timer::unix_ms;
use super::super::RoleError;
use super::Session;

impl<T: Transport> Coordinator<T> {
    /// Sends heartbeats; returns stage donors silent for longer than the timeout, which are
    /// kept as absent: their next frame admits them again.
    pub(super) async fn heartbeat(&mut self, session: &Session) -> Result<Vec<PeerId>, RoleError> {
        let timeout = self.config.heartbeat_timeout;
        let now = Instant::now();
        let lost: Vec<PeerId> = self
            .last_seen
            .iter()
            .filter(|(_, seen)| now.duration_since(**seen) > timeout)
            .map(|(peer, _)| *peer)
            .collect();
        for peer in &lost {
            if let Some(donor) = self.donors.get(peer) {
                self.absent.insert(*peer, donor.clone());
            }
        }
        let beat = Message::Heartbeat(Heartbeat {
            nonce: self.epoch as u64,
            sent_ms: unix_ms(),
        });
        let stages = self.plan.stages.iter().map(|s| s.donor);
        let donors: Vec<PeerId> = stages.chain(self.absent.keys().copied()).collect();
        for donor in donors {
            let _ = send_message(&self.transport, donor, &beat).await;
        }
        let stalled = session.active.iter().any(|a| {
            a.sent_at
                .is_some_and(|t| now.duration_since(t) > self.config.step_timeout)
        });
        if stalled && lost.is_empty() {
            return Err(RoleError::Timeout {
                what: "a step through the chain".into(),
                seconds: self.config.step_timeout.as_secs_f64(),
            });
        }
        Ok(lost)
    }

    pub(super) fn record_step(
        &mut self,
        session: &mut Session,
        position: usize,
        result: &StageResult,
    ) {
        let active = &mut session.active[position];
        let Some(sent_at) = active.sent_at.take() else {
            return;
        };
        let step_ms = sent_at.elapsed().as_secs_f64() * 1000.0;
        let compute_ms: f64 = result
            .trace
            .iter()
            .map(|t| f64::from(t.compute_us) / 1000.0)
            .sum();
        if result.n_tokens == 1 {
            session.steps += 1;
            session.step_ms_total += step_ms;
            session.transfer_ms_total += (step_ms - compute_ms).max(0.0);
        }
        self.record_hops(&result.trace);
    }

    pub(super) fn finish_report(&mut self, session: &Session, started: Instant) {
        let report = &mut self.report;
        if session.steps > 0 {
            report.step_ms_mean = session.step_ms_total / session.steps as f64;
            report.transfer_ms_mean = session.transfer_ms_total / session.steps as f64;
        }
        let decode_start = session.first_token_at.unwrap_or(started);
        let seconds = decode_start.elapsed().as_secs_f64();
        if seconds > 0.0 {
            report.decode_tokens_per_s = session.decode_tokens as f64 / seconds;
        }
    }
}
