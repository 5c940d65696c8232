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
        let [wq, wk, wv]: [Matrix; 3] = attention_projections(loader, layer, [q, kv, kv], d)
            .await?
            .try_into()
            .expect("q, k, v");
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
        let [w_gate, w_up]: [Matrix; 2] = gate_and_up(loader, layer, ff, d)
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
        let none = EdgeWeights {
            embedding: None,
            output_norm: None,
            head: None,
        };
        none.reshape(loader, cfg, embedding, head).await
    }

    /// These edges made into those of a stage with the embedding (`embedding`) and the head
    /// (`head`): what is held and still needed stays, the rest is dropped before anything
    /// missing loads.
    pub async fn reshape(
        self,
        loader: &mut Loader<'_>,
        cfg: &ModelConfig,
        embedding: bool,
        head: bool,
    ) -> Result<EdgeWeights, ModelError> {
        let (d, vocab) = (cfg.d_model, cfg.vocab);
        // A tied head reads the embedding matrix; a stage holding both loads it once.
        let tied = !loader.has("output.weight");
        // The held matrices by tensor: a tied head held alone is `token_embd.weight`.
        let (token_embd, output) = match (tied, self.head) {
            (true, held) => (self.embedding.or(held), None),
            (false, held) => (self.embedding, held),
        };
        // What the new stage does not need goes before anything loads.
        let mut token_embd = token_embd.filter(|_| embedding || (head && tied));
        let output = output.filter(|_| head);
        let output_norm = self.output_norm.filter(|_| head);
        let embedding = match (embedding, token_embd.take()) {
            (true, Some(held)) => Some(held),
            (true, None) => Some(loader.matrix("token_embd.weight", d, vocab).await?),
            // A tied head alone keeps the matrix.
            (false, held) => {
                token_embd = held;
                None
            }
        };
        if !head {
            return Ok(EdgeWeights {
                embedding,
                output_norm: None,
                head: None,
            });
        }
        let output_norm = match output_norm {
            Some(held) => held,
            None => loader.vector(cfg.output_norm, d).await?,
        };
        let head = match (tied, &embedding, output, token_embd) {
            (false, _, Some(held), _) => Some(held),
            (false, _, None, _) => Some(loader.matrix("output.weight", d, vocab).await?),
            (true, Some(_), _, _) => None,
            (true, None, _, Some(held)) => Some(held),
            (true, None, _, None) => Some(loader.matrix("token_embd.weight", d, vocab).await?),
        };
        Ok(EdgeWeights {
            embedding,
            output_norm: Some(output_norm),
            head,
        })
    }

    /// The output head: its own matrix, or the embedding when the two are tied.
    pub fn head(&self) -> Option<&Matrix> {
        self.head.as_ref().or(self.embedding.as_ref())
    }
}

/// Wq, Wk and Wv: from the fused `attn_qkv` where the file has it (Phi-3; llama.cpp's
/// `create_tensor_qkv` accepts either form for every architecture), else their own tensors.
async fn attention_projections(
    loader: &mut Loader<'_>,
    layer: u32,
    rows: [u32; 3],
    d: u32,
) -> Result<Vec<Matrix>, ModelError> {
    let fused = layer_tensor(layer, "attn_qkv");
    if loader.has(&fused) {
        return loader.split_matrix(&fused, d, &rows).await;
    }
    let names = ["attn_q", "attn_k", "attn_v"].map(|n| layer_tensor(layer, n));
    let members: Vec<(&str, u32)> = names.iter().map(String::as_str).zip(rows).collect();
    loader.matrices(&members, d).await
}

/// Wgate and Wup: their own tensors, or without `ffn_gate` the fused gate|up of Phi-3's
/// `ffn_up` (`[d, 2 * ff]`, the gate's rows first, as llama.cpp's swiglu splits it).
async fn gate_and_up(
    loader: &mut Loader<'_>,
    layer: u32,
    ff: u32,
    d: u32,
) -> Result<Vec<Matrix>, ModelError> {
    let [gate, up] = ["ffn_gate", "ffn_up"].map(|n| layer_tensor(layer, n));
    if !loader.has(&gate) && loader.has(&up) {
        return loader.split_matrix(&up, d, &[ff, ff]).await;
    }
    loader
        .matrices(&[(gate.as_str(), ff), (up.as_str(), ff)], d)
        .await
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

/// Llama 3's per-pair RoPE frequency factors (written by the converter from `rope_scaling`).
const ROPE_FREQS: &str = "rope_freqs.weight";
/// Phi-3's factors past and within the original context (`rope.scaling.original_context_length`).
const ROPE_FACTORS_LONG: &str = "rope_factors_long.weight";
const ROPE_FACTORS_SHORT: &str = "rope_factors_short.weight";
const ROPE_FACTOR_TENSORS: [&str; 3] = [ROPE_FREQS, ROPE_FACTORS_LONG, ROPE_FACTORS_SHORT];

/// The RoPE factor tensor a stage with a cache of `max_context` positions uses, as llama.cpp's
/// `get_rope_factors` chooses it: `rope_freqs` where the file has it, else Phi-3's long factors
/// when the context is longer than the original one, else its short factors.
pub fn rope_factors_tensor(
    has: impl Fn(&str) -> bool,
    cfg: &ModelConfig,
    max_context: u32,
) -> Option<&'static str> {
    let original = cfg.rope_original_context.unwrap_or(cfg.context_length);
    let name = match (has(ROPE_FREQS), max_context > original) {
        (true, _) => ROPE_FREQS,
        (false, true) => ROPE_FACTORS_LONG,
        (false, false) => ROPE_FACTORS_SHORT,
    };
    has(name).then_some(name)
}

/// The stage's RoPE frequency factors (rope_dims / 2 of them, each positive), where the file
/// has them or the model scales cos and sin (then all ones, for the kernels' one scaled path).
pub async fn load_rope_factors(
    loader: &mut Loader<'_>,
    cfg: &ModelConfig,
    max_context: u32,
) -> Result<Option<Vector>, ModelError> {
    let pairs = cfg.rope.rope_dims / 2;
    let values = match rope_factors_tensor(|n| loader.has(n), cfg, max_context) {
        Some(name) => {
            let values = loader.vector_values(name, pairs).await?;
            if let Some(bad) = values.iter().position(|v| *v <= 0.0) {
                return Err(ModelError::Tensor {
                    tensor: name.into(),
                    message: format!("factor {bad} is {}, not positive", values[bad]),
                });
            }
            values
        }
        None if cfg.rope_attn_factor != 1.0 => vec![1.0; pairs as usize],
        None => return Ok(None),
    };
    let inverse: Vec<f32> = values.iter().map(|f| 1.0 / f).collect();
    Ok(Some(loader.upload_vector("rope inverse factors", &inverse)))
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
                || (!layers.is_empty() && ROPE_FACTOR_TENSORS.contains(name))
                || (embedding && *name == "token_embd.weight")
                || (head && (*name == cfg.output_norm || *name == "output.weight"))
                || (head && tied && *name == "token_embd.weight")
        })
        .map(str::to_string)
        .collect()
}
