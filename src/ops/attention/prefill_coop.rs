//! Prefill attention on cooperative matrices (`wgsl/attention_prefill_coop.wgsl`): the tiled
//! prefill kernel's work with q·k and p·v on the tensor cores, where the device and variant
//! have them (the capability the prefill products use). Same bindings, masks, grid and partial
//! results as `attention_prefill.wgsl`, so `prefill_masked` dispatches either and
//! `attention_combine` merges either's splits.
//!
//! On the H200 the FP32 kernel was 31% of SmolLM2's pp512 and 52% of Gemma 3's (517 µs a
//! layer at head_dim 256; docs/perf.md, session 29): each lane walks every key of its row with
//! scalar dot products over head_dim.

use crate::gpu::{Gpu, Kernel, Lib, Variant};
use crate::ops::quant::MATVEC_TOKENS_ON_GPU;

pub(super) const PREFILL_COOP: Kernel = Kernel {
    name: "attention_prefill_coop",
    source: include_str!("../../../wgsl/attention_prefill_coop.wgsl"),
    entry: "main",
    libs: &[
        Lib::CooperativeMatrix,
        Lib::IndicesInRange,
        Lib::AttentionParams,
        Lib::AttentionMask,
        Lib::AttentionPrefill,
    ],
};

/// Keys per tile, the largest whose workgroup memory fits taken first.
const TILES: [u32; 3] = [64, 32, 16];
/// Four subgroups of four 16-wide blocks of head_dim each.
const MAX_HEAD_DIM: u32 = 256;
/// Calls of as many query tokens as the device multiplies one product per token keep the FP32
/// kernel: a batched step's rows and a speculative step's draft (at most 16 tokens) verify
/// against the kernels plain decoding was checked with (session 24's identical greedy ids on
/// the H200), and would fill few of the 16-row blocks.
const MIN_TOKENS: u32 = MATVEC_TOKENS_ON_GPU + 1;

/// How the kernel runs one head_dim: query rows per workgroup and keys per tile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct CoopPrefill {
    pub rows: u32,
    pub tile: u32,
}

impl CoopPrefill {
    /// The kernel's shape for `head_dim` on this device and variant, if it runs there.
    pub fn plan(gpu: &Gpu, variant: Variant, head_dim: u32, tokens: u32) -> Option<CoopPrefill> {
        let usable = variant.coop_matrix
            && gpu.caps.coop_matrix
            && head_dim.is_multiple_of(16)
            && (16..=MAX_HEAD_DIM).contains(&head_dim)
            && tokens >= MIN_TOKENS;
        if !usable {
            return None;
        }
        let (row_groups, subgroups) = groups(head_dim);
        let tile = TILES.into_iter().find(|&tile| {
            workgroup_bytes(head_dim, tile, row_groups, subgroups) <= gpu.caps.max_workgroup_storage
        })?;
        Some(CoopPrefill {
            rows: 16 * row_groups,
            tile,
        })
    }
}

/// Row groups of 16 per workgroup and subgroups per workgroup, as the kernel derives them:
/// `ceil(head_dim / 64)` subgroups share a row group's head_dim.
fn groups(head_dim: u32) -> (u32, u32) {
    let per_rows = (head_dim / 16).div_ceil(4);
    let row_groups = 4 / per_rows;
    (row_groups, row_groups * per_rows)
}

/// The kernel's workgroup memory: query rows, key and value tiles (f16, rows padded by 8),
/// and per subgroup a 16 x 16 f32 block and a 16 x 24 f16 one.
fn workgroup_bytes(head_dim: u32, tile: u32, row_groups: u32, subgroups: u32) -> u32 {
    let stride = (head_dim + 8) * 2;
    16 * row_groups * stride + 2 * tile * stride + subgroups * (256 * 4 + 16 * 24 * 2)
}

/// Whether prefill attention of `tokens` queries at `head_dim` runs on cooperative matrices
/// on this device in `variant`.
pub fn prefill_uses_coop_matrix(gpu: &Gpu, variant: Variant, head_dim: u32, tokens: u32) -> bool {
    CoopPrefill::plan(gpu, variant, head_dim, tokens).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_follow_head_dim() {
        assert_eq!(groups(64), (4, 4));
        assert_eq!(groups(32), (4, 4));
        assert_eq!(groups(96), (2, 4));
        assert_eq!(groups(128), (2, 4));
        assert_eq!(groups(192), (1, 3));
        assert_eq!(groups(256), (1, 4));
        // Within the 48 KiB NVIDIA's Vulkan driver grants at head_dim 256 with 16-key tiles.
        assert!(workgroup_bytes(256, 16, 1, 4) <= 48 << 10);
        assert!(workgroup_bytes(256, 32, 1, 4) > 48 << 10);
    }
}
