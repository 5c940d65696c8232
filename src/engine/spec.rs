//! Speculative decoding with prompt-lookup drafts (`sample::lookup`): each step feeds the
//! last token and a draft through the stage at once (the multi-token path) and reads back the
//! token chosen after every position; the draft's longest prefix that agrees with those
//! choices is kept, plus the first choice past it, so the output is what plain decoding gives.
//!
//! Greedy requests take each position's argmax on the GPU (4 bytes per position). Sampled
//! requests read every position's logits and sample them in order with the request's own
//! seeded sampler, one draw per kept token as plain decoding draws, so a seed gives the same
//! text with or without drafts (rather than the rejection rule of draft-model speculation,
//! which keeps the distribution but not the draws).
//!
//! Rollback is implicit: the rejected positions' keys and values stay in the KV cache past
//! `cached.len()`, and the next step writes its own over them before any query can see them
//! (attention reads keys up to its own position only, the sliding window included).
//! While there is nothing to verify (drafting paused by `DraftLength`, or no n-gram recurs),
//! greedy tokens come from the pipelined `GreedyDecoder`, as without speculation.

use crate::front::{Decoding, OnEvent, Timings};
use crate::model::StageInput;
use crate::sample::{DraftLength, SpecConfig};

use super::{now_seconds, Engine, EngineError};

/// What a verification step chose after each position.
enum Choices {
    /// Greedy ids, from the GPU.
    Ids(Vec<u32>),
    /// Logits to sample in order.
    Logits(Vec<Vec<f32>>),
}

impl Choices {
    fn pick(&self, position: usize, decoding: &mut Decoding) -> u32 {
        match self {
            Choices::Ids(ids) => ids[position],
            Choices::Logits(rows) => decoding.sample(&rows[position]),
        }
    }
}

impl Engine {
    /// Decodes the rest of `decoding` (whose last token is not in the cache yet) with drafts;
    /// returns the speculation's counts and verification time (`Timings`' draft fields).
    pub(super) async fn speculate(
        &mut self,
        decoding: &mut Decoding,
        config: SpecConfig,
        on_event: &mut OnEvent<'_>,
    ) -> Result<Timings, EngineError> {
        let greedy = decoding.sampler().argmax_suffices();
        let mut length = DraftLength::new(&config);
        let mut drafting = Timings::default();
        while decoding.finished().is_none() {
            let draft = self.draft(decoding, config, length.allowed());
            if greedy && (draft.is_empty() || !length.due()) {
                self.decode_undrafted(decoding, config, &mut length, on_event)
                    .await?;
                drafting.decoder_starts += 1;
                continue;
            }
            let started = now_seconds();
            let accepted = self.verify(decoding, &draft, greedy, on_event).await?;
            let seconds = now_seconds() - started;
            drafting.verifications += 1;
            drafting.verify_seconds += seconds;
            if draft.is_empty() {
                length.record_plain(seconds as f32);
            } else {
                length.record(draft.len() as u32, accepted, seconds as f32);
                drafting.drafted += draft.len() as u32;
                drafting.accepted += accepted;
            }
        }
        Ok(drafting)
    }

    /// A draft of at most `allowed` tokens after the decoding's last token (`Decoding::draft`).
    fn draft(&self, decoding: &Decoding, config: SpecConfig, allowed: u32) -> Vec<u32> {
        let position = self.cached.len() as u32;
        decoding.draft(&config, allowed, position, self.context_length())
    }

    /// Feeds the last token and `draft` in one step and accepts the chosen tokens up to the
    /// first that differs from the draft; returns how many draft tokens were kept.
    async fn verify(
        &mut self,
        decoding: &mut Decoding,
        draft: &[u32],
        greedy: bool,
        on_event: &mut OnEvent<'_>,
    ) -> Result<u32, EngineError> {
        let last = *decoding.tokens().last().expect("tokens hold the prompt");
        let mut input = Vec::with_capacity(draft.len() + 1);
        input.push(last);
        input.extend_from_slice(draft);
        let position = self.cached.len() as u32;
        let step = StageInput::Tokens(&input);
        let choices = if greedy {
            Choices::Ids(self.stage.forward_argmax_rows(&step, position).await?)
        } else {
            let rows = input.len() as u32;
            Choices::Logits(self.stage.forward_logits(&step, position, rows).await?)
        };
        let mut accepted = 0;
        for (index, &fed) in input.iter().enumerate() {
            // `fed` was the right token here, so its keys and values are the sequence's.
            self.cached.push(fed);
            let next = choices.pick(index, decoding);
            let ended = decoding.accept(&self.text, next, on_event).is_some();
            if ended || draft.get(index) != Some(&next) {
                break;
            }
            accepted += 1;
        }
        Ok(accepted)
    }

    /// Greedy tokens through the pipelined decoder while there is nothing to verify (drafting
    /// paused, no n-gram recurs, or no lookup has come true yet: `DraftLength::watch`): a
    /// one-token verification step would wait for its token before the next could start,
    /// 10-15% slower on the H200 (docs/perf.md, session 22). The steps the decoder has in
    /// flight when a draft is due are kept, not wasted, and watched as the others.
    async fn decode_undrafted(
        &mut self,
        decoding: &mut Decoding,
        config: SpecConfig,
        length: &mut DraftLength,
        on_event: &mut OnEvent<'_>,
    ) -> Result<(), EngineError> {
        let mut fed = *decoding.tokens().last().expect("tokens hold the prompt");
        let position = self.cached.len() as u32;
        let mut decoder = self
            .stage
            .greedy_decoder(fed, position, self.decode_depth)?;
        let mut ended = false;
        let mut last_at = now_seconds();
        while !ended {
            let next = decoder.next().await?;
            let at = now_seconds();
            length.record_plain((at - last_at) as f32);
            last_at = at;
            self.cached.push(fed);
            fed = next;
            ended = decoding.accept(&self.text, next, on_event).is_some();
            let due = length.watch(decoding.tokens());
            if due && !self.draft(decoding, config, length.allowed()).is_empty() {
                break;
            }
        }
        if ended {
            // The steps still in flight are past the end: dropped unread, as plain decoding
            // drops them (waiting for them cost up to two steps' time at every request's end).
            return Ok(());
        }
        for next in decoder.drain().await? {
            if ended {
                break;
            }
            self.cached.push(fed);
            fed = next;
            ended = decoding.accept(&self.text, next, on_event).is_some();
            length.watch(decoding.tokens());
        }
        Ok(())
    }
}
