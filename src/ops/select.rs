//! Greedy selection on the GPU (argmax, top-k), so decoding never copies logits to the host.
//!
//! Two passes: up to `MAX_GROUPS` workgroups each keep the best k of one chunk of the logits,
//! then one workgroup merges their lists. Ties go to the lower index, as in a stable sort.
//! Under a constraint, `mask` first sends the disallowed logits to −∞ where they are, so the
//! same selection picks among the allowed tokens.

use crate::gpu::{Kernel, Recorder};

const SOURCE: &str = include_str!("../../wgsl/select.wgsl");
const MASK_SOURCE: &str = include_str!("../../wgsl/mask.wgsl");
/// Lanes per workgroup of the mask (one 32-id word each).
const MASK_WG: u32 = 64;
/// Enough workgroups to fill a GPU, few enough that one workgroup merges their lists quickly.
const MAX_GROUPS: u32 = 256;
/// Logits each lane of the first pass reads before another workgroup is worth starting (at
/// least 4k, so that the threshold scan has subsets worth taking the maximum of). CPU adapters
/// run a lane's reads as one loop; on GPUs they are a chain of memory latencies, so GPUs start
/// more workgroups instead (a 152k-logit argmax took 37 µs on the H200 at 64 per lane).
const CPU_PER_LANE: u32 = 64;
const GPU_PER_LANE: u32 = 8;

/// Lanes per workgroup: merging hands (lanes / 2) lists of k entries through shared memory,
/// kept within 8 KiB (WebGPU guarantees 16 KiB).
fn workgroup_size(k: u32) -> u32 {
    if k > 32 {
        32
    } else {
        64
    }
}

/// The specialisation constants of every selection kernel for `k`. The threshold scan takes
/// the k-th best of about 4k subset maxima: tight enough that few candidates pass it.
fn constants(k: u32) -> [(&'static str, u32); 5] {
    let wg = workgroup_size(k);
    let subsets = (4 * k).div_ceil(wg);
    [
        ("WG", wg),
        ("K", k),
        ("SUBSETS", subsets),
        ("MAXIMA", wg * subsets),
        ("PARTNER_SLOTS", wg / 2 * k),
    ]
}

/// Largest k of `top_k`: the lists live in registers.
pub const MAX_TOP_K: u32 = 64;
/// Indices travel through comparisons as u32 with one value reserved as "none".
const MAX_N: u32 = u32::MAX / 2;

const SELECT_PARTIAL: Kernel = Kernel {
    name: "select_partial",
    source: SOURCE,
    entry: "select_partial",
    libs: &[],
};
const SELECT_FINAL: Kernel = Kernel {
    name: "select_final",
    source: SOURCE,
    entry: "select_final",
    libs: &[],
};
const ARGMAX_FINAL: Kernel = Kernel {
    name: "argmax_final",
    source: SOURCE,
    entry: "argmax_final",
    libs: &[],
};

const MASK_LOGITS: Kernel = Kernel {
    name: "mask_logits",
    source: MASK_SOURCE,
    entry: "mask_logits",
    libs: &[],
};

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct MaskParams {
    n: u32,
    pad: [u32; 3],
}

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct SelectParams {
    n: u32,
    chunk: u32,
    /// 0: the input holds logits; 1: (value bits, index) pairs.
    pairs: u32,
    pad: u32,
}

/// How many u32 words the allowed-set bitset of `n` ids has.
pub fn mask_words(n: u32) -> u32 {
    n.div_ceil(32)
}

/// logits[i] = −∞ for every i < n whose bit in `allowed` is clear (bit i % 32 of word i / 32;
/// `allowed` holds `mask_words(n)` words), in place: the argmax or top-k recorded after it
/// then picks among the allowed ids.
pub fn mask(rec: &mut Recorder, logits: &wgpu::Buffer, n: u32, allowed: &wgpu::Buffer) {
    assert!(
        (1..=MAX_N).contains(&n),
        "mask needs 1 <= n <= {MAX_N}, got {n}"
    );
    let pipeline = rec.pipeline(&MASK_LOGITS, &[]);
    let params = MaskParams { n, pad: [0; 3] };
    rec.dispatch(
        &pipeline,
        &params,
        &[allowed.as_entire_binding(), logits.as_entire_binding()],
        [mask_words(n).div_ceil(MASK_WG), 1, 1],
    );
}

/// `mask` on the CPU.
pub fn mask_reference(logits: &mut [f32], allowed: &[u32]) {
    for (i, logit) in logits.iter_mut().enumerate() {
        let word = allowed.get(i / 32).copied().unwrap_or(0);
        if word & (1 << (i % 32)) == 0 {
            *logit = f32::NEG_INFINITY;
        }
    }
}

/// out[0] = the index of the largest of logits[0..n] (the lowest such index on ties).
pub fn argmax(rec: &mut Recorder, logits: &wgpu::Buffer, n: u32, out: &wgpu::Buffer) {
    argmax_rows(rec, logits, n, 1, out);
}

/// out[r] = the index of the largest of row r, logits[r * n..(r + 1) * n], for r < rows:
/// the greedy token after each position of a speculative step, in the same two dispatches.
pub fn argmax_rows(
    rec: &mut Recorder,
    logits: &wgpu::Buffer,
    n: u32,
    rows: u32,
    out: &wgpu::Buffer,
) {
    assert!(
        (1..=MAX_ROWS).contains(&rows),
        "argmax_rows needs 1..={MAX_ROWS} rows, got {rows}"
    );
    let lists = partial_lists(rec, logits, n, 1, rows);
    let pipeline = rec.pipeline(&ARGMAX_FINAL, &constants(1));
    rec.dispatch(
        &pipeline,
        &lists.params,
        &[lists.buffer.as_entire_binding(), out.as_entire_binding()],
        [1, rows, 1],
    );
}

/// Most rows `argmax_rows` takes: WebGPU guarantees 65535 workgroups per dimension.
pub const MAX_ROWS: u32 = 65535;

/// The k largest of logits[0..n], largest first (lower index first on ties): k u32 ids into
/// `out_ids` and their k f32 values into `out_values`. Needs 1 <= k <= min(n, 64).
pub fn top_k(
    rec: &mut Recorder,
    logits: &wgpu::Buffer,
    n: u32,
    k: u32,
    out_ids: &wgpu::Buffer,
    out_values: &wgpu::Buffer,
) {
    assert!(
        (1..=MAX_TOP_K).contains(&k) && k <= n,
        "top_k needs 1 <= k <= min(n, {MAX_TOP_K}), got k = {k}, n = {n}"
    );
    let lists = partial_lists(rec, logits, n, k, 1);
    let pipeline = rec.pipeline(&SELECT_FINAL, &constants(k));
    rec.dispatch(
        &pipeline,
        &lists.params,
        &[
            lists.buffer.as_entire_binding(),
            out_ids.as_entire_binding(),
            out_values.as_entire_binding(),
        ],
        [1, 1, 1],
    );
}

/// The first pass's output: `params` describe it as the second pass's input.
struct PartialLists {
    buffer: wgpu::Buffer,
    params: SelectParams,
}

fn partial_lists(
    rec: &mut Recorder,
    logits: &wgpu::Buffer,
    n: u32,
    k: u32,
    rows: u32,
) -> PartialLists {
    assert!(
        (1..=MAX_N).contains(&n),
        "selection needs 1 <= n <= {MAX_N}, got {n}"
    );
    let per_lane = if rec.gpu().caps.cpu_work_split {
        CPU_PER_LANE
    } else {
        GPU_PER_LANE
    };
    let groups = n
        .div_ceil(workgroup_size(k) * per_lane.max(4 * k))
        .min(MAX_GROUPS);
    let chunk = n.div_ceil(groups);
    // One scratch buffer per device, kept: a fresh one per call cost a buffer and two bind
    // groups every decode step. Steps in flight share it as they share the stage's scratch:
    // the queue orders their dispatches.
    let bytes = u64::from(groups * k) * u64::from(rows) * 8;
    let buffer = rec.gpu().kept_storage("select partial lists", bytes);
    let pipeline = rec.pipeline(&SELECT_PARTIAL, &constants(k));
    let first = SelectParams {
        n,
        chunk,
        pairs: 0,
        pad: 0,
    };
    rec.dispatch(
        &pipeline,
        &first,
        &[logits.as_entire_binding(), buffer.as_entire_binding()],
        [groups, rows, 1],
    );
    let params = SelectParams {
        n: groups * k,
        chunk: groups * k,
        pairs: 1,
        pad: 0,
    };
    PartialLists { buffer, params }
}

/// Indices of the k largest values, largest first, lower index first on ties; NaN ranks as
/// -inf, as on the GPU.
pub fn top_k_reference(logits: &[f32], k: usize) -> Vec<u32> {
    let key = |v: f32| if v.is_nan() { f32::NEG_INFINITY } else { v };
    let mut order: Vec<u32> = (0..logits.len() as u32).collect();
    order.sort_by(|&a, &b| {
        key(logits[b as usize])
            .partial_cmp(&key(logits[a as usize]))
            .unwrap_or(std::cmp::Ordering::Equal)
            .then(a.cmp(&b))
    });
    order.truncate(k);
    order
}

pub fn argmax_reference(logits: &[f32]) -> u32 {
    top_k_reference(logits, 1)[0]
}
