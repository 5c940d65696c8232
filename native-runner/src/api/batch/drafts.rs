//! Speculative decoding in the scheduler (`webshard_spec`, or `runner serve --spec`): a
//! sequence running alone drafts from its own tokens (prompt lookup, as `runner generate
//! --spec` does) and verifies each draft in one multi-token step on its own cache, keeping the
//! draft's longest prefix that agrees with what the step chose and the choice after it, so the
//! output is what plain decoding gives (greedy, or sampled with the request's seed: one draw
//! per kept token, in order). Rejected positions need no rollback: the next step writes its
//! own keys and values over them before any query reads them, and the pool records only the
//! tokens kept (`KvPool::extend`).
//!
//! Only a lone sequence drafts: beside others, a batched step already spreads its cost over
//! every row, while a draft's step would hold them all up. As in the engine (`DraftLength`),
//! a draft is verified at once only while a span goes on, otherwise once its lookup has come
//! true for a few plain tokens; the length adapts, and drafting pauses where drafts fail or
//! cost more than they give. Plain tokens between drafts come from the pipelined batched steps.

use webshard::engine::EngineError;
use webshard::front::GenerateOptions;
use webshard::model::StageInput;
use webshard::sample::{DraftLength, SpecConfig};

use super::{accept_next, now_seconds, Next, Scheduler};

/// A sequence's speculation: its settings, the adaptive draft length and what it drafted.
pub(super) struct Drafting {
    config: SpecConfig,
    length: DraftLength,
    /// When its last token came from a step it ran alone, to time plain decoding (the
    /// draft length's cost rule compares drafting with it).
    last_alone: Option<f64>,
    pub drafted: u32,
    pub accepted: u32,
}

impl Drafting {
    /// The request's speculation (or the server's `default`), unless it has a constraint or
    /// asks for log-probabilities: those decode plainly.
    pub fn for_request(options: &GenerateOptions, default: Option<SpecConfig>) -> Option<Drafting> {
        if options.constraint.is_some() || options.logprobs.is_some() {
            return None;
        }
        let config = options.speculation.or(default)?;
        Some(Drafting {
            config,
            length: DraftLength::new(&config),
            last_alone: None,
            drafted: 0,
            accepted: 0,
        })
    }

    /// A token decoded without a draft, the last of `tokens`; one from a step the sequence ran
    /// `alone` times what a plain token costs. The lookup watches it (`DraftLength::watch`).
    pub fn plain_token(&mut self, alone: bool, tokens: &[u32]) {
        let now = now_seconds();
        let seconds = match (alone, self.last_alone) {
            (true, Some(last)) => (now - last) as f32,
            _ => 0.0,
        };
        self.length.record_plain(seconds);
        self.length.watch(tokens);
        self.last_alone = alone.then_some(now);
    }
}

/// What a verification step chose after each position.
enum Chosen {
    Ids(Vec<u32>),
    Logits(Vec<Vec<f32>>),
}

impl Chosen {
    fn take(&mut self, index: usize) -> Next {
        match self {
            Chosen::Ids(ids) => Next::Greedy(ids[index]),
            Chosen::Logits(rows) => Next::Logits(std::mem::take(&mut rows[index])),
        }
    }
}

impl Scheduler {
    /// The draft of the one running sequence, when it drafts, one is due (`DraftLength::due`)
    /// and it has only its last token to feed; `None` while others run, drafting is paused,
    /// no lookup has come true yet, or no n-gram recurs.
    pub(super) fn lone_draft(&self) -> Option<Vec<u32>> {
        let [seq] = self.running.as_slice() else {
            return None;
        };
        let drafting = seq.drafting.as_ref()?;
        if !drafting.length.due() || seq.next.is_some() || seq.to_feed(&self.pool).len() != 1 {
            return None;
        }
        let position = self.pool.held(seq.slot) as u32;
        let context = self.pool.cache(seq.slot).max_ctx;
        let allowed = drafting.length.allowed();
        let draft = seq
            .decoding
            .draft(&drafting.config, allowed, position, context);
        (!draft.is_empty()).then_some(draft)
    }

    /// Feeds the lone sequence's last token and `draft` in one step on its cache and takes
    /// the chosen tokens up to the first that differs from the draft (each streamed as it is
    /// taken; the last one's stop, if any, ends the sequence as a plain step's would).
    pub(super) async fn verify_draft(&mut self, draft: Vec<u32>) -> Result<(), EngineError> {
        let started = std::time::Instant::now();
        let seq = &self.running[0];
        let slot = seq.slot;
        let mut input = Vec::with_capacity(draft.len() + 1);
        input.push(seq.to_feed(&self.pool)[0]);
        input.extend_from_slice(&draft);
        let greedy = seq.greedy_on_device();
        let position = self.pool.held(slot) as u32;
        let own = self.pool.lend_to(&mut self.engine.stage, slot);
        let step = StageInput::Tokens(&input);
        let stage = &self.engine.stage;
        let chosen = match greedy {
            true => stage
                .forward_argmax_rows(&step, position)
                .await
                .map(Chosen::Ids),
            false => {
                let rows = input.len() as u32;
                let logits = stage.forward_logits(&step, position, rows).await;
                logits.map(Chosen::Logits)
            }
        };
        self.pool.take_back(&mut self.engine.stage, slot, own);
        let mut chosen = chosen?;
        let mut accepted = 0;
        for (index, &fed) in input.iter().enumerate() {
            // `fed` was the right token here, so its keys and values are the sequence's.
            self.pool.extend(slot, &[fed]);
            let seq = &mut self.running[0];
            accept_next(seq, &self.engine.text, chosen.take(index)).await?;
            let taken = seq.decoding.tokens().last();
            if seq.decoding.finished().is_some() || draft.get(index) != taken {
                break;
            }
            accepted += 1;
        }
        self.metrics.decoded_step(1, started.elapsed());
        self.metrics.drafted(draft.len() as u32, accepted);
        let drafting = self.running[0]
            .drafting
            .as_mut()
            .expect("only a drafting sequence has a draft");
        let seconds = started.elapsed().as_secs_f32();
        drafting
            .length
            .record(draft.len() as u32, accepted, seconds);
        drafting.drafted += draft.len() as u32;
        drafting.accepted += accepted;
        drafting.last_alone = Some(now_seconds());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use webshard::sample::ConstraintSpec;

    #[test]
    fn a_request_drafts_as_it_or_the_server_asks_unless_constrained_or_with_logprobs() {
        let asked = SpecConfig::lookup(6).unwrap();
        let default = SpecConfig::default();
        let server = Some(default);
        let plain = GenerateOptions::default();
        assert!(Drafting::for_request(&plain, None).is_none());
        assert_eq!(
            Drafting::for_request(&plain, server).unwrap().config,
            default
        );
        let asking = GenerateOptions {
            speculation: Some(asked),
            ..GenerateOptions::default()
        };
        assert_eq!(Drafting::for_request(&asking, None).unwrap().config, asked);
        assert_eq!(
            Drafting::for_request(&asking, server).unwrap().config,
            asked
        );
        let constrained = GenerateOptions {
            constraint: Some(ConstraintSpec::Json),
            ..asking.clone()
        };
        assert!(Drafting::for_request(&constrained, server).is_none());
        let with_logprobs = GenerateOptions {
            logprobs: Some(2),
            ..asking
        };
        assert!(Drafting::for_request(&with_logprobs, server).is_none());
    }
}
