//! Byte-level BPE (GPT-2 style), merging by rank as llama.cpp's `llm_tokenizer_bpe_session`.
//!
//! Strings are interned: every vocab token keeps its id, and merge halves or results that are not
//! tokens get ids past the vocabulary. Merges are then looked up by a pair of ids, so the merge
//! loop never allocates a string.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use rustc_hash::FxHashMap;

use super::index::TokenIndex;
use super::pretokenize::{PreTokenizer, PreTokenizerKind};
use super::unicode::byte_to_char_table;
use super::TokenizerError;

/// A merge rule: its rank (lower merges first) and the id of the merged string.
#[derive(Clone, Copy, Debug)]
struct Merge {
    rank: u32,
    merged: u32,
}

#[derive(Debug)]
pub(crate) struct BpeModel {
    pretokenizer: PreTokenizer,
    /// Whole words found in the vocab skip merging (Llama 3).
    ignore_merges: bool,
    /// Strings that appear in merges but are not vocab tokens, with ids from the vocab size up.
    extra: FxHashMap<Box<str>, u32>,
    merges: FxHashMap<(u32, u32), Merge>,
}

/// A candidate merge `(rank, left, right, left id, right id)`; `Reverse` makes the heap pop the
/// lowest rank first, ties to the leftmost pair, like llama.cpp's comparator.
type PendingMerge = Reverse<(u32, usize, usize, u32, u32)>;

/// One symbol of a word being merged: a byte range of the word and its interned id.
#[derive(Clone, Copy, Debug)]
struct Symbol {
    start: usize,
    len: usize,
    id: Option<u32>,
    prev: Option<usize>,
    next: Option<usize>,
}

impl BpeModel {
    pub(crate) fn new(
        vocab: &TokenIndex,
        merges: &[String],
        pre: PreTokenizerKind,
    ) -> Result<BpeModel, TokenizerError> {
        let mut model = BpeModel {
            pretokenizer: PreTokenizer::new(pre)?,
            ignore_merges: pre == PreTokenizerKind::Llama3,
            extra: FxHashMap::default(),
            merges: FxHashMap::with_capacity_and_hasher(merges.len(), Default::default()),
        };
        let mut joined = String::new();
        for (rank, rule) in merges.iter().enumerate() {
            // llama.cpp splits at the first space after the first byte; rules without one
            // merge two empty strings and can never apply.
            let bytes = rule.as_bytes();
            let Some(split) = bytes.iter().skip(1).position(|&b| b == b' ').map(|p| p + 1) else {
                continue;
            };
            let (left, right) = (&rule[..split], &rule[split + 1..]);
            let left_id = model.intern(vocab, left);
            let right_id = model.intern(vocab, right);
            joined.clear();
            joined.push_str(left);
            joined.push_str(right);
            let merged_id = model.intern(vocab, &joined);
            // The first (lowest-ranked) rule for a pair wins, like `bpe_ranks.emplace`.
            model.merges.entry((left_id, right_id)).or_insert(Merge {
                rank: rank as u32,
                merged: merged_id,
            });
        }
        Ok(model)
    }

    fn intern(&mut self, vocab: &TokenIndex, text: &str) -> u32 {
        if let Some(id) = vocab.get(text) {
            return id;
        }
        let next = (vocab.len() + self.extra.len()) as u32;
        *self.extra.entry(text.into()).or_insert(next)
    }

    fn lookup(&self, vocab: &TokenIndex, text: &str) -> Option<u32> {
        vocab.get(text).or_else(|| self.extra.get(text).copied())
    }

    /// Tokenizes plain text (no special tokens), appending ids to `out`.
    pub(crate) fn encode(&self, vocab: &TokenIndex, text: &str, out: &mut Vec<u32>) {
        let byte_chars = byte_to_char_table();
        let mut encoded = String::new();
        for word in self.pretokenizer.split(text) {
            encoded.clear();
            encoded.extend(word.bytes().map(|b| byte_chars[b as usize]));
            if self.ignore_merges {
                if let Some(id) = vocab.get(&encoded) {
                    out.push(id);
                    continue;
                }
            }
            self.encode_word(vocab, &encoded, out);
        }
    }

    fn encode_word(&self, vocab: &TokenIndex, word: &str, out: &mut Vec<u32>) {
        let mut symbols: Vec<Symbol> = Vec::with_capacity(word.len());
        for (start, c) in word.char_indices() {
            let len = c.len_utf8();
            let index = symbols.len();
            symbols.push(Symbol {
                start,
                len,
                id: self.lookup(vocab, &word[start..start + len]),
                prev: index.checked_sub(1),
                next: (start + len < word.len()).then_some(index + 1),
            });
        }
        let mut queue: BinaryHeap<PendingMerge> = BinaryHeap::new();
        let push_pair =
            |queue: &mut BinaryHeap<_>, symbols: &[Symbol], left: usize, right: usize| {
                if let (Some(l), Some(r)) = (symbols[left].id, symbols[right].id) {
                    if let Some(m) = self.merges.get(&(l, r)) {
                        queue.push(Reverse((m.rank, left, right, l, r)));
                    }
                }
            };
        for i in 1..symbols.len() {
            push_pair(&mut queue, &symbols, i - 1, i);
        }
        while let Some(Reverse((_, left, right, left_id, right_id))) = queue.pop() {
            let (l, r) = (symbols[left], symbols[right]);
            // Skip pairs made stale by an earlier merge.
            if l.len == 0 || r.len == 0 || l.id != Some(left_id) || r.id != Some(right_id) {
                continue;
            }
            let Some(merge) = self.merges.get(&(left_id, right_id)) else {
                continue;
            };
            symbols[left].len += r.len;
            symbols[left].id = Some(merge.merged);
            symbols[left].next = r.next;
            symbols[right].len = 0;
            if let Some(next) = r.next {
                symbols[next].prev = Some(left);
            }
            if let Some(prev) = l.prev {
                push_pair(&mut queue, &symbols, prev, left);
            }
            if let Some(next) = r.next {
                push_pair(&mut queue, &symbols, left, next);
            }
        }
        for symbol in symbols.iter().filter(|s| s.len > 0) {
            match symbol.id.filter(|&id| (id as usize) < vocab.len()) {
                Some(id) => out.push(id),
                None => {
                    // Not a token: fall back to single-byte tokens, dropping bytes without one
                    // (llama.cpp does the same).
                    let text = &word[symbol.start..symbol.start + symbol.len];
                    let mut buf = [0u8; 4];
                    for b in text.bytes() {
                        let c = char::from(b);
                        let single = if b < 0x80 {
                            c.encode_utf8(&mut buf) as &str
                        } else {
                            ""
                        };
                        if let Some(id) = vocab.get(single) {
                            out.push(id);
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(tokens: &[&str], merges: &[&str]) -> (BpeModel, TokenIndex) {
        let index =
            TokenIndex::new(tokens.iter().map(|t| t.to_string()).collect()).expect("unique");
        let merges: Vec<String> = merges.iter().map(|m| m.to_string()).collect();
        let m = BpeModel::new(&index, &merges, PreTokenizerKind::Gpt2).expect("builds");
        (m, index)
    }

    #[test]
    fn merges_apply_by_rank_not_position() {
        // "abc": rank 0 is "b c", so "bc" forms before "a b" could.
        let (m, map) = model(&["a", "b", "c", "ab", "bc", "abc"], &["b c", "a b", "a bc"]);
        let mut out = Vec::new();
        m.encode(&map, "abc", &mut out);
        assert_eq!(out, vec![5]);
        let (m, map) = model(&["a", "b", "c", "ab", "bc"], &["a b", "b c"]);
        let mut out = Vec::new();
        m.encode(&map, "abc", &mut out);
        assert_eq!(out, vec![3, 2]);
    }

    #[test]
    fn spaces_are_byte_encoded() {
        let (m, map) = model(&["a", "Ġ", "Ġa"], &["Ġ a"]);
        let mut out = Vec::new();
        m.encode(&map, "a a", &mut out);
        assert_eq!(out, vec![0, 2]);
    }

    #[test]
    fn merge_through_non_token_intermediate() {
        // "xy" is not a token, but the rule chain still reaches "xyz".
        let (m, map) = model(&["x", "y", "z", "xyz"], &["x y", "xy z"]);
        let mut out = Vec::new();
        m.encode(&map, "xyz", &mut out);
        assert_eq!(out, vec![3]);
        // Stopping at a non-token falls back to single bytes.
        let mut out = Vec::new();
        m.encode(&map, "xy", &mut out);
        assert_eq!(out, vec![0, 1]);
    }
}
