//! Tokenizers built from GGUF metadata alone: byte-level BPE, SentencePiece and WordPiece;
//! chat templates.
//!
//! Behaviour follows llama.cpp (`llama-vocab.cpp`), the reference the goldens come from:
//! special-token splitting, pre-tokenizer regexes, merge order, BOS/EOS rules, the
//! end-of-generation set and `token_to_piece`.

mod bpe;
pub mod chat;
mod index;
mod metadata;
pub mod pretokenize;
mod special;
mod spm;
pub mod stream;
mod unicode;
pub mod vocab;
mod wpm;

use std::collections::BTreeSet;

pub use chat::{ChatMessage, ChatTemplate, ToolSupport};
pub use pretokenize::PreTokenizerKind;
pub use stream::Utf8Stream;
pub use vocab::{TokenizerKind, Vocab};

use bpe::BpeModel;
use index::TokenIndex;
use special::{Fragment, SpecialTokens};
use spm::{SpmModel, SPACE_MARK};
use vocab::{ATTR_BYTE, ATTR_CONTROL, ATTR_NORMAL, ATTR_UNKNOWN, ATTR_USER_DEFINED};
use wpm::{Normalizer, WpmModel};

/// What can go wrong building a tokenizer or rendering a chat template.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("tokenizer metadata: {0}")]
    Metadata(String),
    #[error(
        "unsupported tokenizer model {0:?} (tokenizer.ggml.model); expected \"gpt2\", \"llama\" or \"bert\""
    )]
    UnsupportedModel(String),
    #[error("tokenizer.ggml.tokens is empty")]
    EmptyVocab,
    #[error("{key} has {len} entries, more than the limit of {max}")]
    TooLarge {
        key: &'static str,
        len: usize,
        max: usize,
    },
    #[error("{key} has {found} entries but the vocabulary has {expected} tokens")]
    LengthMismatch {
        key: &'static str,
        expected: usize,
        found: usize,
    },
    #[error("duplicate token in vocabulary: {text:?} has ids {first} and {second}")]
    DuplicateToken {
        text: String,
        first: u32,
        second: u32,
    },
    #[error("{0}")]
    MissingSpecial(&'static str),
    #[error("pre-tokenizer pattern: {0}")]
    Pretokenizer(String),
    #[error("chat template: {0}")]
    Template(String),
}

enum Model {
    Bpe(BpeModel),
    Spm(SpmModel),
    Wpm(WpmModel),
}

/// A tokenizer for one model's vocabulary.
pub struct Tokenizer {
    kind: TokenizerKind,
    tokens: TokenIndex,
    attrs: Vec<u32>,
    scores: Vec<f32>,
    special: SpecialTokens,
    model: Model,
    bos: Option<u32>,
    eos: Option<u32>,
    eot: Option<u32>,
    pad: Option<u32>,
    sep: Option<u32>,
    add_bos: bool,
    add_eos: bool,
    add_sep: bool,
    add_space_prefix: bool,
    eog: BTreeSet<u32>,
    chat_template: Option<String>,
    architecture: Option<String>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("kind", &self.kind)
            .field("vocab_size", &self.tokens.len())
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .field("eog", &self.eog)
            .finish_non_exhaustive()
    }
}

impl Tokenizer {
    /// Builds the tokenizer from vocabulary data.
    pub fn from_vocab(mut vocab: Vocab) -> Result<Tokenizer, TokenizerError> {
        let kind = vocab.kind()?;
        vocab.validate()?;
        let resolved = vocab.resolve(kind)?;
        let tokens = TokenIndex::new(std::mem::take(&mut vocab.tokens))?;
        let model = match kind {
            TokenizerKind::Bpe => {
                let pre = PreTokenizerKind::from_name(vocab.pre.as_deref()).unwrap_or_else(|| {
                    tracing::warn!(pre = ?vocab.pre, "unknown BPE pre-tokenizer, using the GPT-2 pattern");
                    PreTokenizerKind::Gpt2
                });
                Model::Bpe(BpeModel::new(&tokens, &vocab.merges, pre)?)
            }
            TokenizerKind::Spm => Model::Spm(SpmModel::new(&tokens, resolved.unk)),
            TokenizerKind::Wpm => {
                let lowercase = vocab.normalizer_lowercase.unwrap_or(false);
                let normalizer = Normalizer {
                    lowercase,
                    strip_accents: vocab.normalizer_strip_accents.unwrap_or(lowercase),
                };
                Model::Wpm(WpmModel::new(&tokens, resolved.unk, normalizer))
            }
        };
        let special = SpecialTokens::new(tokens.texts(), &resolved.attrs);
        let mut scores = std::mem::take(&mut vocab.scores);
        scores.truncate(tokens.len());
        Ok(Tokenizer {
            kind,
            tokens,
            attrs: resolved.attrs,
            scores,
            special,
            model,
            bos: resolved.bos,
            eos: resolved.eos,
            eot: resolved.eot,
            pad: resolved.pad,
            sep: resolved.sep,
            add_bos: resolved.add_bos,
            add_eos: resolved.add_eos,
            add_sep: resolved.add_sep,
            add_space_prefix: resolved.add_space_prefix,
            eog: resolved.eog,
            chat_template: vocab.chat_template,
            architecture: vocab.architecture,
        })
    }

    /// Text to token ids. `add_special` adds BOS/EOS where the model asks for them;
    /// `parse_special` turns control-token text (`<|im_start|>`) into those tokens.
    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<u32> {
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if add_special && self.add_bos {
            out.extend(self.bos);
        }
        let fragments = self.special.partition(text, parse_special);
        // SentencePiece prefixes a space to text at the start and after each special token.
        let mut after_special = true;
        for fragment in fragments {
            match fragment {
                Fragment::Token(id) => {
                    out.push(id);
                    after_special = true;
                }
                Fragment::Text(piece) => {
                    self.encode_text(piece, after_special, &mut out);
                    after_special = false;
                }
            }
        }
        if add_special && self.add_eos {
            out.extend(self.eos);
        }
        if add_special && self.add_sep {
            out.extend(self.sep);
        }
        out
    }

    fn encode_text(&self, piece: &str, after_special: bool, out: &mut Vec<u32>) {
        match &self.model {
            Model::Bpe(bpe) => bpe.encode(&self.tokens, piece, out),
            Model::Wpm(wpm) => wpm.encode(&self.tokens, piece, out),
            Model::Spm(spm) => {
                let prefix = if self.add_space_prefix && after_special {
                    " "
                } else {
                    ""
                };
                let escaped: String = prefix
                    .chars()
                    .chain(piece.chars())
                    .map(|c| if c == ' ' { SPACE_MARK } else { c })
                    .collect();
                spm.encode(&self.tokens, &self.scores, &escaped, out);
            }
        }
    }

    /// Token ids to text; invalid UTF-8 is replaced only after all bytes are joined.
    pub fn decode(&self, ids: &[u32]) -> String {
        let mut bytes = Vec::new();
        for &id in ids {
            bytes.extend(self.token_bytes(id));
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// The bytes token `id` stands for, as llama.cpp's `token_to_piece(special = false)`:
    /// control and unknown tokens give nothing; user-defined tokens give their text;
    /// normal BPE tokens undo the GPT-2 byte map; normal SentencePiece tokens turn `▁` into a
    /// space; `<0xNN>` byte tokens give that byte. Ids outside the vocabulary give nothing.
    pub fn token_bytes(&self, id: u32) -> Vec<u8> {
        let (Some(text), Some(&attr)) = (self.tokens.text(id), self.attrs.get(id as usize)) else {
            return Vec::new();
        };
        if attr & (ATTR_CONTROL | ATTR_UNKNOWN) != 0 {
            return Vec::new();
        }
        if attr & ATTR_USER_DEFINED != 0 {
            return text.as_bytes().to_vec();
        }
        if attr & ATTR_NORMAL != 0 {
            return match self.kind {
                TokenizerKind::Bpe => decode_byte_level(text),
                TokenizerKind::Spm | TokenizerKind::Wpm => {
                    text.replace(SPACE_MARK, " ").into_bytes()
                }
            };
        }
        if attr & ATTR_BYTE != 0 {
            return parse_byte_token(text).map(|b| vec![b]).unwrap_or_default();
        }
        Vec::new()
    }

    /// The token's text exactly as stored in the vocabulary.
    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.tokens.text(id)
    }

    /// The id of a token with exactly this text, if any.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.tokens.get(text)
    }

    pub fn bos_id(&self) -> Option<u32> {
        self.bos
    }

    pub fn eos_id(&self) -> Option<u32> {
        self.eos
    }

    pub fn eot_id(&self) -> Option<u32> {
        self.eot
    }

    pub fn pad_id(&self) -> Option<u32> {
        self.pad
    }

    /// WordPiece's `[SEP]`, appended by `encode(.., add_special = true, ..)`.
    pub fn sep_id(&self) -> Option<u32> {
        self.sep
    }

    /// Whether `encode(.., add_special = true, ..)` prepends BOS.
    pub fn adds_bos(&self) -> bool {
        self.add_bos
    }

    /// Whether generating `id` ends generation (EOS, EOT, EOM, `<|im_end|>`, `<end_of_turn>`...).
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.contains(&id)
    }

    /// All end-of-generation ids, ascending.
    pub fn eog_ids(&self) -> impl Iterator<Item = u32> + '_ {
        self.eog.iter().copied()
    }

    pub fn vocab_size(&self) -> usize {
        self.tokens.len()
    }

    pub fn kind(&self) -> TokenizerKind {
        self.kind
    }

    /// `tokenizer.chat_template`, when the file has one.
    pub fn chat_template_source(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// `general.architecture`, when known.
    pub fn architecture(&self) -> Option<&str> {
        self.architecture.as_deref()
    }
}

/// Undoes the GPT-2 byte-to-char map; characters outside it are spelled out as llama.cpp does.
fn decode_byte_level(text: &str) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(text.len());
    for c in text.chars() {
        match unicode::char_to_byte(c) {
            Some(b) => bytes.push(b),
            None => {
                let mut utf8 = [0u8; 4];
                let hex: String = c
                    .encode_utf8(&mut utf8)
                    .bytes()
                    .map(|b| format!("{b:02x}"))
                    .collect();
                bytes.extend(format!("[UNK_BYTE_0x{hex}{text}]").into_bytes());
            }
        }
    }
    bytes
}

/// `<0xNN>` → the byte NN.
fn parse_byte_token(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    u8::from_str_radix(hex, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spm(add_space_prefix: Option<bool>) -> Tokenizer {
        let tokens = ["<unk>", "<s>", "</s>", "▁a", "a", "<0x0A>", "<tool>", "▁"];
        Tokenizer::from_vocab(Vocab {
            model: "llama".into(),
            tokens: tokens.iter().map(|t| t.to_string()).collect(),
            scores: vec![0.0, 0.0, 0.0, -1.0, -2.0, 0.0, 0.0, -3.0],
            token_types: vec![2, 3, 3, 1, 1, 6, 4, 1],
            add_space_prefix,
            ..Vocab::default()
        })
        .expect("tokenizer")
    }

    #[test]
    fn spm_space_prefix_at_start_and_after_special_tokens() {
        let t = spm(None);
        assert_eq!(t.encode("a", true, false), vec![1, 3]);
        assert_eq!(t.encode("a</s>a", false, true), vec![3, 2, 3]);
        assert_eq!(t.encode("a</s>a", false, false).first(), Some(&3));
        let t = spm(Some(false));
        assert_eq!(t.encode("a\n", true, false), vec![1, 4, 5]);
    }

    #[test]
    fn token_bytes_follow_token_to_piece() {
        let t = spm(None);
        assert_eq!(t.token_bytes(2), b"", "control");
        assert_eq!(t.token_bytes(0), b"", "unknown");
        assert_eq!(t.token_bytes(6), b"<tool>", "user-defined");
        assert_eq!(t.token_bytes(5), b"\n", "byte");
        assert_eq!(t.token_bytes(3), b" a", "normal");
        assert_eq!(t.token_bytes(99), b"", "out of range");
        assert_eq!(t.decode(&[1, 3, 5, 2]), " a\n");
    }

    #[test]
    fn wordpiece_wraps_in_cls_and_sep_and_decodes_phantom_spaces() {
        let tokens = [
            "[PAD]", "[UNK]", "[CLS]", "[SEP]", "▁hello", "▁world", "s", "▁!",
        ];
        let t = Tokenizer::from_vocab(Vocab {
            model: "bert".into(),
            tokens: tokens.iter().map(|t| t.to_string()).collect(),
            token_types: vec![3, 3, 3, 3, 1, 1, 1, 1],
            bos_id: Some(2),
            sep_id: Some(3),
            // BERT's default [UNK] is id 100, outside this small vocabulary.
            unk_id: Some(1),
            normalizer_lowercase: Some(true),
            ..Vocab::default()
        })
        .expect("tokenizer");
        assert_eq!(
            t.encode("Hello worlds!", true, false),
            vec![2, 4, 5, 6, 7, 3]
        );
        assert_eq!(t.encode("hello zzz", false, false), vec![4, 1]);
        assert_eq!(t.decode(&[2, 4, 5, 6, 3]), " hello worlds");
    }

    #[test]
    fn byte_level_decode_undoes_the_byte_map() {
        let tokens = ["Ġa", "Ã©", "Ċ", "Ġ", "a", "Ã", "©"];
        let t = Tokenizer::from_vocab(Vocab {
            model: "gpt2".into(),
            pre: Some("gpt-2".into()),
            tokens: tokens.iter().map(|t| t.to_string()).collect(),
            merges: vec!["Ġ a".into(), "Ã ©".into()],
            ..Vocab::default()
        })
        .expect("tokenizer");
        assert_eq!(t.decode(&[0, 1, 2]), " aé\n");
        assert_eq!(t.encode(" aé\n", true, false), vec![0, 1, 2]);
    }
}
