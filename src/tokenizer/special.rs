//! Splitting text around special-token text before the model tokenizer sees it.
//!
//! llama.cpp (`tokenizer_st_partition`) takes special tokens longest first and, for each, splits
//! every remaining text fragment at its occurrences, left to right. A shorter token therefore
//! never breaks up a longer one, wherever they sit. We find every occurrence at once with
//! Aho-Corasick and then accept them in that same priority order, which yields the same split
//! without one pass over the text per special token (Gemma 3 has about 6 400 of them).

use std::collections::{BTreeMap, BTreeSet};

use aho_corasick::{AhoCorasick, MatchKind};

use super::vocab::{ATTR_CONTROL, ATTR_RSTRIP, ATTR_UNKNOWN, ATTR_USER_DEFINED};

/// A piece of input: plain text for the model tokenizer, or one special token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fragment<'t> {
    Text(&'t str),
    Token(u32),
}

/// One automaton over a set of special tokens, with their priority ranks.
#[derive(Debug)]
struct Matcher {
    automaton: Option<AhoCorasick>,
    /// Token id for each automaton pattern.
    ids: Vec<u32>,
    /// Priority of each pattern: lower is taken first.
    ranks: Vec<usize>,
}

impl Matcher {
    fn new(ordered: &[(u32, &str)]) -> Matcher {
        let ids = ordered.iter().map(|&(id, _)| id).collect();
        let ranks = (0..ordered.len()).collect();
        let automaton = if ordered.is_empty() {
            None
        } else {
            AhoCorasick::builder()
                .match_kind(MatchKind::Standard)
                .build(ordered.iter().map(|&(_, text)| text))
                .ok()
        };
        Matcher {
            automaton,
            ids,
            ranks,
        }
    }

    fn partition<'t>(&self, text: &'t str, out: &mut Vec<Fragment<'t>>) {
        let Some(automaton) = &self.automaton else {
            out.push(Fragment::Text(text));
            return;
        };
        let mut hits: Vec<(usize, usize, usize)> = automaton
            .find_overlapping_iter(text)
            .map(|m| (self.ranks[m.pattern().as_usize()], m.start(), m.end()))
            .collect();
        hits.sort_unstable();
        let mut taken: BTreeMap<usize, (usize, u32)> = BTreeMap::new();
        for (rank, start, end) in hits {
            let overlaps_before = taken
                .range(..end)
                .next_back()
                .is_some_and(|(_, &(prev_end, _))| prev_end > start);
            if !overlaps_before {
                taken.insert(start, (end, self.ids[rank]));
            }
        }
        let mut cursor = 0;
        for (start, (end, id)) in taken {
            if start > cursor {
                out.push(Fragment::Text(&text[cursor..start]));
            }
            out.push(Fragment::Token(id));
            cursor = end;
        }
        if cursor < text.len() {
            out.push(Fragment::Text(&text[cursor..]));
        }
    }
}

/// Special-token splitting for one vocabulary.
#[derive(Debug)]
pub(crate) struct SpecialTokens {
    /// Control, user-defined and unknown tokens: used when parsing special text.
    all: Matcher,
    /// User-defined tokens only: always split out, even without special parsing (as HF does).
    user_defined: Matcher,
    /// Tokens that eat the whitespace after them (llama.cpp's `LLAMA_TOKEN_ATTR_RSTRIP`).
    rstrip: BTreeSet<u32>,
}

impl SpecialTokens {
    pub(crate) fn new(tokens: &[String], attrs: &[u32]) -> SpecialTokens {
        let mut ordered: Vec<(u32, &str, u32)> = tokens
            .iter()
            .zip(attrs)
            .enumerate()
            .filter(|(_, (_, &attr))| attr & (ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN) != 0)
            .map(|(id, (text, &attr))| (id as u32, text.as_str(), attr))
            .collect();
        // Longest first as llama.cpp; equal lengths by id so the order is deterministic.
        ordered.sort_by(|a, b| b.1.len().cmp(&a.1.len()).then(a.0.cmp(&b.0)));
        let all: Vec<(u32, &str)> = ordered.iter().map(|&(id, text, _)| (id, text)).collect();
        let user: Vec<(u32, &str)> = ordered
            .iter()
            .filter(|&&(_, _, attr)| attr & (ATTR_CONTROL | ATTR_UNKNOWN) == 0)
            .map(|&(id, text, _)| (id, text))
            .collect();
        let rstrip = ordered
            .iter()
            .filter(|&&(_, _, attr)| attr & ATTR_RSTRIP != 0)
            .map(|&(id, _, _)| id)
            .collect();
        SpecialTokens {
            all: Matcher::new(&all),
            user_defined: Matcher::new(&user),
            rstrip,
        }
    }

    /// Splits `text` into plain-text and special-token fragments.
    pub(crate) fn partition<'t>(&self, text: &'t str, parse_special: bool) -> Vec<Fragment<'t>> {
        let mut out = Vec::new();
        if text.is_empty() {
            return out;
        }
        let matcher = if parse_special {
            &self.all
        } else {
            &self.user_defined
        };
        matcher.partition(text, &mut out);
        self.strip_after_rstrip_tokens(out)
    }

    /// Drops the whitespace (C's `isspace`) that starts a text fragment after an RSTRIP token,
    /// and the fragment if nothing is left, as llama.cpp trims the right remainder of a match.
    fn strip_after_rstrip_tokens<'t>(&self, fragments: Vec<Fragment<'t>>) -> Vec<Fragment<'t>> {
        if self.rstrip.is_empty() {
            return fragments;
        }
        let mut out = Vec::with_capacity(fragments.len());
        let mut strip_next = false;
        for fragment in fragments {
            match fragment {
                Fragment::Token(id) => {
                    strip_next = self.rstrip.contains(&id);
                    out.push(fragment);
                }
                Fragment::Text(piece) => {
                    let piece = if strip_next {
                        piece.trim_start_matches([' ', '\t', '\n', '\x0b', '\x0c', '\r'])
                    } else {
                        piece
                    };
                    strip_next = false;
                    if !piece.is_empty() {
                        out.push(Fragment::Text(piece));
                    }
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::vocab::ATTR_NORMAL;

    fn specials(list: &[(&str, u32)]) -> SpecialTokens {
        let tokens: Vec<String> = list.iter().map(|(t, _)| t.to_string()).collect();
        let attrs: Vec<u32> = list.iter().map(|&(_, a)| a).collect();
        SpecialTokens::new(&tokens, &attrs)
    }

    #[test]
    fn longer_token_wins_wherever_it_sits() {
        // "<a>" occurs first, but the longer "a><b" takes priority, as in llama.cpp.
        let s = specials(&[
            ("<a>", ATTR_CONTROL),
            ("a><b", ATTR_CONTROL),
            ("x", ATTR_NORMAL),
        ]);
        assert_eq!(
            s.partition("<a><b>", true),
            vec![Fragment::Text("<"), Fragment::Token(1), Fragment::Text(">")]
        );
    }

    #[test]
    fn control_tokens_need_parse_special() {
        let s = specials(&[("<|im_end|>", ATTR_CONTROL), ("<tool>", ATTR_USER_DEFINED)]);
        assert_eq!(
            s.partition("a<|im_end|><tool>", false),
            vec![Fragment::Text("a<|im_end|>"), Fragment::Token(1)]
        );
        assert_eq!(
            s.partition("a<|im_end|><tool>", true),
            vec![Fragment::Text("a"), Fragment::Token(0), Fragment::Token(1)]
        );
    }

    #[test]
    fn rstrip_tokens_eat_the_whitespace_after_them() {
        let s = specials(&[
            ("<|im_end|>", ATTR_CONTROL | ATTR_RSTRIP),
            ("<|im_start|>", ATTR_CONTROL),
        ]);
        assert_eq!(
            s.partition("a<|im_end|>\n \tb<|im_start|> c<|im_end|>\n", true),
            vec![
                Fragment::Text("a"),
                Fragment::Token(0),
                Fragment::Text("b"),
                Fragment::Token(1),
                Fragment::Text(" c"),
                Fragment::Token(0)
            ]
        );
    }

    #[test]
    fn repeated_and_adjacent_occurrences() {
        let s = specials(&[("\n\n", ATTR_USER_DEFINED), ("\n", ATTR_USER_DEFINED)]);
        assert_eq!(
            s.partition("\n\n\nx\n", false),
            vec![
                Fragment::Token(0),
                Fragment::Token(1),
                Fragment::Text("x"),
                Fragment::Token(1)
            ]
        );
    }
}
