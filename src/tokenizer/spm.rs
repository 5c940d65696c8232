//! SentencePiece (BPE with scores) as llama.cpp's `llm_tokenizer_spm`: start from UTF-8
//! characters, repeatedly merge the adjacent pair whose concatenation is the highest-scoring
//! token, and emit `<0xNN>` byte tokens for whatever is left that is not a token.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use super::index::TokenIndex;

/// Escaped space, as SentencePiece writes it.
pub(crate) const SPACE_MARK: char = '\u{2581}';

#[derive(Debug)]
pub(crate) struct SpmModel {
    /// Token for each byte value, from `<0xNN>` (or the bare byte), else the unknown token.
    byte_tokens: Vec<Option<u32>>,
}

#[derive(Clone, Copy, Debug)]
struct Symbol {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

/// A candidate merge; the heap pops the highest score, ties going to the leftmost pair.
#[derive(Clone, Copy, Debug)]
struct Bigram {
    score: f32,
    left: usize,
    right: usize,
    size: usize,
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Bigram {}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Bigram {
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .total_cmp(&other.score)
            .then_with(|| other.left.cmp(&self.left))
    }
}

impl SpmModel {
    pub(crate) fn new(vocab: &TokenIndex, unk: Option<u32>) -> SpmModel {
        let mut byte_tokens = vec![None; 256];
        for (b, slot) in byte_tokens.iter_mut().enumerate() {
            let hex = format!("<0x{b:02X}>");
            let bare = (b < 0x80).then(|| char::from(b as u8).to_string());
            *slot = vocab
                .get(&hex)
                .or_else(|| bare.and_then(|s| vocab.get(&s)))
                .or(unk);
        }
        SpmModel { byte_tokens }
    }

    /// Tokenizes already-escaped text (spaces as U+2581), appending ids to `out`.
    pub(crate) fn encode(
        &self,
        vocab: &TokenIndex,
        scores: &[f32],
        text: &str,
        out: &mut Vec<u32>,
    ) {
        let mut symbols: Vec<Symbol> = Vec::with_capacity(text.len());
        for (start, c) in text.char_indices() {
            let index = symbols.len();
            let len = c.len_utf8();
            symbols.push(Symbol {
                start,
                len,
                prev: index.checked_sub(1),
                next: (start + len < text.len()).then_some(index + 1),
            });
        }
        let mut queue = BinaryHeap::new();
        let try_add =
            |queue: &mut BinaryHeap<Bigram>, symbols: &[Symbol], left: usize, right: usize| {
                let (l, r) = (symbols[left], symbols[right]);
                let joined = &text[l.start..r.start + r.len];
                if let Some(id) = vocab.get(joined) {
                    queue.push(Bigram {
                        score: scores.get(id as usize).copied().unwrap_or(0.0),
                        left,
                        right,
                        size: joined.len(),
                    });
                }
            };
        for i in 1..symbols.len() {
            try_add(&mut queue, &symbols, i - 1, i);
        }
        while let Some(bigram) = queue.pop() {
            let (l, r) = (symbols[bigram.left], symbols[bigram.right]);
            // Symbols only grow, so a size change means the pair went stale.
            if l.len == 0 || r.len == 0 || l.len + r.len != bigram.size {
                continue;
            }
            symbols[bigram.left].len += r.len;
            symbols[bigram.left].next = r.next;
            symbols[bigram.right].len = 0;
            if let Some(next) = r.next {
                symbols[next].prev = Some(bigram.left);
            }
            if let Some(prev) = l.prev {
                try_add(&mut queue, &symbols, prev, bigram.left);
            }
            if let Some(next) = r.next {
                try_add(&mut queue, &symbols, bigram.left, next);
            }
        }
        let mut index = (!symbols.is_empty()).then_some(0);
        while let Some(i) = index {
            let s = symbols[i];
            let piece = &text[s.start..s.start + s.len];
            match vocab.get(piece) {
                Some(id) => out.push(id),
                None => out.extend(piece.bytes().filter_map(|b| self.byte_tokens[b as usize])),
            }
            index = s.next;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vocab(tokens: &[(&str, f32)]) -> (TokenIndex, Vec<f32>) {
        let index = TokenIndex::new(tokens.iter().map(|(t, _)| t.to_string()).collect());
        (
            index.expect("unique"),
            tokens.iter().map(|&(_, s)| s).collect(),
        )
    }

    #[test]
    fn highest_score_merges_first() {
        let (map, scores) = vocab(&[
            ("a", 0.0),
            ("b", 0.0),
            ("c", 0.0),
            ("ab", -5.0),
            ("bc", -1.0),
        ]);
        let model = SpmModel::new(&map, None);
        let mut out = Vec::new();
        model.encode(&map, &scores, "abc", &mut out);
        assert_eq!(out, vec![0, 4]);
    }

    #[test]
    fn unknown_characters_fall_back_to_bytes() {
        let mut tokens: Vec<(String, f32)> = vec![("▁".into(), 0.0)];
        tokens.extend((0..256).map(|b| (format!("<0x{b:02X}>"), 0.0)));
        let refs: Vec<(&str, f32)> = tokens.iter().map(|(t, s)| (t.as_str(), *s)).collect();
        let (map, scores) = vocab(&refs);
        let model = SpmModel::new(&map, None);
        let mut out = Vec::new();
        model.encode(&map, &scores, "▁é", &mut out);
        assert_eq!(out, vec![0, 1 + 0xC3, 1 + 0xA9]);
    }
}
