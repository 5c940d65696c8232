//! Prompt-lookup drafts for speculative decoding, and the adaptive draft length.
//!
//! A draft is what followed the latest earlier occurrence of the last `n` tokens (prompt and
//! completion so far), trying `n` from `ngram_max` down to 1: answers that copy spans of
//! their input (code edits, summaries, extraction) continue such spans token for token. The
//! engine verifies a draft in one multi-token step and keeps the longest prefix that agrees
//! with what it would have generated, so drafts change speed, never output.
//!
//! `DraftLength` decides when a draft is verified and how long it may be. A draft is verified
//! at once only while a span goes on (the last draft was accepted whole) or drafts have been
//! paying; otherwise plain tokens keep coming from the pipelined decoder, each checked against
//! what the lookup foretold, and a draft is verified once the lookup has foretold `confirm`
//! plain tokens in a row. A lookup that fails costs nothing then, where a failed verification
//! step costs about two plain tokens' time, and cost three before session 36's cheaper
//! few-token steps (an H100: docs/perf.md): in text that repeats nothing a one-token n-gram
//! recurs almost everywhere.
//! The length doubles after a draft accepted whole and falls to one past the accepted prefix
//! after a rejection; drafting stops for a while (longer each time it fails again) when the
//! recent acceptance rate is low or when the measured tokens per second of drafting fall
//! below plain decoding's. The cost rule matters where a multi-token step costs several plain
//! ones (CPU adapters: docs/perf.md); on a GPU it rarely fires.

/// Longest draft a step may verify: the head computes logits for at most 16 rows at once
/// (the draft plus the token before it).
pub const MAX_DRAFT: u32 = 15;
/// Longest n-gram looked up: longer matches are rarer and predict little better.
pub const DEFAULT_NGRAM_MAX: usize = 3;
/// Plain tokens a lookup must foretell in a row before its draft is verified: a one-token
/// n-gram's next token comes true by chance often enough in any text. On an H100
/// (docs/perf.md, session 35) two took SmolLM2's answer that repeats nothing from 0.93x to
/// 0.96x plain decoding and left Qwen2.5-Coder's code edit where verifying every draft has it
/// (the same drafts, ~2.5x); three gave 0.98x on the first but 1.7x on the second.
pub const DEFAULT_CONFIRM: u32 = 2;

/// Speculation settings, as `--spec lookup --draft-max K` gives them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SpecConfig {
    /// Most draft tokens per verification step (1..=`MAX_DRAFT`).
    pub draft_max: u32,
    /// Longest n-gram looked up (at least 1).
    pub ngram_max: usize,
    /// Drafting pauses when its measured speed falls below this times plain decoding's; 0
    /// keeps drafting whatever it costs (tests that compare outputs).
    pub min_gain: f32,
    /// Plain tokens a lookup must foretell before its draft is verified, unless a span goes
    /// on; 0 verifies every draft found (tests that need drafts rejected).
    pub confirm: u32,
}

/// Drafts may grow to `MAX_DRAFT`: the length starts at 4 and doubles only while whole drafts
/// are accepted, and on the H200 Qwen2.5-Coder's code edit went 1.38x -> 2.12x plain decoding
/// with 15 against 8, with no loss where little recurs (docs/perf.md, session 22).
impl Default for SpecConfig {
    fn default() -> Self {
        SpecConfig {
            draft_max: MAX_DRAFT,
            ngram_max: DEFAULT_NGRAM_MAX,
            min_gain: 1.0,
            confirm: DEFAULT_CONFIRM,
        }
    }
}

/// What is wrong with the speculation a request names: its kind, or its draft length.
#[derive(Debug, Clone, PartialEq)]
pub enum SpecRequestError {
    Kind(String),
    DraftMax(String),
}

impl SpecConfig {
    /// The speculation a request names by `kind` (`"lookup"`, the only one) and `draft_max`
    /// (default `MAX_DRAFT`): the HTTP API's `webshard_spec` and the page's `spec` options.
    pub fn named(kind: &str, draft_max: Option<u32>) -> Result<SpecConfig, SpecRequestError> {
        if kind != "lookup" {
            let why = format!("\"{kind}\" is not known (\"lookup\" is)");
            return Err(SpecRequestError::Kind(why));
        }
        let draft_max = draft_max.unwrap_or(SpecConfig::default().draft_max);
        SpecConfig::lookup(draft_max).map_err(SpecRequestError::DraftMax)
    }

    /// Lookup with drafts of at most `draft_max` tokens, or an error saying the bounds.
    pub fn lookup(draft_max: u32) -> Result<SpecConfig, String> {
        if !(1..=MAX_DRAFT).contains(&draft_max) {
            return Err(format!(
                "draft-max {draft_max} is outside 1..={MAX_DRAFT} (the head computes at most {} rows per step)",
                MAX_DRAFT + 1
            ));
        }
        Ok(SpecConfig {
            draft_max,
            ..SpecConfig::default()
        })
    }
}

/// `max_len` tokens that followed the latest earlier occurrence of the longest suffix of
/// `tokens` (of at most `ngram_max` tokens) seen before, continued as a loop where they run
/// into the end (`continue_from`); empty when none recurs.
pub fn lookup_draft(tokens: &[u32], ngram_max: usize, max_len: usize) -> Vec<u32> {
    if max_len == 0 {
        return Vec::new();
    }
    for n in (1..=ngram_max.min(tokens.len().saturating_sub(1))).rev() {
        let pattern = &tokens[tokens.len() - n..];
        // Latest first: the nearest repetition is the likeliest to continue.
        let found = (0..tokens.len() - n)
            .rev()
            .find(|&start| &tokens[start..start + n] == pattern);
        if let Some(start) = found {
            return continue_from(tokens, start + n, max_len);
        }
    }
    Vec::new()
}

/// `max_len` tokens copied from `from` on; a copy that reaches the end of `tokens` goes on
/// with what it copied (an overlapping copy), so a loop whose period is shorter than the
/// draft is drafted whole rather than cut at the last token (SmolLM2's answers that loop
/// with a period of 6 drafted 5 tokens a step).
fn continue_from(tokens: &[u32], from: usize, max_len: usize) -> Vec<u32> {
    let mut draft = Vec::with_capacity(max_len);
    for at in from..from + max_len {
        let next = match tokens.get(at) {
            Some(&token) => token,
            None => draft[at - tokens.len()],
        };
        draft.push(next);
    }
    draft
}

/// Weight of the newest step in the running acceptance rate and costs.
const RATE_WEIGHT: f32 = 0.3;
/// Plain tokens before the first draft: they measure what a plain token costs.
const FIRST_PLAIN: u32 = 3;
/// Below this running rate of accepted draft tokens, drafting pauses.
const PAUSE_BELOW: f32 = 0.25;
/// Plain tokens of the first pause; each pause that ends in another low rate doubles it.
const FIRST_PAUSE: u32 = 8;
const LONGEST_PAUSE: u32 = 256;
/// The running rate a fresh start (and the end of a pause) assumes: two bad steps pause
/// drafting, and drafts are verified at once only while the rate is above it
/// (`DraftLength::due`); until then they come through the gate (`DraftLength::watch`).
const START_RATE: f32 = 0.5;

/// The adaptive draft length and the pause after low acceptance or a measured loss.
#[derive(Debug, Clone)]
pub struct DraftLength {
    max: u32,
    next: u32,
    rate: f32,
    /// Plain tokens left before drafting resumes.
    paused_for: u32,
    pause: u32,
    min_gain: f32,
    /// Running seconds per plain token, and per drafting step with the tokens it gave.
    plain_seconds: Option<f32>,
    step_seconds: Option<f32>,
    step_tokens: Option<f32>,
    /// The last draft was accepted whole, or a lookup has foretold `confirm` plain tokens in a
    /// row (with `confirm` 0 every draft is due: `due`).
    due: bool,
    confirm: u32,
    ngram_max: usize,
    /// What the latest lookup says the next plain tokens are, and how many came true so far.
    foretold: Vec<u32>,
    came_true: u32,
}

fn running(old: Option<f32>, new: f32) -> f32 {
    old.map_or(new, |old| (1.0 - RATE_WEIGHT) * old + RATE_WEIGHT * new)
}

impl DraftLength {
    pub fn new(config: &SpecConfig) -> DraftLength {
        let max = config.draft_max.max(1);
        let measure_first = config.min_gain > 0.0;
        DraftLength {
            max,
            next: max.min(4),
            rate: START_RATE,
            paused_for: if measure_first { FIRST_PLAIN } else { 0 },
            pause: FIRST_PAUSE,
            min_gain: config.min_gain,
            plain_seconds: None,
            step_seconds: None,
            step_tokens: None,
            due: false,
            confirm: config.confirm,
            ngram_max: config.ngram_max,
            foretold: Vec::new(),
            came_true: 0,
        }
    }

    /// Whether a draft found now is to be verified now: drafting is not paused, and a span
    /// goes on, a lookup's draft has come true for `confirm` plain tokens, or drafts have been
    /// paying (a running acceptance rate above a fresh start's: extraction, where the answer
    /// moves from one copied line to the next and the first lookup after a rejection is
    /// usually right). Otherwise plain tokens keep coming from the pipelined
    /// decoder, each passed to `watch`.
    pub fn due(&self) -> bool {
        self.paused_for == 0 && (self.confirm == 0 || self.due || self.rate > START_RATE)
    }

    /// After a plain token (the last of `tokens`, prompt and completion so far): checks it
    /// against what the lookup foretold and looks up what comes next. True once a draft is
    /// due, for `due` to say. The tokens of the steps still in flight when a draft fell due
    /// are watched too: one the lookup did not foretell sends the caller back to plain
    /// decoding, which costs the pipeline's restart (~0.5 ms on an H100) where verifying the
    /// draft would likely cost a failed step (1.7-2.2 ms, docs/perf.md session 36).
    pub fn watch(&mut self, tokens: &[u32]) -> bool {
        if self.confirm == 0 {
            return self.due();
        }
        let next = tokens.last().copied();
        if !self.foretold.is_empty() && self.foretold.first().copied() == next {
            self.foretold.remove(0);
            self.came_true += 1;
        } else {
            self.foretold.clear();
            self.came_true = 0;
        }
        if self.foretold.is_empty() {
            self.foretold = lookup_draft(tokens, self.ngram_max, self.confirm as usize);
        }
        self.due = self.came_true >= self.confirm;
        self.due()
    }

    /// How many draft tokens the next step may verify; 0 while drafting is paused.
    pub fn allowed(&self) -> u32 {
        if self.paused_for > 0 {
            0
        } else {
            self.next
        }
    }

    /// After a verification step of `seconds` that kept `accepted` of `drafted` draft tokens.
    pub fn record(&mut self, drafted: u32, accepted: u32, seconds: f32) {
        if drafted == 0 {
            return;
        }
        let fraction = accepted as f32 / drafted as f32;
        self.rate = running(Some(self.rate), fraction);
        self.step_seconds = Some(running(self.step_seconds, seconds));
        self.step_tokens = Some(running(self.step_tokens, (accepted + 1) as f32));
        self.next = if accepted == drafted {
            (self.next * 2).min(self.max)
        } else {
            (accepted + 1).min(self.max)
        };
        self.due = accepted == drafted;
        self.foretold.clear();
        self.came_true = 0;
        if self.rate < PAUSE_BELOW || self.gain() < self.min_gain {
            self.pause_drafting();
        } else if fraction >= 0.5 {
            self.pause = FIRST_PAUSE;
        }
    }

    /// Drafting's tokens per second over plain decoding's, as measured so far (1 until both
    /// are known).
    fn gain(&self) -> f32 {
        match (self.plain_seconds, self.step_seconds, self.step_tokens) {
            (Some(plain), Some(step), Some(tokens)) if step > 0.0 => tokens * plain / step,
            _ => 1.0,
        }
    }

    /// A pause long enough that probing costs little: doubled after each failed probe, and
    /// stretched by how many plain tokens a drafting step costs.
    fn pause_drafting(&mut self) {
        let step_cost = match (self.plain_seconds, self.step_seconds) {
            (Some(plain), Some(step)) if plain > 0.0 => (step / plain).ceil() as u32,
            _ => 1,
        };
        self.paused_for = self.pause * step_cost.clamp(1, 16);
        self.pause = (self.pause * 2).min(LONGEST_PAUSE);
        self.rate = START_RATE;
        self.step_tokens = None;
        self.step_seconds = None;
    }

    /// After a token generated without a draft (paused, or no n-gram recurred) in `seconds`
    /// (0 when its cost is not known on its own).
    pub fn record_plain(&mut self, seconds: f32) {
        self.paused_for = self.paused_for.saturating_sub(1);
        if seconds > 0.0 {
            self.plain_seconds = Some(running(self.plain_seconds, seconds));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_names_lookup_with_a_draft_length_in_bounds() {
        let default = SpecConfig::named("lookup", None).unwrap();
        assert_eq!(default, SpecConfig::default());
        assert_eq!(SpecConfig::named("lookup", Some(4)).unwrap().draft_max, 4);
        assert!(matches!(
            SpecConfig::named("ngram", Some(4)),
            Err(SpecRequestError::Kind(_))
        ));
        assert!(matches!(
            SpecConfig::named("lookup", Some(MAX_DRAFT + 1)),
            Err(SpecRequestError::DraftMax(_))
        ));
    }

    #[test]
    fn the_latest_longest_match_is_continued() {
        // "1 2 3 4 5 ... 1 2 3 9 ... 1 2 3": the latest "1 2 3" is followed by 9.
        let tokens = [1, 2, 3, 4, 5, 1, 2, 3, 9, 7, 1, 2, 3];
        assert_eq!(lookup_draft(&tokens, 3, 2), vec![9, 7]);
        // A 3-gram that never recurred falls back to the 2-gram, then the 1-gram.
        assert_eq!(lookup_draft(&[5, 6, 8, 6, 7, 8, 6], 3, 3), vec![7, 8, 6]);
        // The 1-gram 3 recurs right before the end: the copy loops on it.
        assert_eq!(lookup_draft(&[1, 2, 3, 3], 3, 4), vec![3, 3, 3, 3]);
    }

    #[test]
    fn nothing_recurs_nothing_is_drafted() {
        assert!(lookup_draft(&[1, 2, 3, 4], 3, 4).is_empty());
        assert!(lookup_draft(&[7], 3, 4).is_empty());
        assert!(lookup_draft(&[], 3, 4).is_empty());
        assert!(lookup_draft(&[1, 1], 3, 0).is_empty());
    }

    #[test]
    fn a_draft_that_reaches_the_end_continues_the_loop() {
        assert_eq!(lookup_draft(&[4, 5, 4], 2, 5), vec![5, 4, 5, 4, 5]);
        assert_eq!(lookup_draft(&[9, 1, 2, 3, 1, 2], 2, 4), vec![3, 1, 2, 3]);
    }

    #[test]
    fn the_length_grows_on_full_acceptance_and_falls_on_rejection() {
        let mut length = DraftLength::new(&uncosted(8));
        assert_eq!(length.allowed(), 4);
        length.record(4, 4, 1.0);
        assert_eq!(length.allowed(), 8);
        length.record(8, 8, 1.0);
        assert_eq!(length.allowed(), 8);
        length.record(8, 2, 1.0);
        assert_eq!(length.allowed(), 3);
    }

    #[test]
    fn low_acceptance_pauses_drafting_longer_each_time() {
        let mut length = DraftLength::new(&uncosted(8));
        length.record(4, 0, 1.0);
        assert_eq!(
            length.allowed(),
            1,
            "one bad step after a fair start keeps drafting"
        );
        length.record(1, 0, 1.0);
        assert_eq!(length.allowed(), 0, "two bad steps pause it");
        for _ in 0..FIRST_PAUSE {
            assert_eq!(length.allowed(), 0);
            length.record_plain(0.0);
        }
        assert_eq!(length.allowed(), 1);
        length.record(1, 0, 1.0);
        length.record(1, 0, 1.0);
        for _ in 0..2 * FIRST_PAUSE {
            assert_eq!(length.allowed(), 0);
            length.record_plain(0.0);
        }
        assert_eq!(length.allowed(), 1);
    }

    /// Drafting whatever it costs, a lookup confirmed by two plain tokens (the sequences below
    /// are written for two).
    fn uncosted(draft_max: u32) -> SpecConfig {
        SpecConfig {
            min_gain: 0.0,
            confirm: 2,
            ..SpecConfig::lookup(draft_max).unwrap()
        }
    }

    #[test]
    fn drafting_that_is_slower_than_plain_decoding_pauses() {
        let mut length = DraftLength::new(&SpecConfig::lookup(8).unwrap());
        for _ in 0..FIRST_PLAIN {
            assert_eq!(length.allowed(), 0, "plain tokens first, to measure them");
            length.record_plain(0.1);
        }
        // Two of four kept: 3 tokens in a step of 0.2 s beat 0.1 s per plain token.
        length.record(4, 2, 0.2);
        assert_eq!(length.allowed(), 3);
        // Three tokens in 0.6 s lose to plain decoding: a pause stretched by the step's cost.
        length.record(3, 2, 0.6);
        assert_eq!(length.allowed(), 0);
        let mut paused = 0;
        while length.allowed() == 0 {
            length.record_plain(0.1);
            paused += 1;
        }
        assert!(paused > FIRST_PAUSE, "paused {paused} tokens");
    }

    #[test]
    fn a_draft_is_due_once_its_lookup_has_come_true_for_confirm_tokens() {
        let mut length = DraftLength::new(&uncosted(8));
        let mut tokens = vec![10, 1, 2, 3, 4, 11, 1];
        assert!(!length.due(), "nothing foretold yet");
        assert!(!length.watch(&tokens), "1 foretells 2 3");
        tokens.push(2);
        assert!(!length.watch(&tokens), "one of two came true");
        tokens.push(3);
        assert!(length.watch(&tokens), "two came true");
        assert!(length.due());
        // The draft then verified is rejected after one token: the next must come true again.
        length.record(4, 1, 1.0);
        assert!(!length.due());
        tokens.extend([4, 12]);
        assert!(!length.watch(&tokens), "12 was not foretold");
        tokens.push(1);
        assert!(!length.watch(&tokens));
        tokens.push(2);
        assert!(!length.watch(&tokens), "one came true since 12");
    }

    #[test]
    fn a_span_accepted_whole_goes_on_without_confirmation() {
        let mut length = DraftLength::new(&uncosted(8));
        let mut tokens = vec![5, 6, 7, 8, 9, 5];
        for next in [6, 7, 8] {
            tokens.push(next);
            length.watch(&tokens);
        }
        assert!(length.due());
        length.record(4, 4, 1.0);
        assert!(length.due(), "a draft accepted whole: its span goes on");
        length.record(8, 4, 1.0);
        assert!(
            length.due(),
            "drafts have been paying: the next is verified at once"
        );
        length.record(5, 0, 1.0);
        assert!(!length.due(), "the rate fell below a fresh start's");
    }

    #[test]
    fn confirm_zero_verifies_every_draft_unless_paused() {
        let eager = SpecConfig {
            confirm: 0,
            ..uncosted(8)
        };
        let mut length = DraftLength::new(&eager);
        assert!(length.due());
        assert!(length.watch(&[1, 2, 3]));
        length.record(4, 0, 1.0);
        assert!(
            length.due(),
            "one bad step after a fair start keeps drafting"
        );
        length.record(1, 0, 1.0);
        assert!(!length.due(), "paused");
    }

    #[test]
    fn a_paused_lookup_is_not_due_until_the_pause_ends() {
        let mut length = DraftLength::new(&SpecConfig {
            confirm: 2,
            ..SpecConfig::lookup(8).unwrap()
        });
        let mut tokens = vec![1, 2, 3, 1];
        for next in [2, 3] {
            tokens.push(next);
            length.record_plain(0.1);
            assert!(
                !length.watch(&tokens),
                "the first plain tokens measure plain decoding"
            );
        }
        length.record_plain(0.1);
        tokens.push(1);
        assert!(
            length.watch(&tokens),
            "the lookup came true twice, and the pause ended"
        );
    }

    #[test]
    fn after_a_pause_a_draft_waits_for_its_lookup_to_come_true() {
        let mut length = DraftLength::new(&uncosted(8));
        length.record(4, 0, 1.0);
        length.record(1, 0, 1.0);
        let mut tokens = vec![1, 2, 3];
        while length.allowed() == 0 {
            tokens.push(100 + tokens.len() as u32);
            length.record_plain(0.0);
            length.watch(&tokens);
        }
        assert!(!length.due(), "the pause ended, but nothing has come true");
        tokens.push(1);
        assert!(!length.watch(&tokens), "1 foretells 2 3");
        tokens.extend([2, 3]);
        length.watch(&tokens[..tokens.len() - 1]);
        assert!(length.watch(&tokens), "2 and 3 came true");
    }

    #[test]
    fn draft_max_is_bounded() {
        assert!(SpecConfig::lookup(0).is_err());
        assert!(SpecConfig::lookup(MAX_DRAFT + 1).is_err());
        assert_eq!(SpecConfig::lookup(5).unwrap().draft_max, 5);
    }
}
