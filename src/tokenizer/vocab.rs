//! The vocabulary as GGUF stores it, and the facts llama.cpp derives from it at load time:
//! token attributes, special ids, end-of-generation ids, and the add-BOS/space-prefix defaults.

use std::collections::BTreeSet;

use super::TokenizerError;

// Token attribute bits, as llama.cpp's `llama_token_attr`.
pub(crate) const ATTR_UNKNOWN: u32 = 1 << 0;
pub(crate) const ATTR_UNUSED: u32 = 1 << 1;
pub(crate) const ATTR_NORMAL: u32 = 1 << 2;
pub(crate) const ATTR_CONTROL: u32 = 1 << 3;
pub(crate) const ATTR_USER_DEFINED: u32 = 1 << 4;
pub(crate) const ATTR_BYTE: u32 = 1 << 5;
pub(crate) const ATTR_RSTRIP: u32 = 1 << 8;

/// Upper bound on vocabulary size; real vocabularies stay well under a million.
pub const MAX_VOCAB: usize = 4 << 20;

/// The tokenizer part of a GGUF file's metadata, as plain data.
#[derive(Clone, Debug, Default)]
pub struct Vocab {
    /// `tokenizer.ggml.model`: `gpt2` (byte-level BPE), `llama` (SentencePiece) or `bert`
    /// (WordPiece).
    pub model: String,
    /// `tokenizer.ggml.pre`: the BPE pre-tokenizer name.
    pub pre: Option<String>,
    /// `tokenizer.ggml.tokens`.
    pub tokens: Vec<String>,
    /// `tokenizer.ggml.scores`; empty when absent.
    pub scores: Vec<f32>,
    /// `tokenizer.ggml.token_type`; empty when absent (all tokens are then normal).
    pub token_types: Vec<i32>,
    /// `tokenizer.ggml.merges` (`"left right"`); BPE only.
    pub merges: Vec<String>,
    pub bos_id: Option<u32>,
    pub eos_id: Option<u32>,
    pub eot_id: Option<u32>,
    pub eom_id: Option<u32>,
    pub unk_id: Option<u32>,
    pub pad_id: Option<u32>,
    /// `tokenizer.ggml.seperator_token_id` (sic): WordPiece's `[SEP]`.
    pub sep_id: Option<u32>,
    pub add_bos: Option<bool>,
    pub add_eos: Option<bool>,
    pub add_space_prefix: Option<bool>,
    /// `tokenizer.ggml.normalizer.lowercase` (WordPiece; default false, as llama.cpp).
    pub normalizer_lowercase: Option<bool>,
    /// `tokenizer.ggml.normalizer.strip_accents` (WordPiece; default: as lowercase).
    pub normalizer_strip_accents: Option<bool>,
    /// `tokenizer.chat_template`.
    pub chat_template: Option<String>,
    /// `general.architecture`, which picks the built-in chat format when no template ships.
    pub architecture: Option<String>,
    /// `general.name`: llama.cpp sets some token attributes by it (see `name_rules`).
    pub name: Option<String>,
}

/// Which tokenizer algorithm a vocabulary uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenizerKind {
    /// Byte-level BPE (`tokenizer.ggml.model = gpt2`).
    Bpe,
    /// SentencePiece with scores and byte fallback (`tokenizer.ggml.model = llama`).
    Spm,
    /// WordPiece, BERT's (`tokenizer.ggml.model = bert`).
    Wpm,
}

/// Special ids and flags resolved with llama.cpp's defaults.
#[derive(Clone, Debug)]
pub(crate) struct Resolved {
    pub attrs: Vec<u32>,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub eot: Option<u32>,
    pub eom: Option<u32>,
    pub unk: Option<u32>,
    pub pad: Option<u32>,
    pub sep: Option<u32>,
    pub add_bos: bool,
    pub add_eos: bool,
    /// Whether `encode(.., add_special = true, ..)` appends `sep` (WordPiece's `[SEP]`).
    pub add_sep: bool,
    pub add_space_prefix: bool,
    pub eog: BTreeSet<u32>,
}

/// Token texts that mark the end of a turn (llama.cpp's EOT auto-detection list).
const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];

/// Token texts that end generation (llama.cpp's EOG list).
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<｜end▁of▁sentence｜>",
];

/// Fill-in-the-middle separators llama.cpp also treats as end of generation.
const FIM_EOG_TEXTS: &[&str] = &[
    "<|fim_pad|>",
    "<fim-pad>",
    "<fim_pad>",
    "<PAD>",
    "<|fim_repo|>",
    "<|repo_name|>",
    "<fim-repo>",
    "<REPO>",
    "<reponame>",
    "<|file_sep|>",
];

fn attr_of_type(token_type: i32) -> u32 {
    match token_type {
        1 => ATTR_NORMAL,
        2 => ATTR_UNKNOWN,
        3 => ATTR_CONTROL,
        4 => ATTR_USER_DEFINED,
        5 => ATTR_UNUSED,
        6 => ATTR_BYTE,
        _ => 0,
    }
}

impl Vocab {
    pub fn kind(&self) -> Result<TokenizerKind, TokenizerError> {
        match self.model.as_str() {
            "gpt2" => Ok(TokenizerKind::Bpe),
            "llama" => Ok(TokenizerKind::Spm),
            "bert" => Ok(TokenizerKind::Wpm),
            other => Err(TokenizerError::UnsupportedModel(other.to_owned())),
        }
    }

    /// Checks array lengths and sizes; replaces empty token texts as llama.cpp does.
    pub(crate) fn validate(&mut self) -> Result<(), TokenizerError> {
        let n = self.tokens.len();
        if n == 0 {
            return Err(TokenizerError::EmptyVocab);
        }
        if n > MAX_VOCAB {
            return Err(TokenizerError::TooLarge {
                key: "tokenizer.ggml.tokens",
                len: n,
                max: MAX_VOCAB,
            });
        }
        for (key, len) in [
            ("tokenizer.ggml.scores", self.scores.len()),
            ("tokenizer.ggml.token_type", self.token_types.len()),
        ] {
            if len != 0 && len < n {
                return Err(TokenizerError::LengthMismatch {
                    key,
                    expected: n,
                    found: len,
                });
            }
        }
        for (i, token) in self.tokens.iter_mut().enumerate() {
            if token.is_empty() {
                *token = format!("[EMPTY_{i}]");
            }
        }
        Ok(())
    }

    /// Resolves special ids, flags and attributes the way llama.cpp's `llama_vocab::load` does.
    pub(crate) fn resolve(&self, kind: TokenizerKind) -> Result<Resolved, TokenizerError> {
        let n = self.tokens.len();
        let in_range = |id: Option<u32>| id.filter(|&i| (i as usize) < n);
        // Defaults per model type; a GGUF id out of range keeps the default.
        let (bos_default, eos_default, unk_default) = match kind {
            TokenizerKind::Spm => (Some(1), Some(2), Some(0)),
            TokenizerKind::Bpe => (Some(11), Some(11), None),
            TokenizerKind::Wpm => (Some(101), None, Some(100)),
        };
        let wpm = kind == TokenizerKind::Wpm;
        let pick = |given: Option<u32>, default: Option<u32>| in_range(given).or(in_range(default));
        let mut attrs: Vec<u32> = if self.token_types.is_empty() {
            vec![ATTR_NORMAL; n]
        } else {
            self.token_types[..n]
                .iter()
                .map(|&t| attr_of_type(t))
                .collect()
        };
        let pre_adds_bos = matches!(
            self.pre.as_deref(),
            Some(
                "llama3"
                    | "llama-v3"
                    | "llama-bpe"
                    | "falcon3"
                    | "pixtral"
                    | "tekken"
                    | "chameleon"
            )
        );
        let mut resolved = Resolved {
            attrs: Vec::new(),
            bos: pick(self.bos_id, bos_default),
            eos: pick(self.eos_id, eos_default),
            eot: in_range(self.eot_id),
            eom: in_range(self.eom_id),
            unk: pick(self.unk_id, unk_default),
            pad: pick(self.pad_id, wpm.then_some(0)),
            sep: pick(self.sep_id, wpm.then_some(102)),
            // llama.cpp's WordPiece always wraps text in [CLS] .. [SEP] when asked for
            // special tokens, whatever the add_* keys say.
            add_bos: wpm
                || self
                    .add_bos
                    .unwrap_or(kind == TokenizerKind::Spm || pre_adds_bos),
            add_eos: !wpm && self.add_eos.unwrap_or(false),
            add_sep: wpm,
            add_space_prefix: match kind {
                TokenizerKind::Spm => self.add_space_prefix.unwrap_or(true),
                TokenizerKind::Bpe | TokenizerKind::Wpm => false,
            },
            eog: BTreeSet::new(),
        };
        if resolved.add_bos && resolved.bos.is_none() {
            return Err(TokenizerError::MissingSpecial(
                "add_bos_token is true but bos_token_id is not set",
            ));
        }
        if resolved.add_sep && resolved.sep.is_none() {
            return Err(TokenizerError::MissingSpecial(
                "a WordPiece vocabulary needs a [SEP] token (seperator_token_id)",
            ));
        }
        if resolved.add_eos && resolved.eos.is_none() {
            return Err(TokenizerError::MissingSpecial(
                "add_eos_token is true but eos_token_id is not set",
            ));
        }
        self.detect_end_tokens(&mut resolved, &mut attrs);
        self.name_rules(&mut attrs);
        resolved.attrs = attrs;
        Ok(resolved)
    }

    /// llama.cpp's per-model attributes (`llama_vocab::impl::load`): a model whose lower-cased
    /// `general.name` contains "phi-3" or "phi3" eats the whitespace after every special token
    /// (so "<|im_end|>\n" tokenizes as "<|im_end|>"), except after `<unk>`, `<s>` and
    /// `<|endoftext|>`, and after `</s>` too.
    fn name_rules(&self, attrs: &mut [u32]) {
        let name = self.name.as_deref().unwrap_or_default().to_lowercase();
        if !(name.contains("phi-3") || name.contains("phi3")) {
            return;
        }
        let special = ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN;
        for (text, attr) in self.tokens.iter().zip(attrs.iter_mut()) {
            let strips = match text.as_str() {
                "<unk>" | "<s>" | "<|endoftext|>" => false,
                "</s>" => true,
                _ => *attr & special != 0,
            };
            if strips {
                *attr |= ATTR_RSTRIP;
            } else {
                *attr &= !ATTR_RSTRIP;
            }
        }
    }

    /// llama.cpp finds EOT/EOM/EOG tokens by their text and forces them to be control tokens.
    fn detect_end_tokens(&self, resolved: &mut Resolved, attrs: &mut [u32]) {
        let mut eog = BTreeSet::new();
        for (id, text) in self.tokens.iter().enumerate() {
            let id32 = id as u32;
            let text = text.as_str();
            let mut control = false;
            if resolved.eot.is_none() && EOT_TEXTS.contains(&text) {
                resolved.eot = Some(id32);
                control = true;
            }
            if resolved.eom.is_none() && text == "<|eom_id|>" {
                resolved.eom = Some(id32);
                control = true;
            }
            if FIM_EOG_TEXTS.contains(&text) || EOG_TEXTS.contains(&text) {
                eog.insert(id32);
                control = true;
            }
            if control {
                attrs[id] |= ATTR_CONTROL;
            }
            // gpt-oss: llama.cpp always renders these as text.
            if matches!(
                text,
                "<|channel|>" | "<|message|>" | "<|start|>" | "<|constrain|>"
            ) {
                attrs[id] = ATTR_USER_DEFINED;
            }
        }
        eog.extend(
            [resolved.eos, resolved.eot, resolved.eom]
                .into_iter()
                .flatten(),
        );
        // o200k-harmony: with <|return|> and <|call|> present, <|end|> only ends a message.
        let has = |t: &str| eog.iter().any(|&id| self.tokens[id as usize] == t);
        if has("<|return|>") && has("<|call|>") {
            if let Some(end) = eog
                .iter()
                .copied()
                .find(|&id| self.tokens[id as usize] == "<|end|>")
            {
                eog.remove(&end);
                attrs[end as usize] = ATTR_USER_DEFINED;
            }
        }
        resolved.eog = eog;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vocab(tokens: &[&str], types: &[i32], model: &str) -> Vocab {
        Vocab {
            model: model.into(),
            tokens: tokens.iter().map(|t| t.to_string()).collect(),
            token_types: types.to_vec(),
            ..Vocab::default()
        }
    }

    #[test]
    fn eog_includes_eos_and_detected_end_tokens() {
        let mut v = vocab(
            &["<unk>", "<|endoftext|>", "<|im_end|>", "a", "<|file_sep|>"],
            &[2, 3, 3, 1, 3],
            "gpt2",
        );
        v.eos_id = Some(2);
        let r = v.resolve(TokenizerKind::Bpe).expect("resolves");
        assert_eq!(r.eog.iter().copied().collect::<Vec<_>>(), vec![1, 2, 4]);
        assert!(!r.add_bos);
        assert_eq!(r.bos, None, "default BPE bos 11 is out of range");
    }

    #[test]
    fn phi3_names_make_special_tokens_rstrip_as_llama_cpp() {
        let tokens = ["<|endoftext|>", "<|im_end|>", "</s>", "a"];
        let mut v = vocab(&tokens, &[3, 3, 1, 1], "gpt2");
        v.name = Some("Tiny Phi3".into());
        let r = v.resolve(TokenizerKind::Bpe).expect("resolves");
        let rstrip: Vec<bool> = r.attrs.iter().map(|a| a & ATTR_RSTRIP != 0).collect();
        assert_eq!(rstrip, vec![false, true, true, false]);
        v.name = Some("SmolLM2".into());
        let r = v.resolve(TokenizerKind::Bpe).expect("resolves");
        assert!(r.attrs.iter().all(|a| a & ATTR_RSTRIP == 0));
    }

    #[test]
    fn end_token_not_marked_control_becomes_control() {
        let v = vocab(&["<s>", "</s>", "<end_of_turn>"], &[3, 3, 1], "llama");
        let r = v.resolve(TokenizerKind::Spm).expect("resolves");
        assert_ne!(r.attrs[2] & ATTR_CONTROL, 0);
        assert_eq!(r.eot, Some(2));
        assert!(r.add_bos && r.add_space_prefix, "SPM defaults");
        assert_eq!(r.bos, Some(1));
    }

    #[test]
    fn add_bos_without_bos_is_an_error() {
        let mut v = vocab(&["a", "b"], &[], "gpt2");
        v.add_bos = Some(true);
        assert!(matches!(
            v.resolve(TokenizerKind::Bpe),
            Err(TokenizerError::MissingSpecial(_))
        ));
    }

    #[test]
    fn short_arrays_are_rejected_with_the_key() {
        let mut v = vocab(&["a", "b", "c"], &[1, 1], "gpt2");
        let err = v.validate().expect_err("token_type too short");
        assert!(
            err.to_string().contains("tokenizer.ggml.token_type"),
            "{err}"
        );
    }
}
