//! Activation buffers of a stage, sized once for its largest batch.

use crate::gpu::{storage_buffer, Gpu};
use crate::ops::select::{mask_words, MAX_TOP_K};

use super::config::ModelConfig;

/// Most rows the head computes logits for in one submit (vocabularies reach 262k entries).
pub const HEAD_ROWS: u32 = 16;

pub struct Scratch {
    pub ids: wgpu::Buffer,
    /// The residual stream, `[tokens, d_model]`.
    pub hidden: wgpu::Buffer,
    pub normed: wgpu::Buffer,
    pub q: wgpu::Buffer,
    pub k: wgpu::Buffer,
    pub v: wgpu::Buffer,
    /// q, k and v of one token one after another (decode computes them into one buffer), or
    /// of up to `qkv_rows` tokens in sections (`rope::StoreTarget::sections`).
    pub qkv: wgpu::Buffer,
    pub qkv_rows: u32,
    pub attn: wgpu::Buffer,
    /// A block's output before it joins the residual stream.
    pub delta: wgpu::Buffer,
    /// One token's residual stream between the two halves of a Gemma 3 block, where its
    /// products fold the post-norms in (`block::Stream`): they read one copy and write the other.
    pub hidden_alt: wgpu::Buffer,
    pub gate: wgpu::Buffer,
    pub up: wgpu::Buffer,
    pub act: wgpu::Buffer,
    pub head_in: wgpu::Buffer,
    pub head_normed: wgpu::Buffer,
    pub logits: wgpu::Buffer,
    /// The greedy id of each head row (`HEAD_ROWS` of them; a decode step uses the first).
    pub argmax: wgpu::Buffer,
    /// A constrained step's allowed set as a bitset (`ops::select::mask`).
    pub allowed: wgpu::Buffer,
    /// A masked top-k's ids, then (copied after them for one readback) its values.
    pub top_ids: wgpu::Buffer,
    pub top_values: wgpu::Buffer,
    /// A short-convolution block's B, C and x, `[tokens, 3 · d_model]` (LFM2; 4 bytes for
    /// models without one).
    pub mixer: wgpu::Buffer,
    /// A batched decode step's row table (position, slot base) per row
    /// (`attention::row_table`), `[max_batch, 2]` u32.
    pub row_table: wgpu::Buffer,
}

impl Scratch {
    /// The bytes `new` allocates (for fitting a model before loading it).
    pub fn bytes(cfg: &ModelConfig, max_batch: u32) -> u64 {
        // ids and the row table, then hidden..act as listed in `new`.
        let per_row = 3 + 3 * cfg.d_model + 2 * cfg.q_dim() + 2 * cfg.kv_dim() + 3 * cfg.ff_dim;
        // qkv (below) and hidden_alt.
        let sections = qkv_rows(max_batch) * (cfg.q_dim() + 2 * cfg.kv_dim());
        let one_token = sections + cfg.d_model;
        let head = 2 * cfg.d_model + cfg.vocab;
        // argmax (one per head row), the allowed set, top-k ids (with room for the values)
        // and values.
        let selection = HEAD_ROWS + mask_words(cfg.vocab) + 3 * MAX_TOP_K;
        4 * (u64::from(max_batch) * u64::from(per_row)
            + u64::from(one_token)
            + u64::from(HEAD_ROWS) * u64::from(head)
            + u64::from(selection))
            + mixer_bytes(cfg, max_batch)
    }

    pub fn new(gpu: &Gpu, cfg: &ModelConfig, max_batch: u32) -> Scratch {
        let rows = u64::from(max_batch);
        let f32s =
            |label: &str, per_row: u32| storage_buffer(gpu, label, rows * u64::from(per_row) * 4);
        let head = u64::from(HEAD_ROWS);
        Scratch {
            ids: storage_buffer(gpu, "ids", rows * 4),
            hidden: f32s("hidden", cfg.d_model),
            normed: f32s("normed", cfg.d_model),
            q: f32s("q", cfg.q_dim()),
            k: f32s("k", cfg.kv_dim()),
            v: f32s("v", cfg.kv_dim()),
            qkv: storage_buffer(
                gpu,
                "qkv",
                u64::from(qkv_rows(max_batch) * (cfg.q_dim() + 2 * cfg.kv_dim())) * 4,
            ),
            qkv_rows: qkv_rows(max_batch),
            attn: f32s("attn", cfg.q_dim()),
            delta: f32s("delta", cfg.d_model),
            hidden_alt: storage_buffer(gpu, "hidden alt", u64::from(cfg.d_model) * 4),
            gate: f32s("gate", cfg.ff_dim),
            up: f32s("up", cfg.ff_dim),
            act: f32s("act", cfg.ff_dim),
            head_in: storage_buffer(gpu, "head_in", head * u64::from(cfg.d_model) * 4),
            head_normed: storage_buffer(gpu, "head_normed", head * u64::from(cfg.d_model) * 4),
            logits: storage_buffer(gpu, "logits", head * u64::from(cfg.vocab) * 4),
            argmax: storage_buffer(gpu, "argmax", head * 4),
            allowed: storage_buffer(gpu, "allowed", u64::from(mask_words(cfg.vocab)) * 4),
            top_ids: storage_buffer(gpu, "top ids", u64::from(2 * MAX_TOP_K) * 4),
            top_values: storage_buffer(gpu, "top values", u64::from(MAX_TOP_K) * 4),
            mixer: storage_buffer(gpu, "mixer", mixer_bytes(cfg, max_batch)),
            row_table: storage_buffer(gpu, "row table", rows * 8),
        }
    }
}

/// Tokens whose q, k and v `qkv` holds: as many as a batched step's products take one product
/// per token for (`quant::MATVEC_TOKENS_ON_GPU`), at most the stage's batch.
fn qkv_rows(max_batch: u32) -> u32 {
    max_batch.clamp(1, crate::ops::quant::MATVEC_TOKENS_ON_GPU)
}

fn mixer_bytes(cfg: &ModelConfig, max_batch: u32) -> u64 {
    match cfg.short_conv {
        Some(_) => u64::from(max_batch) * 3 * u64::from(cfg.d_model) * 4,
        None => 4,
    }
}
