//! The KV pool of one served model: `--parallel` slots, each a KV cache of `--ctx` positions,
//! counted in blocks of `BLOCK_TOKENS`; and the prefix cache over them.
//!
//! A slot's cache is one contiguous region of the pool's buffers (the attention kernels read
//! a sequence's keys from its region's position 0), so blocks are the unit of accounting and
//! of reuse rather than of placement.
//! A freed slot keeps its keys and values: they are the prefix cache. A new request takes the
//! free slot whose tokens share the longest prefix with its prompt (the least recently used
//! one when none does, which evicts that slot's cached prefix), and when another slot, busy or
//! free, holds more full blocks of the prompt, those blocks are copied into the taken slot on
//! the GPU. The prompt's tokens so reused are not computed again (`cached_tokens`).

use webshard::gpu::Gpu;
use webshard::model::{ModelError, Stage};
use webshard::ops::attention::KvCache;

/// Tokens per block: the granularity at which prefixes are shared between slots.
pub const BLOCK_TOKENS: usize = 16;

struct Slot {
    /// `None` only while the slot's cache is lent to the stage for a prefill chunk.
    cache: Option<KvCache>,
    /// The tokens whose keys and values the cache holds at positions 0.., in order.
    tokens: Vec<u32>,
    busy: bool,
    /// When the slot was last claimed or released (the pool's clock), for LRU eviction.
    last_used: u64,
}

pub struct KvPool {
    slots: Vec<Slot>,
    positions: u32,
    clock: u64,
}

/// A slot taken for a request, and how many of its prompt's tokens it already holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Claim {
    pub slot: usize,
    pub reused: usize,
}

impl KvPool {
    /// `slots` caches shaped like the stage's own (`Stage::new_slot_kv_caches`: one pool of
    /// buffers where the stage allows it).
    pub fn new(stage: &Stage, slots: usize) -> Result<KvPool, ModelError> {
        let caches = stage.new_slot_kv_caches(slots as u32)?;
        let slots = caches
            .into_iter()
            .map(|cache| Slot {
                cache: Some(cache),
                tokens: Vec::new(),
                busy: false,
                last_used: 0,
            })
            .collect();
        Ok(KvPool {
            slots,
            positions: stage.spec.max_context,
            clock: 0,
        })
    }

    pub fn has_free_slot(&self) -> bool {
        self.slots.iter().any(|slot| !slot.busy)
    }

    /// Takes a free slot for `prompt` (not empty), reusing the longest cached prefix of it
    /// that leaves at least its last token to compute; `None` when every slot is busy.
    pub fn claim(&mut self, gpu: &Gpu, prompt: &[u32]) -> Option<Claim> {
        let limit = prompt.len().saturating_sub(1);
        let own = |slot: &Slot| common_prefix(&slot.tokens, prompt).min(limit);
        let chosen = (0..self.slots.len())
            .filter(|&index| !self.slots[index].busy)
            .max_by_key(|&index| {
                let slot = &self.slots[index];
                (own(slot), std::cmp::Reverse(slot.last_used))
            })?;
        let mut reused = own(&self.slots[chosen]);
        let donor = (0..self.slots.len())
            .filter(|&index| index != chosen)
            .map(|index| (index, full_blocks(own(&self.slots[index]))))
            .max_by_key(|&(_, shared)| shared);
        if let Some((donor, shared)) = donor.filter(|&(_, shared)| shared > reused) {
            self.copy_prefix(gpu, donor, chosen, shared);
            reused = shared;
        }
        self.clock += 1;
        let slot = &mut self.slots[chosen];
        slot.tokens.clear();
        slot.tokens.extend_from_slice(&prompt[..reused]);
        slot.busy = true;
        slot.last_used = self.clock;
        Some(Claim {
            slot: chosen,
            reused,
        })
    }

    /// Frees `slot`; its tokens stay cached for later prompts until it is claimed again.
    pub fn release(&mut self, slot: usize) {
        self.clock += 1;
        let slot = &mut self.slots[slot];
        slot.busy = false;
        slot.last_used = self.clock;
    }

    /// Forgets every cached prefix and frees every slot (after a failed step, whose caches
    /// may be half-written).
    pub fn clear(&mut self) {
        for slot in &mut self.slots {
            slot.tokens.clear();
            slot.busy = false;
        }
    }

    /// The cache of `slot`.
    pub fn cache(&self, slot: usize) -> &KvCache {
        self.slots[slot]
            .cache
            .as_ref()
            .expect("a slot's cache is back once its prefill chunk is recorded")
    }

    /// Lends `slot`'s cache out (to the stage, for a prefill chunk); `put_back` returns it.
    pub fn lend(&mut self, slot: usize) -> KvCache {
        self.slots[slot]
            .cache
            .take()
            .expect("a slot's cache is lent once at a time")
    }

    pub fn put_back(&mut self, slot: usize, cache: KvCache) {
        self.slots[slot].cache = Some(cache);
    }

    /// Records that `tokens` were fed into `slot` after what it held.
    pub fn extend(&mut self, slot: usize, tokens: &[u32]) {
        self.slots[slot].tokens.extend_from_slice(tokens);
    }

    /// How many tokens `slot` holds.
    pub fn held(&self, slot: usize) -> usize {
        self.slots[slot].tokens.len()
    }

    pub fn usage(&self) -> PoolUsage {
        let blocks = |slot: &Slot| slot.tokens.len().div_ceil(BLOCK_TOKENS) as u64;
        let mut usage = PoolUsage {
            slots: self.slots.len() as u64,
            busy_slots: 0,
            used_tokens: 0,
            used_blocks: 0,
            cached_blocks: 0,
            total_blocks: (self.slots.len() * (self.positions as usize).div_ceil(BLOCK_TOKENS))
                as u64,
            total_tokens: self.slots.len() as u64 * u64::from(self.positions),
        };
        for slot in &self.slots {
            if slot.busy {
                usage.busy_slots += 1;
                usage.used_tokens += slot.tokens.len() as u64;
                usage.used_blocks += blocks(slot);
            } else {
                usage.cached_blocks += blocks(slot);
            }
        }
        usage
    }

    /// Copies the keys and values of positions `0..tokens` of every layer from slot `from`
    /// into slot `to` (same shapes, so the same offsets), queued before any later step.
    fn copy_prefix(&mut self, gpu: &Gpu, from: usize, to: usize, tokens: usize) {
        self.cache(to)
            .copy_prefix_from(gpu, self.cache(from), tokens as u32);
        let prefix = self.slots[from].tokens[..tokens].to_vec();
        self.slots[to].tokens = prefix;
    }
}

/// What the pool holds, for `/metrics`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolUsage {
    pub slots: u64,
    pub busy_slots: u64,
    /// Tokens and blocks held by running sequences.
    pub used_tokens: u64,
    pub used_blocks: u64,
    /// Blocks of free slots kept as the prefix cache (evicted as slots are claimed).
    pub cached_blocks: u64,
    pub total_blocks: u64,
    pub total_tokens: u64,
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// `tokens` rounded down to whole blocks.
fn full_blocks(tokens: usize) -> usize {
    tokens - tokens % BLOCK_TOKENS
}

/// Slots `--parallel` gets when not given: as many caches of `--ctx` as `budget_bytes` holds,
/// at least one and at most `most` (whole-batch steps stop paying past a few rows on a CPU
/// adapter and past a few dozen on a GPU).
pub fn default_slots(slot_bytes: u64, budget_bytes: u64, most: usize) -> usize {
    let fitting = budget_bytes / slot_bytes.max(1);
    (fitting as usize).clamp(1, most)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_and_blocks() {
        assert_eq!(common_prefix(&[1, 2, 3], &[1, 2, 4, 5]), 2);
        assert_eq!(common_prefix(&[], &[1]), 0);
        assert_eq!(full_blocks(BLOCK_TOKENS * 2 + 3), BLOCK_TOKENS * 2);
        assert_eq!(full_blocks(BLOCK_TOKENS - 1), 0);
    }

    #[test]
    fn default_slots_fit_the_budget_within_bounds() {
        assert_eq!(default_slots(100, 1000, 16), 10);
        assert_eq!(default_slots(100, 50, 16), 1);
        assert_eq!(default_slots(1, 1000, 4), 4);
        assert_eq!(default_slots(0, 1000, 4), 4);
    }
}
