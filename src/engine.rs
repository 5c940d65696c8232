//! The single-device engine: tokenizer, chat template, one stage holding the whole model, and
//! the generation loop. The runner, the browser page and the shard coordinator's local fallback
//! all drive it.

use std::sync::Arc;

use crate::gguf::{read_header, Header, RangeSource};
use crate::gpu::Gpu;
use crate::model::decode::DEFAULT_DEPTH;
use crate::model::{
    self, LoadOptions, LoadProgress, ModelConfig, ModelError, Stage, StageInput, StageSpec,
};
use crate::sample::{Sampler, SamplerConfig, StopChecker, StopReason};
use crate::tokenizer::{ChatMessage, ChatTemplate, Tokenizer, TokenizerError};

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    #[error(transparent)]
    Gguf(#[from] crate::gguf::GgufError),
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error("token id {id} is outside the vocabulary of {vocab}")]
    BadToken { id: u32, vocab: u32 },
}

/// How to load a model.
#[derive(Debug, Clone)]
pub struct EngineOptions {
    pub max_context: u32,
    pub load: LoadOptions,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            max_context: 4096,
            load: LoadOptions::default(),
        }
    }
}

/// What to generate and when to stop.
#[derive(Debug, Clone, Default)]
pub struct GenerateOptions {
    pub max_tokens: u32,
    pub sampler: SamplerConfig,
    pub stop: Vec<String>,
}

/// The result of a generation, with its timings.
#[derive(Debug, Clone, Default)]
pub struct Generated {
    pub prompt_ids: Vec<u32>,
    pub ids: Vec<u32>,
    pub text: String,
    pub prefill_tokens: u32,
    pub prefill_seconds: f64,
    pub decode_seconds: f64,
    /// Why generation ended early: `None` when it ran to `max_tokens` or `on_text` stopped it.
    pub stop: Option<StopReason>,
}

/// Called with each piece of text as it becomes printable; return false to stop.
pub type OnText<'a> = dyn FnMut(&str) -> bool + 'a;

pub struct Engine {
    pub header: Header,
    pub cfg: ModelConfig,
    pub tokenizer: Tokenizer,
    pub template: ChatTemplate,
    pub stage: Stage,
    /// Tokens whose keys and values are in the cache, in order, for reuse across turns.
    cached: Vec<u32>,
}

impl Engine {
    pub async fn load(
        gpu: Arc<Gpu>,
        source: &dyn RangeSource,
        options: &EngineOptions,
        progress: &mut dyn FnMut(LoadProgress<'_>),
    ) -> Result<Engine, EngineError> {
        let header = read_header(source).await?;
        let cfg = model::config_for(&header)?;
        let tokenizer = Tokenizer::from_metadata(&header.metadata)?;
        let template = ChatTemplate::new(&tokenizer)?;
        let spec = StageSpec::whole(&cfg, options.max_context, &gpu);
        let stage = Stage::load(gpu, source, &header, spec, options.load, progress).await?;
        Ok(Engine {
            header,
            cfg,
            tokenizer,
            template,
            stage,
            cached: Vec::new(),
        })
    }

    /// Tokenizes as the goldens' generate records are: BOS as the file says, special-token
    /// text parsed into special tokens.
    pub fn tokenize_prompt(&self, text: &str) -> Vec<u32> {
        self.tokenizer.encode(text, true, true)
    }

    /// The prompt text for a chat, rendered with the model's template.
    pub fn chat_prompt(&self, messages: &[ChatMessage]) -> Result<String, EngineError> {
        Ok(self.template.render_prompt(messages, true)?)
    }

    /// Feeds `ids` after whatever the cache already holds in common with them, and returns
    /// the logits of the last position.
    async fn prefill(&mut self, ids: &[u32]) -> Result<Vec<f32>, EngineError> {
        let common = common_prefix(&self.cached, ids).min(ids.len() - 1);
        self.cached.truncate(common);
        let max_batch = self.stage.spec.max_batch as usize;
        let mut logits = Vec::new();
        for chunk in ids[common..].chunks(max_batch) {
            let start = self.cached.len() as u32;
            let is_last = self.cached.len() + chunk.len() == ids.len();
            if is_last {
                let rows = self
                    .stage
                    .forward_logits(&StageInput::Tokens(chunk), start, 1)
                    .await?;
                logits = rows.into_iter().next().unwrap_or_default();
            } else {
                self.stage.forward(&StageInput::Tokens(chunk), start)?;
            }
            self.cached.extend_from_slice(chunk);
        }
        Ok(logits)
    }

    /// Generates after `prompt_ids`, calling `on_text` with printable text as it comes.
    pub async fn generate(
        &mut self,
        prompt_ids: &[u32],
        options: &GenerateOptions,
        on_text: &mut OnText<'_>,
    ) -> Result<Generated, EngineError> {
        if prompt_ids.is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        self.check_ids(prompt_ids)?;
        let mut sampler = Sampler::new(options.sampler.clone());
        let mut stops = StopChecker::new(options.stop.clone());
        let mut out = Generated {
            prompt_ids: prompt_ids.to_vec(),
            ..Default::default()
        };
        let started = now_seconds();
        let reused = common_prefix(&self.cached, prompt_ids).min(prompt_ids.len() - 1);
        let mut logits = Some(self.prefill(prompt_ids).await?);
        out.prefill_tokens = (prompt_ids.len() - reused) as u32;
        out.prefill_seconds = now_seconds() - started;
        let decode_started = now_seconds();
        let mut history = prompt_ids.to_vec();
        let config = sampler.config();
        // Plain argmax runs on the GPU, fed back without a host round trip per token.
        let on_gpu = config.is_greedy() && config.repeat_penalty == 1.0;
        let mut decoder = None;
        while (out.ids.len() as u32) < options.max_tokens {
            let next = match logits.take() {
                Some(l) => sampler.sample(&l, &history),
                None if on_gpu => {
                    let last = *history.last().expect("history holds the prompt");
                    if decoder.is_none() {
                        let position = self.cached.len() as u32;
                        decoder = Some(self.stage.greedy_decoder(last, position, DEFAULT_DEPTH)?);
                    }
                    let next = decoder
                        .as_mut()
                        .expect("decoder was just made")
                        .next()
                        .await?;
                    self.cached.push(last);
                    next
                }
                None => {
                    decode_sampled(&self.stage, &mut self.cached, &mut sampler, &history).await?
                }
            };
            let step = stops.push_token(&self.tokenizer, next);
            out.text.push_str(&step.text);
            if step.stop.is_some() {
                out.stop = step.stop;
                if !self.tokenizer.is_eog(next) {
                    out.ids.push(next);
                }
                on_text(&step.text);
                break;
            }
            out.ids.push(next);
            history.push(next);
            if !on_text(&step.text) {
                break;
            }
        }
        let tail = stops.flush();
        out.text.push_str(&tail);
        on_text(&tail);
        out.decode_seconds = now_seconds() - decode_started;
        Ok(out)
    }

    /// Teacher-forced logits after every prefix `ids[..=i]`, starting from an empty cache.
    pub async fn score(&mut self, ids: &[u32]) -> Result<Vec<Vec<f32>>, EngineError> {
        self.check_ids(ids)?;
        self.cached.clear();
        let mut all = Vec::with_capacity(ids.len());
        let max_batch = self.stage.spec.max_batch as usize;
        for (index, chunk) in ids.chunks(max_batch).enumerate() {
            let start = (index * max_batch) as u32;
            let input = StageInput::Tokens(chunk);
            all.extend(
                self.stage
                    .forward_logits(&input, start, chunk.len() as u32)
                    .await?,
            );
            self.cached.extend_from_slice(chunk);
        }
        Ok(all)
    }

    /// Evaluates `ids` from an empty cache and returns the last position's logits (the
    /// prompt-processing path on its own).
    pub async fn evaluate(&mut self, ids: &[u32]) -> Result<Vec<f32>, EngineError> {
        if ids.is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        self.check_ids(ids)?;
        self.cached.clear();
        self.prefill(ids).await
    }

    /// How many tokens' keys and values the cache holds.
    pub fn cached_len(&self) -> usize {
        self.cached.len()
    }

    /// Forgets the cached conversation.
    pub fn reset(&mut self) {
        self.cached.clear();
    }

    fn check_ids(&self, ids: &[u32]) -> Result<(), EngineError> {
        match ids.iter().find(|&&id| id >= self.cfg.vocab) {
            Some(&id) => Err(EngineError::BadToken {
                id,
                vocab: self.cfg.vocab,
            }),
            None => Ok(()),
        }
    }
}

/// One sampled decode step after `history`, whose last token is not in the cache yet.
async fn decode_sampled(
    stage: &Stage,
    cached: &mut Vec<u32>,
    sampler: &mut Sampler,
    history: &[u32],
) -> Result<u32, EngineError> {
    let last = *history.last().expect("history holds the prompt");
    let input = StageInput::Tokens(std::slice::from_ref(&last));
    let logits = stage.forward_logits(&input, cached.len() as u32, 1).await?;
    cached.push(last);
    Ok(sampler.sample(&logits[0], history))
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// Seconds on a monotonic clock (web-time's `Instant` works natively and in browsers).
fn now_seconds() -> f64 {
    use std::sync::OnceLock;
    static START: OnceLock<web_time::Instant> = OnceLock::new();
    START
        .get_or_init(web_time::Instant::now)
        .elapsed()
        .as_secs_f64()
}
