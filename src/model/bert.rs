//! The BERT encoder as llama.cpp's `bert` architecture (MiniLM, BGE, E5): learned absolute
//! positions, token-type row 0 added to every token, LayerNorms with bias after each sublayer,
//! bidirectional attention and a GELU feed-forward, every projection with a bias.
//!
//! ```text
//! x = layer_norm(tok[id] + type[0] + pos[p])
//! x = layer_norm(x + Wo · attention(Wq·x + bq, Wk·x + bk, Wv·x + bv) + bo)   (no causal mask)
//! x = layer_norm(x + Wdown · gelu(Wup·x + bup) + bdown)
//! ```
//!
//! `nomic-bert` (nomic-embed-text) is the same encoder with rotary positions instead of learned
//! ones (NeoX pairs, `nomic-bert.rope.freq_base`), q, k and v in one fused `attn_qkv` tensor,
//! no biases, and a SwiGLU feed-forward: `Wdown · (silu(Wgate·x) * Wup·x)`.
//!
//! The output is the hidden state of every token; pooling (`crate::embed`) makes embeddings.
//! One call packs several sequences (at most `pass_tokens` tokens in all), as llama.cpp's
//! sequence ids in one ubatch: their tokens follow one another, positions restart at each
//! sequence, and attention keeps every token to its own sequence (`segmented_attention`), so
//! the projections and feed-forward run over all the tokens at once and no padding is
//! computed. Keys and values go through a `KvCache` of `pass_tokens` positions so the
//! attention kernels are the decoders' own.

use std::sync::Arc;

use crate::gguf::{Header, Metadata, RangeSource};
use crate::gpu::{self, Gpu, Recorder};
use crate::ops::attention::{
    kv_write, segment_table, segmented_attention, AttentionParams, KvCache, Segments,
};
use crate::ops::elementwise::{activate, add_bias, add_in_place, gated_activation, Activation};
use crate::ops::norm::layer_norm;
use crate::ops::quant::{embed, matmul_product};
use crate::ops::rope::{rope_at, RopeParams};

use super::loader::{LoadOptions, LoadProgress, Loader, Matrix, Vector};
use super::ModelError;

/// `general.architecture` of the files this module runs.
pub const ARCHITECTURE: &str = "bert";
/// nomic-bert's `general.architecture`.
pub const NOMIC_ARCHITECTURE: &str = "nomic-bert";
/// Every encoder architecture this module runs.
pub const ENCODER_ARCHITECTURES: &[&str] = &[ARCHITECTURE, NOMIC_ARCHITECTURE];
/// Upper bound on the context an encoder may declare (BERT's is 512; long-context ones 8192).
const MAX_CONTEXT: u32 = 1 << 16;
/// Tokens one packed call holds at least (more where the context is longer): 16 inputs of
/// 128 tokens, enough rows that a GPU's matmul tiles fill, at ~30 KB of activations a token
/// for MiniLM.
const MIN_PASS_TOKENS: u32 = 2048;

/// The shape of a BERT encoder, from `bert.*` metadata.
#[derive(Debug, Clone, PartialEq)]
pub struct BertConfig {
    pub n_layers: u32,
    pub d_model: u32,
    pub n_heads: u32,
    pub head_dim: u32,
    pub ff_dim: u32,
    pub vocab: u32,
    pub context_length: u32,
    pub norm_eps: f32,
    /// `bert.pooling_type` as llama.cpp numbers it (0 none, 1 mean, 2 CLS, 3 last, 4 rank).
    pub pooling_type: Option<u32>,
    /// nomic-bert's rotary positions; `None` for learned ones (bert).
    pub rope: Option<RopeParams>,
}

fn positive(meta: &Metadata, key: &str) -> Result<u32, ModelError> {
    match meta.get_u32(key)? {
        0 => Err(ModelError::Plan(format!("{key} is 0"))),
        v => Ok(v),
    }
}

impl BertConfig {
    pub fn from_header(header: &Header) -> Result<BertConfig, ModelError> {
        let arch = header.architecture()?;
        if !ENCODER_ARCHITECTURES.contains(&arch) {
            return Err(ModelError::Plan(format!(
                "general.architecture is {arch:?}, not an encoder this engine runs ({ENCODER_ARCHITECTURES:?})"
            )));
        }
        let meta = &header.metadata;
        let key = |suffix: &str| format!("{arch}.{suffix}");
        let d_model = positive(meta, &key("embedding_length"))?;
        let n_heads = positive(meta, &key("attention.head_count"))?;
        let vocab = header
            .tensor("token_embd.weight")
            .and_then(|t| t.shape.get(1).copied())
            .ok_or_else(|| ModelError::Tensor {
                tensor: "token_embd.weight".into(),
                message: "missing or not a matrix".into(),
            })?;
        let cfg = BertConfig {
            n_layers: positive(meta, &key("block_count"))?,
            d_model,
            n_heads,
            head_dim: d_model / n_heads,
            ff_dim: positive(meta, &key("feed_forward_length"))?,
            vocab: u32::try_from(vocab)
                .map_err(|_| ModelError::Plan("vocabulary too large".into()))?,
            context_length: positive(meta, &key("context_length"))?,
            norm_eps: meta.get_f32(&key("attention.layer_norm_epsilon"))?,
            pooling_type: meta.opt_u32(&key("pooling_type"))?,
            rope: match arch == NOMIC_ARCHITECTURE {
                true => Some(RopeParams {
                    head_dim: d_model / n_heads,
                    rope_dims: d_model / n_heads,
                    freq_base: meta.opt_f32(&key("rope.freq_base"))?.unwrap_or(10_000.0),
                    freq_scale: 1.0,
                    neox: true,
                }),
                false => None,
            },
        };
        cfg.validate()
    }

    fn validate(self) -> Result<BertConfig, ModelError> {
        let fail = |why: String| Err(ModelError::Plan(why));
        if !self.d_model.is_multiple_of(self.n_heads) || !self.head_dim.is_multiple_of(16) {
            return fail(format!(
                "{} heads do not split {} dimensions into heads of a multiple of 16",
                self.n_heads, self.d_model
            ));
        }
        if self.context_length > MAX_CONTEXT {
            return fail(format!(
                "context length {} beyond the limit of {MAX_CONTEXT}",
                self.context_length
            ));
        }
        if let Some(rope) = self
            .rope
            .filter(|r| !(r.freq_base.is_finite() && r.freq_base > 0.0))
        {
            return fail(format!("rope.freq_base {} is not valid", rope.freq_base));
        }
        if !(self.norm_eps.is_finite() && self.norm_eps >= 0.0) {
            return fail(format!("layer_norm_epsilon {} is not valid", self.norm_eps));
        }
        Ok(self)
    }
}

/// A LayerNorm's weight and bias.
#[derive(Debug)]
struct Norm {
    weight: Vector,
    bias: Vector,
}

impl Norm {
    /// out = LayerNorm(x) over `rows` rows of `cols`.
    fn record(
        &self,
        rec: &mut Recorder,
        x: &wgpu::Buffer,
        out: &wgpu::Buffer,
        [rows, cols]: [u32; 2],
        eps: f32,
    ) {
        let (weight, bias) = (&self.weight.buffer, &self.bias.buffer);
        layer_norm(rec, x, weight, bias, out, rows, cols, eps);
    }
}

/// A projection and its bias.
#[derive(Debug)]
struct Linear {
    weight: Matrix,
    bias: Vector,
}

#[derive(Debug)]
struct BertLayer {
    q: Linear,
    k: Linear,
    v: Linear,
    out: Linear,
    attn_norm: Norm,
    up: Linear,
    /// SwiGLU's gate (nomic-bert); `None` for GELU.
    gate: Option<Linear>,
    down: Linear,
    out_norm: Norm,
}

/// Activations of one call, for at most `pass_tokens` tokens.
#[derive(Debug)]
struct Buffers {
    ids: wgpu::Buffer,
    /// Each token's position in its own sequence.
    positions: wgpu::Buffer,
    /// `segment_table`'s words: each token's first and last key.
    segments: wgpu::Buffer,
    zeros: wgpu::Buffer,
    x: wgpu::Buffer,
    tmp: wgpu::Buffer,
    q: wgpu::Buffer,
    k: wgpu::Buffer,
    v: wgpu::Buffer,
    attn: wgpu::Buffer,
    ff: wgpu::Buffer,
    gate: wgpu::Buffer,
    gated: wgpu::Buffer,
}

/// A loaded encoder on one device.
pub struct BertEncoder {
    gpu: Arc<Gpu>,
    pub cfg: BertConfig,
    token_embd: Matrix,
    /// Learned positions (bert); nomic-bert rotates q and k instead.
    position_embd: Option<Matrix>,
    token_types: Option<Matrix>,
    embd_norm: Norm,
    layers: Vec<BertLayer>,
    cache: KvCache,
    buffers: Buffers,
}

impl BertEncoder {
    /// Loads every tensor of the encoder from `source`.
    pub async fn load(
        gpu: Arc<Gpu>,
        source: &dyn RangeSource,
        header: &Header,
        progress: &mut dyn FnMut(LoadProgress<'_>),
    ) -> Result<BertEncoder, ModelError> {
        let cfg = BertConfig::from_header(header)?;
        let total = header.tensors.iter().map(|t| t.bytes).sum();
        let options = LoadOptions::default();
        let mut loader = Loader::new(&gpu, source, header, options, total, progress);
        let d = cfg.d_model;
        let token_embd = loader.matrix("token_embd.weight", d, cfg.vocab).await?;
        let position_embd = match cfg.rope {
            Some(_) => None,
            None => Some(
                loader
                    .matrix("position_embd.weight", d, cfg.context_length)
                    .await?,
            ),
        };
        let token_types = match header.tensor("token_types.weight") {
            Some(info) => {
                let rows = info.shape.get(1).copied().unwrap_or(0).clamp(1, 16) as u32;
                Some(loader.matrix("token_types.weight", d, rows).await?)
            }
            None => None,
        };
        let embd_norm = norm(&mut loader, "token_embd_norm", d).await?;
        let mut layers = Vec::with_capacity(cfg.n_layers as usize);
        for layer in 0..cfg.n_layers {
            layers.push(load_layer(&mut loader, &cfg, layer).await?);
        }
        loader.flush();
        let pass_tokens = cfg.context_length.max(MIN_PASS_TOKENS);
        let cache = KvCache::new(&gpu, cfg.n_layers, pass_tokens, cfg.n_heads, cfg.head_dim)?;
        let buffers = Buffers::new(&gpu, &cfg, pass_tokens);
        Ok(BertEncoder {
            gpu,
            cfg,
            token_embd,
            position_embd,
            token_types,
            embd_norm,
            layers,
            cache,
            buffers,
        })
    }

    /// The most tokens one `hidden_states_packed` call takes, all its sequences together.
    pub fn pass_tokens(&self) -> u32 {
        self.cache.max_ctx
    }

    /// The hidden states of several sequences in one GPU pass, each computed as if alone:
    /// `[tokens, d_model]` row-major, the sequences' rows one after another in order.
    pub async fn hidden_states_packed(&self, inputs: &[&[u32]]) -> Result<Vec<f32>, ModelError> {
        let mut lengths = Vec::with_capacity(inputs.len());
        for ids in inputs {
            self.check_sequence(ids)?;
            lengths.push(ids.len() as u32);
        }
        let tokens: u32 = lengths.iter().sum();
        if tokens == 0 || tokens > self.pass_tokens() {
            return Err(ModelError::Plan(format!(
                "{} sequences of {tokens} tokens in all do not fit one pass of 1..={} tokens",
                inputs.len(),
                self.pass_tokens()
            )));
        }
        let ids: Vec<u32> = inputs.concat();
        let positions: Vec<u32> = lengths.iter().flat_map(|&n| 0..n).collect();
        let (gpu, b) = (&self.gpu, &self.buffers);
        gpu.queue
            .write_buffer(&b.ids, 0, bytemuck::cast_slice(&ids));
        gpu.queue
            .write_buffer(&b.positions, 0, bytemuck::cast_slice(&positions));
        let table = segment_table(&lengths);
        gpu.queue
            .write_buffer(&b.segments, 0, bytemuck::cast_slice(&table));
        let segments = Segments {
            lengths: &lengths,
            table: &b.segments,
        };
        let mut rec = Recorder::new(gpu);
        self.record_embeddings(&mut rec, tokens);
        for (index, layer) in self.layers.iter().enumerate() {
            self.record_layer(&mut rec, layer, index as u32, &segments);
        }
        let bytes = u64::from(tokens) * u64::from(self.cfg.d_model) * 4;
        let data = rec.submit_and_read(&b.x, 0, bytes).await?;
        Ok(bytemuck::pod_collect_to_vec(&data))
    }

    /// One sequence's ids: 1..=context_length of them, each in the vocabulary.
    fn check_sequence(&self, ids: &[u32]) -> Result<(), ModelError> {
        if ids.is_empty() {
            return Err(ModelError::Plan(
                "an empty token sequence has no hidden states".into(),
            ));
        }
        if ids.len() > self.cfg.context_length as usize {
            return Err(ModelError::ContextFull {
                needed: u32::try_from(ids.len()).unwrap_or(u32::MAX),
                max: self.cfg.context_length,
            });
        }
        match ids.iter().find(|&&id| id >= self.cfg.vocab) {
            Some(bad) => Err(ModelError::Plan(format!(
                "token id {bad} outside the vocabulary of {}",
                self.cfg.vocab
            ))),
            None => Ok(()),
        }
    }

    fn record_embeddings(&self, rec: &mut Recorder, tokens: u32) {
        let b = &self.buffers;
        let (d, eps) = (self.cfg.d_model, self.cfg.norm_eps);
        embed(rec, &self.token_embd.view(), &b.ids, &b.tmp, tokens, 1.0);
        if let Some(positions) = &self.position_embd {
            embed(rec, &positions.view(), &b.positions, &b.attn, tokens, 1.0);
            add_in_place(rec, &b.tmp, &b.attn, tokens * d);
        }
        if let Some(types) = &self.token_types {
            // llama.cpp gives every token type 0 ("sentence A").
            embed(rec, &types.view(), &b.zeros, &b.attn, tokens, 1.0);
            add_in_place(rec, &b.tmp, &b.attn, tokens * d);
        }
        self.embd_norm.record(rec, &b.tmp, &b.x, [tokens, d], eps);
    }

    fn record_layer(&self, rec: &mut Recorder, layer: &BertLayer, index: u32, segments: &Segments) {
        let b = &self.buffers;
        let tokens = segments.tokens();
        let cfg = &self.cfg;
        let d = cfg.d_model;
        linear(rec, &layer.q, &b.x, &b.q, tokens);
        linear(rec, &layer.k, &b.x, &b.k, tokens);
        linear(rec, &layer.v, &b.x, &b.v, tokens);
        if let Some(params) = &cfg.rope {
            rope_at(rec, &b.q, tokens, cfg.n_heads, &b.positions, params);
            rope_at(rec, &b.k, tokens, cfg.n_heads, &b.positions, params);
        }
        kv_write(rec, &self.cache, index, &b.k, &b.v, 0, tokens);
        let params = AttentionParams::standard(cfg.n_heads, cfg.n_heads, cfg.head_dim);
        segmented_attention(rec, &b.q, &self.cache, index, &b.attn, segments, &params);
        linear(rec, &layer.out, &b.attn, &b.tmp, tokens);
        add_in_place(rec, &b.tmp, &b.x, tokens * d);
        layer
            .attn_norm
            .record(rec, &b.tmp, &b.x, [tokens, d], cfg.norm_eps);
        linear(rec, &layer.up, &b.x, &b.ff, tokens);
        let ff = tokens * cfg.ff_dim;
        let activated = match &layer.gate {
            Some(gate) => {
                linear(rec, gate, &b.x, &b.gate, tokens);
                gated_activation(rec, &b.gate, &b.ff, &b.gated, ff, Activation::Silu);
                &b.gated
            }
            None => {
                activate(rec, &b.ff, ff, Activation::GeluTanh);
                &b.ff
            }
        };
        linear(rec, &layer.down, activated, &b.tmp, tokens);
        add_in_place(rec, &b.tmp, &b.x, tokens * d);
        layer
            .out_norm
            .record(rec, &b.tmp, &b.x, [tokens, d], cfg.norm_eps);
    }
}

/// out = W·x + b for `tokens` rows, with one kernel whatever `tokens` is (not `quant::matmul`,
/// which takes the matrix-vector kernel for few tokens): a text's vector then does not depend
/// on the texts batched with it. The two kernels differ by float rounding (about 1e-7), which
/// the f16 variants' attention tiles can turn into a whole f16 step of a key or value (1.3e-5
/// in a MiniLM vector on lavapipe).
fn linear(rec: &mut Recorder, l: &Linear, x: &wgpu::Buffer, out: &wgpu::Buffer, tokens: u32) {
    matmul_product(rec, &l.weight.view(), x, out, tokens);
    add_bias(rec, out, &l.bias.buffer, tokens, l.weight.rows);
}

async fn norm(loader: &mut Loader<'_>, name: &str, len: u32) -> Result<Norm, ModelError> {
    Ok(Norm {
        weight: loader.vector(&format!("{name}.weight"), len).await?,
        bias: loader.vector(&format!("{name}.bias"), len).await?,
    })
}

async fn linear_weights(
    loader: &mut Loader<'_>,
    name: &str,
    cols: u32,
    rows: u32,
) -> Result<Linear, ModelError> {
    let weight = loader.matrix(&format!("{name}.weight"), cols, rows).await?;
    let bias_name = format!("{name}.bias");
    // llama.cpp treats the projection biases as optional; a missing one is zero.
    let bias = match loader.has(&bias_name) {
        true => loader.vector(&bias_name, rows).await?,
        false => loader.upload_vector(&bias_name, &vec![0.0; rows as usize]),
    };
    Ok(Linear { weight, bias })
}

/// q, k and v from one `[d, 3d]` tensor (rows q, then k, then v), each a view of its rows;
/// a fused bias is split the same way, a missing one is zero.
async fn fused_qkv(loader: &mut Loader<'_>, name: &str, d: u32) -> Result<[Linear; 3], ModelError> {
    let fused = loader.matrix(&format!("{name}.weight"), d, 3 * d).await?;
    let bias_name = format!("{name}.bias");
    let biases = match loader.has(&bias_name) {
        true => loader.vector_values(&bias_name, 3 * d).await?,
        false => vec![0.0; 3 * d as usize],
    };
    let part = |index: u32| Linear {
        weight: Matrix {
            weights: Arc::clone(&fused.weights),
            row_offset: fused.row_offset + index * d,
            quant: fused.quant,
            cols: d,
            rows: d,
        },
        bias: loader.upload_vector(
            &bias_name,
            &biases[(index * d) as usize..((index + 1) * d) as usize],
        ),
    };
    Ok([part(0), part(1), part(2)])
}

async fn load_layer(
    loader: &mut Loader<'_>,
    cfg: &BertConfig,
    layer: u32,
) -> Result<BertLayer, ModelError> {
    let (d, ff) = (cfg.d_model, cfg.ff_dim);
    let name = |n: &str| format!("blk.{layer}.{n}");
    let [q, k, v] = match loader.has(&name("attn_qkv.weight")) {
        true => fused_qkv(loader, &name("attn_qkv"), d).await?,
        false => [
            linear_weights(loader, &name("attn_q"), d, d).await?,
            linear_weights(loader, &name("attn_k"), d, d).await?,
            linear_weights(loader, &name("attn_v"), d, d).await?,
        ],
    };
    let gate = match cfg.rope {
        Some(_) => Some(linear_weights(loader, &name("ffn_gate"), d, ff).await?),
        None => None,
    };
    Ok(BertLayer {
        q,
        k,
        v,
        out: linear_weights(loader, &name("attn_output"), d, d).await?,
        attn_norm: norm(loader, &name("attn_output_norm"), d).await?,
        up: linear_weights(loader, &name("ffn_up"), d, ff).await?,
        gate,
        down: linear_weights(loader, &name("ffn_down"), ff, d).await?,
        out_norm: norm(loader, &name("layer_output_norm"), d).await?,
    })
}

impl Buffers {
    fn new(gpu: &Gpu, cfg: &BertConfig, tokens: u32) -> Buffers {
        let rows = |cols: u32| u64::from(tokens) * u64::from(cols) * 4;
        let activations = |label: &str, cols: u32| gpu::storage_buffer(gpu, label, rows(cols));
        let words = |label: &str, per_token: u32| {
            gpu::upload_u32(gpu, label, &vec![0; (tokens * per_token) as usize])
        };
        Buffers {
            ids: words("bert ids", 1),
            positions: words("bert positions", 1),
            segments: words("bert segments", 2),
            zeros: words("bert token types", 1),
            x: activations("bert x", cfg.d_model),
            tmp: activations("bert tmp", cfg.d_model),
            q: activations("bert q", cfg.d_model),
            k: activations("bert k", cfg.d_model),
            v: activations("bert v", cfg.d_model),
            attn: activations("bert attn", cfg.d_model),
            ff: activations("bert ff", cfg.ff_dim),
            gate: activations("bert gate", cfg.ff_dim),
            gated: activations("bert gated", cfg.ff_dim),
        }
    }
}
