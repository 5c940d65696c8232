//! Greedy decoding with the token fed back on the GPU.
//!
//! A decode step's argmax is copied into the id buffer the next step's embedding reads, so the
//! host can record and submit step `n + 1` before step `n` has finished: the GPU never waits
//! for the host between tokens, and the host's recording of a step overlaps the GPU's work on
//! the one before. The ids still come back (4 bytes per step) for the caller, `depth` steps
//! behind the GPU. Steps submitted past a stop only write cache positions after the last
//! accepted token, which the next call overwrites.

use std::collections::VecDeque;

use crate::gpu::PendingRead;

use super::stage::Stage;
use super::ModelError;

/// Steps in flight beyond the one being waited for.
pub const DEFAULT_DEPTH: usize = 2;
/// Most steps a decoder keeps in flight (`Engine::set_decode_depth`): past a stop, each costs
/// a wasted step.
pub const MAX_DEPTH: usize = 8;

pub struct GreedyDecoder<'s> {
    stage: &'s Stage,
    /// Position of the next step to submit; its input token is in the id buffer.
    next_position: u32,
    in_flight: VecDeque<PendingRead>,
    depth: usize,
    /// Whether no step has been submitted yet: the first finds the GPU idle (a restart after
    /// a verification step), so it is submitted in parts.
    first: bool,
}

impl Stage {
    /// Decodes greedily after `token` at `position`, keeping up to `depth` steps in flight.
    pub fn greedy_decoder(
        &self,
        token: u32,
        position: u32,
        depth: usize,
    ) -> Result<GreedyDecoder<'_>, ModelError> {
        if token >= self.cfg.vocab {
            return Err(ModelError::Plan(format!(
                "token {token} outside the vocabulary of {}",
                self.cfg.vocab
            )));
        }
        self.gpu
            .queue
            .write_buffer(&self.scratch.ids, 0, bytemuck::bytes_of(&token));
        Ok(GreedyDecoder {
            stage: self,
            next_position: position,
            in_flight: VecDeque::new(),
            depth: depth.max(1),
            first: true,
        })
    }
}

impl GreedyDecoder<'_> {
    /// The next greedy token, in order.
    pub async fn next(&mut self) -> Result<u32, ModelError> {
        while self.in_flight.len() < self.depth && self.next_position < self.stage.spec.max_context
        {
            self.submit_step()?;
        }
        let Some(pending) = self.in_flight.pop_front() else {
            return Err(ModelError::ContextFull {
                needed: self.next_position + 1,
                max: self.stage.spec.max_context,
            });
        };
        let bytes = pending.wait(&self.stage.gpu).await?;
        Ok(u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]))
    }

    /// Stops submitting and returns the tokens of the steps still in flight, in order: they
    /// continue the sequence, so a caller switching to another kind of step keeps them.
    pub async fn drain(mut self) -> Result<Vec<u32>, ModelError> {
        let mut ids = Vec::with_capacity(self.in_flight.len());
        while let Some(pending) = self.in_flight.pop_front() {
            let bytes = pending.wait(&self.stage.gpu).await?;
            ids.push(u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]));
        }
        Ok(ids)
    }

    fn submit_step(&mut self) -> Result<(), ModelError> {
        let stage = self.stage;
        let position = self.next_position;
        stage.check_batch(1, position)?;
        let first = std::mem::replace(&mut self.first, false);
        let pending = stage.with_recorder(("greedy", 1), |mut rec| {
            if first {
                rec.submit_in_parts();
            }
            stage.record_embedding(&mut rec, 1)?;
            stage.record_blocks(&mut rec, position, 1);
            stage.record_argmax(&mut rec, 1)?;
            let s = &stage.scratch;
            rec.copy(&s.argmax, 0, &s.ids, 0, 4);
            Ok(rec.submit_with_read(&s.argmax, 0, 4))
        })?;
        self.in_flight.push_back(pending);
        self.next_position += 1;
        Ok(())
    }
}
