//! A stage: layers `[a, b)` of a model on one device, plus the embedding if it is first and the
//! head if it is last. A single device runs the stage `[0, n_layers)` with both.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::{Arc, Mutex};

use crate::gguf::RangeSource;
use crate::gpu::{DispatchGraph, Gpu, Recorder};
use crate::ops::attention::{AttentionParams, KvCache};
use crate::ops::rope::RopeScaling;
use crate::ops::short_conv::ShortConvState;
use crate::ops::{norm, quant, select};

use super::config::ModelConfig;
use super::graphs::RecentGraphs;
use super::loader::{LoadOptions, LoadProgress, Loader, Vector};
use super::open::OpenModel;
use super::scratch::Scratch;
use super::weights::{load_rope_factors, EdgeWeights, LayerWeights};
use super::ModelError;

/// What a stage is asked to hold.
#[derive(Debug, Clone)]
pub struct StageSpec {
    pub layers: Range<u32>,
    pub embedding: bool,
    pub head: bool,
    /// Longest sequence the KV cache holds.
    pub max_context: u32,
    /// Most tokens one forward call processes (prefill is chunked to this).
    pub max_batch: u32,
}

impl StageSpec {
    /// The whole model on `gpu`.
    pub fn whole(cfg: &ModelConfig, max_context: u32, gpu: &Gpu) -> StageSpec {
        StageSpec {
            layers: 0..cfg.n_layers,
            embedding: true,
            head: true,
            max_context: max_context.min(cfg.context_length).max(1),
            max_batch: default_max_batch(gpu),
        }
    }
}

/// A sequence's cache for a stage: keys and values of its layers, and the state of its
/// short-convolution blocks where the model has them.
fn new_cache(gpu: &Gpu, cfg: &ModelConfig, spec: &StageSpec) -> Result<KvCache, ModelError> {
    let layers = spec.layers.len() as u32;
    let mut cache = KvCache::new(gpu, layers, spec.max_context, cfg.n_kv_heads, cfg.head_dim)?;
    if let Some(layout) = &cfg.short_conv {
        let blocks = layout.count(spec.layers.clone());
        let state = ShortConvState::new(gpu, blocks, spec.max_context, cfg.d_model)?;
        cache.short_conv = Some(state);
    }
    Ok(cache)
}

/// Bytes of the tensors a stage of `new` needs that one of `old` does not hold (progress).
fn missing_bytes(model: &OpenModel, old: &StageSpec, new: &StageSpec) -> u64 {
    let held = model.tensor_plan(old).names;
    model
        .tensor_plan(new)
        .names
        .iter()
        .filter(|name| !held.contains(name))
        .filter_map(|name| model.header.tensor(name))
        .map(|tensor| tensor.bytes)
        .sum()
}

/// Prompt tokens per forward: a GPU fills its cores only with long chunks (512 prefills
/// 2.5–3.4× faster than 128 on the H200), while a CPU adapter gains nothing from them and
/// pays in scratch memory.
pub fn default_max_batch(gpu: &Gpu) -> u32 {
    if gpu.caps.cpu_work_split {
        128
    } else {
        512
    }
}

/// The input of a forward call: token ids (first stage) or the residual stream from the
/// previous stage, `[tokens, d_model]` row-major.
pub enum StageInput<'a> {
    Tokens(&'a [u32]),
    Hidden(&'a [f32]),
}

impl StageInput<'_> {
    pub(super) fn tokens(&self, d_model: u32) -> usize {
        match self {
            StageInput::Tokens(ids) => ids.len(),
            StageInput::Hidden(h) => h.len() / d_model as usize,
        }
    }
}

pub struct Stage {
    pub gpu: Arc<Gpu>,
    pub cfg: ModelConfig,
    pub spec: StageSpec,
    pub(super) layers: Vec<LayerWeights>,
    edges: EdgeWeights,
    /// RoPE frequency factors of the model (Llama 3, Phi-3), shared by its blocks.
    rope_factors: Option<Vector>,
    pub(super) cache: KvCache,
    pub(super) scratch: Scratch,
    /// Bind groups of the step shapes this stage records again and again, by the KV cache
    /// they ran with (`KvCache::id`) and (step, tokens): a host that swaps caches between
    /// steps (a donor's request slots) finds each cache's bind groups as it left them.
    graphs: Mutex<RecentGraphs<(u64, GraphKey), DispatchGraph>>,
}

/// Which recurring recording a graph belongs to: the step's name and its token count.
pub(super) type GraphKey = (&'static str, u32);

/// Step shapes kept (the least recently used go first past it): prefill of odd lengths would
/// otherwise keep adding them, speculative steps add one per draft length, and each KV cache
/// swapped in has shapes of its own.
const MAX_GRAPHS: usize = 64;

impl Stage {
    /// Loads the stage's tensors of the opened `model` from `source`, streaming them into
    /// GPU buffers.
    pub async fn load(
        gpu: Arc<Gpu>,
        source: &dyn RangeSource,
        model: &OpenModel,
        spec: StageSpec,
        options: LoadOptions,
        progress: &mut dyn FnMut(LoadProgress<'_>),
    ) -> Result<Stage, ModelError> {
        model.check_layers(&spec.layers)?;
        let (header, cfg) = (&model.header, model.cfg.clone());
        let total = model.tensor_plan(&spec).bytes;
        let mut loader = Loader::new(&gpu, source, header, options, total, progress);
        let edges = EdgeWeights::load(&mut loader, &cfg, spec.embedding, spec.head).await?;
        let rope_factors = match spec.layers.is_empty() {
            true => None,
            false => load_rope_factors(&mut loader, &cfg, spec.max_context).await?,
        };
        let mut layers = Vec::with_capacity(spec.layers.len());
        for layer in spec.layers.clone() {
            layers.push(LayerWeights::load(&mut loader, &cfg, layer).await?);
        }
        loader.flush();
        let cache = new_cache(&gpu, &cfg, &spec)?;
        let scratch = Scratch::new(&gpu, &cfg, spec.max_batch);
        Ok(Stage {
            gpu,
            cfg,
            spec,
            layers,
            edges,
            rope_factors,
            cache,
            scratch,
            graphs: Mutex::new(RecentGraphs::new(MAX_GRAPHS)),
        })
    }

    /// This stage made into one of `spec` over the same `model`: the layers (and embedding,
    /// head, RoPE factors) it holds that `spec` needs stay where they are, the rest are
    /// dropped before the missing ones stream in from `source`. The KV cache starts empty.
    /// A donor given an overlapping range by a re-plan downloads only what it lacks.
    pub async fn restage(
        self,
        source: &dyn RangeSource,
        model: &OpenModel,
        spec: StageSpec,
        options: LoadOptions,
        progress: &mut dyn FnMut(LoadProgress<'_>),
    ) -> Result<Stage, ModelError> {
        model.check_layers(&spec.layers)?;
        // The graphs hold bind groups on the old buffers: they go, and the old cache with
        // them, before anything new is allocated.
        drop(self.graphs);
        drop(self.cache);
        let old = self.spec.clone();
        let mut held: HashMap<u32, LayerWeights> = old.layers.clone().zip(self.layers).collect();
        held.retain(|layer, _| spec.layers.contains(layer));
        let keep_rope = old.max_context == spec.max_context && !old.layers.is_empty();
        let rope_factors = self
            .rope_factors
            .filter(|_| keep_rope && !spec.layers.is_empty());
        let cfg = self.cfg;
        let total = missing_bytes(model, &old, &spec);
        let mut loader = Loader::new(&self.gpu, source, &model.header, options, total, progress);
        let edges = self
            .edges
            .reshape(&mut loader, &cfg, spec.embedding, spec.head);
        let edges = edges.await?;
        let rope_factors = match (rope_factors, spec.layers.is_empty()) {
            (Some(kept), _) => Some(kept),
            (None, true) => None,
            (None, false) => load_rope_factors(&mut loader, &cfg, spec.max_context).await?,
        };
        let mut layers = Vec::with_capacity(spec.layers.len());
        for layer in spec.layers.clone() {
            layers.push(match held.remove(&layer) {
                Some(weights) => weights,
                None => LayerWeights::load(&mut loader, &cfg, layer).await?,
            });
        }
        loader.flush();
        let cache = new_cache(&self.gpu, &cfg, &spec)?;
        let scratch = match old.max_batch == spec.max_batch {
            true => self.scratch,
            false => Scratch::new(&self.gpu, &cfg, spec.max_batch),
        };
        Ok(Stage {
            gpu: self.gpu,
            cfg,
            spec,
            layers,
            edges,
            rope_factors,
            cache,
            scratch,
            graphs: Mutex::new(RecentGraphs::new(MAX_GRAPHS)),
        })
    }

    /// Runs `body` with a recorder reusing the bind groups of the last recording under `key`.
    /// `body` must submit: the graph is only borrowed while recording.
    pub(super) fn with_recorder<T>(
        &self,
        key: GraphKey,
        body: impl FnOnce(Recorder<'_>) -> Result<T, ModelError>,
    ) -> Result<T, ModelError> {
        let key = (self.cache.id(), key);
        let mut graphs = self.graphs.lock().unwrap_or_else(|e| e.into_inner());
        let graph = graphs.get(key);
        body(Recorder::with_graph(&self.gpu, graph))
    }

    /// Runs the stage's layers over `input` at positions `start_pos..`, leaving the residual
    /// stream in the scratch. `tokens` must fit `max_batch` and the context.
    pub fn record_layers(
        &self,
        rec: &mut Recorder,
        input: &StageInput,
        start_pos: u32,
    ) -> Result<u32, ModelError> {
        let tokens = input.tokens(self.cfg.d_model) as u32;
        self.check_batch(tokens, start_pos)?;
        // The host waits on every step that records the layers (a prompt, a verification, a
        // donor's step) with nothing else in flight.
        rec.submit_in_parts();
        let s = &self.scratch;
        match input {
            StageInput::Tokens(ids) => {
                self.gpu
                    .queue
                    .write_buffer(&s.ids, 0, bytemuck::cast_slice(ids));
                self.record_embedding(rec, tokens)?;
            }
            StageInput::Hidden(hidden) => {
                self.gpu
                    .queue
                    .write_buffer(&s.hidden, 0, bytemuck::cast_slice(hidden));
            }
        }
        self.record_blocks(rec, start_pos, tokens);
        Ok(tokens)
    }

    /// Embeds the `tokens` ids already in the scratch's id buffer into the residual stream.
    pub(super) fn record_embedding(
        &self,
        rec: &mut Recorder,
        tokens: u32,
    ) -> Result<(), ModelError> {
        let embedding = self.edges.embedding.as_ref().ok_or_else(|| {
            ModelError::Plan("this stage holds no embedding to embed tokens".into())
        })?;
        let s = &self.scratch;
        quant::embed(
            rec,
            &embedding.view(),
            &s.ids,
            &s.hidden,
            tokens,
            (self.cfg.arch.embed_scale)(&self.cfg),
        );
        Ok(())
    }

    /// The stage's blocks over the residual stream of `tokens` tokens at `start_pos..`.
    pub(super) fn record_blocks(&self, rec: &mut Recorder, start_pos: u32, tokens: u32) {
        if let Some(rows) = self.seat_rows(start_pos, tokens) {
            let table = self.cache.pages().map(|pages| &pages.table);
            self.record_row_blocks(rec, &super::batch::StepRows::new(&rows, table));
            return;
        }
        for index in 0..self.layers.len() {
            let step = self.layer_step(rec, index, &self.cache, start_pos, tokens, None);
            (self.cfg.arch.forward_layer)(rec, &step);
        }
    }

    /// Block `index`'s step over `tokens` tokens from `start_pos` of `cache`, or over a batched
    /// step's `rows`, with where its q, k and v go decided for the device `rec` records on.
    pub(super) fn layer_step<'a>(
        &'a self,
        rec: &Recorder,
        index: usize,
        cache: &'a KvCache,
        start_pos: u32,
        tokens: u32,
        rows: Option<&'a super::batch::StepRows<'a>>,
    ) -> super::LayerStep<'a> {
        let mut step = super::LayerStep {
            cfg: &self.cfg,
            weights: &self.layers[index],
            scratch: &self.scratch,
            cache,
            cache_layer: index as u32,
            layer: self.spec.layers.start + index as u32,
            start_pos,
            tokens,
            rows,
            qkv_in_sections: false,
            rope_scaling: self.rope_scaling(),
            previous: index.checked_sub(1).map(|i| &self.layers[i]),
            next: self.layers.get(index + 1),
        };
        step.qkv_in_sections = tokens == 1 || super::block::qkv_in_sections(rec, &step);
        step
    }

    /// The RoPE frequency factors and magnitude every block of this stage rotates by, if any.
    pub(super) fn rope_scaling(&self) -> Option<RopeScaling<'_>> {
        self.rope_factors.as_ref().map(|f| RopeScaling {
            inverse_factors: &f.buffer,
            mscale: self.cfg.rope_attn_factor,
        })
    }

    /// Final norm and head over rows `rows` of the residual stream (at most `HEAD_ROWS`),
    /// leaving their logits in the scratch's logits buffer.
    pub fn record_head(&self, rec: &mut Recorder, rows: Range<u32>) -> Result<(), ModelError> {
        let head = self
            .edges
            .head()
            .ok_or_else(|| ModelError::Plan("this stage holds no output head".into()))?;
        let norm_weight = self
            .edges
            .output_norm
            .as_ref()
            .ok_or_else(|| ModelError::Plan("this stage holds no output norm".into()))?;
        let s = &self.scratch;
        let count = rows.len() as u32;
        if count == 0 || count > super::scratch::HEAD_ROWS {
            return Err(ModelError::Plan(format!("{count} head rows at once")));
        }
        let row_bytes = u64::from(self.cfg.d_model) * 4;
        rec.copy(
            &s.hidden,
            u64::from(rows.start) * row_bytes,
            &s.head_in,
            0,
            u64::from(count) * row_bytes,
        );
        norm::rms_norm(
            rec,
            &s.head_in,
            &norm_weight.buffer,
            &s.head_normed,
            count,
            self.cfg.d_model,
            self.cfg.rms_eps,
        );
        quant::matmul(rec, &head.view(), &s.head_normed, &s.logits, count);
        Ok(())
    }

    /// Runs the layers and submits, keeping only what they write into the KV cache (prefill
    /// chunks before the last).
    pub fn forward(&self, input: &StageInput<'_>, start_pos: u32) -> Result<(), ModelError> {
        let tokens = input.tokens(self.cfg.d_model) as u32;
        self.with_recorder(("layers", tokens), |mut rec| {
            self.record_layers(&mut rec, input, start_pos)?;
            rec.submit();
            Ok(())
        })
    }

    /// Greedy next token after `input`: only 4 bytes come back from the GPU.
    pub async fn forward_argmax(
        &self,
        input: &StageInput<'_>,
        start_pos: u32,
    ) -> Result<u32, ModelError> {
        let tokens = input.tokens(self.cfg.d_model) as u32;
        let pending = self.with_recorder(("argmax", tokens), |mut rec| {
            self.record_layers(&mut rec, input, start_pos)?;
            self.record_argmax(&mut rec, tokens)?;
            Ok(rec.submit_with_read(&self.scratch.argmax, 0, 4))
        })?;
        let bytes = pending.wait(&self.gpu).await?;
        Ok(u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]))
    }

    /// The greedy token after each position of `input` (a speculative step: the token before
    /// a draft, then the draft), at most `HEAD_ROWS` tokens; 4 bytes per position come back.
    pub async fn forward_argmax_rows(
        &self,
        input: &StageInput<'_>,
        start_pos: u32,
    ) -> Result<Vec<u32>, ModelError> {
        let tokens = input.tokens(self.cfg.d_model) as u32;
        let pending = self.with_recorder(("argmax rows", tokens), |mut rec| {
            self.record_layers(&mut rec, input, start_pos)?;
            self.record_head(&mut rec, 0..tokens)?;
            let s = &self.scratch;
            select::argmax_rows(&mut rec, &s.logits, self.cfg.vocab, tokens, &s.argmax);
            Ok(rec.submit_with_read(&s.argmax, 0, u64::from(tokens) * 4))
        })?;
        let bytes = pending.wait(&self.gpu).await?;
        Ok(bytemuck::pod_collect_to_vec(&bytes))
    }

    /// Head and argmax over the last of `tokens` rows, into the scratch's argmax slot.
    pub(super) fn record_argmax(&self, rec: &mut Recorder, tokens: u32) -> Result<(), ModelError> {
        self.record_head(rec, tokens - 1..tokens)?;
        select::argmax(
            rec,
            &self.scratch.logits,
            self.cfg.vocab,
            &self.scratch.argmax,
        );
        Ok(())
    }

    /// Full logits for the last `rows` tokens of `input` (teacher-forced scoring, sampling).
    pub async fn forward_logits(
        &self,
        input: &StageInput<'_>,
        start_pos: u32,
        last_rows: u32,
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        let tokens = input.tokens(self.cfg.d_model) as u32;
        let first = tokens.saturating_sub(last_rows);
        if tokens - first <= super::scratch::HEAD_ROWS {
            return self.forward_logits_tail(input, start_pos, first).await;
        }
        self.with_recorder(("layers", tokens), |mut rec| {
            self.record_layers(&mut rec, input, start_pos)?;
            rec.submit();
            Ok(())
        })?;
        let mut out = Vec::new();
        let mut row = first;
        while row < tokens {
            let end = (row + super::scratch::HEAD_ROWS).min(tokens);
            let vocab = u64::from(self.cfg.vocab);
            let pending = self.with_recorder(("head", end - row), |mut rec| {
                self.record_head(&mut rec, row..end)?;
                let bytes = u64::from(end - row) * vocab * 4;
                Ok(rec.submit_with_read(&self.scratch.logits, 0, bytes))
            })?;
            let bytes = pending.wait(&self.gpu).await?;
            let values: Vec<f32> = bytemuck::pod_collect_to_vec(&bytes);
            out.extend(values.chunks(vocab as usize).map(<[f32]>::to_vec));
            row = end;
        }
        Ok(out)
    }

    /// `forward_logits` when the rows from `first` fit one head pass: layers and head in one
    /// submit (a sampled decode step: one submit and one wait, not two submits).
    async fn forward_logits_tail(
        &self,
        input: &StageInput<'_>,
        start_pos: u32,
        first: u32,
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        let tokens = input.tokens(self.cfg.d_model) as u32;
        let vocab = u64::from(self.cfg.vocab);
        let pending = self.with_recorder(("logits tail", tokens), |mut rec| {
            self.record_layers(&mut rec, input, start_pos)?;
            self.record_head(&mut rec, first..tokens)?;
            let bytes = u64::from(tokens - first) * vocab * 4;
            Ok(rec.submit_with_read(&self.scratch.logits, 0, bytes))
        })?;
        let bytes = pending.wait(&self.gpu).await?;
        let values: Vec<f32> = bytemuck::pod_collect_to_vec(&bytes);
        Ok(values.chunks(vocab as usize).map(<[f32]>::to_vec).collect())
    }

    /// The residual stream after this stage's layers, for the next stage.
    pub async fn forward_hidden(
        &self,
        input: &StageInput<'_>,
        start_pos: u32,
    ) -> Result<Vec<f32>, ModelError> {
        let tokens = input.tokens(self.cfg.d_model) as u32;
        let pending = self.with_recorder(("hidden", tokens), |mut rec| {
            self.record_layers(&mut rec, input, start_pos)?;
            let bytes = u64::from(tokens) * u64::from(self.cfg.d_model) * 4;
            Ok(rec.submit_with_read(&self.scratch.hidden, 0, bytes))
        })?;
        let out = pending.wait(&self.gpu).await?;
        Ok(bytemuck::pod_collect_to_vec(&out))
    }

    /// A fresh, empty KV cache shaped like this stage's own, so a host serving several
    /// sequences can keep one per sequence and swap it in (`swap_kv_cache`) before each call.
    pub fn new_kv_cache(&self) -> Result<KvCache, ModelError> {
        new_cache(&self.gpu, &self.cfg, &self.spec)
    }

    /// `slots` caches shaped like `new_kv_cache`'s in one pool (`KvCache::pooled`), whose
    /// rows a batched step attends in one dispatch; `None` where the model keeps state beside
    /// its keys and values (short convolutions) or one pooled layer exceeds a binding.
    pub fn new_pooled_kv_caches(&self, slots: u32) -> Option<Vec<KvCache>> {
        if self.cfg.short_conv.is_some() {
            return None;
        }
        let (cfg, layers) = (&self.cfg, self.spec.layers.len() as u32);
        let context = self.spec.max_context;
        KvCache::pooled(
            &self.gpu,
            layers,
            context,
            cfg.n_kv_heads,
            cfg.head_dim,
            slots,
        )
        .ok()
    }

    /// `seats` caches of this stage's context over one paged pool of `pages` pages (the sink
    /// included; `KvCache::paged`), for the sequences of batched steps; `None` where the model
    /// keeps state beside its keys and values, the device lacks the bindings of the rows
    /// kernels (the only decode kernels that read pages), or the pool exceeds a binding.
    pub fn new_paged_kv_caches(&self, seats: u32, pages: u32) -> Option<Vec<KvCache>> {
        let cfg = &self.cfg;
        let params = AttentionParams::standard(cfg.n_heads, cfg.n_kv_heads, cfg.head_dim);
        let rows_kernels = crate::ops::rope::rope_store_rows_supported(&self.gpu)
            && crate::ops::attention::decode_rows_supported(&self.gpu, &params);
        if cfg.short_conv.is_some() || !rows_kernels {
            return None;
        }
        let layers = self.spec.layers.len() as u32;
        let shape = [layers, self.spec.max_context, cfg.n_kv_heads, cfg.head_dim];
        KvCache::paged(&self.gpu, shape, seats, pages, self.spec.max_batch).ok()
    }

    /// `slots` caches for the sequences of batched steps: one pool where the stage allows it
    /// (`new_pooled_kv_caches`: a batched step then attends every row in one dispatch), else a
    /// cache per slot.
    pub fn new_slot_kv_caches(&self, slots: u32) -> Result<Vec<KvCache>, ModelError> {
        match self.new_pooled_kv_caches(slots) {
            Some(caches) => Ok(caches),
            None => (0..slots).map(|_| self.new_kv_cache()).collect(),
        }
    }

    /// Makes `cache` the one forward calls read and write, and returns the previous one.
    /// Work already submitted keeps the buffers it was recorded with.
    pub fn swap_kv_cache(&mut self, cache: KvCache) -> KvCache {
        std::mem::replace(&mut self.cache, cache)
    }

    pub(super) fn check_batch(&self, tokens: u32, start_pos: u32) -> Result<(), ModelError> {
        if tokens == 0 || tokens > self.spec.max_batch {
            return Err(ModelError::Plan(format!(
                "{tokens} tokens in one forward (1..={})",
                self.spec.max_batch
            )));
        }
        if start_pos + tokens > self.spec.max_context {
            return Err(ModelError::ContextFull {
                needed: start_pos + tokens,
                max: self.spec.max_context,
            });
        }
        Ok(())
    }
}
