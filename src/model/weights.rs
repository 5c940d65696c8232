//! The weights of one stage: its layers, plus the embedding and head where it holds them.

use super::config::ModelConfig;
use super::loader::{Loader, Matrix, Vector};
use super::ModelError;

/// One transformer block. Optional parts are read only for architectures that declare them
/// (`Architecture::block_tensors`), and only where the file holds them.
/// Neighbours of one type among q, k and v, and gate and up, share a tensor where they fit one
/// binding (`Loader::matrices`), for decode to compute them in one dispatch.
#[derive(Debug)]
pub struct LayerWeights {
    pub attn_norm: Vector,
    /// The attention projections; `None` in a short-convolution block (`short_conv`).
    pub attention: Option<AttentionMatrices>,
    /// A gated short-convolution block's weights (LFM2), in place of attention.
    pub short_conv: Option<ShortConvWeights>,
    /// The q/k/v biases (`BlockTensors::qkv_bias`), for prefill.
    pub bq: Option<Vector>,
    pub bk: Option<Vector>,
    pub bv: Option<Vector>,
    /// The same biases one after another (zeros for a missing one), for decode, which computes
    /// q, k and v into one buffer in that order.
    pub qkv_bias: Option<Vector>,
    /// Per-head q and k norms (`BlockTensors::qk_norm`).
    pub q_norm: Option<Vector>,
    pub k_norm: Option<Vector>,
    /// Norms on the attention and feed-forward outputs (`BlockTensors::post_norms`).
    pub post_attn_norm: Option<Vector>,
    pub post_ffn_norm: Option<Vector>,
    pub ffn_norm: Vector,
    pub w_gate: Matrix,
    pub w_up: Matrix,
    pub w_down: Matrix,
}

#[derive(Debug)]
pub struct AttentionMatrices {
    pub wq: Matrix,
    pub wk: Matrix,
    pub wv: Matrix,
    pub wo: Matrix,
}

/// `shortconv.in_proj` (d → B, C, x), the convolution's taps `[d][L]` and `out_proj`.
#[derive(Debug)]
pub struct ShortConvWeights {
    pub in_proj: Matrix,
    pub conv: Vector,
    pub out_proj: Matrix,
}

impl LayerWeights {
    /// The attention projections of an attention block.
    pub fn attention(&self) -> &AttentionMatrices {
        // The block kinds of the weights and of the forward both come from the config.
        self.attention
            .as_ref()
            .expect("an attention block's weights hold its projections")
    }
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
    /// Loads block `layer`: the tensors every architecture has, plus the optional ones its
    /// architecture reads that the file holds.
    pub async fn load(
        loader: &mut Loader<'_>,
        cfg: &ModelConfig,
        layer: u32,
    ) -> Result<LayerWeights, ModelError> {
        let (d, q, kv, ff) = (cfg.d_model, cfg.q_dim(), cfg.kv_dim(), cfg.ff_dim);
        let name = |n: &str| layer_tensor(layer, n);
        let reads = cfg.arch.block_tensors;
        if let Some(layout) = cfg.short_conv.as_ref().filter(|l| l.is_conv(layer)) {
            return LayerWeights::load_short_conv(loader, cfg, layer, layout.kernel_len).await;
        }
        if reads.qk_norm && loader.has(&name("attn_q_norm")) != loader.has(&name("attn_k_norm")) {
            return Err(ModelError::Tensor {
                tensor: name("attn_q_norm"),
                message: "per-head q and k norms come in pairs; this block has only one".into(),
            });
        }
        let attn_norm = loader.vector(&name("attn_norm"), d).await?;
        let [q_name, k_name, v_name] = ["attn_q", "attn_k", "attn_v"].map(name);
        let qkv = [(q_name.as_str(), q), (&k_name, kv), (&v_name, kv)];
        let [wq, wk, wv]: [Matrix; 3] =
            loader.matrices(&qkv, d).await?.try_into().expect("q, k, v");
        let [bq, bk, bv, qkv_bias] = match reads.qkv_bias {
            true => qkv_biases(loader, layer, [q, kv, kv]).await?,
            false => [None, None, None, None],
        };
        let wo = loader.matrix(&name("attn_output"), q, d).await?;
        let q_norm =
            optional_vector(loader, &name("attn_q_norm"), cfg.head_dim, reads.qk_norm).await?;
        let k_norm =
            optional_vector(loader, &name("attn_k_norm"), cfg.head_dim, reads.qk_norm).await?;
        let post_attn_norm =
            optional_vector(loader, &name("post_attention_norm"), d, reads.post_norms).await?;
        let ffn_norm = loader.vector(&name("ffn_norm"), d).await?;
        let [gate_name, up_name] = ["ffn_gate", "ffn_up"].map(name);
        let ffn = [(gate_name.as_str(), ff), (&up_name, ff)];
        let [w_gate, w_up]: [Matrix; 2] = loader
            .matrices(&ffn, d)
            .await?
            .try_into()
            .expect("gate, up");
        Ok(LayerWeights {
            attn_norm,
            attention: Some(AttentionMatrices { wq, wk, wv, wo }),
            short_conv: None,
            bq,
            bk,
            bv,
            qkv_bias,
            q_norm,
            k_norm,
            post_attn_norm,
            ffn_norm,
            w_gate,
            w_up,
            w_down: loader.matrix(&name("ffn_down"), ff, d).await?,
            post_ffn_norm: optional_vector(loader, &name("post_ffw_norm"), d, reads.post_norms)
                .await?,
        })
    }
}

impl LayerWeights {
    /// A short-convolution block: its norms, `shortconv.*` and the feed-forward.
    async fn load_short_conv(
        loader: &mut Loader<'_>,
        cfg: &ModelConfig,
        layer: u32,
        kernel_len: u32,
    ) -> Result<LayerWeights, ModelError> {
        let (d, ff) = (cfg.d_model, cfg.ff_dim);
        let name = |n: &str| layer_tensor(layer, n);
        let attn_norm = loader.vector(&name("attn_norm"), d).await?;
        let short_conv = ShortConvWeights {
            in_proj: loader.matrix(&name("shortconv.in_proj"), d, 3 * d).await?,
            conv: loader.table(&name("shortconv.conv"), kernel_len, d).await?,
            out_proj: loader.matrix(&name("shortconv.out_proj"), d, d).await?,
        };
        let ffn_norm = loader.vector(&name("ffn_norm"), d).await?;
        let [gate_name, up_name] = ["ffn_gate", "ffn_up"].map(name);
        let ffn = [(gate_name.as_str(), ff), (&up_name, ff)];
        let [w_gate, w_up]: [Matrix; 2] = loader
            .matrices(&ffn, d)
            .await?
            .try_into()
            .expect("gate, up");
        Ok(LayerWeights {
            attn_norm,
            attention: None,
            short_conv: Some(short_conv),
            bq: None,
            bk: None,
            bv: None,
            qkv_bias: None,
            q_norm: None,
            k_norm: None,
            post_attn_norm: None,
            post_ffn_norm: None,
            ffn_norm,
            w_gate,
            w_up,
            w_down: loader.matrix(&name("ffn_down"), ff, d).await?,
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
        let output_norm = Some(loader.vector(cfg.output_norm, d).await?);
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

/// The q, k and v biases (where the file has them) and their concatenation, zeros standing in
/// for a missing one; all `None` without any.
async fn qkv_biases(
    loader: &mut Loader<'_>,
    layer: u32,
    lens: [u32; 3],
) -> Result<[Option<Vector>; 4], ModelError> {
    let names = ["attn_q", "attn_k", "attn_v"].map(|n| layer_bias(layer, n));
    if !names.iter().any(|n| loader.has(n)) {
        return Ok([None, None, None, None]);
    }
    let mut biases = [None, None, None];
    let mut concatenated = Vec::new();
    for ((name, len), bias) in names.iter().zip(lens).zip(&mut biases) {
        if loader.has(name) {
            let values = loader.vector_values(name, len).await?;
            *bias = Some(loader.upload_vector(name, &values));
            concatenated.extend(values);
        } else {
            concatenated.extend(std::iter::repeat_n(0.0, len as usize));
        }
    }
    let qkv = loader.upload_vector(&layer_bias(layer, "attn_qkv"), &concatenated);
    let [bq, bk, bv] = biases;
    Ok([bq, bk, bv, Some(qkv)])
}

/// The vector `name` where the architecture `reads` it and the file holds it.
async fn optional_vector(
    loader: &mut Loader<'_>,
    name: &str,
    len: u32,
    reads: bool,
) -> Result<Option<Vector>, ModelError> {
    match reads && loader.has(name) {
        true => Ok(Some(loader.vector(name, len).await?)),
        false => Ok(None),
    }
}

/// Names of every tensor a stage over `layers` needs, to size progress and downloads.
pub fn stage_tensor_names(
    header: &crate::gguf::Header,
    cfg: &ModelConfig,
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
                || (head && (*name == cfg.output_norm || *name == "output.weight"))
                || (head && tied && *name == "token_embd.weight")
        })
        .map(str::to_string)
        .collect()
}
