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

/// What a step produced.
pub(super) enum StepOutput {
    /// The residual stream after the stage, `[tokens, d_model]`.
    Hidden(Vec<f32>),
    Sampled(u32),
    /// Highest logits of the last position, highest first.
    TopK {
        ids: Vec<u32>,
        logits: Vec<f32>,
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
}

impl StageHost {
    /// Opens the model and loads only the tensors of the assigned stage.
    pub async fn load(gpu: Arc<Gpu>, assign: &Assign) -> Result<StageHost, ModelError> {
        let source = crate::gguf::open_source(&assign.model_url).await?;
        let model = OpenModel::read(source.as_ref()).await?;
        let stage = load_stage(gpu, source.as_ref(), &model, assign).await?;
        let bytes_downloaded = source.stats().bytes_fetched;
        Ok(StageHost {
            stage,
            assign: assign.clone(),
            bytes_downloaded,
            slots: empty_slots(assign.runtime.kv_slots),
            active: 0,
        })
    }

    /// Whether a new assignment needs exactly the weights and buffers loaded here.
    pub fn can_serve(&self, assign: &Assign) -> bool {
        let (old, new) = (&self.assign, assign);
        old.model_url == new.model_url
            && (old.layer_start, old.layer_end, old.n_layers)
                == (new.layer_start, new.layer_end, new.n_layers)
            && (old.embedding, old.head) == (new.embedding, new.head)
            && same_buffers(&old.runtime, &new.runtime)
    }

    /// Keeps the weights for a new epoch; every request's keys and values are forgotten,
    /// since the coordinator replays requests from position 0 after a re-plan.
    pub fn reassign(&mut self, assign: &Assign) {
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
        let hidden;
        let input = match &forward.input {
            WireInput::Tokens(ids) => StageInput::Tokens(ids),
            WireInput::Hidden(activations) => {
                hidden = activations.to_f32();
                StageInput::Hidden(&hidden)
            }
        };
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
                let (logits, _) = self.masked_logits(&input, start, allowed).await?;
                StepOutput::Sampled(top_k(&logits, 1).0.first().copied().unwrap_or_default())
            }
            (Reply::TopK { k }, None) => {
                let logits = stage.forward_logits(&input, start, 1).await?;
                let last = logits.into_iter().next().unwrap_or_default();
                let (ids, logits) = top_k(&last, k as usize);
                StepOutput::TopK { ids, logits }
            }
            (Reply::TopK { k }, Some(allowed)) => {
                let (last, count) = self.masked_logits(&input, start, allowed).await?;
                // Only allowed ids: the disallowed ones are −∞, which no frame may carry.
                let (ids, logits) = top_k(&last, (k as usize).min(count));
                StepOutput::TopK { ids, logits }
            }
            (Reply::Hidden { .. }, _) => {
                StepOutput::Hidden(stage.forward_hidden(&input, start).await?)
            }
        })
    }

    /// The last position's logits with every token outside `allowed` at −∞ (the engine's
    /// mask, `TokenMask::apply`), and how many are allowed (validation made it at least one).
    async fn masked_logits(
        &self,
        input: &StageInput<'_>,
        start: u32,
        allowed: &AllowedTokens,
    ) -> Result<(Vec<f32>, usize), ModelError> {
        let rows = self.stage.forward_logits(input, start, 1).await?;
        let mut last = rows.into_iter().next().unwrap_or_default();
        // A NaN would outrank (or, negative, underrank) every allowed logit in the argmax.
        if last.iter().any(|v| !v.is_finite()) {
            return Err(ModelError::Plan(
                "the stage produced non-finite logits".into(),
            ));
        }
        let mask = allowed.to_mask(self.stage.cfg.vocab);
        mask.apply(&mut last);
        Ok((last, mask.count()))
    }
}

async fn load_stage(
    gpu: Arc<Gpu>,
    source: &dyn RangeSource,
    model: &OpenModel,
    assign: &Assign,
) -> Result<Stage, ModelError> {
    let spec = StageSpec {
        layers: assign.layer_start..assign.layer_end,
        embedding: assign.embedding,
        head: assign.head,
        max_context: assign.runtime.max_context,
        max_batch: assign.runtime.max_batch,
    };
    let cfg = &model.cfg;
    if cfg.n_layers != assign.n_layers || cfg.d_model != assign.d_model {
        return Err(ModelError::Plan(format!(
            "the Assign describes {} layers of d_model {}, the model file has {} of {}",
            assign.n_layers, assign.d_model, cfg.n_layers, cfg.d_model
        )));
    }
    Stage::load(
        gpu,
        source,
        model,
        spec,
        LoadOptions::default(),
        &mut |_| {},
    )
    .await
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
