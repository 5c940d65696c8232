//! Embeddings: tokenizer + encoder + pooling, as llama.cpp computes them (`llama-embedding`,
//! llama-cpp-python's `Llama.embed`): each text is tokenized with its special tokens
//! (`[CLS] .. [SEP]` for WordPiece), run through the encoder as if alone, pooled the way the
//! GGUF's `*.pooling_type` says (or the caller asks), and optionally L2-normalised. An
//! encoder packs as many inputs into one GPU pass as fit (`BertEncoder::hidden_states_packed`,
//! each input attending to itself only); a pooled decoder runs one input per pass.
//!
//! Two kinds of model embed: encoders (`bert`, `nomic-bert`, with bidirectional attention) and any causal
//! decoder the engine runs (`llama`, `qwen2`, `gemma3`), whose hidden states after the final
//! RMS norm (llama.cpp's `t_embd`, the head's input) are pooled; their attention stays causal,
//! as in llama.cpp.
//!
//! `Embedder::embed(texts)` is the entry point the CLI and the HTTP API share.

use std::sync::Arc;

use crate::gguf::{read_header, GgmlType, GgufError, Header, RangeSource, SourceError};
use crate::gpu::Gpu;
use crate::model::bert::{self, BertEncoder};
use crate::model::{
    LoadOptions, LoadProgress, ModelError, OpenModel, Stage, StageInput, StageSpec,
};
use crate::ops::norm::rms_norm_reference;
use crate::tokenizer::{Tokenizer, TokenizerError};

/// How per-token hidden states become one vector (llama.cpp's `llama_pooling_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pooling {
    /// The average over every token, special tokens included.
    Mean,
    /// The first token's state (`[CLS]`).
    Cls,
    /// The last token's state.
    Last,
}

impl Pooling {
    /// llama.cpp's number for a pooling type: 1 mean, 2 CLS, 3 last; `None` for the others
    /// (0 none: per-token output; 4 rank: a reranker's score), which this engine does not make.
    pub fn from_llama(code: u32) -> Option<Pooling> {
        match code {
            1 => Some(Pooling::Mean),
            2 => Some(Pooling::Cls),
            3 => Some(Pooling::Last),
            _ => None,
        }
    }

    /// `mean`, `cls` or `last`, as the CLI and the API spell them.
    pub fn parse(name: &str) -> Option<Pooling> {
        match name {
            "mean" => Some(Pooling::Mean),
            "cls" => Some(Pooling::Cls),
            "last" => Some(Pooling::Last),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Pooling::Mean => "mean",
            Pooling::Cls => "cls",
            Pooling::Last => "last",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum EmbedError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error(transparent)]
    Source(#[from] SourceError),
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    #[error("input {index} has {tokens} tokens, more than the model's context of {max}")]
    TooLong {
        index: usize,
        tokens: usize,
        max: u32,
    },
    #[error("input {index} has no tokens")]
    Empty { index: usize },
    #[error("input {index} has token id {id}, outside the vocabulary of {vocab}")]
    OutOfVocabulary { index: usize, id: u32, vocab: u32 },
    #[error(
        "the model's pooling type {0} is not one of mean (1), CLS (2) or last (3); choose one"
    )]
    UnsupportedPooling(u32),
}

/// Per-call choices; `None` pooling means the model's own.
#[derive(Debug, Clone, Copy, Default)]
pub struct EmbedOptions {
    pub pooling: Option<Pooling>,
    /// Divide each vector by its Euclidean norm (llama.cpp's `embd_normalize = 2`).
    pub normalize: bool,
}

/// What turns token ids into per-token hidden states.
#[allow(clippy::large_enum_variant)] // one per embedder, never in a collection
enum Network {
    Encoder(BertEncoder),
    Decoder(PooledDecoder),
}

/// A causal decoder without its head: the stage's residual stream, then the final RMS norm
/// on the host (a few rows of `d_model`, so the GPU's head buffers need not grow).
struct PooledDecoder {
    stage: Stage,
    output_norm: Vec<f32>,
}

/// An embedding model loaded on one device.
pub struct Embedder {
    tokenizer: Tokenizer,
    network: Network,
    /// From `*.pooling_type`; `None` when the file names none.
    model_pooling: Option<u32>,
    /// `general.architecture`.
    arch: String,
}

/// Whether `general.architecture` names an encoder (rather than a causal decoder).
pub fn is_encoder(header: &Header) -> bool {
    header
        .architecture()
        .is_ok_and(|arch| bert::ENCODER_ARCHITECTURES.contains(&arch))
}

impl Embedder {
    /// Reads the header, builds the tokenizer and loads the network; a decoder's KV cache
    /// holds `max_context` positions (at most the model's own context).
    pub async fn load(
        gpu: Arc<Gpu>,
        source: &dyn RangeSource,
        max_context: u32,
        progress: &mut dyn FnMut(LoadProgress<'_>),
    ) -> Result<Embedder, EmbedError> {
        let header = read_header(source).await?;
        let tokenizer = Tokenizer::from_metadata(&header.metadata)?;
        let arch = header.architecture()?.to_string();
        if is_encoder(&header) {
            let encoder = BertEncoder::load(gpu, source, &header, progress).await?;
            let model_pooling = encoder.cfg.pooling_type;
            return Ok(Embedder {
                tokenizer,
                network: Network::Encoder(encoder),
                model_pooling,
                arch,
            });
        }
        let model_pooling = header.metadata.opt_u32(&format!("{arch}.pooling_type"))?;
        let decoder = PooledDecoder::load(gpu, source, header, max_context, progress).await?;
        Ok(Embedder {
            tokenizer,
            network: Network::Decoder(decoder),
            model_pooling,
            arch,
        })
    }

    /// `general.architecture`: `bert`, `nomic-bert`, `llama`...
    pub fn architecture(&self) -> &str {
        &self.arch
    }

    /// Length of each embedding.
    pub fn dimensions(&self) -> usize {
        match &self.network {
            Network::Encoder(encoder) => encoder.cfg.d_model as usize,
            Network::Decoder(decoder) => decoder.stage.cfg.d_model as usize,
        }
    }

    /// Token ids run from 0 to this, exclusive.
    pub fn vocab(&self) -> u32 {
        match &self.network {
            Network::Encoder(encoder) => encoder.cfg.vocab,
            Network::Decoder(decoder) => decoder.stage.cfg.vocab,
        }
    }

    /// The most tokens one input may have, special tokens included.
    pub fn context_length(&self) -> u32 {
        match &self.network {
            Network::Encoder(encoder) => encoder.cfg.context_length,
            Network::Decoder(decoder) => decoder.stage.spec.max_context,
        }
    }

    /// The pooling used when a call names none: the file's, else mean (llama.cpp would give
    /// per-token vectors, which an embedding API has no place for).
    pub fn default_pooling(&self) -> Result<Pooling, EmbedError> {
        match self.model_pooling {
            None | Some(0) => Ok(Pooling::Mean),
            Some(code) => Pooling::from_llama(code).ok_or(EmbedError::UnsupportedPooling(code)),
        }
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// The ids llama.cpp feeds the model for `text` (special tokens added, none parsed).
    pub fn tokenize(&self, text: &str) -> Vec<u32> {
        self.tokenizer.encode(text, true, false)
    }

    /// One embedding per text, in order.
    pub async fn embed<S: AsRef<str>>(
        &self,
        texts: &[S],
        options: EmbedOptions,
    ) -> Result<Vec<Vec<f32>>, EmbedError> {
        let inputs: Vec<Vec<u32>> = texts.iter().map(|t| self.tokenize(t.as_ref())).collect();
        self.embed_ids(&inputs, options).await
    }

    /// One embedding per token sequence, in order. Every sequence is checked against the
    /// context before any runs, so an error names the first input that cannot fit.
    pub async fn embed_ids(
        &self,
        inputs: &[Vec<u32>],
        options: EmbedOptions,
    ) -> Result<Vec<Vec<f32>>, EmbedError> {
        let pooling = match options.pooling {
            Some(p) => p,
            None => self.default_pooling()?,
        };
        let max = self.context_length();
        for (index, ids) in inputs.iter().enumerate() {
            if ids.is_empty() {
                return Err(EmbedError::Empty { index });
            }
            if ids.len() > max as usize {
                return Err(EmbedError::TooLong {
                    index,
                    tokens: ids.len(),
                    max,
                });
            }
            let vocab = self.vocab();
            if let Some(&id) = ids.iter().find(|&&id| id >= vocab) {
                return Err(EmbedError::OutOfVocabulary { index, id, vocab });
            }
        }
        let dims = self.dimensions();
        let mut out = Vec::with_capacity(inputs.len());
        for pass in self.passes(inputs) {
            let hidden = self.hidden_states(pass).await?;
            let mut rows = hidden.as_slice();
            for ids in pass {
                let (mine, rest) = rows.split_at(ids.len() * dims);
                rows = rest;
                let mut vector = pool(mine, dims, pooling);
                if options.normalize {
                    l2_normalize(&mut vector);
                }
                out.push(vector);
            }
        }
        Ok(out)
    }
}

impl Embedder {
    /// `inputs` split into GPU passes, in order: an encoder's passes greedily hold as many
    /// consecutive inputs as fit its pass; a decoder's hold one each (packing a causal model
    /// would need a causal mask within each sequence as well, and a cache position per token).
    fn passes<'a>(&self, inputs: &'a [Vec<u32>]) -> Vec<&'a [Vec<u32>]> {
        let limit = match &self.network {
            Network::Encoder(encoder) => encoder.pass_tokens() as usize,
            Network::Decoder(_) => return inputs.chunks(1).collect(),
        };
        let mut passes = Vec::new();
        let (mut start, mut tokens) = (0, 0);
        for (index, ids) in inputs.iter().enumerate() {
            if index > start && tokens + ids.len() > limit {
                passes.push(&inputs[start..index]);
                (start, tokens) = (index, 0);
            }
            tokens += ids.len();
        }
        if start < inputs.len() {
            passes.push(&inputs[start..]);
        }
        passes
    }

    /// The hidden states of one pass's inputs, their rows one after another.
    async fn hidden_states(&self, pass: &[Vec<u32>]) -> Result<Vec<f32>, ModelError> {
        match &self.network {
            Network::Encoder(encoder) => {
                let inputs: Vec<&[u32]> = pass.iter().map(Vec::as_slice).collect();
                encoder.hidden_states_packed(&inputs).await
            }
            Network::Decoder(decoder) => decoder.hidden_states(&pass[0]).await,
        }
    }
}

impl PooledDecoder {
    async fn load(
        gpu: Arc<Gpu>,
        source: &dyn RangeSource,
        header: Header,
        max_context: u32,
        progress: &mut dyn FnMut(LoadProgress<'_>),
    ) -> Result<PooledDecoder, ModelError> {
        let model = OpenModel::from_header(header)?;
        let d = model.cfg.d_model;
        let output_norm = host_vector(source, &model.header, "output_norm.weight", d).await?;
        let spec = StageSpec {
            head: false,
            ..StageSpec::whole(&model.cfg, max_context, &gpu)
        };
        let options = LoadOptions::default();
        let stage = Stage::load(gpu, source, &model, spec, options, progress).await?;
        Ok(PooledDecoder { stage, output_norm })
    }

    /// Normed hidden states of every token, the prompt fed in chunks of the stage's batch.
    async fn hidden_states(&self, ids: &[u32]) -> Result<Vec<f32>, ModelError> {
        let max = self.stage.spec.max_context;
        if ids.is_empty() || ids.len() > max as usize {
            return Err(ModelError::ContextFull {
                needed: u32::try_from(ids.len()).unwrap_or(u32::MAX),
                max,
            });
        }
        let vocab = self.stage.cfg.vocab;
        if let Some(bad) = ids.iter().find(|&&id| id >= vocab) {
            return Err(ModelError::Plan(format!(
                "token id {bad} outside the vocabulary of {vocab}"
            )));
        }
        let batch = self.stage.spec.max_batch as usize;
        let mut residual = Vec::with_capacity(ids.len() * self.output_norm.len());
        for (index, chunk) in ids.chunks(batch).enumerate() {
            let start = (index * batch) as u32;
            let input = StageInput::Tokens(chunk);
            residual.extend(self.stage.forward_hidden(&input, start).await?);
        }
        let eps = self.stage.cfg.rms_eps;
        Ok(rms_norm_reference(&residual, &self.output_norm, eps))
    }
}

/// The values of vector tensor `name` (F32 or F16) of `len` elements, on the host.
async fn host_vector(
    source: &dyn RangeSource,
    header: &Header,
    name: &str,
    len: u32,
) -> Result<Vec<f32>, ModelError> {
    let bad = |message: String| ModelError::Tensor {
        tensor: name.into(),
        message,
    };
    let info = header
        .tensor(name)
        .ok_or_else(|| bad("missing from the file".into()))?;
    if info.n_elements() != u64::from(len) {
        return Err(bad(format!("shape {:?}, expected [{len}]", info.shape)));
    }
    let bytes = source.read_range(info.offset, info.bytes).await?;
    let values: Vec<f32> = match info.ggml_type {
        GgmlType::F32 => bytemuck::pod_collect_to_vec(&bytes),
        GgmlType::F16 => bytes
            .chunks_exact(2)
            .map(|h| half::f16::from_le_bytes([h[0], h[1]]).to_f32())
            .collect(),
        other => return Err(ModelError::unsupported(name, other)),
    };
    match values.iter().position(|v| !v.is_finite()) {
        Some(index) => Err(bad(format!("element {index} is not finite"))),
        None => Ok(values),
    }
}

/// Pools `hidden` (`[tokens, dims]` row-major, at least one token) into one vector.
pub fn pool(hidden: &[f32], dims: usize, pooling: Pooling) -> Vec<f32> {
    let tokens = hidden.len() / dims;
    assert!(
        tokens > 0 && hidden.len() == tokens * dims,
        "pool: hidden is not [tokens, dims]"
    );
    match pooling {
        Pooling::Cls => hidden[..dims].to_vec(),
        Pooling::Last => hidden[(tokens - 1) * dims..].to_vec(),
        Pooling::Mean => {
            let mut sum = vec![0.0f64; dims];
            for row in hidden.chunks_exact(dims) {
                for (s, &v) in sum.iter_mut().zip(row) {
                    *s += f64::from(v);
                }
            }
            sum.iter().map(|&s| (s / tokens as f64) as f32).collect()
        }
    }
}

/// Divides `v` by its Euclidean norm, computed in f64; a zero vector stays zero (as
/// llama.cpp's `common_embd_normalize`).
pub fn l2_normalize(v: &mut [f32]) {
    let norm = v
        .iter()
        .map(|&x| f64::from(x) * f64::from(x))
        .sum::<f64>()
        .sqrt();
    if norm > 0.0 {
        for x in v.iter_mut() {
            *x = (f64::from(*x) / norm) as f32;
        }
    }
}

/// Cosine similarity of two vectors of one length, in f64.
pub fn cosine_similarity(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len(), "cosine_similarity of different lengths");
    let dot: f64 = a
        .iter()
        .zip(b)
        .map(|(&x, &y)| f64::from(x) * f64::from(y))
        .sum();
    let norm = |v: &[f32]| v.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>().sqrt();
    dot / (norm(a) * norm(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pooling_picks_mean_first_and_last_rows() {
        let hidden = [1.0, 2.0, 3.0, 4.0, 8.0, 0.0];
        assert_eq!(pool(&hidden, 2, Pooling::Mean), vec![4.0, 2.0]);
        assert_eq!(pool(&hidden, 2, Pooling::Cls), vec![1.0, 2.0]);
        assert_eq!(pool(&hidden, 2, Pooling::Last), vec![8.0, 0.0]);
    }

    #[test]
    fn normalisation_gives_unit_length_and_keeps_zero() {
        let mut v = vec![3.0, 4.0];
        l2_normalize(&mut v);
        assert_eq!(v, vec![0.6, 0.8]);
        let mut zero = vec![0.0; 3];
        l2_normalize(&mut zero);
        assert_eq!(zero, vec![0.0; 3]);
        assert!((cosine_similarity(&[1.0, 0.0], &[2.0, 0.0]) - 1.0).abs() < 1e-12);
    }

    #[test]
    fn pooling_names_and_llama_codes() {
        for p in [Pooling::Mean, Pooling::Cls, Pooling::Last] {
            assert_eq!(Pooling::parse(p.name()), Some(p));
        }
        assert_eq!(Pooling::from_llama(2), Some(Pooling::Cls));
        assert_eq!(Pooling::from_llama(0), None);
        assert_eq!(Pooling::parse("max"), None);
    }
}
