//! Split decode attention for GPU adapters (`wgsl/attention_decode_gpu.wgsl` around
//! `attention_decode_core.wgsl`): one workgroup per (split, query head, token) with every phase
//! spread over its lanes. CPU adapters keep
//! `attention_decode.wgsl`, whose work split suits them.

use super::{check_call, dispatch_split, first_visible, AttentionParams, SplitCall};
use crate::gpu::{Gpu, Kernel, Lib, Recorder};
use crate::ops::attention::KvCache;

const DECODE_GPU: Kernel = Kernel {
    name: "attention_decode_gpu",
    source: concat!(
        include_str!("../../../wgsl/attention_decode_gpu.wgsl"),
        include_str!("../../../wgsl/attention_decode_core.wgsl")
    ),
    entry: "main",
    libs: &[Lib::Reduce, Lib::AttentionMask],
};

/// Lanes of a workgroup.
pub(super) const WG: u32 = 128;
/// Keys one workgroup scores at most (its workgroup memory holds their scores). Up to this
/// many visible keys one split suffices, and the kernel writes `out` without a combine pass.
pub(super) const MAX_KEYS_PER_SPLIT: u32 = 256;
/// Beyond one split, splits are added for parallelism down to this many keys each...
const MIN_KEYS_PER_SPLIT: u32 = 64;
/// ...until this many workgroups keep a large GPU busy.
const TARGET_WORKGROUPS: u32 = 512;

/// Whether the GPU decode kernel can run this shape on this device.
pub(super) fn supported(gpu: &Gpu, p: &AttentionParams) -> bool {
    supported_with(gpu, p, 0)
}

/// `supported` for an entry that needs `entry_bytes` of workgroup memory of its own.
pub(super) fn supported_with(gpu: &Gpu, p: &AttentionParams, entry_bytes: u32) -> bool {
    let hd4 = p.head_dim / 4;
    // q, the scores, the group sums, the reduction scratch, the fresh key and value.
    let shared_bytes = hd4 * 16 + MAX_KEYS_PER_SPLIT * 4 + WG * 16 + WG * 4 + 2 * hd4 * 16;
    hd4 > 0
        && hd4 <= WG
        && hd4.is_multiple_of(4)
        && shared_bytes + entry_bytes <= gpu.caps.max_workgroup_storage
}

/// Key splits for `tokens` queries whose last sees `visible` keys: one while the keys fit one
/// workgroup, else enough to fit and more for parallelism (as far as the partials fit one
/// binding).
pub(super) fn splits(gpu: &Gpu, p: &AttentionParams, tokens: u32, visible: u32) -> u32 {
    let needed = visible.div_ceil(MAX_KEYS_PER_SPLIT);
    if needed == 1 {
        return 1;
    }
    let rows = tokens * p.heads;
    let parallel = visible
        .div_ceil(MIN_KEYS_PER_SPLIT)
        .min(TARGET_WORKGROUPS.div_ceil(rows));
    super::choose_splits(gpu, p, tokens, needed, parallel)
}

/// Decode attention through the GPU kernel (any `tokens`, built for one); see `attention`.
#[allow(clippy::too_many_arguments)]
pub fn attention_decode_gpu(
    rec: &mut Recorder,
    q: &wgpu::Buffer,
    cache: &KvCache,
    layer: u32,
    out: &wgpu::Buffer,
    start_pos: u32,
    tokens: u32,
    p: &AttentionParams,
) {
    check_call(cache, layer, q, out, start_pos, tokens, p);
    if tokens == 0 {
        return;
    }
    assert!(
        supported(rec.gpu(), p),
        "GPU decode attention cannot hold head_dim {}",
        p.head_dim
    );
    let last_pos = start_pos + tokens - 1;
    let visible = last_pos - first_visible(last_pos, p.window) + 1;
    let splits = splits(rec.gpu(), p, tokens, visible);
    let pipeline = rec.pipeline(
        &DECODE_GPU,
        &[("WG", WG), ("HD", p.head_dim), ("KPS", MAX_KEYS_PER_SPLIT)],
    );
    let call = SplitCall {
        q,
        cache,
        layer,
        out,
        start_pos,
        tokens,
        splits,
    };
    dispatch_split(rec, &pipeline, &call, p, [splits, p.heads, tokens]);
}
