//! A donor's loaded stage and its KV slots.
//!
//! `KvCache` holds one sequence, so several requests in flight (micro-batching) each get a
//! cache of their own: slot `request_id % kv_slots`. The coordinator numbers requests so
//! that no two in flight share a slot; a request arriving at position 0 takes its slot over,
//! and one arriving later in its sequence must already own it (otherwise its keys and values
//! are not here and it has to be replayed from 0). The slot's cache is swapped into the
//! stage before each step: one GPU runs one step at a time anyway.

use std::sync::Arc;

use super::super::allowed::AllowedTokens;
use super::super::frame::{Assign, Forward, Reply, StageInput as WireInput, StageRuntime};
use crate::gguf::RangeSource;
use crate::gpu::Gpu;
use crate::model::{LoadOptions, ModelError, OpenModel, Stage, StageInput, StageSpec};
use crate::ops::attention::KvCache;
use crate::sample::log_sum_exp;

/// What a step produced.
pub(super) enum StepOutput {
    /// The residual stream after the stage, `[tokens, d_model]`.
    Hidden(Vec<f32>),
    Sampled(u32),
    /// Highest logits of the last position, highest first, and the log-sum-exp of all when
    /// asked for.
    TopK {
        ids: Vec<u32>,
        logits: Vec<f32>,
        log_norm: Option<f32>,
    },
}

struct Slot {
    owner: Option<u64>,
    /// `None` while the cache is inside the stage, or before the slot's first use.
    cache: Option<KvCache>,
}

pub(super) struct StageHost {
    pub stage: Stage,
    pub assign: Assign,
    pub bytes_downloaded: u64,
    slots: Vec<Slot>,
    /// The slot whose cache is inside the stage now.
    active: usize,
    /// The model's source and header, kept for a re-plan that moves this stage's range.
    source: Box<dyn RangeSource>,
    model: OpenModel,
}

/// A Forward's input as the stage takes it: activations decoded to f32 on the host.
pub(super) enum HostInput<'f> {
    Tokens(&'f [u32]),
    Hidden(Vec<f32>),
}

impl HostInput<'_> {
    pub fn decode(input: &WireInput) -> HostInput<'_> {
        match input {
            WireInput::Tokens(ids) => HostInput::Tokens(ids),
            WireInput::Hidden(activations) => HostInput::Hidden(activations.to_f32()),
        }
    }

    fn stage_input(&self) -> StageInput<'_> {
        match self {
            HostInput::Tokens(ids) => StageInput::Tokens(ids),
            HostInput::Hidden(hidden) => StageInput::Hidden(hidden),
        }
    }
}

impl StageHost {
    /// Opens the model and loads only the tensors of the assigned stage.
    pub async fn load(gpu: Arc<Gpu>, assign: &Assign) -> Result<StageHost, ModelError> {
        let source = crate::gguf::open_source(&assign.model_url).await?;
        let model = OpenModel::read(source.as_ref()).await?;
        check_shape(&model, assign)?;
        let stage = Stage::load(
            gpu,
            source.as_ref(),
            &model,
            stage_spec(assign),
            LoadOptions::default(),
            &mut |_| {},
        )
        .await?;
        let bytes_downloaded = source.stats().bytes_fetched;
        Ok(StageHost::serving(
            stage,
            assign,
            bytes_downloaded,
            source,
            model,
        ))
    }

    /// The host for a new assignment, from the one held before if any: the same range keeps
    /// everything (`reassign`), another range of the same model keeps the layers and edges
    /// both need and downloads only the rest (`Stage::restage`), another model loads anew.
    pub async fn for_assign(
        previous: Option<StageHost>,
        gpu: Arc<Gpu>,
        assign: &Assign,
    ) -> Result<StageHost, ModelError> {
        match previous {
            Some(mut host) if host.can_serve(assign) => {
                host.reassign(assign);
                host.bytes_downloaded = 0;
                Ok(host)
            }
            Some(host) if host.assign.model_url == assign.model_url => host.restage(assign).await,
            previous => {
                // Free the old stage's GPU memory before loading the new one.
                drop(previous);
                StageHost::load(gpu, assign).await
            }
        }
    }

    fn serving(
        stage: Stage,
        assign: &Assign,
        bytes_downloaded: u64,
        source: Box<dyn RangeSource>,
        model: OpenModel,
    ) -> StageHost {
        StageHost {
            stage,
            assign: assign.clone(),
            bytes_downloaded,
            slots: empty_slots(assign.runtime.kv_slots),
            active: 0,
            source,
            model,
        }
    }

    /// Moves the stage to the new assignment's range; every request's keys and values are
    /// forgotten (the coordinator replays from position 0 after a re-plan).
    async fn restage(self, assign: &Assign) -> Result<StageHost, ModelError> {
        check_shape(&self.model, assign)?;
        let StageHost {
            stage,
            slots,
            source,
            model,
            ..
        } = self;
        // The slots' caches are shaped for the old range.
        drop(slots);
        let before = source.stats().bytes_fetched;
        let spec = stage_spec(assign);
        let options = LoadOptions::default();
        let stage = stage
            .restage(source.as_ref(), &model, spec, options, &mut |_| {})
            .await?;
        let bytes_downloaded = source.stats().bytes_fetched - before;
        Ok(StageHost::serving(
            stage,
            assign,
            bytes_downloaded,
            source,
            model,
        ))
    }

    /// Whether a new assignment needs exactly the weights and buffers loaded here.
    fn can_serve(&self, assign: &Assign) -> bool {
        let (old, new) = (&self.assign, assign);
        old.model_url == new.model_url
            && (old.layer_start, old.layer_end, old.n_layers)
                == (new.layer_start, new.layer_end, new.n_layers)
            && (old.embedding, old.head) == (new.embedding, new.head)
            && same_buffers(&old.runtime, &new.runtime)
    }

    /// Keeps the weights for a new epoch; every request's keys and values are forgotten,
    /// since the coordinator replays requests from position 0 after a re-plan.
    fn reassign(&mut self, assign: &Assign) {
        self.assign = assign.clone();
        let caches: Vec<KvCache> = self
            .slots
            .iter_mut()
            .filter_map(|s| s.cache.take())
            .collect();
        self.slots = empty_slots(assign.runtime.kv_slots);
        for (slot, cache) in self.slots.iter_mut().skip(1).zip(caches) {
            slot.cache = Some(cache);
        }
        self.active = 0;
    }

    /// Makes `request_id`'s cache the stage's. Returns the request whose keys and values were
    /// dropped to make room, if any.
    pub fn select_slot(&mut self, request_id: u64, start_pos: u32) -> Result<Option<u64>, String> {
        let index = (request_id % self.slots.len() as u64) as usize;
        let owner = self.slots[index].owner;
        let evicted = match owner {
            Some(owner) if owner == request_id => None,
            _ if start_pos != 0 => {
                return Err(format!(
                    "request {request_id} at position {start_pos} has no keys and values on this \
                     stage (its slot {index} holds {owner:?}); replay it from position 0"
                ))
            }
            _ => owner,
        };
        if index != self.active {
            let cache = match self.slots[index].cache.take() {
                Some(cache) => cache,
                None => self.stage.new_kv_cache().map_err(|e| e.to_string())?,
            };
            let previous = self.stage.swap_kv_cache(cache);
            self.slots[self.active].cache = Some(previous);
            self.active = index;
        }
        self.slots[index].owner = Some(request_id);
        Ok(evicted)
    }

    /// Runs the stage's layers for one validated Forward (its slot selected).
    pub async fn run(&self, forward: &Forward) -> Result<StepOutput, ModelError> {
        self.run_input(forward, &HostInput::decode(&forward.input))
            .await
    }

    /// `run` with the Forward's input already decoded.
    pub async fn run_input(
        &self,
        forward: &Forward,
        input: &HostInput<'_>,
    ) -> Result<StepOutput, ModelError> {
        let input = input.stage_input();
        let stage = &self.stage;
        let start = forward.start_pos;
        if !stage.spec.head {
            return Ok(StepOutput::Hidden(
                stage.forward_hidden(&input, start).await?,
            ));
        }
        Ok(match (forward.reply, &forward.allowed) {
            (Reply::Greedy, None) => {
                StepOutput::Sampled(stage.forward_argmax(&input, start).await?)
            }
            (Reply::Greedy, Some(allowed)) => {
                let (logits, ..) = self.masked_logits(&input, start, allowed, false).await?;
                StepOutput::Sampled(top_k(&logits, 1).0.first().copied().unwrap_or_default())
            }
            (Reply::TopK { k, normalised }, None) => {
                let logits = stage.forward_logits(&input, start, 1).await?;
                let last = logits.into_iter().next().unwrap_or_default();
                let log_norm = normalised.then(|| log_sum_exp(&last));
                let (ids, logits) = top_k(&last, k as usize);
                StepOutput::TopK {
                    ids,
                    logits,
                    log_norm,
                }
            }
            (Reply::TopK { k, normalised }, Some(allowed)) => {
                let (last, count, log_norm) =
                    (self.masked_logits(&input, start, allowed, normalised)).await?;
                // Only allowed ids: the disallowed ones are −∞, which no frame may carry.
                let (ids, logits) = top_k(&last, (k as usize).min(count));
                StepOutput::TopK {
                    ids,
                    logits,
                    log_norm,
                }
            }
            (Reply::Hidden { .. }, _) => {
                StepOutput::Hidden(stage.forward_hidden(&input, start).await?)
            }
        })
    }

    /// The last position's logits with every token outside `allowed` at −∞ (the engine's
    /// mask, `TokenMask::apply`), how many are allowed (validation made it at least one), and
    /// with `normalised` the log-sum-exp of the logits before the mask (log-probabilities are
    /// the model's).
    async fn masked_logits(
        &self,
        input: &StageInput<'_>,
        start: u32,
        allowed: &AllowedTokens,
        normalised: bool,
    ) -> Result<(Vec<f32>, usize, Option<f32>), ModelError> {
        let rows = self.stage.forward_logits(input, start, 1).await?;
        let mut last = rows.into_iter().next().unwrap_or_default();
        // A NaN would outrank (or, negative, underrank) every allowed logit in the argmax.
        if last.iter().any(|v| !v.is_finite()) {
            return Err(ModelError::Plan(
                "the stage produced non-finite logits".into(),
            ));
        }
        let log_norm = normalised.then(|| log_sum_exp(&last));
        let mask = allowed.to_mask(self.stage.cfg.vocab);
        mask.apply(&mut last);
        Ok((last, mask.count(), log_norm))
    }
}

fn stage_spec(assign: &Assign) -> StageSpec {
    StageSpec {
        layers: assign.layer_start..assign.layer_end,
        embedding: assign.embedding,
        head: assign.head,
        max_context: assign.runtime.max_context,
        max_batch: assign.runtime.max_batch,
    }
}

fn check_shape(model: &OpenModel, assign: &Assign) -> Result<(), ModelError> {
    let cfg = &model.cfg;
    if cfg.n_layers != assign.n_layers || cfg.d_model != assign.d_model {
        return Err(ModelError::Plan(format!(
            "the Assign describes {} layers of d_model {}, the model file has {} of {}",
            assign.n_layers, assign.d_model, cfg.n_layers, cfg.d_model
        )));
    }
    Ok(())
}

fn same_buffers(a: &StageRuntime, b: &StageRuntime) -> bool {
    a.max_context == b.max_context && a.max_batch == b.max_batch
}

fn empty_slots(count: u32) -> Vec<Slot> {
    (0..count.max(1))
        .map(|_| Slot {
            owner: None,
            cache: None,
        })
        .collect()
}

/// The `k` highest logits, highest first, ties by lower id (the sampler's order).
pub(super) fn top_k(logits: &[f32], k: usize) -> (Vec<u32>, Vec<f32>) {
    let mut order: Vec<u32> = (0..logits.len() as u32).collect();
    let descending = |a: &u32, b: &u32| {
        logits[*b as usize]
            .total_cmp(&logits[*a as usize])
            .then(a.cmp(b))
    };
    let k = k.min(order.len());
    if k > 0 && k < order.len() {
        order.select_nth_unstable_by(k - 1, descending);
    }
    order.truncate(k);
    order.sort_unstable_by(descending);
    let values = order.iter().map(|&id| logits[id as usize]).collect();
    (order, values)
}
