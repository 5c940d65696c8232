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
use crate::model::decode::{DEFAULT_DEPTH, MAX_DEPTH};
use crate::model::{
    self, LoadOptions, LoadProgress, ModelError, OpenModel, Stage, StageInput, StageSpec,
};
use crate::ops::select;
use crate::sample::{
    Constraint, ConstraintError, ConstraintSpec, MaskAhead, Masked, SpecConfig, TokenMask,
    TokenView,
};
use crate::tokenizer::TokenizerError;

mod spec;

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
    #[error("the prompt is {prompt} tokens and {max_tokens} more are to be generated, but the context holds {context}")]
    ContextTooSmall {
        prompt: usize,
        max_tokens: u32,
        context: u32,
    },
    #[error(transparent)]
    DoesNotFit(#[from] model::fit::FitError),
    #[error(transparent)]
    Constraint(#[from] ConstraintError),
}

/// How to load a model.
#[derive(Debug, Clone)]
pub struct EngineOptions {
    pub max_context: u32,
    pub load: LoadOptions,
    /// GPU memory the model may use (`--gpu-mem-mib`), checked before any weights are read.
    pub gpu_budget_bytes: Option<u64>,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            max_context: 4096,
            load: LoadOptions::default(),
            gpu_budget_bytes: None,
        }
    }
}

/// Called as prefill goes with (prompt tokens done, prompt tokens to do), counting only the
/// tokens the cache did not already hold.
pub type OnPrefill = dyn FnMut(usize, usize) + Send;

pub struct Engine {
    /// Header and configuration, read once.
    pub model: OpenModel,
    pub text: TextFront,
    pub stage: Stage,
    /// Tokens whose keys and values are in the cache, in order, for reuse across turns.
    cached: Vec<u32>,
    on_prefill: Option<Box<OnPrefill>>,
    /// Prompt chunks shorter than this are fed one token at a time (`per_token_prefill_below`).
    per_token_below: usize,
    /// Greedy decoding's steps in flight (`set_decode_depth`).
    decode_depth: usize,
    /// The vocabulary as constraints see it, built on first use.
    token_view: Option<TokenView>,
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
        model::fit::check(
            &model.header,
            &model.cfg,
            &spec,
            &gpu.caps,
            options.gpu_budget_bytes,
        )?;
        let stage = Stage::load(gpu, source, &model, spec, options.load, progress).await?;
        let per_token_below = per_token_prefill_below(&stage.gpu);
        Ok(Engine {
            model,
            text,
            stage,
            per_token_below,
            decode_depth: DEFAULT_DEPTH,
            cached: Vec::new(),
            on_prefill: None,
            token_view: None,
        })
    }

    /// The text front's tokenization of a prompt (see `TextFront::tokenize_prompt`).
    pub fn tokenize_prompt(&self, text: &str) -> Vec<u32> {
        self.text.tokenize_prompt(text)
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

    /// Keeps `depth` greedy decoding steps in flight (1..=`MAX_DEPTH`, clamped) instead of
    /// `DEFAULT_DEPTH`: for measuring where a step's read-back comes late (a browser's
    /// `mapAsync`), `runner bench --decode-depth` and the page's `decodeDepth`.
    pub fn set_decode_depth(&mut self, depth: usize) {
        self.decode_depth = depth.clamp(1, MAX_DEPTH);
    }

    /// Greedy decoding's steps in flight (`set_decode_depth`).
    pub fn decode_depth(&self) -> usize {
        self.decode_depth
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
        self.prefill_then(ids, true).await
    }

    /// `prefill`, the last position's logits read back when `read`, else left on the device
    /// for a masked pick (and an empty vector returned).
    async fn prefill_then(&mut self, ids: &[u32], read: bool) -> Result<Vec<f32>, EngineError> {
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
                logits = self.prefill_per_token(chunk, is_last, read).await?;
            } else if is_last {
                logits = self
                    .last_logits(&StageInput::Tokens(chunk), start, read)
                    .await?;
            } else {
                self.stage.forward(&StageInput::Tokens(chunk), start)?;
            }
            self.cached.extend_from_slice(chunk);
            self.report_prefill(self.cached.len() - common, total);
        }
        Ok(logits)
    }

    /// Feeds `chunk` one token at a time through the decode path (matrix-vector kernels),
    /// with the last position's logits when `want_logits` (read back when `read`).
    async fn prefill_per_token(
        &mut self,
        chunk: &[u32],
        want_logits: bool,
        read: bool,
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
        self.last_logits(&input, position, read).await
    }

    /// The logits after `input`'s last token: read back, or (`read` false) left on the device
    /// for `Stage::masked_argmax` / `masked_top_k`, returning an empty vector.
    async fn last_logits(
        &self,
        input: &StageInput<'_>,
        position: u32,
        read: bool,
    ) -> Result<Vec<f32>, EngineError> {
        if !read {
            self.stage.submit_logits(input, position)?;
            return Ok(Vec::new());
        }
        let rows = self.stage.forward_logits(input, position, 1).await?;
        Ok(rows.into_iter().next().unwrap_or_default())
    }

    /// Generates one request after its (checked, non-empty) prompt, reusing the cached prefix.
    async fn run(
        &mut self,
        mut decoding: Decoding,
        speculation: Option<SpecConfig>,
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
        let mut drafting = Timings::default();
        if let Some(config) = speculation {
            if let Some(first) = logits.take().filter(|_| decoding.finished().is_none()) {
                let next = decoding.sample(&first);
                decoding.accept(&self.text, next, on_event);
            }
            drafting = self.speculate(&mut decoding, config, on_event).await?;
        }
        while decoding.finished().is_none() {
            let next = match logits.take() {
                Some(l) => decoding.sample(&l),
                None if on_gpu => {
                    let last = *decoding.tokens().last().expect("tokens hold the prompt");
                    if decoder.is_none() {
                        let position = self.cached.len() as u32;
                        decoder = Some(self.stage.greedy_decoder(
                            last,
                            position,
                            self.decode_depth,
                        )?);
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
            ..drafting
        };
        Ok(decoding.into_generated(reused as u32, timings))
    }

    /// The vocabulary as constraints see it (built once per engine: it walks the vocabulary).
    pub fn token_view(&mut self) -> Result<TokenView, EngineError> {
        if self.token_view.is_none() {
            self.token_view = Some(TokenView::new(&self.text.tokenizer)?);
        }
        Ok(self.token_view.clone().expect("just built"))
    }

    /// `run` under a constraint: every step picks from logits masked to the allowed tokens.
    /// The next mask is computed on the CPU while the GPU computes the step; then it goes to
    /// the GPU, which masks the logits and takes the argmax (greedy) or the top k (sampling
    /// with top-k on), so only those come back. Penalties or top-k off need every logit: those
    /// read the logits back and mask them on the CPU. The request ends when the constraint is
    /// complete.
    async fn run_constrained(
        &mut self,
        mut decoding: Decoding,
        spec: &ConstraintSpec,
        on_event: &mut OnEvent<'_>,
    ) -> Result<Generated, EngineError> {
        let constraint = Constraint::new(&self.token_view()?, spec)?;
        let started = now_seconds();
        let prompt_len = decoding.tokens().len();
        let reused = common_prefix(&self.cached, decoding.tokens()).min(prompt_len - 1);
        let ahead = MaskAhead::start(constraint);
        let prompt = decoding.tokens().to_vec();
        let on_gpu = decoding.sampler().candidates_needed(
            select::MAX_TOP_K.min(self.model.cfg.vocab.saturating_sub(1)) as usize,
        );
        let read = on_gpu.is_none();
        let (logits, masked) = futures::join!(self.prefill_then(&prompt, read), ahead.finish());
        let (mut logits, mut masked) = (logits?, masked?);
        if !read {
            // The prompt's last chunk was only submitted: its time is prefill's, not decode's.
            let _ = self.stage.gpu.device.poll(wgpu::PollType::Wait {
                submission_index: None,
                timeout: None,
            });
        }
        let decode_started = now_seconds();
        let mut mask_seconds = 0.0;
        while decoding.finished().is_none() {
            mask_seconds += masked.seconds;
            let mask = masked.mask?;
            let next = match on_gpu {
                Some(k) => self.pick_masked(&mut decoding, &mask, k as u32).await?,
                None => {
                    mask.apply(&mut logits);
                    decoding.sample(&logits)
                }
            };
            let mut constraint = masked.constraint;
            constraint.commit(next)?;
            if decoding.accept(&self.text, next, on_event).is_some() {
                break;
            }
            if constraint.is_complete() {
                decoding.stop();
                break;
            }
            (logits, masked) = self.decode_with_mask(next, constraint, read).await?;
        }
        let timings = Timings {
            prefill_seconds: decode_started - started,
            decode_seconds: now_seconds() - decode_started,
            mask_seconds,
            ..Timings::default()
        };
        Ok(decoding.into_generated(reused as u32, timings))
    }

    /// The token the GPU picks among `mask`'s ids from the logits it holds: the argmax, or a
    /// draw from the best `k`.
    async fn pick_masked(
        &self,
        decoding: &mut Decoding,
        mask: &TokenMask,
        k: u32,
    ) -> Result<u32, EngineError> {
        let words = mask.words(self.model.cfg.vocab as usize);
        if k == 1 {
            return Ok(self.stage.masked_argmax(&words).await?);
        }
        let (ids, values) = self.stage.masked_top_k(&words, k).await?;
        Ok(decoding.sample_among(&ids, &values))
    }

    /// One decode step of `last` on the GPU, joined with the next mask on the CPU; its logits
    /// read back when `read`, else left on the device (an empty vector).
    async fn decode_with_mask(
        &mut self,
        last: u32,
        constraint: Constraint,
        read: bool,
    ) -> Result<(Vec<f32>, Masked), EngineError> {
        let ahead = MaskAhead::start(constraint);
        let input = StageInput::Tokens(std::slice::from_ref(&last));
        let position = self.cached.len() as u32;
        let (logits, masked) =
            futures::join!(self.last_logits(&input, position, read), ahead.finish());
        self.cached.push(last);
        Ok((logits?, masked?))
    }

    /// Teacher-forced logits after every prefix `ids[..=i]`, starting from an empty cache.
    pub async fn score(&mut self, ids: &[u32]) -> Result<Vec<Vec<f32>>, EngineError> {
        self.score_from(ids, 0).await
    }

    /// `score`'s rows for positions `first..` only (none when `first >= ids.len()`): the
    /// positions before run without their output head, which for a large vocabulary is most of
    /// a position's work (a golden record's prompt needs no logits but its last position's).
    pub async fn score_from(
        &mut self,
        ids: &[u32],
        first: usize,
    ) -> Result<Vec<Vec<f32>>, EngineError> {
        check_ids(ids, self.model.cfg.vocab)?;
        self.cached.clear();
        let first = first.min(ids.len());
        let max_batch = self.stage.spec.max_batch as usize;
        for chunk in ids[..first].chunks(max_batch) {
            let start = self.cached.len() as u32;
            self.stage.forward(&StageInput::Tokens(chunk), start)?;
            self.cached.extend_from_slice(chunk);
        }
        let mut all = Vec::with_capacity(ids.len() - first);
        for chunk in ids[first..].chunks(max_batch) {
            let start = self.cached.len() as u32;
            let input = StageInput::Tokens(chunk);
            let rows = self.stage.forward_logits(&input, start, chunk.len() as u32);
            all.extend(rows.await?);
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
            if request.options.logprobs.is_some() {
                // The API's batch scheduler reads the logits and gives them; this loop does not.
                return Err(RequestError::Unsupported("log-probabilities").into());
            }
            let prompt_ids = self.prompt_ids(&request.prompt)?;
            decodings.push(Decoding::new(index, prompt_ids, &request.options));
        }
        let mut results = Vec::with_capacity(requests.len());
        for (decoding, request) in decodings.into_iter().zip(requests) {
            let result = match &request.options.constraint {
                Some(spec) => self.run_constrained(decoding, spec, on_event).await?,
                None => {
                    let speculation = request.options.speculation;
                    self.run(decoding, speculation, on_event).await?
                }
            };
            results.push(result);
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
