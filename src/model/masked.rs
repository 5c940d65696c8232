//! Constrained steps with the mask applied on the GPU. The step's layers and head are
//! submitted first and their logits stay on the device while the CPU computes the allowed set;
//! then one small submit masks the logits there and takes the argmax (greedy) or the top k
//! (sampling), so only 4 bytes, or k ids and values, come back instead of the whole vocabulary.

use crate::ops::select::{self, mask_words, MAX_TOP_K};

use super::stage::{Stage, StageInput};
use super::ModelError;

impl Stage {
    /// Runs the layers and the head over the last of `input`'s tokens and submits, leaving
    /// that position's logits on the device for `masked_argmax` or `masked_top_k`.
    pub fn submit_logits(&self, input: &StageInput<'_>, start_pos: u32) -> Result<(), ModelError> {
        let tokens = input.tokens(self.cfg.d_model) as u32;
        self.with_recorder(("logits", tokens), |mut rec| {
            self.record_layers(&mut rec, input, start_pos)?;
            self.record_head(&mut rec, tokens - 1..tokens)?;
            rec.submit();
            Ok(())
        })
    }

    /// The argmax over the ids `allowed` allows (a bitset of `mask_words(vocab)` words, as
    /// `TokenMask::words` gives) of the logits `submit_logits` left.
    pub async fn masked_argmax(&self, allowed: &[u32]) -> Result<u32, ModelError> {
        self.write_allowed(allowed)?;
        let (s, vocab) = (&self.scratch, self.cfg.vocab);
        let pending = self.with_recorder(("masked argmax", 1), |mut rec| {
            select::mask(&mut rec, &s.logits, vocab, &s.allowed);
            select::argmax(&mut rec, &s.logits, vocab, &s.argmax);
            Ok(rec.submit_with_read(&s.argmax, 0, 4))
        })?;
        let bytes = pending.wait(&self.gpu).await?;
        Ok(u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]))
    }

    /// The `k` best of the logits `submit_logits` left among the ids `allowed` allows, best
    /// first (lower id first on ties): their ids and values. Fewer than `k` allowed ids fill
    /// the rest with disallowed ones at −∞. Needs 1 <= k <= min(vocab, `MAX_TOP_K`).
    pub async fn masked_top_k(
        &self,
        allowed: &[u32],
        k: u32,
    ) -> Result<(Vec<u32>, Vec<f32>), ModelError> {
        let (s, vocab) = (&self.scratch, self.cfg.vocab);
        if k == 0 || k > MAX_TOP_K.min(vocab) {
            return Err(ModelError::Plan(format!(
                "masked top-k of {k} (1..={})",
                MAX_TOP_K.min(vocab)
            )));
        }
        self.write_allowed(allowed)?;
        let bytes = u64::from(k) * 4;
        let pending = self.with_recorder(("masked top-k", k), |mut rec| {
            select::mask(&mut rec, &s.logits, vocab, &s.allowed);
            select::top_k(&mut rec, &s.logits, vocab, k, &s.top_ids, &s.top_values);
            rec.copy(&s.top_values, 0, &s.top_ids, bytes, bytes);
            Ok(rec.submit_with_read(&s.top_ids, 0, 2 * bytes))
        })?;
        let read = pending.wait(&self.gpu).await?;
        let (ids, values) = read[..2 * bytes as usize].split_at(bytes as usize);
        Ok((
            bytemuck::pod_collect_to_vec(ids),
            bytemuck::pod_collect_to_vec(values),
        ))
    }

    fn write_allowed(&self, allowed: &[u32]) -> Result<(), ModelError> {
        let words = mask_words(self.cfg.vocab) as usize;
        if allowed.len() != words {
            return Err(ModelError::Plan(format!(
                "an allowed set of {} words for a vocabulary of {} ({words} words)",
                allowed.len(),
                self.cfg.vocab
            )));
        }
        self.gpu
            .queue
            .write_buffer(&self.scratch.allowed, 0, bytemuck::cast_slice(allowed));
        Ok(())
    }
}
