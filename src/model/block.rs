//! The pieces every architecture's block is built from. Each has one path for prefill (many
//! tokens: tiled products, separate norms and adds) and a fused one for decode (one token, or
//! a few: a batched step's rows, a speculative draft; each its own product): norms folded into the
//! products that read them; bias, gate activation and residual add folded into the products'
//! epilogues; rope, per-head norms and the cache write in one dispatch. Decode is bound by
//! dispatch count, so every dispatch spared is time saved.

use crate::gpu::Recorder;
use crate::ops::elementwise::{self, Activation};
use crate::ops::quant::{Epilogue, Fusion, QuantMatrix, Residual};
use crate::ops::{norm, quant};

use super::loader::{Matrix, Vector};
use super::weights::LayerWeights;
use super::LayerStep;

mod attend;
pub(super) use attend::{rotate_and_attend, QkNorms};

/// Where a block's products read the residual stream: `base` as it is (`hidden`, usually), or,
/// for one token, with a post-norm folded in (`fold`: the products read `base + rms_norm(delta)
/// · weight` and write it into `fold.out`), which spares Gemma 3 the post-norms' own
/// dispatches, two a layer (see `quant::Residual`).
#[derive(Clone, Copy)]
pub(super) struct Stream<'a> {
    pub base: &'a wgpu::Buffer,
    pub fold: Option<Residual<'a>>,
}

impl<'a> Stream<'a> {
    pub fn hidden(step: &LayerStep<'a>) -> Stream<'a> {
        Stream {
            base: &step.scratch.hidden,
            fold: None,
        }
    }

    /// Plain streams are `hidden` itself: only one token's fused products take a fold.
    fn check(&self, step: &LayerStep) {
        assert!(
            self.fold.is_none() || step.tokens == 1,
            "a folded residual stream is for one token's products"
        );
    }
}

/// Whether one token's products can fold `upper`'s feed-forward post-norm into `lower`'s q/k/v
/// products and `upper`'s attention post-norm into its own gate and up products (`Stream`):
/// the device stages every one of those products' rows. One answer for both blocks of a pair,
/// so that the block leaving a norm behind and the one taking it up agree.
pub(super) fn post_norms_fold(rec: &Recorder, upper: &LayerWeights, lower: &LayerWeights) -> bool {
    let a = lower.attention();
    let qkv = runs(&[&a.wq, &a.wk, &a.wv])
        .iter()
        .all(|run| quant::residual_fold_supported(rec, run, &Epilogue::Store));
    let (gate, up) = (upper.w_gate.view(), upper.w_up.view());
    let glu = match quant::shares_part(&gate, &up) {
        true => {
            let epilogue = Epilogue::Glu(up, Activation::GeluTanh);
            quant::residual_fold_supported(rec, &gate, &epilogue)
        }
        false => [gate, up]
            .iter()
            .all(|m| quant::residual_fold_supported(rec, m, &Epilogue::Store)),
    };
    qkv && glu
}

/// Whether the step's products take the fused matrix-vector path: one token, or as many as
/// the device multiplies one product per token (a batched step's rows, a speculative step's
/// draft, a short prompt), whose unfused path would add a norm and an add or bias per product.
fn fused(rec: &Recorder, step: &LayerStep) -> bool {
    step.tokens == 1 || quant::per_token_products(rec.gpu(), step.tokens)
}

/// q, k and v = W · rms_norm(hidden) (+ bias), with the block's attention norm. One token
/// computes them one after another into `qkv`, a single product for each run of them sharing
/// a tensor, with the norm and bias fused; a few tokens (a batched step's rows, a speculative
/// verification) likewise into `qkv`'s sections where `qkv_in_sections` says so, else each
/// into `q`, `k` and `v`; more normalise once into `normed` for the tiled products into `q`,
/// `k` and `v`. `block::attend` reads them where they are.
pub(super) fn qkv_projections(rec: &mut Recorder, step: &LayerStep) {
    qkv_projections_from(rec, step, Stream::hidden(step));
}

/// Whether several tokens' q, k and v go into sections of `qkv` (`quant::matvec_sections`: q
/// `[tokens, q_dim]`, then k and v `[tokens, kv_dim]`), one product for each run of them
/// sharing a tensor: the fused products' path, within `qkv`'s rows, without integer products.
/// A 16-row step of SmolLM2 spent 60 dispatches (~0.47 ms of 2.4 on an H100) on its separate
/// k and v products (docs/perf.md, session 37). False for a block without attention (LFM2's
/// short convolutions).
pub(super) fn qkv_in_sections(rec: &Recorder, step: &LayerStep) -> bool {
    let tokens = step.tokens;
    let Some(a) = step.weights.attention.as_ref() else {
        return false;
    };
    tokens > 1
        && tokens <= step.scratch.qkv_rows
        && fused(rec, step)
        && runs(&[&a.wq, &a.wk, &a.wv])
            .iter()
            .all(|run| quant::sections_supported(rec.gpu(), run, tokens))
}

/// `qkv_projections` reading the residual stream from `stream`.
pub(super) fn qkv_projections_from(rec: &mut Recorder, step: &LayerStep, stream: Stream) {
    let (cfg, w, s, tokens) = (step.cfg, step.weights, step.scratch, step.tokens);
    stream.check(step);
    if step.qkv_in_sections {
        let norm = Some((&w.attn_norm.buffer, cfg.rms_eps));
        let epilogue = w
            .qkv_bias
            .as_ref()
            .map_or(Epilogue::Store, |b| Epilogue::Bias(&b.buffer));
        let (q, kv) = (cfg.q_dim(), cfg.kv_dim());
        let mut out_offset = 0;
        let a = w.attention();
        for run in runs(&[&a.wq, &a.wk, &a.wv]) {
            let fusion = Fusion {
                residual: stream.fold,
                norm,
                epilogue,
                out_offset,
            };
            match tokens {
                1 => quant::matvec(rec, &run, stream.base, &s.qkv, &fusion),
                _ => {
                    let ends = [q, q + kv, q + 2 * kv];
                    quant::matvec_sections(rec, &run, stream.base, &s.qkv, &fusion, tokens, ends)
                }
            }
            out_offset += run.rows;
        }
        return;
    }
    if tokens > 1 && fused(rec, step) {
        let products = separate_projections(step).map(|(matrix, bias, out)| {
            let epilogue = bias
                .as_ref()
                .map_or(Epilogue::Store, |b| Epilogue::Bias(&b.buffer));
            (matrix.view(), out, epilogue)
        });
        let norm = Some((&w.attn_norm.buffer, cfg.rms_eps));
        quant::matvec_tokens_each(rec, &s.hidden, norm, tokens, &products);
        return;
    }
    norm::rms_norm(
        rec,
        &s.hidden,
        &w.attn_norm.buffer,
        &s.normed,
        tokens,
        cfg.d_model,
        cfg.rms_eps,
    );
    for (matrix, bias, out) in separate_projections(step) {
        quant::matmul(rec, &matrix.view(), &s.normed, out, tokens);
        if let Some(bias) = bias {
            elementwise::add_bias(rec, out, &bias.buffer, tokens, bias.len);
        }
    }
}

/// q, k and v each as its own product: matrix, bias if any, and the buffer it goes to.
fn separate_projections<'a>(
    step: &LayerStep<'a>,
) -> [(&'a Matrix, &'a Option<Vector>, &'a wgpu::Buffer); 3] {
    let (w, s) = (step.weights, step.scratch);
    let a = w.attention();
    [
        (&a.wq, &w.bq, &s.q),
        (&a.wk, &w.bk, &s.k),
        (&a.wv, &w.bv, &s.v),
    ]
}

/// The matrices as few products as their tensors allow: each run of neighbours whose rows
/// follow one another in one tensor as a single matrix.
fn runs<'a>(matrices: &[&'a Matrix]) -> Vec<QuantMatrix<'a>> {
    let mut runs: Vec<QuantMatrix<'a>> = Vec::new();
    for (i, matrix) in matrices.iter().enumerate() {
        match runs.last_mut() {
            Some(run) if i > 0 && matrices[i - 1].followed_by(matrix) => run.rows += matrix.rows,
            _ => runs.push(matrix.view()),
        }
    }
    runs
}

/// `hidden += W · input`: accumulated by the product itself for one token.
pub(super) fn project_into_residual(
    rec: &mut Recorder,
    step: &LayerStep,
    matrix: &Matrix,
    input: &wgpu::Buffer,
) {
    let (s, tokens) = (step.scratch, step.tokens);
    if fused(rec, step) {
        let fusion = Fusion {
            epilogue: Epilogue::Accumulate,
            ..Fusion::default()
        };
        quant::matvec_tokens(rec, &matrix.view(), input, &s.hidden, &fusion, tokens);
        return;
    }
    quant::matmul(rec, &matrix.view(), input, &s.delta, tokens);
    elementwise::add_in_place(rec, &s.hidden, &s.delta, tokens * step.cfg.d_model);
}

/// Where the MLP's output goes.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum FeedForwardOut {
    /// Added to the residual stream.
    Residual,
    /// Into `delta`, for a post-norm before it joins the stream.
    Delta,
}

/// The gated MLP over `rms_norm(hidden)` with the block's ffn norm. The fused path fuses the norm
/// into the gate and up products, and computes both with the activation in one product where
/// they share a tensor (else the activation goes into the up product).
pub(super) fn feed_forward(
    rec: &mut Recorder,
    step: &LayerStep,
    activation: Activation,
    out: FeedForwardOut,
) {
    feed_forward_from(rec, step, activation, out, Stream::hidden(step));
}

/// `feed_forward` reading the residual stream from `stream`.
pub(super) fn feed_forward_from(
    rec: &mut Recorder,
    step: &LayerStep,
    activation: Activation,
    out: FeedForwardOut,
    stream: Stream,
) {
    let (cfg, w, s, tokens) = (step.cfg, step.weights, step.scratch, step.tokens);
    stream.check(step);
    if fused(rec, step) {
        let norm = Some((&w.ffn_norm.buffer, cfg.rms_eps));
        let (gate, up) = (w.w_gate.view(), w.w_up.view());
        let x = stream.base;
        if quant::shares_part(&gate, &up) {
            let glu = Fusion {
                residual: stream.fold,
                norm,
                epilogue: Epilogue::Glu(up, activation),
                out_offset: 0,
            };
            quant::matvec_tokens(rec, &gate, x, &s.act, &glu, tokens);
        } else {
            let gate_fusion = Fusion {
                residual: stream.fold,
                norm,
                ..Fusion::default()
            };
            quant::matvec_tokens(rec, &gate, x, &s.gate, &gate_fusion, tokens);
            let up_fusion = Fusion {
                residual: stream.fold,
                norm,
                epilogue: Epilogue::Gated(&s.gate, activation),
                out_offset: 0,
            };
            quant::matvec_tokens(rec, &up, x, &s.act, &up_fusion, tokens);
        }
        let (target, epilogue) = match out {
            FeedForwardOut::Residual => (&s.hidden, Epilogue::Accumulate),
            FeedForwardOut::Delta => (&s.delta, Epilogue::Store),
        };
        let down = Fusion {
            epilogue,
            ..Fusion::default()
        };
        quant::matvec_tokens(rec, &w.w_down.view(), &s.act, target, &down, tokens);
        return;
    }
    norm::rms_norm(
        rec,
        &s.hidden,
        &w.ffn_norm.buffer,
        &s.normed,
        tokens,
        cfg.d_model,
        cfg.rms_eps,
    );
    quant::matmul(rec, &w.w_gate.view(), &s.normed, &s.gate, tokens);
    quant::matmul(rec, &w.w_up.view(), &s.normed, &s.up, tokens);
    elementwise::gated_activation(rec, &s.gate, &s.up, &s.act, tokens * cfg.ff_dim, activation);
    quant::matmul(rec, &w.w_down.view(), &s.act, &s.delta, tokens);
    if out == FeedForwardOut::Residual {
        elementwise::add_in_place(rec, &s.hidden, &s.delta, tokens * cfg.d_model);
    }
}

/// Attention with per-head q and k RMSNorms before rope where the layer has them (qwen3,
/// lfm2's attention blocks), into the residual.
pub(super) fn qk_normed_attention(rec: &mut Recorder, step: &LayerStep) {
    let LayerStep {
        cfg,
        weights: w,
        scratch: s,
        ..
    } = *step;
    qkv_projections(rec, step);
    let norms = match (&w.q_norm, &w.k_norm) {
        (Some(q), Some(k)) => Some(QkNorms { q, k }),
        _ => None,
    };
    rotate_and_attend(rec, step, &cfg.rope, norms, None);
    project_into_residual(rec, step, &w.attention().wo, &s.attn);
}
