//! The weights of one stage: its layers, plus the embedding and head where it holds them.

use super::config::ModelConfig;
use super::loader::{Loader, Matrix, Vector};
use super::ModelError;

/// One transformer block. Optional parts are present only in the architectures that have them.
#[derive(Debug)]
pub struct LayerWeights {
    pub attn_norm: Vector,
    pub wq: Matrix,
    pub wk: Matrix,
    pub wv: Matrix,
    pub wo: Matrix,
    /// Qwen2's q/k/v biases.
    pub bq: Option<Vector>,
    pub bk: Option<Vector>,
    pub bv: Option<Vector>,
    /// Gemma 3's per-head q and k norms.
    pub q_norm: Option<Vector>,
    pub k_norm: Option<Vector>,
    /// Gemma 3's norms on the attention and feed-forward outputs.
    pub post_attn_norm: Option<Vector>,
    pub post_ffn_norm: Option<Vector>,
    pub ffn_norm: Vector,
    pub w_gate: Matrix,
    pub w_up: Matrix,
    pub w_down: Matrix,
}

/// Embedding (first stage) and final norm plus output head (last stage).
#[derive(Debug)]
pub struct EdgeWeights {
    pub embedding: Option<Matrix>,
    pub output_norm: Option<Vector>,
    pub head: Option<Matrix>,
}

/// Names of block `layer`'s tensors.
pub fn layer_tensor(layer: u32, name: &str) -> String {
    format!("blk.{layer}.{name}.weight")
}

fn layer_bias(layer: u32, name: &str) -> String {
    format!("blk.{layer}.{name}.bias")
}

impl LayerWeights {
    /// Loads block `layer`: the tensors every architecture has, plus whichever optional ones
    /// the file holds.
    pub async fn load(
        loader: &mut Loader<'_>,
        cfg: &ModelConfig,
        layer: u32,
    ) -> Result<LayerWeights, ModelError> {
        let (d, q, kv, ff) = (cfg.d_model, cfg.q_dim(), cfg.kv_dim(), cfg.ff_dim);
        let name = |n: &str| layer_tensor(layer, n);
        if loader.has(&name("attn_q_norm")) != loader.has(&name("attn_k_norm")) {
            return Err(ModelError::Tensor {
                tensor: name("attn_q_norm"),
                message: "per-head q and k norms come in pairs; this block has only one".into(),
            });
        }
        Ok(LayerWeights {
            attn_norm: loader.vector(&name("attn_norm"), d).await?,
            wq: loader.matrix(&name("attn_q"), d, q).await?,
            wk: loader.matrix(&name("attn_k"), d, kv).await?,
            wv: loader.matrix(&name("attn_v"), d, kv).await?,
            wo: loader.matrix(&name("attn_output"), q, d).await?,
            bq: optional_vector(loader, &layer_bias(layer, "attn_q"), q).await?,
            bk: optional_vector(loader, &layer_bias(layer, "attn_k"), kv).await?,
            bv: optional_vector(loader, &layer_bias(layer, "attn_v"), kv).await?,
            q_norm: optional_vector(loader, &name("attn_q_norm"), cfg.head_dim).await?,
            k_norm: optional_vector(loader, &name("attn_k_norm"), cfg.head_dim).await?,
            post_attn_norm: optional_vector(loader, &name("post_attention_norm"), d).await?,
            ffn_norm: loader.vector(&name("ffn_norm"), d).await?,
            w_gate: loader.matrix(&name("ffn_gate"), d, ff).await?,
            w_up: loader.matrix(&name("ffn_up"), d, ff).await?,
            w_down: loader.matrix(&name("ffn_down"), ff, d).await?,
            post_ffn_norm: optional_vector(loader, &name("post_ffw_norm"), d).await?,
        })
    }
}

impl EdgeWeights {
    pub async fn load(
        loader: &mut Loader<'_>,
        cfg: &ModelConfig,
        embedding: bool,
        head: bool,
    ) -> Result<EdgeWeights, ModelError> {
        let (d, vocab) = (cfg.d_model, cfg.vocab);
        let embedding = match embedding {
            true => Some(loader.matrix("token_embd.weight", d, vocab).await?),
            false => None,
        };
        if !head {
            return Ok(EdgeWeights {
                embedding,
                output_norm: None,
                head: None,
            });
        }
        let output_norm = Some(loader.vector("output_norm.weight", d).await?);
        // A tied head reads the embedding matrix; a stage holding both loads it once.
        let head = match (loader.has("output.weight"), &embedding) {
            (true, _) => Some(loader.matrix("output.weight", d, vocab).await?),
            (false, Some(_)) => None,
            (false, None) => Some(loader.matrix("token_embd.weight", d, vocab).await?),
        };
        Ok(EdgeWeights {
            embedding,
            output_norm,
            head,
        })
    }

    /// The output head: its own matrix, or the embedding when the two are tied.
    pub fn head(&self) -> Option<&Matrix> {
        self.head.as_ref().or(self.embedding.as_ref())
    }
}

async fn optional_vector(
    loader: &mut Loader<'_>,
    name: &str,
    len: u32,
) -> Result<Option<Vector>, ModelError> {
    match loader.has(name) {
        true => Ok(Some(loader.vector(name, len).await?)),
        false => Ok(None),
    }
}

/// Names of every tensor a stage over `layers` needs, to size progress and downloads.
pub fn stage_tensor_names(
    header: &crate::gguf::Header,
    layers: std::ops::Range<u32>,
    embedding: bool,
    head: bool,
) -> Vec<String> {
    let in_layers = |name: &str| {
        name.strip_prefix("blk.")
            .and_then(|rest| rest.split('.').next())
            .and_then(|n| n.parse::<u32>().ok())
            .is_some_and(|n| layers.contains(&n))
    };
    let tied = header.tensor("output.weight").is_none();
    header
        .tensors
        .iter()
        .map(|t| t.name.as_str())
        .filter(|name| {
            in_layers(name)
                || (embedding && *name == "token_embd.weight")
                || (head && (*name == "output_norm.weight" || *name == "output.weight"))
                || (head && tied && *name == "token_embd.weight")
        })
        .map(str::to_string)
        .collect()
}
