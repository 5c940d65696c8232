//! What a caller asks for and what it gets back, the same for every way of generating: a
//! prompt and options in, a token event per token while it runs, one result per request.

use std::ops::ControlFlow;

use serde::Serialize;

use crate::sample::{ConstraintSpec, SamplerConfig, SpecConfig};
use crate::tokenizer::{ChatMessage, TokenizerError};

/// What to continue.
#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    /// Text tokenized as `runner generate` does: BOS as the file says, special-token text
    /// (e.g. `<|im_start|>`) parsed into special tokens.
    Text(String),
    /// Token ids, taken as they are.
    Ids(Vec<u32>),
    /// A conversation, rendered with the model's chat template and a generation prompt.
    Chat(Vec<ChatMessage>),
    /// A conversation with tool definitions (OpenAI's `tools` entries), which the template
    /// shows the model (see `ChatTemplate::tool_support`).
    ToolChat {
        messages: Vec<ChatMessage>,
        tools: Vec<serde_json::Value>,
    },
}

/// What to generate and when to stop.
#[derive(Debug, Clone, Default)]
pub struct GenerateOptions {
    /// Most completion tokens (the end-of-generation token that stops it is not counted).
    pub max_tokens: u32,
    /// Temperature, top-k/top-p/min-p, repetition penalty and the seed of the draws.
    pub sampler: SamplerConfig,
    /// Generation stops when the text contains one of these; it is not part of the text.
    pub stop: Vec<String>,
    /// What the output must be (JSON, a JSON Schema, a regex, a Lark grammar); `None` is
    /// free text. The API maps `response_format` and forced tool calls onto it.
    pub constraint: Option<ConstraintSpec>,
    /// `Some(n)`: each completion token's log-probability and the `n` most likely tokens at
    /// its position (`Generated::logprobs`). A generator that cannot give them refuses the
    /// request (`RequestError::Unsupported`).
    pub logprobs: Option<u32>,
    /// Speculative decoding with prompt-lookup drafts (`None`: plain decoding). It changes
    /// the speed, never the output, so a generator that cannot draft (the fleet) decodes
    /// plainly; constrained requests always do.
    pub speculation: Option<SpecConfig>,
}

/// A completion token's log-probability under the model (its logits before any penalty,
/// temperature or constraint) and the most likely tokens at its position, best first.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct TokenLogprobs {
    pub id: u32,
    pub logprob: f32,
    /// (id, log-probability), best first.
    pub top: Vec<(u32, f32)>,
}

/// One generation to run.
#[derive(Debug, Clone)]
pub struct GenerateRequest {
    pub prompt: Prompt,
    pub options: GenerateOptions,
}

impl GenerateRequest {
    pub fn new(prompt: Prompt, options: GenerateOptions) -> GenerateRequest {
        GenerateRequest { prompt, options }
    }
}

/// A token as it is generated, for streaming.
#[derive(Clone, Copy, Debug)]
pub struct TokenEvent<'a> {
    /// Index of the request in the slice given to `Generator::generate`.
    pub request: usize,
    /// Index of the token in the completion.
    pub index: u32,
    pub id: u32,
    /// Text that became printable with this token (on the last token, everything still
    /// held back, so the pieces add up to the result's text).
    pub text: &'a str,
}

/// Called with every token; `ControlFlow::Break` cancels that request after this token.
pub type OnEvent<'a> = dyn FnMut(TokenEvent<'_>) -> ControlFlow<()> + 'a;

/// Why a generation ended.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FinishReason {
    /// An end-of-generation token, a stop string, or a complete constrained output.
    Stop,
    /// `max_tokens` reached.
    #[default]
    Length,
    /// The consumer broke off (`ControlFlow::Break` from the event callback).
    Cancelled,
}

/// Where a generation's time went.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct Timings {
    /// From the start of the request to its first token's logits (prompt processing).
    pub prefill_seconds: f64,
    /// From then to the last token.
    pub decode_seconds: f64,
    /// CPU seconds spent computing constraint masks, overlapped with the GPU's steps.
    pub mask_seconds: f64,
    /// Speculative decoding: draft tokens verified, and how many of them were kept.
    pub drafted: u32,
    pub accepted: u32,
    /// Speculative decoding: verification steps and their wall time (host recording, GPU and
    /// read-back), and how often the pipelined decoder was started between them: where a
    /// speculative run's time goes beside its plain tokens.
    pub verifications: u32,
    pub verify_seconds: f64,
    pub decoder_starts: u32,
}

impl Timings {
    /// Adds `other`'s times and counts to these (totals over several requests). The pattern
    /// names every field, so a new one does not compile until it is added up too.
    pub fn add(&mut self, other: &Timings) {
        let Timings {
            prefill_seconds,
            decode_seconds,
            mask_seconds,
            drafted,
            accepted,
            verifications,
            verify_seconds,
            decoder_starts,
        } = *other;
        self.prefill_seconds += prefill_seconds;
        self.decode_seconds += decode_seconds;
        self.mask_seconds += mask_seconds;
        self.drafted += drafted;
        self.accepted += accepted;
        self.verifications += verifications;
        self.verify_seconds += verify_seconds;
        self.decoder_starts += decoder_starts;
    }
}

/// Token counts, as an OpenAI-style `usage` reports them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Usage {
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
    /// Prompt tokens whose keys and values were reused from the cache, not computed.
    pub cached_tokens: u32,
}

/// One request's result.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Generated {
    pub prompt_ids: Vec<u32>,
    /// The completion; without the end-of-generation token that stopped it.
    pub ids: Vec<u32>,
    pub text: String,
    pub finish_reason: FinishReason,
    /// Leading prompt tokens already in the cache (prefix reuse).
    pub cached_tokens: u32,
    pub timings: Timings,
    /// One entry per completion token when the options asked for them.
    pub logprobs: Option<Vec<TokenLogprobs>>,
}

impl Generated {
    pub fn usage(&self) -> Usage {
        Usage {
            prompt_tokens: self.prompt_ids.len() as u32,
            completion_tokens: self.ids.len() as u32,
            cached_tokens: self.cached_tokens,
        }
    }

    /// Prompt tokens that went through the model.
    pub fn prefill_tokens(&self) -> u32 {
        (self.prompt_ids.len() as u32).saturating_sub(self.cached_tokens)
    }
}

/// A request no generator can run: the caller's mistake (an HTTP 400), found before any
/// work is done.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error("token id {id} is outside the vocabulary of {vocab}")]
    BadToken { id: u32, vocab: u32 },
    #[error("prompt and generation need {needed} positions, the context holds {max}")]
    ContextLength { needed: u64, max: u32 },
    #[error(transparent)]
    Template(#[from] TokenizerError),
    #[error("{0} is not supported here")]
    Unsupported(&'static str),
}
