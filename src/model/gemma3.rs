//! The Gemma 3 block.
//!
//! Differs from llama in: the embedding scaled by sqrt(d_model); per-head RMSNorm on q and k;
//! RMSNorm on the attention and feed-forward outputs before they join the residual stream;
//! GELU (tanh) gating; sliding-window attention on local layers (every sixth layer is global)
//! with RoPE base 10 000 there and the file's base on global layers.

use crate::gguf::Metadata;
use crate::gpu::Recorder;
use crate::ops::elementwise::{self, Activation};
use crate::ops::quant::Residual;
use crate::ops::rope::RopeParams;
use crate::ops::{norm, quant};

use super::arch::{Architecture, BlockTensors, RopeLayout};
use super::block::{
    feed_forward, feed_forward_from, post_norms_fold, qkv_projections_from, rotate_and_attend,
    FeedForwardOut, QkNorms, Stream,
};
use super::config::{ConfigError, ModelConfig, SlidingWindow};
use super::loader::Vector;
use super::weights::LayerWeights;
use super::LayerStep;

/// Every sixth layer attends globally (llama.cpp's gemma3 swa pattern).
const GLOBAL_LAYER_PERIOD: u32 = 6;
/// RoPE base of the sliding-window layers, fixed by the architecture rather than the file.
const LOCAL_ROPE_BASE: f32 = 10_000.0;

pub const GEMMA3: Architecture = Architecture {
    name: "gemma3",
    rope_layout: RopeLayout::Neox,
    configure,
    embed_scale,
    block_tensors: BlockTensors {
        qkv_bias: false,
        qk_norm: true,
        post_norms: true,
    },
    forward_layer,
};

/// The embedding is scaled by sqrt(d_model).
fn embed_scale(cfg: &ModelConfig) -> f32 {
    (cfg.d_model as f32).sqrt()
}

/// Adds what only Gemma 3's metadata says: the sliding window and the local layers' RoPE.
fn configure(meta: &Metadata, mut cfg: ModelConfig) -> Result<ModelConfig, ConfigError> {
    let window = meta.get_u32("gemma3.attention.sliding_window")?;
    cfg.sliding_window = Some(SlidingWindow {
        window,
        period: GLOBAL_LAYER_PERIOD,
    });
    cfg.rope_local = Some(RopeParams {
        freq_base: LOCAL_ROPE_BASE,
        freq_scale: 1.0,
        ..cfg.rope
    });
    Ok(cfg)
}

fn forward_layer(rec: &mut Recorder, step: &LayerStep) {
    let LayerStep {
        cfg,
        weights: w,
        scratch: s,
        tokens,
        layer,
        ..
    } = *step;
    let local = cfg.is_local_layer(layer);
    let rope_params = match (local, &cfg.rope_local) {
        (true, Some(local_rope)) => local_rope,
        _ => &cfg.rope,
    };
    qkv_projections_from(rec, step, stream_in(rec, step));
    let window = cfg.sliding_window.filter(|_| local).map(|sw| sw.window);
    let norms = match (&w.q_norm, &w.k_norm) {
        (Some(q), Some(k)) => Some(QkNorms { q, k }),
        _ => None,
    };
    rotate_and_attend(rec, step, rope_params, norms, window);
    quant::matmul(rec, &w.attention().wo.view(), &s.attn, &s.normed, tokens);
    if step.next.is_some_and(|next| folds(rec, step, w, next)) {
        // The attention's post-norm joins the stream inside the gate and up products, which
        // leave it in hidden_alt; the feed-forward's joins inside the next block's q/k/v.
        let post_attn = w
            .post_attn_norm
            .as_ref()
            .expect("folds checked the post-norm");
        let mid = folded(step, &s.hidden, &s.normed, post_attn, &s.hidden_alt);
        feed_forward_from(rec, step, Activation::GeluTanh, FeedForwardOut::Delta, mid);
        return;
    }
    post_norm(rec, w.post_attn_norm.as_ref(), &s.normed, step);
    feed_forward(rec, step, Activation::GeluTanh, FeedForwardOut::Delta);
    post_norm(rec, w.post_ffn_norm.as_ref(), &s.delta, step);
}

/// Whether one token's step folds `upper`'s post-norms into the products after them, with
/// `lower` the block after `upper` (`block::Stream`).
fn folds(rec: &Recorder, step: &LayerStep, upper: &LayerWeights, lower: &LayerWeights) -> bool {
    step.tokens == 1
        && upper.post_attn_norm.is_some()
        && upper.post_ffn_norm.is_some()
        && post_norms_fold(rec, upper, lower)
}

/// Where this block's q/k/v products read the stream: hidden_alt with the previous block's
/// feed-forward post-norm still to join it where that block left it so, else hidden.
fn stream_in<'a>(rec: &Recorder, step: &LayerStep<'a>) -> Stream<'a> {
    let s = step.scratch;
    match step.previous {
        Some(previous) if folds(rec, step, previous, step.weights) => {
            let post_ffn = previous.post_ffn_norm.as_ref().expect("folds checked it");
            folded(step, &s.hidden_alt, &s.delta, post_ffn, &s.hidden)
        }
        _ => Stream::hidden(step),
    }
}

/// The stream `base + rms_norm(delta) · weight`, written into `out` by the products reading it.
fn folded<'a>(
    step: &LayerStep<'a>,
    base: &'a wgpu::Buffer,
    delta: &'a wgpu::Buffer,
    weight: &'a Vector,
    out: &'a wgpu::Buffer,
) -> Stream<'a> {
    Stream {
        base,
        fold: Some(Residual {
            delta,
            weight: &weight.buffer,
            eps: step.cfg.rms_eps,
            out,
        }),
    }
}

/// `hidden += rms_norm(output)` with the block's post-norm weight, in one dispatch.
fn post_norm(rec: &mut Recorder, weight: Option<&Vector>, output: &wgpu::Buffer, step: &LayerStep) {
    let (cfg, s, tokens) = (step.cfg, step.scratch, step.tokens);
    match weight {
        Some(weight) => norm::rms_norm_add(
            rec,
            output,
            &weight.buffer,
            &s.hidden,
            tokens,
            cfg.d_model,
            cfg.rms_eps,
        ),
        None => elementwise::add_in_place(rec, &s.hidden, output, tokens * cfg.d_model),
    }
}
