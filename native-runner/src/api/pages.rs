//! The pages of a paged KV pool as the host counts them, and the prefix cache over them.
//! Nothing here touches the GPU: `pool` points seats at the pages this book hands out.
//!
//! A page whose tokens are known (full, or the last page of a finished sequence) remembers
//! them and the page before it in its sequence (with that page's generation). A prompt walks
//! its full pages from the first through the full pages' keys, so a match means the same
//! tokens at the same positions after the same prefix, compared exactly (no hash collision can
//! pass one prompt's keys off as another's); those pages are shared, never written again. Then
//! a page nobody holds that continues the same prefix and begins with the prompt's next
//! tokens is taken over whole: its first tokens are reused and the rest is written anew (so a
//! prompt seen before is computed from its last token only). A page's generation changes
//! whenever it is given out again, so a key naming a page since reused never matches. Pages no
//! sequence holds are free (nothing known) or cached (known), and a reservation takes free ones
//! first, then the least recently released cached ones. Page 0 is the pool's sink and is never
//! handed out.

use std::collections::{BTreeSet, HashMap};

use super::pool::BLOCK_TOKENS;

/// The page before a page in its sequence, and that page's generation then.
type Parent = Option<(u32, u64)>;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct PageKey {
    parent: Parent,
    tokens: [u32; BLOCK_TOKENS],
}

#[derive(Debug, Clone)]
struct Known {
    parent: Parent,
    tokens: Vec<u32>,
}

#[derive(Debug, Default, Clone)]
struct Page {
    /// Sequences holding the page.
    holders: u32,
    generation: u64,
    known: Option<Known>,
    /// When the last holder let it go (the book's clock), for eviction order.
    released: u64,
}

/// What a prompt finds in the book: full pages to share, then a page to take over with how
/// many of its first tokens the prompt reuses.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Found {
    pub shared: Vec<u32>,
    pub continued: Option<(u32, usize)>,
}

impl Found {
    /// Prompt tokens whose keys and values are already there.
    pub fn tokens(&self) -> usize {
        self.shared.len() * BLOCK_TOKENS + self.continued.map_or(0, |(_, reused)| reused)
    }
}

pub struct PageBook {
    pages: Vec<Page>,
    /// Full pages by their key.
    keyed: HashMap<PageKey, u32>,
    /// Pages with known tokens, by the page before them.
    children: HashMap<Parent, Vec<u32>>,
    /// Pages nobody holds whose tokens are not known.
    free: Vec<u32>,
    /// Pages nobody holds whose tokens are known, by release time.
    cached: BTreeSet<(u64, u32)>,
    clock: u64,
}

impl PageBook {
    /// A book of `pages` pages, page 0 the sink.
    pub fn new(pages: u32) -> PageBook {
        PageBook {
            pages: vec![Page::default(); pages as usize],
            keyed: HashMap::new(),
            children: HashMap::new(),
            free: (1..pages).rev().collect(),
            cached: BTreeSet::new(),
            clock: 0,
        }
    }

    /// What the book holds of `prompt`'s first `limit` tokens.
    pub fn lookup(&self, prompt: &[u32], limit: usize) -> Found {
        let prompt = &prompt[..limit.min(prompt.len())];
        let mut found = Found::default();
        let mut parent = None;
        for block in prompt.chunks_exact(BLOCK_TOKENS) {
            let tokens = block.try_into().expect("chunks_exact gives whole blocks");
            let Some(&page) = self.keyed.get(&PageKey { parent, tokens }) else {
                break;
            };
            found.shared.push(page);
            parent = Some((page, self.pages[page as usize].generation));
        }
        let rest = &prompt[found.shared.len() * BLOCK_TOKENS..];
        found.continued = self
            .children
            .get(&parent)
            .into_iter()
            .flatten()
            .filter(|&&page| self.pages[page as usize].holders == 0)
            .map(|&page| (page, self.common_start(page, rest)))
            .filter(|&(_, reused)| reused > 0)
            .max_by_key(|&(page, reused)| (reused, std::cmp::Reverse(page)));
        found
    }

    fn common_start(&self, page: u32, rest: &[u32]) -> usize {
        let known = self.pages[page as usize].known.as_ref();
        let tokens = known.map_or(&[][..], |k| &k.tokens);
        tokens.iter().zip(rest).take_while(|(a, b)| a == b).count()
    }

    /// Holds `found`'s pages (the shared ones with whoever holds them, the continued one
    /// alone) and enough other pages to make `total`, in position order; `None`, holding
    /// nothing, when too few pages are free or cached.
    pub fn reserve(&mut self, found: Found, total: usize) -> Option<Vec<u32>> {
        let idle_shared = found
            .shared
            .iter()
            .filter(|&&page| self.pages[page as usize].holders == 0)
            .count();
        let wanted = total.saturating_sub(found.shared.len());
        if self.free.len() + self.cached.len() - idle_shared < wanted {
            return None;
        }
        for &page in &found.shared {
            self.hold(page);
        }
        let mut pages = found.shared;
        if let Some((page, _)) = found.continued.filter(|_| wanted > 0) {
            self.cached
                .remove(&(self.pages[page as usize].released, page));
            self.give_out(page);
            pages.push(page);
        }
        while pages.len() < total {
            let page = self.take_unshared();
            pages.push(page);
        }
        Some(pages)
    }

    fn hold(&mut self, page: u32) {
        let entry = &mut self.pages[page as usize];
        if entry.holders == 0 {
            self.cached.remove(&(entry.released, page));
        }
        entry.holders += 1;
    }

    /// A free page, else the least recently released cached one.
    fn take_unshared(&mut self) -> u32 {
        let page = match self.free.pop() {
            Some(page) => page,
            None => {
                self.cached
                    .pop_first()
                    .expect("reserve counted the pages")
                    .1
            }
        };
        self.give_out(page);
        page
    }

    /// Gives `page` (held by nobody) to one sequence, which will write it: what was known of
    /// it is forgotten, and its generation moves on so that no key names it as a parent.
    fn give_out(&mut self, page: u32) {
        if let Some(known) = self.pages[page as usize].known.take() {
            if let Ok(tokens) = <[u32; BLOCK_TOKENS]>::try_from(known.tokens.as_slice()) {
                let key = PageKey {
                    parent: known.parent,
                    tokens,
                };
                if self.keyed.get(&key) == Some(&page) {
                    self.keyed.remove(&key);
                }
            }
            if let Some(siblings) = self.children.get_mut(&known.parent) {
                siblings.retain(|&p| p != page);
            }
        }
        let entry = &mut self.pages[page as usize];
        entry.generation += 1;
        entry.holders = 1;
    }

    /// Lets go of `pages` (one sequence's); those nobody else holds become cached (tokens
    /// known) or free.
    pub fn release(&mut self, pages: &[u32]) {
        self.clock += 1;
        for &page in pages {
            let entry = &mut self.pages[page as usize];
            entry.holders -= 1;
            if entry.holders > 0 {
                continue;
            }
            entry.released = self.clock;
            match entry.known {
                Some(_) => {
                    self.cached.insert((self.clock, page));
                }
                None => self.free.push(page),
            }
        }
    }

    /// Records that `page` holds `tokens` (1 to a page's worth) after `parent` (the sequence's
    /// page before it), so later prompts find it: by key when it is full. A page already
    /// known, or full with the tokens another page holds after the same parent, is left as is.
    pub fn register(&mut self, page: u32, parent: Option<u32>, tokens: &[u32]) {
        if tokens.is_empty() || tokens.len() > BLOCK_TOKENS {
            return;
        }
        if self.pages[page as usize].known.is_some() {
            return;
        }
        let parent = parent.map(|p| (p, self.pages[p as usize].generation));
        if let Ok(full) = <[u32; BLOCK_TOKENS]>::try_from(tokens) {
            let key = PageKey {
                parent,
                tokens: full,
            };
            if self.keyed.contains_key(&key) {
                return;
            }
            self.keyed.insert(key, page);
        }
        self.children.entry(parent).or_default().push(page);
        self.pages[page as usize].known = Some(Known {
            parent,
            tokens: tokens.to_vec(),
        });
    }

    /// Forgets everything known and frees every page.
    pub fn clear(&mut self) {
        let count = self.pages.len() as u32;
        for page in &mut self.pages {
            page.holders = 0;
            page.known = None;
            page.generation += 1;
        }
        self.keyed.clear();
        self.children.clear();
        self.cached.clear();
        self.free = (1..count).rev().collect();
    }

    /// Pages some sequence holds.
    pub fn held(&self) -> u64 {
        self.pages.iter().filter(|page| page.holders > 0).count() as u64
    }

    /// Pages kept only as the prefix cache.
    pub fn cached(&self) -> u64 {
        self.cached.len() as u64
    }

    /// Pages a reservation may take (the sink excluded).
    pub fn total(&self) -> u64 {
        self.pages.len() as u64 - 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const B: usize = BLOCK_TOKENS;

    fn tokens(count: usize, salt: u32) -> Vec<u32> {
        (0..count as u32).map(|i| i * 7 + salt).collect()
    }

    /// Reserves `total` pages for `prompt`, registers its full pages as computed, and
    /// returns the pages and how many of the prompt's tokens were found.
    fn run(book: &mut PageBook, prompt: &[u32], total: usize) -> (Vec<u32>, usize) {
        let found = book.lookup(prompt, prompt.len() - 1);
        let reused = found.tokens();
        let pages = book.reserve(found, total).expect("room");
        for (index, block) in prompt.chunks_exact(B).enumerate() {
            let parent = index.checked_sub(1).map(|i| pages[i]);
            book.register(pages[index], parent, block);
        }
        (pages, reused)
    }

    /// `run`, then the release of its pages with the last, partial one registered as the
    /// pool does.
    fn run_and_release(book: &mut PageBook, prompt: &[u32], total: usize) -> (Vec<u32>, usize) {
        let (pages, reused) = run(book, prompt, total);
        let last = prompt.len() / B;
        let parent = last.checked_sub(1).map(|i| pages[i]);
        book.register(pages[last], parent, &prompt[last * B..]);
        book.release(&pages);
        (pages, reused)
    }

    #[test]
    fn a_shared_prefix_is_found_and_held_not_copied() {
        let mut book = PageBook::new(20);
        let prompt = tokens(3 * B + 5, 1);
        let (first, reused) = run(&mut book, &prompt, 5);
        assert_eq!(reused, 0);
        assert_eq!(book.held(), 5);
        assert!(!first.contains(&0), "the sink is never handed out");
        // A second prompt with the same first two pages, running at the same time.
        let mut other = prompt[..2 * B].to_vec();
        other.extend(tokens(B + 3, 100));
        let (second, reused) = run(&mut book, &other, 4);
        assert_eq!(reused, 2 * B, "the held third page is not taken over");
        assert_eq!(second[..2], first[..2], "the same pages, held twice");
        assert_eq!(book.held(), 5 + 2, "two new pages only");
        book.release(&first);
        book.release(&second);
        assert_eq!(book.held(), 0);
        assert_eq!(book.cached(), 3 + 1, "every keyed page stays cached");
        // The whole first prompt again: its three full pages, not its last partial one.
        assert_eq!(book.lookup(&prompt, 3 * B).shared, first[..3]);
    }

    #[test]
    fn a_prompt_seen_before_is_reused_but_for_its_last_token_and_a_later_turn_wholly() {
        let mut book = PageBook::new(10);
        let prompt = tokens(2 * B + 5, 1);
        let (pages, _) = run_and_release(&mut book, &prompt, 3);
        // The last page held 5 known tokens: the same prompt takes it over for 4 of them.
        let found = book.lookup(&prompt, prompt.len() - 1);
        assert_eq!(found.shared, pages[..2]);
        assert_eq!(found.continued, Some((pages[2], 4)));
        assert_eq!(found.tokens(), prompt.len() - 1);
        // A next turn (the prompt and more) reuses all 5; the page is then that sequence's.
        let mut turn = prompt.clone();
        turn.extend(tokens(20, 50));
        let (taken, reused) = run(&mut book, &turn, 4);
        assert_eq!(reused, prompt.len());
        assert_eq!(taken[..3], pages[..]);
        let again = book.lookup(&prompt, prompt.len() - 1);
        assert_eq!(again.continued, None, "a held page is not taken over");
    }

    #[test]
    fn a_different_page_before_breaks_the_match() {
        let mut book = PageBook::new(10);
        let mut a = tokens(B, 1);
        a.extend(tokens(B + 1, 50));
        let mut b = tokens(B, 2);
        b.extend(tokens(B + 1, 50));
        let (pages_a, _) = run(&mut book, &a, 3);
        book.release(&pages_a);
        assert!(
            book.lookup(&b, 2 * B) == Found::default(),
            "b's first page differs"
        );
        assert_eq!(book.lookup(&a, 2 * B).shared.len(), 2);
    }

    #[test]
    fn eviction_takes_free_pages_first_then_the_oldest_cached_and_forgets_their_keys() {
        let mut book = PageBook::new(5); // 4 pages to give out
        let old = tokens(B + 1, 1);
        let new = tokens(B + 1, 2);
        let (pages_old, _) = run(&mut book, &old, 2);
        book.release(&pages_old);
        let (pages_new, _) = run(&mut book, &new, 2);
        book.release(&pages_new);
        assert_eq!(book.cached(), 2);
        // Three pages: the two free ones, then the oldest cached (old's first page).
        let (taken, _) = run(&mut book, &tokens(2, 3), 3);
        assert!(taken.contains(&pages_old[0]));
        assert!(
            book.lookup(&old, B) == Found::default(),
            "evicted, so no longer found"
        );
        assert_eq!(book.lookup(&new, B).shared, pages_new[..1]);
        // Only one page left: a reservation of two waits, holding nothing.
        assert!(book.reserve(Found::default(), 2).is_none());
        assert_eq!(book.held(), 3);
    }

    #[test]
    fn a_reused_parent_page_does_not_let_its_old_children_match() {
        let mut book = PageBook::new(4); // pages 1, 2 and 3
        let first = tokens(2 * B + 1, 1);
        let (pages, _) = run(&mut book, &first, 3);
        book.release(&pages);
        // The free page goes to someone else; the next reservation evicts `first`'s first
        // page and fills it with other tokens.
        let elsewhere = book.reserve(Found::default(), 1).expect("the free page");
        assert_eq!(elsewhere, pages[2..]);
        let other = tokens(B + 1, 9);
        let (taken, _) = run(&mut book, &other, 1);
        assert_eq!(taken, pages[..1]);
        // `first`'s second page was computed after `first`'s first block, not `other`'s: a
        // prompt of `other`'s block and then `first`'s second finds the first page only.
        let mut mixed = other[..B].to_vec();
        mixed.extend_from_slice(&first[B..2 * B]);
        assert_eq!(book.lookup(&mixed, 2 * B).shared, pages[..1]);
    }

    #[test]
    fn clear_forgets_everything() {
        let mut book = PageBook::new(6);
        let prompt = tokens(2 * B + 1, 1);
        run(&mut book, &prompt, 3);
        book.clear();
        assert_eq!((book.held(), book.cached()), (0, 0));
        assert!(book.lookup(&prompt, 2 * B) == Found::default());
        assert!(book.reserve(Found::default(), 5).is_some());
    }
}
