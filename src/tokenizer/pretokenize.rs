//! Byte-level BPE pre-tokenizers: split text into words before merges run.
//!
//! Mirrors llama.cpp's `unicode_regex_split`: a pre-tokenizer is a list of splitters applied in
//! turn, each re-splitting every fragment the previous one produced; text a regex does not match
//! stays as fragments of its own. llama.cpp runs the GPT-2 and Llama-3 patterns through
//! hand-written matchers (with their own corner cases), and every other pattern through a regex
//! engine; we do the same so the words, and so the ids, come out identical.

use fancy_regex::Regex;

use super::unicode::{flags_of, CpFlags};
use super::TokenizerError;

/// llama.cpp's GPT-2 pattern; matched by [`split_gpt2`].
const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";

/// Qwen2's pattern with the case-insensitive group spelled out, as llama.cpp has it.
const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// llama.cpp's patterns for a vocabulary whose `pre` is `default` or missing.
const DEFAULT_PUNCT: &str = r"[\p{P}\$\+<=>\^~\|]+";
const DEFAULT_NUMBERS: &str = r"\p{N}+";
const DEFAULT_DIGIT_TRIPLES: &str = r"[0-9][0-9][0-9]";

/// One splitting step.
#[derive(Debug)]
enum Splitter {
    /// llama.cpp's hand-written GPT-2 matcher.
    Gpt2,
    /// llama.cpp's hand-written Llama-3 matcher.
    Llama3,
    /// A general regex, matched within each fragment.
    Regex(Box<Regex>),
}

/// Which pre-tokenizer a `tokenizer.ggml.pre` value selects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PreTokenizerKind {
    /// `gpt-2` and relatives: the GPT-2 pattern alone.
    Gpt2,
    /// `llama-bpe` / `llama3`: the Llama-3 pattern; whole words found in the vocab skip merges.
    Llama3,
    /// `qwen2` and relatives.
    Qwen2,
    /// `smollm`, `starcoder` and relatives: digits split one by one, then GPT-2.
    Smollm,
    /// `default` or no `pre` key: llama.cpp's four-pattern default.
    Default,
}

impl PreTokenizerKind {
    /// Maps a `tokenizer.ggml.pre` value; `None` for a name llama.cpp does not know here.
    pub fn from_name(pre: Option<&str>) -> Option<PreTokenizerKind> {
        let kind = match pre {
            None | Some("default") => PreTokenizerKind::Default,
            Some(
                "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "pixtral" | "dbrx" | "smaug-bpe",
            ) => PreTokenizerKind::Llama3,
            Some("qwen2" | "deepseek-r1-qwen" | "stablelm2" | "megrez") => PreTokenizerKind::Qwen2,
            Some(
                "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone"
                | "minerva-7b",
            ) => PreTokenizerKind::Smollm,
            Some(
                "gpt-2" | "phi-2" | "jina-es" | "jina-de" | "gigachat" | "jina-v2-es"
                | "jina-v2-de" | "mpt" | "olmo" | "jais" | "exaone4",
            ) => PreTokenizerKind::Gpt2,
            Some(_) => return None,
        };
        Some(kind)
    }
}

/// A compiled pre-tokenizer.
#[derive(Debug)]
pub(crate) struct PreTokenizer {
    splitters: Vec<Splitter>,
}

fn compile(pattern: &str) -> Result<Splitter, TokenizerError> {
    Regex::new(pattern)
        .map(|re| Splitter::Regex(Box::new(re)))
        .map_err(|e| TokenizerError::Pretokenizer(format!("{pattern}: {e}")))
}

impl PreTokenizer {
    pub(crate) fn new(kind: PreTokenizerKind) -> Result<PreTokenizer, TokenizerError> {
        let splitters = match kind {
            PreTokenizerKind::Gpt2 => vec![Splitter::Gpt2],
            PreTokenizerKind::Llama3 => vec![Splitter::Llama3],
            PreTokenizerKind::Qwen2 => vec![compile(QWEN2)?],
            PreTokenizerKind::Smollm => vec![compile(r"\p{N}")?, Splitter::Gpt2],
            PreTokenizerKind::Default => vec![
                compile(DEFAULT_PUNCT)?,
                compile(GPT2)?,
                compile(DEFAULT_NUMBERS)?,
                compile(DEFAULT_DIGIT_TRIPLES)?,
            ],
        };
        Ok(PreTokenizer { splitters })
    }

    /// Splits `text` into words (consecutive, non-empty, covering all of `text`).
    pub(crate) fn split<'t>(&self, text: &'t str) -> Vec<&'t str> {
        let mut bounds: Vec<(usize, usize)> = vec![(0, text.len())];
        for splitter in &self.splitters {
            let mut next = Vec::with_capacity(bounds.len() * 2);
            for &(start, end) in &bounds {
                let piece = &text[start..end];
                let before = next.len();
                match splitter {
                    Splitter::Gpt2 => split_custom(piece, gpt2_word_end, &mut next),
                    Splitter::Llama3 => split_custom(piece, llama3_word_end, &mut next),
                    Splitter::Regex(re) => split_regex(re, piece, &mut next),
                }
                for b in &mut next[before..] {
                    b.0 += start;
                    b.1 += start;
                }
            }
            bounds = next;
        }
        bounds.into_iter().map(|(s, e)| &text[s..e]).collect()
    }
}

/// Regex split like `std::regex_iterator` in llama.cpp: matches and the gaps between them.
fn split_regex(re: &Regex, piece: &str, out: &mut Vec<(usize, usize)>) {
    let mut last = 0;
    for found in re.find_iter(piece) {
        // A backtracking limit hit leaves the rest of the fragment as one word.
        let Ok(m) = found else { break };
        if m.start() == m.end() {
            continue;
        }
        if m.start() > last {
            out.push((last, m.start()));
        }
        out.push((m.start(), m.end()));
        last = m.end();
    }
    if last < piece.len() {
        out.push((last, piece.len()));
    }
}

/// The codepoints of one fragment, with flags that read as out-of-range past either end.
struct Cursor {
    chars: Vec<char>,
    flags: Vec<CpFlags>,
}

impl Cursor {
    fn new(piece: &str) -> Cursor {
        let chars: Vec<char> = piece.chars().collect();
        let flags = chars.iter().map(|&c| flags_of(c)).collect();
        Cursor { chars, flags }
    }
    fn len(&self) -> usize {
        self.chars.len()
    }
    fn cpt(&self, pos: usize) -> Option<char> {
        self.chars.get(pos).copied()
    }
    fn flags(&self, pos: usize) -> CpFlags {
        self.flags
            .get(pos)
            .copied()
            .unwrap_or(CpFlags::OUT_OF_RANGE)
    }
    fn is_symbol(&self, pos: usize) -> bool {
        let f = self.flags(pos);
        f.in_range() && !(f.is_whitespace() || f.is_letter() || f.is_number())
    }
    /// Length of a contraction (`'s`, `'ll`, ...) starting at `pos`, if any.
    fn contraction(&self, pos: usize, fold_case: bool) -> Option<usize> {
        if self.cpt(pos) != Some('\'') || pos + 1 >= self.len() {
            return None;
        }
        let fold = |c: Option<char>| c.map(|c| if fold_case { c.to_ascii_lowercase() } else { c });
        let next = fold(self.cpt(pos + 1));
        if matches!(next, Some('s' | 't' | 'm' | 'd')) {
            return Some(2);
        }
        if pos + 2 < self.len() {
            let pair = (next, fold(self.cpt(pos + 2)));
            if matches!(
                pair,
                (Some('r'), Some('e')) | (Some('v'), Some('e')) | (Some('l'), Some('l'))
            ) {
                return Some(3);
            }
        }
        None
    }
    fn skip_while(&self, mut pos: usize, keep: impl Fn(CpFlags) -> bool) -> usize {
        while keep(self.flags(pos)) {
            pos += 1;
        }
        pos
    }
    /// `\s+(?!\S)|\s+` at `pos`: the end of the whitespace word, or `None` if no whitespace.
    fn whitespace_end(&self, pos: usize) -> Option<usize> {
        let count = self.skip_while(pos, |f| f.is_whitespace()) - pos;
        if count > 1 && self.cpt(pos + count).is_some() {
            Some(pos + count - 1)
        } else if count > 0 {
            Some(pos + count)
        } else {
            None
        }
    }
}

/// Runs a hand-written matcher over a fragment, emitting word boundaries in byte offsets.
fn split_custom(piece: &str, word_end: fn(&Cursor, usize) -> usize, out: &mut Vec<(usize, usize)>) {
    let cursor = Cursor::new(piece);
    let mut byte_at = Vec::with_capacity(cursor.len() + 1);
    let mut offset = 0;
    for c in &cursor.chars {
        byte_at.push(offset);
        offset += c.len_utf8();
    }
    byte_at.push(offset);
    let mut pos = 0;
    while pos < cursor.len() {
        // Every matcher consumes at least one codepoint, so this loop terminates.
        let end = word_end(&cursor, pos).clamp(pos + 1, cursor.len());
        out.push((byte_at[pos], byte_at[end]));
        pos = end;
    }
}

/// GPT-2: `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`.
fn gpt2_word_end(cur: &Cursor, pos: usize) -> usize {
    if let Some(len) = cur.contraction(pos, false) {
        return pos + len;
    }
    let space = cur.cpt(pos) == Some(' ');
    let lead = if space { pos + 1 } else { pos };
    let f = cur.flags(lead);
    if f.is_letter() {
        return cur.skip_while(lead, |f| f.is_letter());
    }
    if f.is_number() {
        return cur.skip_while(lead, |f| f.is_number());
    }
    if cur.is_symbol(lead) {
        return cur.skip_while(lead, |f| {
            f.in_range() && !(f.is_whitespace() || f.is_letter() || f.is_number())
        });
    }
    cur.whitespace_end(pos).unwrap_or(pos + 1)
}

/// Llama 3: `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
/// ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`.
fn llama3_word_end(cur: &Cursor, pos: usize) -> usize {
    if let Some(len) = cur.contraction(pos, true) {
        return pos + len;
    }
    let c = cur.cpt(pos);
    let f = cur.flags(pos);
    let newline = |c: Option<char>| matches!(c, Some('\r' | '\n'));
    if !(newline(c) || f.is_number()) && (f.is_letter() || cur.flags(pos + 1).is_letter()) {
        return cur.skip_while(pos + 1, |f| f.is_letter());
    }
    if f.is_number() {
        return cur.skip_while(pos, |f| f.is_number()).min(pos + 3);
    }
    let lead = if c == Some(' ') { pos + 1 } else { pos };
    let f2 = cur.flags(lead);
    // llama.cpp tests the first codepoint's range bit here, so a lone trailing space lands
    // in this branch as a one-codepoint word.
    if !(f2.is_whitespace() || f2.is_letter() || f2.is_number()) && f.in_range() {
        let mut end = cur.skip_while(lead, |f| {
            f.in_range() && !(f.is_whitespace() || f.is_letter() || f.is_number())
        });
        while newline(cur.cpt(end)) {
            end += 1;
        }
        return end;
    }
    let ws_end = cur.skip_while(pos, |f| f.is_whitespace());
    if let Some(last_newline) = (pos..ws_end).rev().find(|&p| newline(cur.cpt(p))) {
        return last_newline + 1;
    }
    cur.whitespace_end(pos).unwrap_or(pos + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(kind: PreTokenizerKind, text: &str) -> Vec<String> {
        PreTokenizer::new(kind)
            .expect("patterns compile")
            .split(text)
            .into_iter()
            .map(str::to_owned)
            .collect()
    }

    #[test]
    fn gpt2_matcher_agrees_with_the_regex() {
        let samples = [
            "Hello world",
            "I'm can't won't they'll we've he'd",
            "  leading and trailing   ",
            "tabs\tand\nnewlines\n\n",
            "naïve café 12345 x=1+2; ☃☃ 😀👍🏽",
            "'S 'LL 'x '",
            "a  b   c",
        ];
        let regex = Regex::new(&format!("{GPT2}|\\s+")).expect("pattern compiles");
        for text in samples {
            let mut expected = Vec::new();
            split_regex(&regex, text, &mut expected);
            let expected: Vec<&str> = expected.iter().map(|&(s, e)| &text[s..e]).collect();
            assert_eq!(
                words(PreTokenizerKind::Gpt2, text),
                expected,
                "text {text:?}"
            );
        }
    }

    #[test]
    fn llama3_matcher_agrees_with_the_regex() {
        let samples = [
            "Hello world",
            "I'M CAN'T we'Ve",
            "  leading and trailing   ",
            "tabs\tand\nnewlines\n\n  \n x",
            "naïve café 1234567 x=1+2;\n☃☃ 😀👍🏽",
            "a  b   c",
            "!!!???...\r\n",
        ];
        let pattern = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
        let regex = Regex::new(pattern).expect("pattern compiles");
        for text in samples {
            let mut expected = Vec::new();
            split_regex(&regex, text, &mut expected);
            let expected: Vec<&str> = expected.iter().map(|&(s, e)| &text[s..e]).collect();
            assert_eq!(
                words(PreTokenizerKind::Llama3, text),
                expected,
                "text {text:?}"
            );
        }
    }

    #[test]
    fn smollm_splits_digits_before_gpt2() {
        assert_eq!(
            words(PreTokenizerKind::Smollm, "abc 123"),
            vec!["abc", " ", "1", "2", "3"]
        );
    }

    #[test]
    fn words_cover_the_text() {
        let text = "mixed 123abc456 def789\u{a0}x\u{200b}y";
        for kind in [
            PreTokenizerKind::Gpt2,
            PreTokenizerKind::Llama3,
            PreTokenizerKind::Qwen2,
            PreTokenizerKind::Smollm,
            PreTokenizerKind::Default,
        ] {
            assert_eq!(words(kind, text).concat(), text, "{kind:?}");
        }
    }
}
