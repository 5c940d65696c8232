//! The vocabulary as llguidance sees it: each token id's bytes and the end-of-generation ids,
//! built from the GGUF tokenizer (no `tokenizer.json`), so every model we run can be
//! constrained.

use std::sync::Arc;

use llguidance::ParserFactory;
use toktrie::{ApproximateTokEnv, TokEnv, TokRxInfo, TokTrie};

use super::constraint::ConstraintError;
use crate::tokenizer::Tokenizer;

/// Tokens longer than this are never allowed under a constraint: real vocabularies stay far
/// below it, and the trie's node layout has bounded depth.
const MAX_TOKEN_BYTES: usize = 1024;

/// A vocabulary's token trie and the grammar compiler built on it; build once per model and
/// share across requests (building walks the whole vocabulary).
#[derive(Clone)]
pub struct TokenView {
    factory: Arc<ParserFactory>,
    vocab_size: usize,
}

impl std::fmt::Debug for TokenView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenView")
            .field("vocab_size", &self.vocab_size)
            .finish_non_exhaustive()
    }
}

impl TokenView {
    /// The view of `tokenizer`'s vocabulary.
    pub fn new(tokenizer: &Tokenizer) -> Result<TokenView, ConstraintError> {
        let words = token_words(tokenizer);
        let eog: Vec<u32> = tokenizer.eog_ids().collect();
        let eos = tokenizer
            .eos_id()
            .or_else(|| eog.first().copied())
            .ok_or(ConstraintError::NoEndOfGeneration)?;
        let info = TokRxInfo {
            tok_bos: tokenizer.bos_id(),
            tok_pad: tokenizer.pad_id(),
            tok_end_of_turn: tokenizer.eot_id(),
            ..TokRxInfo::new(words.len() as u32, eos)
        };
        let mut ends = vec![eos];
        ends.extend(eog.iter().copied().filter(|&id| id != eos));
        let trie = TokTrie::from(&info, &words).with_eos_tokens(&ends);
        Self::from_trie(trie)
    }

    /// A view over single bytes, enough to compile (and so check) a grammar without a model.
    pub fn bytes_only() -> Result<TokenView, ConstraintError> {
        Self::from_env(ApproximateTokEnv::single_byte_env())
    }

    fn from_trie(trie: TokTrie) -> Result<TokenView, ConstraintError> {
        // Our tokenizer is not exposed to llguidance: it only needs the bytes to compute masks,
        // and tokenizing (for forced tokens, which we do not use) falls back to the trie.
        Self::from_env(Arc::new(ApproximateTokEnv::new(trie)))
    }

    fn from_env(env: TokEnv) -> Result<TokenView, ConstraintError> {
        let vocab_size = env.tok_trie().vocab_size();
        let mut factory =
            ParserFactory::new_simple(&env).map_err(|e| ConstraintError::Compile(e.to_string()))?;
        factory.quiet();
        Ok(TokenView {
            factory: Arc::new(factory),
            vocab_size,
        })
    }

    pub(crate) fn factory(&self) -> &ParserFactory {
        &self.factory
    }

    /// Tokens the view knows; logits past it (padded output heads) are never allowed.
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }
}

/// Each id's bytes as llama.cpp hands them to llguidance: the plain piece, or for tokens
/// whose piece is empty (control tokens such as `<|im_end|>`) their text after the 0xFF
/// special-token marker, so a grammar can name them but text never matches them.
fn token_words(tokenizer: &Tokenizer) -> Vec<Vec<u8>> {
    (0..tokenizer.vocab_size() as u32)
        .map(|id| {
            let bytes = tokenizer.token_bytes(id);
            let word = match (bytes.is_empty(), tokenizer.token_text(id)) {
                (true, Some(text)) if !text.is_empty() => {
                    let mut marked = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                    marked.extend_from_slice(text.as_bytes());
                    marked
                }
                _ => bytes,
            };
            if word.len() > MAX_TOKEN_BYTES {
                Vec::new()
            } else {
                word
            }
        })
        .collect()
}
