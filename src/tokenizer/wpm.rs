//! WordPiece (BERT) as llama.cpp's `llm_tokenizer_wpm`: normalise (optional lowercase and
//! accent stripping), split into words at whitespace and around punctuation, ASCII symbols and
//! CJK ideographs, then cover each word greedily with the longest vocabulary tokens.
//!
//! llama.cpp's GGUF converter stores word-initial pieces with a leading `▁` and continuation
//! pieces (`##ing`) bare, so each word is matched as `▁word`. A word that cannot be covered
//! completely becomes one unknown token.

use super::index::TokenIndex;
use super::spm::SPACE_MARK;
use super::unicode::flags_of;

/// BERT's normaliser options (`tokenizer.ggml.normalizer.*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Normalizer {
    pub lowercase: bool,
    pub strip_accents: bool,
}

#[derive(Debug)]
pub(crate) struct WpmModel {
    /// Longest token in bytes: no match can be longer.
    max_token_len: usize,
    unk: Option<u32>,
    normalizer: Normalizer,
}

impl WpmModel {
    pub(crate) fn new(vocab: &TokenIndex, unk: Option<u32>, normalizer: Normalizer) -> WpmModel {
        let max_token_len = vocab.texts().iter().map(String::len).max().unwrap_or(0);
        WpmModel {
            max_token_len,
            unk,
            normalizer,
        }
    }

    /// Tokenizes one fragment of raw text (special tokens already split off), appending ids.
    pub(crate) fn encode(&self, vocab: &TokenIndex, text: &str, out: &mut Vec<u32>) {
        for word in words(text, self.normalizer) {
            let marked = format!("{SPACE_MARK}{word}");
            let before = out.len();
            if !self.cover(vocab, &marked, out) {
                out.truncate(before);
            }
            if out.len() == before {
                out.extend(self.unk);
            }
        }
    }

    /// Greedy longest-match cover of `word`; false (with partial output) when some position
    /// starts no token.
    fn cover(&self, vocab: &TokenIndex, word: &str, out: &mut Vec<u32>) -> bool {
        let mut start = 0;
        while start < word.len() {
            let longest = word.len().min(start + self.max_token_len);
            let found = (start + 1..=longest)
                .rev()
                .filter(|&end| word.is_char_boundary(end))
                .find_map(|end| vocab.get(&word[start..end]).map(|id| (id, end)));
            let Some((id, end)) = found else {
                return false;
            };
            out.push(id);
            start = end;
        }
        true
    }
}

/// BERT's pre-tokenization: normalised words, each punctuation mark, ASCII symbol and CJK
/// ideograph a word of its own; NUL, U+FFFD and control characters dropped.
pub(crate) fn words(text: &str, normalizer: Normalizer) -> Vec<String> {
    let mut words = vec![String::new()];
    for raw in text.chars() {
        let c = if normalizer.strip_accents {
            first_of_nfd(raw)
        } else {
            raw
        };
        let flags = flags_of(c);
        if flags.is_whitespace() {
            if !words.last().is_some_and(String::is_empty) {
                words.push(String::new());
            }
            continue;
        }
        if c == '\0' || c == '\u{FFFD}' || flags.is_control() {
            continue;
        }
        if normalizer.strip_accents && flags.is_accent_mark() {
            continue;
        }
        let alone = flags.is_punctuation() || (c < '\u{7F}' && flags.is_symbol()) || is_cjk(c);
        let c = if normalizer.lowercase {
            first_of_lowercase(c)
        } else {
            c
        };
        let current = words.last_mut().expect("words is never empty");
        if alone {
            if !current.is_empty() {
                words.push(String::new());
            }
            let current = words.last_mut().expect("just pushed");
            current.push(c);
            words.push(String::new());
        } else {
            current.push(c);
        }
    }
    words.retain(|w| !w.is_empty());
    words
}

/// llama.cpp's NFD maps each character to the first character of its canonical decomposition.
fn first_of_nfd(c: char) -> char {
    let mut first = None;
    unicode_normalization::char::decompose_canonical(c, |d| {
        first.get_or_insert(d);
    });
    first.unwrap_or(c)
}

/// llama.cpp's lowercase map keeps the first character of the full lowercase mapping.
fn first_of_lowercase(c: char) -> char {
    c.to_lowercase().next().unwrap_or(c)
}

/// The CJK ranges BERT splits per character (as Hugging Face's, including its 0x2B920 typo).
fn is_cjk(c: char) -> bool {
    const RANGES: [(u32, u32); 8] = [
        (0x4E00, 0x9FFF),
        (0x3400, 0x4DBF),
        (0x20000, 0x2A6DF),
        (0x2A700, 0x2B73F),
        (0x2B740, 0x2B81F),
        (0x2B920, 0x2CEAF),
        (0xF900, 0xFAFF),
        (0x2F800, 0x2FA1F),
    ];
    let cp = c as u32;
    RANGES.iter().any(|&(lo, hi)| (lo..=hi).contains(&cp))
}

#[cfg(test)]
mod tests {
    use super::*;

    const UNCASED: Normalizer = Normalizer {
        lowercase: true,
        strip_accents: true,
    };

    fn vocab(texts: &[&str]) -> TokenIndex {
        TokenIndex::new(texts.iter().map(|t| t.to_string()).collect()).expect("unique")
    }

    #[test]
    fn words_split_at_spaces_punctuation_and_ideographs() {
        let got = words("Héllo, wörld!  a$b\u{7}c 日本 x\u{301}", UNCASED);
        let want = ["hello", ",", "world", "!", "a", "$", "bc", "日", "本", "x"];
        assert_eq!(got, want);
        let cased = Normalizer {
            lowercase: false,
            strip_accents: false,
        };
        assert_eq!(words("Héllo €5", cased), ["Héllo", "€5"], "€ is not ASCII");
    }

    #[test]
    fn longest_match_with_continuations_and_unknown_words() {
        let v = vocab(&["[UNK]", "▁un", "▁unaff", "able", "aff", "▁a", "▁!", "x"]);
        let model = WpmModel::new(&v, Some(0), UNCASED);
        let mut out = Vec::new();
        model.encode(&v, "Unaffable! unzz a", &mut out);
        assert_eq!(out, vec![2, 3, 6, 0, 5]);
    }
}
