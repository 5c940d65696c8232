//! The KV pool of one served model: `--parallel` seats, each a KV cache of up to `--ctx`
//! positions kept in pages of `BLOCK_TOKENS` positions (`KvCache::paged`), and the prefix
//! cache over those pages (`pages::PageBook`).
//!
//! A request reserves, when it is admitted, the pages its prompt and `max_tokens` can fill, so
//! a running sequence never waits for memory, and a short request holds a few pages rather
//! than a whole `--ctx`. Its prompt's full pages that an earlier sequence computed are shared,
//! not copied: its seat's page table points at them, and the tokens so reused are not
//! computed again (`cached_tokens`). Pages no sequence holds stay cached until a reservation
//! needs them.
//!
//! Models that keep state beside the keys and values (LFM2's short convolutions), or whose
//! pool a binding cannot hold, get a whole cache per seat and no prefix cache.

use webshard::gpu::Gpu;
use webshard::model::{ModelError, Stage};
use webshard::ops::attention::{KvCache, PAGE_TOKENS};

use super::pages::PageBook;

/// Tokens per page: the granularity at which prefixes are shared between sequences.
pub const BLOCK_TOKENS: usize = PAGE_TOKENS as usize;

struct Seat {
    /// `None` only while the seat's cache is lent to the stage for a prefill chunk.
    cache: Option<KvCache>,
    /// The pages the seat holds, in position order (paged pools).
    pages: Vec<u32>,
    /// The tokens whose keys and values the cache holds at positions 0.., in order.
    tokens: Vec<u32>,
    busy: bool,
}

pub struct KvPool {
    seats: Vec<Seat>,
    /// The pages and the prefix cache; `None` where each seat has a whole cache.
    book: Option<PageBook>,
    positions: u32,
}

/// A seat taken for a request, and how many of its prompt's tokens it already holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Claim {
    pub slot: usize,
    pub reused: usize,
}

impl KvPool {
    /// `seats` seats of the stage's context over pages for `seats` whole contexts (the same
    /// memory as a whole cache per seat), or whole caches where the stage cannot page.
    pub fn new(stage: &Stage, seats: usize) -> Result<KvPool, ModelError> {
        let positions = stage.spec.max_context;
        let pages = seats as u32 * positions.div_ceil(PAGE_TOKENS) + 1;
        let (caches, book) = match stage.new_paged_kv_caches(seats as u32, pages) {
            Some(caches) => (caches, Some(PageBook::new(pages))),
            None => (stage.new_slot_kv_caches(seats as u32)?, None),
        };
        let seats = caches
            .into_iter()
            .map(|cache| Seat {
                cache: Some(cache),
                pages: Vec::new(),
                tokens: Vec::new(),
                busy: false,
            })
            .collect();
        Ok(KvPool {
            seats,
            book,
            positions,
        })
    }

    pub fn has_free_slot(&self) -> bool {
        self.seats.iter().any(|seat| !seat.busy)
    }

    /// Takes a free seat for `prompt` (not empty) with room for `need` positions, reusing the
    /// longest prefix of it the pages hold (`PageBook::lookup`) that leaves at least its last
    /// token to compute;
    /// `None` while every seat is busy or the free pages are too few (a need within the
    /// context always fits once the pool is idle).
    pub fn claim(&mut self, gpu: &Gpu, prompt: &[u32], need: usize) -> Option<Claim> {
        let slot = self.seats.iter().position(|seat| !seat.busy)?;
        let need = need.clamp(prompt.len(), self.positions as usize);
        let mut reused = 0;
        if let Some(book) = &mut self.book {
            let found = book.lookup(prompt, prompt.len().saturating_sub(1));
            reused = found.tokens();
            let pages = book.reserve(found, need.div_ceil(BLOCK_TOKENS))?;
            let seat = &mut self.seats[slot];
            let cache = seat.cache.as_ref().expect("a free seat's cache is home");
            cache.set_pages(gpu, &pages);
            seat.pages = pages;
        }
        let seat = &mut self.seats[slot];
        seat.tokens.clear();
        seat.tokens.extend_from_slice(&prompt[..reused]);
        seat.busy = true;
        Some(Claim { slot, reused })
    }

    /// Frees `slot`; its pages stay cached for later prompts (the last one too, full or not).
    pub fn release(&mut self, slot: usize) {
        let seat = &mut self.seats[slot];
        seat.busy = false;
        if let Some(book) = &mut self.book {
            let last = seat.tokens.len() / BLOCK_TOKENS;
            if let Some(&page) = seat.pages.get(last) {
                let parent = last.checked_sub(1).map(|i| seat.pages[i]);
                book.register(page, parent, &seat.tokens[last * BLOCK_TOKENS..]);
            }
            book.release(&seat.pages);
        }
        seat.tokens.clear();
        seat.pages.clear();
    }

    /// Forgets every cached prefix and frees every seat (after a failed step, whose pages may
    /// be half-written).
    pub fn clear(&mut self) {
        for seat in &mut self.seats {
            seat.tokens.clear();
            seat.pages.clear();
            seat.busy = false;
        }
        if let Some(book) = &mut self.book {
            book.clear();
        }
    }

    /// The cache of `slot`.
    pub fn cache(&self, slot: usize) -> &KvCache {
        self.seats[slot]
            .cache
            .as_ref()
            .expect("a seat's cache is back once its prefill chunk is recorded")
    }

    /// Makes `slot`'s cache the stage's, for a step of that sequence alone (a prefill chunk,
    /// a draft's verification); returns the stage's own cache, which `take_back` needs.
    pub fn lend_to(&mut self, stage: &mut Stage, slot: usize) -> KvCache {
        let lent = self.seats[slot]
            .cache
            .take()
            .expect("a seat's cache is lent once at a time");
        stage.swap_kv_cache(lent)
    }

    /// Takes `slot`'s cache back from the stage, which gets its `own` again.
    pub fn take_back(&mut self, stage: &mut Stage, slot: usize, own: KvCache) {
        self.seats[slot].cache = Some(stage.swap_kv_cache(own));
    }

    /// Records that `tokens` were fed into `slot` after what it held (their keys and values
    /// are in steps already submitted); each page they fill joins the prefix cache.
    pub fn extend(&mut self, slot: usize, tokens: &[u32]) {
        let seat = &mut self.seats[slot];
        let before = seat.tokens.len();
        seat.tokens.extend_from_slice(tokens);
        let Some(book) = &mut self.book else {
            return;
        };
        for index in before / BLOCK_TOKENS..seat.tokens.len() / BLOCK_TOKENS {
            let Some(&page) = seat.pages.get(index) else {
                break;
            };
            let parent = index.checked_sub(1).map(|i| seat.pages[i]);
            let block = &seat.tokens[index * BLOCK_TOKENS..][..BLOCK_TOKENS];
            book.register(page, parent, block);
        }
    }

    /// How many tokens `slot` holds.
    pub fn held(&self, slot: usize) -> usize {
        self.seats[slot].tokens.len()
    }

    pub fn usage(&self) -> PoolUsage {
        let busy = self.seats.iter().filter(|seat| seat.busy);
        let used_tokens: u64 = busy.clone().map(|seat| seat.tokens.len() as u64).sum();
        let seats = self.seats.len() as u64;
        let (used_blocks, cached_blocks, total_blocks) = match &self.book {
            Some(book) => (book.held(), book.cached(), book.total()),
            None => {
                let blocks = |seat: &Seat| seat.tokens.len().div_ceil(BLOCK_TOKENS) as u64;
                let per_seat = u64::from(self.positions).div_ceil(BLOCK_TOKENS as u64);
                (busy.clone().map(blocks).sum(), 0, seats * per_seat)
            }
        };
        PoolUsage {
            slots: seats,
            busy_slots: busy.count() as u64,
            used_tokens,
            used_blocks,
            cached_blocks,
            total_blocks,
            total_tokens: total_blocks * BLOCK_TOKENS as u64,
        }
    }
}

/// What the pool holds, for `/metrics`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolUsage {
    pub slots: u64,
    pub busy_slots: u64,
    /// Tokens held by running sequences.
    pub used_tokens: u64,
    /// Pages held by running sequences (a page shared by several counts once).
    pub used_blocks: u64,
    /// Pages no sequence holds, kept as the prefix cache (evicted as reservations need them).
    pub cached_blocks: u64,
    pub total_blocks: u64,
    pub total_tokens: u64,
}

/// Seats `--parallel` gets when not given: as many caches of `--ctx` as `budget_bytes` holds,
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
    fn default_slots_fit_the_budget_within_bounds() {
        assert_eq!(default_slots(100, 1000, 16), 10);
        assert_eq!(default_slots(100, 50, 16), 1);
        assert_eq!(default_slots(1, 1000, 4), 4);
        assert_eq!(default_slots(0, 1000, 4), 4);
    }
}
