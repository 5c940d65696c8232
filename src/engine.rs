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
use crate::sample::{Sampler, SamplerConfig, StopChecker};
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
    #[error("the prompt is {prompt} tokens and {max_tokens} more are to be generated, but the context holds {context}")]
    ContextTooSmall {
        prompt: usize,
        max_tokens: u32,
        context: u32,
    },
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
}

/// Called with each piece of text as it becomes printable; return false to stop.
pub type OnText<'a> = dyn FnMut(&str) -> bool + 'a;

/// Called as prefill goes with (prompt tokens done, prompt tokens to do), counting only the
/// tokens the cache did not already hold.
pub type OnPrefill = dyn FnMut(usize, usize) + Send;

pub struct Engine {
    pub header: Header,
    pub cfg: ModelConfig,
    pub tokenizer: Tokenizer,
    pub template: ChatTemplate,
    pub stage: Stage,
    /// Tokens whose keys and values are in the cache, in order, for reuse across turns.
    cached: Vec<u32>,
    on_prefill: Option<Box<OnPrefill>>,
    /// Prompt chunks shorter than this are fed one token at a time (`per_token_prefill_below`).
    per_token_below: usize,
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
        let per_token_below = per_token_prefill_below(&stage.gpu);
        Ok(Engine {
            header,
            cfg,
            tokenizer,
            template,
            stage,
            per_token_below,
            cached: Vec::new(),
            on_prefill: None,
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

    /// The most tokens the cache holds: prompt and generated text together.
    pub fn context_length(&self) -> u32 {
        self.stage.spec.max_context
    }

    /// Whether a prompt of `prompt_tokens` and `max_tokens` more fit the context, checked
    /// before any work so a prompt too long is refused at once rather than after prefill.
    pub fn check_fits(&self, prompt_tokens: usize, max_tokens: u32) -> Result<(), EngineError> {
        let context = self.context_length();
        if prompt_tokens + max_tokens as usize > context as usize {
            return Err(EngineError::ContextTooSmall {
                prompt: prompt_tokens,
                max_tokens,
                context,
            });
        }
        Ok(())
    }

    /// Feeds prompt chunks shorter than `tokens` one token at a time instead of the built-in
    /// choice (for measuring the crossover: `runner bench --per-token-prefill-below`).
    pub fn set_per_token_prefill_below(&mut self, tokens: usize) {
        self.per_token_below = tokens;
    }

    /// Reports prefill progress to `on_prefill` from now on (the runner's progress bar).
    pub fn set_prefill_progress(&mut self, on_prefill: Box<OnPrefill>) {
        self.on_prefill = Some(on_prefill);
    }

    /// Tells `on_prefill` how far prefill is. Chunks are only submitted, so this waits for
    /// the GPU first: without the wait the count would run ahead of the work.
    fn report_prefill(&mut self, done: usize, total: usize) {
        if let Some(on_prefill) = self.on_prefill.as_mut() {
            if done > 0 && done < total {
                let _ = self.stage.gpu.device.poll(wgpu::PollType::Wait {
                    submission_index: None,
                    timeout: None,
                });
            }
            on_prefill(done, total);
        }
    }

    /// Feeds `ids` after whatever the cache already holds in common with them, and returns
    /// the logits of the last position.
    async fn prefill(&mut self, ids: &[u32]) -> Result<Vec<f32>, EngineError> {
        let common = common_prefix(&self.cached, ids).min(ids.len() - 1);
        self.cached.truncate(common);
        let max_batch = self.stage.spec.max_batch as usize;
        let mut logits = Vec::new();
        let total = ids.len() - common;
        self.report_prefill(0, total);
        for chunk in ids[common..].chunks(max_batch) {
            let start = self.cached.len() as u32;
            let is_last = self.cached.len() + chunk.len() == ids.len();
            if chunk.len() < self.per_token_below {
                logits = self.prefill_per_token(chunk, is_last).await?;
            } else if is_last {
                let rows = self
                    .stage
                    .forward_logits(&StageInput::Tokens(chunk), start, 1)
                    .await?;
                logits = rows.into_iter().next().unwrap_or_default();
            } else {
                self.stage.forward(&StageInput::Tokens(chunk), start)?;
            }
            self.cached.extend_from_slice(chunk);
            self.report_prefill(self.cached.len() - common, total);
        }
        Ok(logits)
    }

    /// Feeds `chunk` one token at a time through the decode path (matrix-vector kernels),
    /// returning the last position's logits when `want_logits`.
    async fn prefill_per_token(
        &mut self,
        chunk: &[u32],
        want_logits: bool,
    ) -> Result<Vec<f32>, EngineError> {
        let start = self.cached.len() as u32;
        let (last, rest) = chunk.split_last().expect("chunks are not empty");
        for (offset, id) in rest.iter().enumerate() {
            let input = StageInput::Tokens(std::slice::from_ref(id));
            self.stage.forward(&input, start + offset as u32)?;
        }
        let input = StageInput::Tokens(std::slice::from_ref(last));
        let position = start + rest.len() as u32;
        if !want_logits {
            self.stage.forward(&input, position)?;
            return Ok(Vec::new());
        }
        let rows = self.stage.forward_logits(&input, position, 1).await?;
        Ok(rows.into_iter().next().unwrap_or_default())
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

/// Below how many tokens a prompt chunk is cheaper fed token by token than as one batch.
/// On a CPU adapter (lavapipe) the tiled prefill kernels cost more than a decode step per
/// token for short chunks, measured in docs/perf.md ("Short prompts on lavapipe"), and a
/// process's first batch also compiles them; on a GPU one batch of any size costs about one
/// decode step, so only single tokens take the decode path (as they always do).
pub fn per_token_prefill_below(gpu: &Gpu) -> usize {
    if gpu.caps.cpu_work_split {
        PER_TOKEN_PREFILL_BELOW_ON_CPU
    } else {
        0
    }
}

/// The measured crossover on lavapipe (docs/perf.md).
const PER_TOKEN_PREFILL_BELOW_ON_CPU: usize = 28;

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
