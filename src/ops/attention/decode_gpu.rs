//! Split decode attention for GPU adapters (`wgsl/attention_decode_gpu.wgsl` around
//! `attention_decode_core.wgsl`): one workgroup per (split, query head, token) with every phase
//! spread over its lanes. CPU adapters keep
//! `attention_decode.wgsl`, whose work split suits them.

use super::{dispatch_split, first_visible, AttentionCall, AttentionParams, SplitCall};
use crate::gpu::{Gpu, Kernel, Lib, Recorder};

const DECODE_GPU: Kernel = Kernel {
    name: "attention_decode_gpu",
    source: concat!(
        include_str!("../../../wgsl/attention_decode_gpu.wgsl"),
        include_str!("../../../wgsl/attention_decode_core.wgsl")
    ),
    entry: "main",
    libs: &[Lib::Reduce, Lib::AttentionParams, Lib::AttentionMask],
};

/// Lanes of a workgroup at head_dim < 256; wider heads take `WIDE_WG` (see `constants`).
const WG: u32 = 128;
/// Lanes of a workgroup from head_dim 256 (Gemma 3): twice the key groups for the value pass,
/// whose walk is otherwise four times as long as at head_dim 64. WebGPU's default limit.
const WIDE_WG: u32 = 256;
/// A lane's share of one key's q·k stays at most this many vec4s: wider heads split each key
/// over several lanes (see `lanes_per_key`).
const KEY_VEC4S_PER_LANE: u32 = 16;
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
    let wg = lanes(p.head_dim);
    // q, the scores, the group sums, the reduction scratch and the key parts, the fresh key
    // and value.
    let shared_bytes = hd4 * 16 + MAX_KEYS_PER_SPLIT * 4 + wg * 16 + 2 * wg * 4 + 2 * hd4 * 16;
    hd4 > 0
        && hd4 <= wg
        && hd4.is_multiple_of(4)
        && shared_bytes + entry_bytes <= gpu.caps.max_workgroup_storage
}

/// Lanes of a workgroup for this head_dim.
fn lanes(head_dim: u32) -> u32 {
    match head_dim >= 256 {
        true => WIDE_WG,
        false => WG,
    }
}

/// Lanes that share one key's q·k, a power of two that divides the head's vec4s into runs of
/// four: 1 up to head_dim 127, 2 for 128, 4 for 256. One lane per key walked all 64 vec4s of a
/// Gemma 3 key in a chain of 16 dependent loop steps, which made its attention twice as slow
/// as the other models' (28.7 against 14 µs a dispatch on the H200).
fn lanes_per_key(head_dim: u32) -> u32 {
    let hd4 = head_dim / 4;
    let mut lanes = 1;
    while hd4 >= 2 * KEY_VEC4S_PER_LANE * lanes && hd4.is_multiple_of(8 * lanes) {
        lanes *= 2;
    }
    lanes
}

/// The specialisation constants of every entry around `attention_decode_core.wgsl`.
pub(super) fn constants(head_dim: u32) -> [(&'static str, u32); 4] {
    [
        ("WG", lanes(head_dim)),
        ("HD", head_dim),
        ("KPS", MAX_KEYS_PER_SPLIT),
        ("LPK", lanes_per_key(head_dim)),
    ]
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
pub fn attention_decode_gpu(rec: &mut Recorder, call: &AttentionCall, p: &AttentionParams) {
    call.check(p);
    let (start_pos, tokens) = (call.start_pos, call.tokens);
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
    let pipeline = rec.pipeline(&DECODE_GPU, &constants(p.head_dim));
    let split = SplitCall {
        call: *call,
        splits,
    };
    dispatch_split(rec, &pipeline, &split, p, [splits, p.heads, tokens]);
}
