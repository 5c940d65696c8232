//! Reading the tokenizer keys out of GGUF metadata.
//!
//! The large arrays (262k entries for Gemma 3) are walked here directly rather than through the
//! typed array getters, which build an element key string per entry; errors still name the key
//! and the index.

use crate::gguf::{GgufError, Metadata, Value};

use super::vocab::{Vocab, MAX_VOCAB};
use super::TokenizerError;

impl From<GgufError> for TokenizerError {
    fn from(err: GgufError) -> TokenizerError {
        TokenizerError::Metadata(err.to_string())
    }
}

/// The items of array `key`, or `None` when the key is absent; bounded in length.
fn array<'m>(md: &'m Metadata, key: &str) -> Result<Option<&'m [Value]>, TokenizerError> {
    let Some(value) = md.get(key) else {
        return Ok(None);
    };
    let items = value.as_array().ok_or_else(|| {
        TokenizerError::Metadata(format!("{key} is {}, expected an array", value.type_name()))
    })?;
    if items.len() > MAX_VOCAB {
        return Err(TokenizerError::Metadata(format!(
            "{key} has {} entries, more than the limit of {MAX_VOCAB}",
            items.len()
        )));
    }
    Ok(Some(items))
}

fn element_error(key: &str, index: usize, value: &Value, expected: &str) -> TokenizerError {
    TokenizerError::Metadata(format!(
        "{key}[{index}] is {}, expected {expected}",
        value.type_name()
    ))
}

fn strings(md: &Metadata, key: &str) -> Result<Option<Vec<String>>, TokenizerError> {
    let Some(items) = array(md, key)? else {
        return Ok(None);
    };
    let converted = items.iter().enumerate().map(|(i, v)| {
        v.as_str()
            .map(str::to_owned)
            .ok_or_else(|| element_error(key, i, v, "a string"))
    });
    converted.collect::<Result<Vec<_>, _>>().map(Some)
}

fn floats(md: &Metadata, key: &str) -> Result<Vec<f32>, TokenizerError> {
    let Some(items) = array(md, key)? else {
        return Ok(Vec::new());
    };
    let converted = items.iter().enumerate().map(|(i, v)| match *v {
        Value::F32(x) => Ok(x),
        Value::F64(x) => Ok(x as f32),
        // llama.cpp also accepts integer scores.
        Value::I32(x) => Ok(x as f32),
        _ => Err(element_error(key, i, v, "a float")),
    });
    converted.collect()
}

fn ints(md: &Metadata, key: &str) -> Result<Vec<i32>, TokenizerError> {
    let Some(items) = array(md, key)? else {
        return Ok(Vec::new());
    };
    let converted = items.iter().enumerate().map(|(i, v)| {
        v.as_integer()
            .and_then(|x| i32::try_from(x).ok())
            .ok_or_else(|| element_error(key, i, v, "an i32"))
    });
    converted.collect()
}

impl Vocab {
    /// Collects the `tokenizer.*` keys (and `general.architecture`) from GGUF metadata.
    pub fn from_metadata(md: &Metadata) -> Result<Vocab, TokenizerError> {
        const TOKENS: &str = "tokenizer.ggml.tokens";
        Ok(Vocab {
            model: md.get_str("tokenizer.ggml.model")?.to_owned(),
            pre: md.opt_str("tokenizer.ggml.pre")?.map(str::to_owned),
            tokens: strings(md, TOKENS)?
                .ok_or_else(|| TokenizerError::Metadata(format!("missing key {TOKENS}")))?,
            scores: floats(md, "tokenizer.ggml.scores")?,
            token_types: ints(md, "tokenizer.ggml.token_type")?,
            merges: strings(md, "tokenizer.ggml.merges")?.unwrap_or_default(),
            bos_id: md.opt_u32("tokenizer.ggml.bos_token_id")?,
            eos_id: md.opt_u32("tokenizer.ggml.eos_token_id")?,
            eot_id: md.opt_u32("tokenizer.ggml.eot_token_id")?,
            eom_id: md.opt_u32("tokenizer.ggml.eom_token_id")?,
            unk_id: md.opt_u32("tokenizer.ggml.unknown_token_id")?,
            pad_id: md.opt_u32("tokenizer.ggml.padding_token_id")?,
            sep_id: md.opt_u32("tokenizer.ggml.seperator_token_id")?,
            add_bos: md.opt_bool("tokenizer.ggml.add_bos_token")?,
            add_eos: md.opt_bool("tokenizer.ggml.add_eos_token")?,
            add_space_prefix: md.opt_bool("tokenizer.ggml.add_space_prefix")?,
            normalizer_lowercase: md.opt_bool("tokenizer.ggml.normalizer.lowercase")?,
            normalizer_strip_accents: md.opt_bool("tokenizer.ggml.normalizer.strip_accents")?,
            chat_template: md.opt_str("tokenizer.chat_template")?.map(str::to_owned),
            architecture: md.opt_str("general.architecture")?.map(str::to_owned),
            name: md.opt_str("general.name")?.map(str::to_owned),
        })
    }
}

impl super::Tokenizer {
    /// Builds the tokenizer from a GGUF file's metadata.
    pub fn from_metadata(metadata: &Metadata) -> Result<super::Tokenizer, TokenizerError> {
        super::Tokenizer::from_vocab(Vocab::from_metadata(metadata)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metadata(entries: Vec<(&str, Value)>) -> Metadata {
        let mut md = Metadata::new();
        for (key, value) in entries {
            md.insert(key.to_owned(), value).expect("insert");
        }
        md
    }

    fn strs(items: &[&str]) -> Value {
        Value::Array(items.iter().map(|s| Value::String(s.to_string())).collect())
    }

    #[test]
    fn reads_a_minimal_vocabulary() {
        let md = metadata(vec![
            ("tokenizer.ggml.model", Value::String("gpt2".into())),
            ("tokenizer.ggml.tokens", strs(&["a", "b", "ab"])),
            ("tokenizer.ggml.merges", strs(&["a b"])),
            (
                "tokenizer.ggml.token_type",
                Value::Array(vec![Value::I32(1); 3]),
            ),
            ("tokenizer.ggml.eos_token_id", Value::U32(2)),
        ]);
        let vocab = Vocab::from_metadata(&md).expect("vocab");
        assert_eq!(vocab.tokens, vec!["a", "b", "ab"]);
        assert_eq!(vocab.merges, vec!["a b"]);
        assert_eq!(vocab.token_types, vec![1, 1, 1]);
        assert_eq!(vocab.eos_id, Some(2));
        assert!(vocab.scores.is_empty());
    }

    #[test]
    fn errors_name_the_key_and_index() {
        let md = metadata(vec![
            ("tokenizer.ggml.model", Value::String("gpt2".into())),
            (
                "tokenizer.ggml.tokens",
                Value::Array(vec![Value::String("a".into()), Value::U32(5)]),
            ),
        ]);
        let err = Vocab::from_metadata(&md).expect_err("bad element");
        assert!(
            err.to_string().contains("tokenizer.ggml.tokens[1]"),
            "{err}"
        );
        let md = metadata(vec![("tokenizer.ggml.model", Value::String("gpt2".into()))]);
        let err = Vocab::from_metadata(&md).expect_err("no tokens");
        assert!(err.to_string().contains("tokenizer.ggml.tokens"), "{err}");
        let md = metadata(vec![("tokenizer.ggml.tokens", strs(&["a"]))]);
        let err = Vocab::from_metadata(&md).expect_err("no model");
        assert!(err.to_string().contains("tokenizer.ggml.model"), "{err}");
    }
}
