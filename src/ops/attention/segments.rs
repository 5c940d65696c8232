//! Bidirectional attention over several sequences packed into one call (an encoder's batch,
//! as llama.cpp's sequence ids in one ubatch): the tokens of each sequence follow the last
//! one's, and a token attends only to the tokens of its own sequence. The prefill kernel's
//! `SEGMENTS` variant reads each token's first and last key from a table (`segment_table`),
//! so no padding is computed and a workgroup walks only the keys of the sequences its rows
//! belong to.

use crate::gpu::Recorder;

use super::prefill::{prefill_masked, PrefillMask, PREFILL_WG};
use super::{AttentionCall, AttentionParams, KvCache};

/// The sequences of one packed call: their lengths in order (host side) and the GPU table of
/// `segment_table(lengths)`'s words.
#[derive(Debug, Clone, Copy)]
pub struct Segments<'a> {
    pub lengths: &'a [u32],
    pub table: &'a wgpu::Buffer,
}

/// Two words per token, the first and the last key of its sequence (call indices), for
/// sequences of `lengths` packed in order. Panics on an empty sequence: it has no token to
/// give a row, and the model code refuses empty inputs first.
pub fn segment_table(lengths: &[u32]) -> Vec<u32> {
    let mut words = Vec::with_capacity(2 * lengths.iter().sum::<u32>() as usize);
    let mut first = 0u32;
    for &length in lengths {
        assert!(length > 0, "an empty sequence in a packed attention call");
        let last = first + length - 1;
        for _ in 0..length {
            words.extend([first, last]);
        }
        first = last + 1;
    }
    words
}

impl Segments<'_> {
    /// Tokens of every sequence together.
    pub fn tokens(&self) -> u32 {
        self.lengths.iter().sum()
    }

    /// The most keys one prefill workgroup (`PREFILL_WG` rows, `group` rows a token) sees:
    /// from its first token's sequence start to its last token's sequence end. Bounds the
    /// kernel's key splits as the call's whole length would for one sequence.
    pub(super) fn widest_block(&self, group: u32) -> u32 {
        let tokens = self.tokens();
        let mut ends = Vec::with_capacity(self.lengths.len());
        let mut end = 0u32;
        for &length in self.lengths {
            end += length;
            ends.push(end);
        }
        // The sequence holding `token`: its [start, end).
        let span = |token: u32| {
            let index = ends.partition_point(|&e| e <= token);
            (ends[index] - self.lengths[index], ends[index])
        };
        let blocks = (tokens * group).div_ceil(PREFILL_WG);
        (0..blocks)
            .map(|block| {
                let first = block * PREFILL_WG / group;
                let last = (((block + 1) * PREFILL_WG - 1) / group).min(tokens - 1);
                span(last).1 - span(first).0
            })
            .max()
            .unwrap_or(0)
    }
}

/// out[t, h*hd..] = softmax(q·K^T * scale) V over the keys of token t's own sequence, for the
/// `segments` packed into `q` ([tokens, heads * head_dim] f32) and into positions
/// 0..tokens of `layer`'s cache (kv_write them first). No causal mask and no window.
pub fn segmented_attention(
    rec: &mut Recorder,
    q: &wgpu::Buffer,
    cache: &KvCache,
    layer: u32,
    out: &wgpu::Buffer,
    segments: &Segments,
    p: &AttentionParams,
) {
    assert!(
        p.window.is_none(),
        "segmented attention has no sliding window"
    );
    let tokens = segments.tokens();
    assert!(
        segments.table.size() >= u64::from(tokens) * 8,
        "a segment table of {} bytes for {tokens} tokens",
        segments.table.size()
    );
    // The sequences are packed from position 0 and their lengths give the call's tokens.
    let call = AttentionCall {
        q,
        cache,
        layer,
        out,
        start_pos: 0,
        tokens,
    };
    prefill_masked(rec, &call, p, PrefillMask::Segments(segments));
}
