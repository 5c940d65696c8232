//! The text side every generator shares: prompts into ids (tokenizer, chat template), and per
//! request the sampler and the stop rules that turn sampled ids back into streamed text.

use std::ops::ControlFlow;

use crate::gguf::Header;
use crate::sample::lookup::lookup_draft;
use crate::sample::{Sampler, SamplerConfig, SpecConfig, StopChecker};
use crate::tokenizer::{ChatMessage, ChatTemplate, Tokenizer, TokenizerError};

use super::request::{
    FinishReason, GenerateOptions, Generated, OnEvent, Prompt, RequestError, Timings, TokenEvent,
};

/// A model's tokenizer and chat template, built from its metadata alone.
pub struct TextFront {
    pub tokenizer: Tokenizer,
    pub template: ChatTemplate,
}

impl TextFront {
    pub fn from_header(header: &Header) -> Result<TextFront, TokenizerError> {
        let tokenizer = Tokenizer::from_metadata(&header.metadata)?;
        let template = ChatTemplate::new(&tokenizer)?;
        Ok(TextFront {
            tokenizer,
            template,
        })
    }

    /// Tokenizes as the goldens' generate records are: BOS as the file says, special-token
    /// text parsed into special tokens.
    pub fn tokenize_prompt(&self, text: &str) -> Vec<u32> {
        self.tokenizer.encode(text, true, true)
    }

    /// The prompt text for a chat, rendered with the model's template.
    pub fn chat_prompt(&self, messages: &[ChatMessage]) -> Result<String, TokenizerError> {
        self.template.render_prompt(messages, true)
    }

    /// The ids of `prompt`, checked against a vocabulary of `vocab` ids.
    pub fn prompt_ids(&self, prompt: &Prompt, vocab: u32) -> Result<Vec<u32>, RequestError> {
        let ids = match prompt {
            Prompt::Text(text) => self.tokenize_prompt(text),
            Prompt::Ids(ids) => ids.clone(),
            Prompt::Chat(messages) => self.tokenize_prompt(&self.chat_prompt(messages)?),
            Prompt::ToolChat { messages, tools } => {
                let text = self
                    .template
                    .render_prompt_with_tools(messages, tools, true)?;
                self.tokenize_prompt(&text)
            }
        };
        if ids.is_empty() {
            return Err(RequestError::EmptyPrompt);
        }
        check_ids(&ids, vocab)?;
        Ok(ids)
    }
}

/// Every id below `vocab`.
pub fn check_ids(ids: &[u32], vocab: u32) -> Result<(), RequestError> {
    match ids.iter().find(|&&id| id >= vocab) {
        Some(&id) => Err(RequestError::BadToken { id, vocab }),
        None => Ok(()),
    }
}

/// One request's decoding: its sampler, its stop rules, and the tokens so far. Generators
/// sample (or take an argmax) and hand each token to `accept`, which streams it and says
/// when the request is over.
pub struct Decoding {
    request: usize,
    sampler: Sampler,
    stops: StopChecker,
    max_tokens: u32,
    prompt_len: usize,
    /// The prompt, then the accepted completion.
    tokens: Vec<u32>,
    text: String,
    finish: Option<FinishReason>,
}

impl Decoding {
    pub fn new(request: usize, prompt_ids: Vec<u32>, options: &GenerateOptions) -> Decoding {
        Decoding {
            request,
            sampler: Sampler::new(options.sampler.clone()),
            stops: StopChecker::new(options.stop.clone()),
            max_tokens: options.max_tokens,
            prompt_len: prompt_ids.len(),
            tokens: prompt_ids,
            text: String::new(),
            finish: None,
        }
    }

    pub fn request(&self) -> usize {
        self.request
    }

    /// The prompt and the completion so far: the history the sampler penalises, and what
    /// the model has to have seen before the next token.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    pub fn completion_len(&self) -> u32 {
        (self.tokens.len() - self.prompt_len) as u32
    }

    /// Completion tokens still allowed before `max_tokens`.
    pub fn remaining(&self) -> u32 {
        self.max_tokens.saturating_sub(self.completion_len())
    }

    /// A prompt-lookup draft to verify after the last token, which is fed at `position` of a
    /// cache of `context` positions: at most `allowed` tokens, and no more than the context
    /// and the request can still use (the step emits one token past the draft).
    pub fn draft(
        &self,
        config: &SpecConfig,
        allowed: u32,
        position: u32,
        context: u32,
    ) -> Vec<u32> {
        let context_room = context.saturating_sub(position + 1);
        let output_room = self.remaining().saturating_sub(1);
        let longest = allowed.min(context_room).min(output_room);
        lookup_draft(&self.tokens, config.ngram_max, longest as usize)
    }

    pub fn sampler(&self) -> &SamplerConfig {
        self.sampler.config()
    }

    /// Why the request ended, once it has; a request with `max_tokens` 0 ends before any.
    pub fn finished(&self) -> Option<FinishReason> {
        self.finish
            .or((self.max_tokens == 0).then_some(FinishReason::Length))
    }

    /// The next token from the last position's logits.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        self.sampler
            .sample_completion(logits, &self.tokens, self.prompt_len)
    }

    /// The next token from the best logits only (see `Sampler::sample_among`).
    pub fn sample_among(&mut self, ids: &[u32], values: &[f32]) -> u32 {
        self.sampler.sample_among(ids, values)
    }

    /// Takes token `id`: applies the stop rules, streams it through `on_event`, and returns
    /// why the request ends with it, if it does.
    pub fn accept(
        &mut self,
        text: &TextFront,
        id: u32,
        on_event: &mut OnEvent<'_>,
    ) -> Option<FinishReason> {
        let step = self.stops.push_token(&text.tokenizer, id);
        let index = self.completion_len();
        let stopped = step.stop.is_some();
        if !(stopped && text.tokenizer.is_eog(id)) {
            self.tokens.push(id);
        }
        let finish = match stopped {
            true => Some(FinishReason::Stop),
            false if self.completion_len() >= self.max_tokens => Some(FinishReason::Length),
            false => None,
        };
        let mut piece = step.text;
        if finish.is_some() {
            piece.push_str(&self.stops.flush());
        }
        self.text.push_str(&piece);
        let flow = on_event(TokenEvent {
            request: self.request,
            index,
            id,
            text: &piece,
        });
        self.finish = match (finish, flow) {
            (None, ControlFlow::Break(())) => Some(FinishReason::Cancelled),
            _ => finish,
        };
        self.finish
    }

    /// Ends the request after the token just accepted (a constraint that is complete).
    pub fn stop(&mut self) {
        self.finish.get_or_insert(FinishReason::Stop);
    }

    /// The result, with `cached_tokens` of the prompt reused and the request's timings.
    pub fn into_generated(mut self, cached_tokens: u32, timings: Timings) -> Generated {
        self.text.push_str(&self.stops.flush());
        let finish_reason = self.finished().unwrap_or_default();
        let ids = self.tokens.split_off(self.prompt_len);
        Generated {
            prompt_ids: self.tokens,
            ids,
            text: self.text,
            finish_reason,
            cached_tokens,
            timings,
            logprobs: None,
        }
    }
}
