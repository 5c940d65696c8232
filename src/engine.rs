//! The single-device engine: the text front, one stage holding the whole model, and the
//! generation loop. It is one `Generator` (the front door); the runner, the browser page and
//! the shard tests drive it through that.

use std::sync::Arc;

use crate::front::{
    check_ids, Decoding, GenerateRequest, Generated, Generator, OnEvent, RequestError, TextFront,
    Timings,
};
use crate::gguf::RangeSource;
use crate::gpu::Gpu;
use crate::model::decode::DEFAULT_DEPTH;
use crate::model::{
    LoadOptions, LoadProgress, ModelError, OpenModel, Stage, StageInput, StageSpec,
};
use crate::tokenizer::TokenizerError;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    #[error(transparent)]
    Gguf(#[from] crate::gguf::GgufError),
    #[error(transparent)]
    Request(#[from] RequestError),
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

pub struct Engine {
    /// Header and configuration, read once.
    pub model: OpenModel,
    pub text: TextFront,
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
        let model = OpenModel::read(source).await?;
        let text = TextFront::from_header(&model.header)?;
        let spec = StageSpec::whole(&model.cfg, options.max_context, &gpu);
        let stage = Stage::load(gpu, source, &model, spec, options.load, progress).await?;
        Ok(Engine {
            model,
            text,
            stage,
            cached: Vec::new(),
        })
    }

    /// The text front's tokenization of a prompt (see `TextFront::tokenize_prompt`).
    pub fn tokenize_prompt(&self, text: &str) -> Vec<u32> {
        self.text.tokenize_prompt(text)
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

    /// Generates one request after its (checked, non-empty) prompt, reusing the cached prefix.
    async fn run(
        &mut self,
        mut decoding: Decoding,
        on_event: &mut OnEvent<'_>,
    ) -> Result<Generated, EngineError> {
        let started = now_seconds();
        let prompt_len = decoding.tokens().len();
        let reused = common_prefix(&self.cached, decoding.tokens()).min(prompt_len - 1);
        let mut logits = Some(self.prefill(decoding.tokens()).await?);
        let decode_started = now_seconds();
        // Plain argmax runs on the GPU, fed back without a host round trip per token.
        let on_gpu = decoding.sampler().argmax_suffices();
        let mut decoder = None;
        while decoding.finished().is_none() {
            let next = match logits.take() {
                Some(l) => decoding.sample(&l),
                None if on_gpu => {
                    let last = *decoding.tokens().last().expect("tokens hold the prompt");
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
                None => decode_sampled(&self.stage, &mut self.cached, &mut decoding).await?,
            };
            decoding.accept(&self.text, next, on_event);
        }
        let timings = Timings {
            prefill_seconds: decode_started - started,
            decode_seconds: now_seconds() - decode_started,
        };
        Ok(decoding.into_generated(reused as u32, timings))
    }

    /// Teacher-forced logits after every prefix `ids[..=i]`, starting from an empty cache.
    pub async fn score(&mut self, ids: &[u32]) -> Result<Vec<Vec<f32>>, EngineError> {
        check_ids(ids, self.model.cfg.vocab)?;
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
            return Err(RequestError::EmptyPrompt.into());
        }
        check_ids(ids, self.model.cfg.vocab)?;
        self.cached.clear();
        self.prefill(ids).await
    }

    /// How many tokens' keys and values the cache holds (the API's KV-usage gauge).
    pub fn cached_len(&self) -> usize {
        self.cached.len()
    }

    /// Forgets the cached conversation.
    pub fn reset(&mut self) {
        self.cached.clear();
    }
}

#[async_trait::async_trait(?Send)]
impl Generator for Engine {
    type Error = EngineError;

    fn text(&self) -> &TextFront {
        &self.text
    }

    fn vocab(&self) -> u32 {
        self.model.cfg.vocab
    }

    fn max_context(&self) -> u32 {
        self.stage.spec.max_context
    }

    /// One request after another, each reusing what the cache holds of its prompt (the
    /// conversation so far, for chat turns).
    async fn generate(
        &mut self,
        requests: &[GenerateRequest],
        on_event: &mut OnEvent<'_>,
    ) -> Result<Vec<Generated>, EngineError> {
        let mut decodings = Vec::with_capacity(requests.len());
        for (index, request) in requests.iter().enumerate() {
            let prompt_ids = self.prompt_ids(&request.prompt)?;
            decodings.push(Decoding::new(index, prompt_ids, &request.options));
        }
        let mut results = Vec::with_capacity(requests.len());
        for decoding in decodings {
            results.push(self.run(decoding, on_event).await?);
        }
        Ok(results)
    }
}

/// One sampled decode step after the decoding's tokens, whose last is not in the cache yet.
async fn decode_sampled(
    stage: &Stage,
    cached: &mut Vec<u32>,
    decoding: &mut Decoding,
) -> Result<u32, EngineError> {
    let last = *decoding.tokens().last().expect("tokens hold the prompt");
    let input = StageInput::Tokens(std::slice::from_ref(&last));
    let logits = stage.forward_logits(&input, cached.len() as u32, 1).await?;
    cached.push(last);
    Ok(decoding.sample(&logits[0]))
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
