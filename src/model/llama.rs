//! The llama block (SmolLM2, Llama 2/3) and, with q/k/v biases, Qwen2's.
//!
//! ```text
//! x += Wo · attention(rope(Wq·n + bq), rope(Wk·n + bk), Wv·n + bv)    n = rms_norm(x)
//! x += Wdown · (silu(Wgate·n) ⊙ Wup·n)                                 n = rms_norm(x)
//! ```

use crate::gpu::Recorder;
use crate::ops::elementwise::Activation;

use super::block::{
    feed_forward, normed_projections, project_into_residual, rotate_and_attend, FeedForwardOut,
};
use super::LayerStep;

pub fn forward_layer(rec: &mut Recorder, step: &LayerStep) {
    let LayerStep {
        cfg,
        weights: w,
        scratch: s,
        ..
    } = *step;
    normed_projections(
        rec,
        step,
        &w.attn_norm,
        &[
            (&w.wq, w.bq.as_ref(), &s.q),
            (&w.wk, w.bk.as_ref(), &s.k),
            (&w.wv, w.bv.as_ref(), &s.v),
        ],
    );
    rotate_and_attend(rec, step, &cfg.rope, None, None);
    project_into_residual(rec, step, &w.wo, &s.attn);
    feed_forward(rec, step, Activation::Silu, FeedForwardOut::Residual);
}
