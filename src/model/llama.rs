//! The llama block (SmolLM2, Llama 2/3) and, with q/k/v biases, Qwen2's.
//!
//! ```text
//! x += Wo · attention(rope(Wq·n + bq), rope(Wk·n + bk), Wv·n + bv)    n = rms_norm(x)
//! x += Wdown · (silu(Wgate·n) ⊙ Wup·n)                                 n = rms_norm(x)
//! ```

use crate::gpu::Recorder;
use crate::ops::elementwise::Activation;

use super::block::{
    feed_forward, project_into_residual, qkv_projections, rotate_and_attend, FeedForwardOut,
};
use super::LayerStep;

pub fn forward_layer(rec: &mut Recorder, step: &LayerStep) {
    let LayerStep {
        cfg,
        weights: w,
        scratch: s,
        ..
    } = *step;
    qkv_projections(rec, step);
    rotate_and_attend(rec, step, &cfg.rope, None, None);
    project_into_residual(rec, step, &w.wo, &s.attn);
    feed_forward(rec, step, Activation::Silu, FeedForwardOut::Residual);
}
