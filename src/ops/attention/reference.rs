//! Straightforward f32 CPU reference for attention over one layer of a KV cache.

use super::softmax::softmax_in_place;
use super::AttentionParams;

/// out[t, h*hd..] for queries `q` [tokens, heads * head_dim] at positions start_pos + t, over
/// one layer of keys and values laid out [pos][kv_head][head_dim] (at least start_pos + tokens
/// positions). Query head h reads kv head h / (heads / kv_heads).
pub fn attention_reference(
    q: &[f32],
    k_cache: &[f32],
    v_cache: &[f32],
    start_pos: u32,
    tokens: u32,
    p: &AttentionParams,
) -> Vec<f32> {
    let visible = |t: usize| {
        let pos = start_pos as usize + t;
        let first = p.window.map_or(0, |w| (pos + 1).saturating_sub(w as usize));
        first..=pos
    };
    masked_reference(q, k_cache, v_cache, tokens, p, visible)
}

/// As `attention_reference` at start_pos 0 without the causal mask: every query sees keys
/// 0..tokens (the window is ignored).
pub fn bidirectional_attention_reference(
    q: &[f32],
    k_cache: &[f32],
    v_cache: &[f32],
    tokens: u32,
    p: &AttentionParams,
) -> Vec<f32> {
    masked_reference(q, k_cache, v_cache, tokens, p, |_| 0..=tokens as usize - 1)
}

/// As `bidirectional_attention_reference` for sequences of `lengths` packed one after another
/// into the queries and keys: each query sees the keys of its own sequence only.
pub fn segmented_attention_reference(
    q: &[f32],
    k_cache: &[f32],
    v_cache: &[f32],
    lengths: &[u32],
    p: &AttentionParams,
) -> Vec<f32> {
    let mut spans = Vec::new();
    let mut first = 0usize;
    for &length in lengths {
        let span = first..=first + length as usize - 1;
        spans.extend(std::iter::repeat_n(span, length as usize));
        first += length as usize;
    }
    let tokens = spans.len() as u32;
    masked_reference(q, k_cache, v_cache, tokens, p, |t| spans[t].clone())
}

/// Query t sees the keys `visible(t)`.
fn masked_reference(
    q: &[f32],
    k_cache: &[f32],
    v_cache: &[f32],
    tokens: u32,
    p: &AttentionParams,
    visible: impl Fn(usize) -> std::ops::RangeInclusive<usize>,
) -> Vec<f32> {
    let (heads, kv_heads, head_dim) = (p.heads as usize, p.kv_heads as usize, p.head_dim as usize);
    let group = heads / kv_heads;
    let mut out = vec![0.0f32; tokens as usize * heads * head_dim];
    for t in 0..tokens as usize {
        let keys = visible(t);
        for h in 0..heads {
            let query = &q[(t * heads + h) * head_dim..][..head_dim];
            let kv = h / group;
            let row = |cache: &'_ [f32], j: usize| -> Vec<f32> {
                cache[(j * kv_heads + kv) * head_dim..][..head_dim].to_vec()
            };
            let mut weights: Vec<f32> = keys
                .clone()
                .map(|j| {
                    let key = row(k_cache, j);
                    let score = query.iter().zip(&key).map(|(a, b)| a * b).sum::<f32>() * p.scale;
                    p.softcap.map_or(score, |cap| cap * (score / cap).tanh())
                })
                .collect();
            softmax_in_place(&mut weights);
            let target = &mut out[(t * heads + h) * head_dim..][..head_dim];
            for (j, weight) in keys.clone().zip(&weights) {
                for (o, v) in target.iter_mut().zip(row(v_cache, j)) {
                    *o += weight * v;
                }
            }
        }
    }
    out
}
