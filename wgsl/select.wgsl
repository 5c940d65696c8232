// Greedy selection on the GPU: the K best (value, index) pairs of a logits vector, best first,
// ties broken by the lower index. Two passes: `select_partial` keeps the best K of one chunk
// per workgroup, then one workgroup merges the chunks' lists (`select_final`, `argmax_final`).
// f32 in every variant: logits are compared, never computed.
//
// Each lane keeps a sorted list of its best K candidates in private memory; the workgroup then
// pops the best head among the lanes' lists K times. A shared-memory tree reduces (value,
// index) pairs so that -inf logits and ties keep their exact order.

struct Params {
    // Candidates in this pass: logits in the first, groups * K list entries in the second.
    n: u32,
    // Candidates each workgroup of the first pass reads.
    chunk: u32,
    pad0: u32,
    pad1: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
// Logits (first pass) or list entries as (value bits, index) pairs (second pass).
@group(0) @binding(1) var<storage, read> input: array<u32>;
// Per-workgroup lists as (value bits, index) pairs (first pass), or the ids (second pass).
@group(0) @binding(2) var<storage, read_write> out_a: array<u32>;
// The values' bits (second pass of top-k).
@group(0) @binding(3) var<storage, read_write> out_b: array<u32>;

const NO_INDEX: u32 = 0xffffffffu;

var<private> top_value: array<f32, K>;
var<private> top_index: array<u32, K>;
var<private> top_count: u32;

var<workgroup> shared_value: array<f32, WG>;
var<workgroup> shared_index: array<u32, WG>;
var<workgroup> winner_value: array<f32, K>;
var<workgroup> winner_index: array<u32, K>;

fn negative_infinity() -> f32 {
    // Through a variable: WGSL forbids infinities in const-expressions (Tint enforces it).
    var bits = 0xff800000u;
    return bitcast<f32>(bits);
}

fn better(value: f32, index: u32, other_value: f32, other_index: u32) -> bool {
    return value > other_value || (value == other_value && index < other_index);
}

// NaN would break the order of the lists, so it ranks as -inf. Tested on the bits: drivers
// may fold `v != v` away.
fn insert(raw_value: f32, index: u32) {
    var value = raw_value;
    if ((bitcast<u32>(value) & 0x7fffffffu) > 0x7f800000u) {
        value = negative_infinity();
    }
    if (top_count == K && !better(value, index, top_value[K - 1u], top_index[K - 1u])) {
        return;
    }
    var slot = min(top_count, K - 1u);
    top_count = min(top_count + 1u, K);
    while (slot > 0u && better(value, index, top_value[slot - 1u], top_index[slot - 1u])) {
        top_value[slot] = top_value[slot - 1u];
        top_index[slot] = top_index[slot - 1u];
        slot = slot - 1u;
    }
    top_value[slot] = value;
    top_index[slot] = index;
}

// Best (value, index) over the workgroup, left in shared_value[0] / shared_index[0].
fn reduce_best(value: f32, index: u32, lane: u32) {
    shared_value[lane] = value;
    shared_index[lane] = index;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride = stride / 2u) {
        if (lane < stride) {
            let other_value = shared_value[lane + stride];
            let other_index = shared_index[lane + stride];
            if (better(other_value, other_index, shared_value[lane], shared_index[lane])) {
                shared_value[lane] = other_value;
                shared_index[lane] = other_index;
            }
        }
        workgroupBarrier();
    }
}

// Pops the best head of the lanes' lists K times into winner_value / winner_index.
fn merge_lists(lane: u32) {
    var head = 0u;
    for (var round = 0u; round < K; round = round + 1u) {
        var value = negative_infinity();
        var index = NO_INDEX;
        if (head < top_count) {
            value = top_value[head];
            index = top_index[head];
        }
        reduce_best(value, index, lane);
        let best_index = shared_index[0];
        if (lane == 0u) {
            winner_value[round] = shared_value[0];
            winner_index[round] = best_index;
        }
        workgroupBarrier();
        if (head < top_count && index == best_index) {
            head = head + 1u;
        }
    }
    workgroupBarrier();
}

@compute @workgroup_size(WG)
fn select_partial(@builtin(workgroup_id) group: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    top_count = 0u;
    let begin = group.x * params.chunk;
    let end = min(begin + params.chunk, params.n);
    for (var i = begin + lane; i < end; i = i + WG) {
        insert(bitcast<f32>(input[i]), i);
    }
    merge_lists(lane);
    for (var j = lane; j < K; j = j + WG) {
        let entry = (group.x * K + j) * 2u;
        out_a[entry] = bitcast<u32>(winner_value[j]);
        out_a[entry + 1u] = winner_index[j];
    }
}

fn gather_lists(lane: u32) {
    top_count = 0u;
    for (var i = lane; i < params.n; i = i + WG) {
        insert(bitcast<f32>(input[2u * i]), input[2u * i + 1u]);
    }
    merge_lists(lane);
}

@compute @workgroup_size(WG)
fn select_final(@builtin(local_invocation_index) lane: u32) {
    gather_lists(lane);
    for (var j = lane; j < K; j = j + WG) {
        out_a[j] = winner_index[j];
        out_b[j] = bitcast<u32>(winner_value[j]);
    }
}

@compute @workgroup_size(WG)
fn argmax_final(@builtin(local_invocation_index) lane: u32) {
    gather_lists(lane);
    if (lane == 0u) {
        out_a[0] = winner_index[0];
    }
}
