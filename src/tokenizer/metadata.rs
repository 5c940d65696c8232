//! Reading the tokenizer keys out of GGUF metadata.

use crate::gguf::{GgufError, Metadata};

use super::vocab::{Vocab, MAX_VOCAB};
use super::TokenizerError;

impl From<GgufError> for TokenizerError {
    fn from(err: GgufError) -> TokenizerError {
        TokenizerError::Metadata(err.to_string())
    }
}

fn owned(strings: Vec<&str>) -> Vec<String> {
    strings.into_iter().map(str::to_owned).collect()
}

/// Reads an array key, refusing more entries than any vocabulary needs.
fn bounded<T>(key: &'static str, values: Option<Vec<T>>) -> Result<Vec<T>, TokenizerError> {
    let values = values.unwrap_or_default();
    if values.len() > MAX_VOCAB {
        return Err(TokenizerError::TooLarge {
            key,
            len: values.len(),
            max: MAX_VOCAB,
        });
    }
    Ok(values)
}

impl Vocab {
    /// Collects the `tokenizer.*` keys (and `general.architecture`) from GGUF metadata.
    pub fn from_metadata(md: &Metadata) -> Result<Vocab, TokenizerError> {
        const TOKENS: &str = "tokenizer.ggml.tokens";
        const SCORES: &str = "tokenizer.ggml.scores";
        const TYPES: &str = "tokenizer.ggml.token_type";
        const MERGES: &str = "tokenizer.ggml.merges";
        Ok(Vocab {
            model: md.get_str("tokenizer.ggml.model")?.to_owned(),
            pre: md.opt_str("tokenizer.ggml.pre")?.map(str::to_owned),
            tokens: owned(md.get_str_array(TOKENS)?),
            scores: bounded(SCORES, md.opt_f32_array(SCORES)?)?,
            token_types: bounded(TYPES, md.opt_i32_array(TYPES)?)?,
            merges: owned(bounded(MERGES, md.opt_str_array(MERGES)?)?),
            bos_id: md.opt_u32("tokenizer.ggml.bos_token_id")?,
            eos_id: md.opt_u32("tokenizer.ggml.eos_token_id")?,
            eot_id: md.opt_u32("tokenizer.ggml.eot_token_id")?,
            eom_id: md.opt_u32("tokenizer.ggml.eom_token_id")?,
            unk_id: md.opt_u32("tokenizer.ggml.unknown_token_id")?,
            pad_id: md.opt_u32("tokenizer.ggml.padding_token_id")?,
            add_bos: md.opt_bool("tokenizer.ggml.add_bos_token")?,
            add_eos: md.opt_bool("tokenizer.ggml.add_eos_token")?,
            add_space_prefix: md.opt_bool("tokenizer.ggml.add_space_prefix")?,
            chat_template: md.opt_str("tokenizer.chat_template")?.map(str::to_owned),
            architecture: md.opt_str("general.architecture")?.map(str::to_owned),
        })
    }
}

impl super::Tokenizer {
    /// Builds the tokenizer from a GGUF file's metadata.
    pub fn from_metadata(metadata: &Metadata) -> Result<super::Tokenizer, TokenizerError> {
        super::Tokenizer::from_vocab(Vocab::from_metadata(metadata)?)
    }
}
