// Greedy selection on the GPU: the K best (value, index) pairs of a logits vector, best first,
// ties broken by the lower index. Two passes: `select_partial` keeps the best K of one chunk
// per workgroup, then one workgroup merges the chunks' lists (`select_final`, `argmax_final`).
// f32 in every variant: logits are compared, never computed.
//
// Each lane keeps a sorted list of its best K candidates in private memory; the lanes' lists
// are then merged pairwise through shared memory. Comparisons are on (value, index) pairs, so
// -inf logits and ties keep their exact order. For K > 1 a cheap first scan finds a threshold
// that only a few candidates pass, because sorted insertion is the costly part.
// Needs WG (a power of two), K, SUBSETS (per lane, for the threshold), MAXIMA = WG * SUBSETS
// and PARTNER_SLOTS = WG / 2 * K.
//
// Several rows at once (the logits of a speculative step's positions): workgroup y is the row,
// whose `n` candidates start at y * n in the input; the first pass writes row y's lists after
// the lists of the rows before it, so the second pass reads them the same way.

struct Params {
    // Candidates in this pass: logits in the first, groups * K list entries in the second.
    n: u32,
    // Candidates each workgroup reads.
    chunk: u32,
    // 0: the input holds logits; 1: it holds (value bits, index) pairs.
    pairs: u32,
    pad: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
// Logits (first pass) or list entries as (value bits, index) pairs (second pass).
@group(0) @binding(1) var<storage, read> input: array<u32>;
// Per-workgroup lists as (value bits, index) pairs (first pass), or the ids (second pass).
@group(0) @binding(2) var<storage, read_write> out_a: array<u32>;
// The values' bits (second pass of top-k).
@group(0) @binding(3) var<storage, read_write> out_b: array<u32>;

const NO_INDEX: u32 = 0xffffffffu;

struct Candidate {
    value: f32,
    index: u32,
}

var<private> top_value: array<f32, K>;
var<private> top_index: array<u32, K>;
var<private> top_count: u32;
// Where this workgroup's row starts in the input, in candidates.
var<private> row_base: u32;

// Lists handed from the upper half of the active lanes to the lower half while merging.
var<workgroup> partner_value: array<f32, PARTNER_SLOTS>;
var<workgroup> partner_index: array<u32, PARTNER_SLOTS>;
var<workgroup> partner_count: array<u32, WG>;
// The lanes' subset maxima, and the K-th best of them.
var<workgroup> maxima_value: array<f32, MAXIMA>;
var<workgroup> maxima_index: array<u32, MAXIMA>;
var<workgroup> threshold: Candidate;

fn no_candidate() -> Candidate {
    // Through a variable: WGSL forbids infinities in const-expressions (Tint enforces it).
    var bits = 0xff800000u;
    return Candidate(bitcast<f32>(bits), NO_INDEX);
}

fn better(a: Candidate, b: Candidate) -> bool {
    return a.value > b.value || (a.value == b.value && a.index < b.index);
}

// NaN would break the order of the lists, so it ranks as -inf. Tested on the bits: drivers
// may fold `v != v` away.
fn load(i: u32) -> Candidate {
    let at = row_base + i;
    var candidate = Candidate(bitcast<f32>(input[at]), i);
    if (params.pairs != 0u) {
        candidate = Candidate(bitcast<f32>(input[2u * at]), input[2u * at + 1u]);
    }
    if ((bitcast<u32>(candidate.value) & 0x7fffffffu) > 0x7f800000u) {
        candidate.value = no_candidate().value;
    }
    return candidate;
}

fn list_entry(j: u32) -> Candidate {
    if (j < top_count) {
        return Candidate(top_value[j], top_index[j]);
    }
    return no_candidate();
}

fn insert(candidate: Candidate) {
    if (top_count == K && !better(candidate, list_entry(K - 1u))) {
        return;
    }
    var slot = min(top_count, K - 1u);
    top_count = min(top_count + 1u, K);
    while (slot > 0u && better(candidate, list_entry(slot - 1u))) {
        top_value[slot] = top_value[slot - 1u];
        top_index[slot] = top_index[slot - 1u];
        slot = slot - 1u;
    }
    top_value[slot] = candidate.value;
    top_index[slot] = candidate.index;
}

// Sets `threshold` to the K-th best of the maxima of WG * SUBSETS disjoint subsets of
// [begin, end). Those maxima are distinct candidates, so the chunk's K best are all at least
// as good as the threshold. Fewer than K non-empty subsets leave it at "no candidate".
fn find_threshold(begin: u32, end: u32, lane: u32) {
    var best: array<Candidate, SUBSETS>;
    for (var s = 0u; s < SUBSETS; s = s + 1u) {
        best[s] = no_candidate();
    }
    for (var base = begin + lane; base < end; base = base + MAXIMA) {
        for (var s = 0u; s < SUBSETS; s = s + 1u) {
            let i = base + s * WG;
            if (i < end) {
                let candidate = load(i);
                if (better(candidate, best[s])) {
                    best[s] = candidate;
                }
            }
        }
    }
    for (var s = 0u; s < SUBSETS; s = s + 1u) {
        maxima_value[s * WG + lane] = best[s].value;
        maxima_index[s * WG + lane] = best[s].index;
    }
    if (lane == 0u) {
        threshold = no_candidate();
    }
    workgroupBarrier();
    for (var s = 0u; s < SUBSETS; s = s + 1u) {
        var rank = 0u;
        for (var m = 0u; m < MAXIMA; m = m + 1u) {
            if (better(Candidate(maxima_value[m], maxima_index[m]), best[s])) {
                rank = rank + 1u;
            }
        }
        if (rank == K - 1u) {
            threshold = best[s];
        }
    }
    workgroupBarrier();
}

// Merges this lane's list with the one its partner left in `slot`, keeping the best K. The
// merged list is built apart and copied back entry by entry: with the list copied whole first
// (`var own = top_value;`) Mesa 25's GL compiler read the copy from the list being written,
// repeating entries (llvmpipe's GL, docs/ci.md session 19).
fn merge_with_partner(slot: u32) {
    var merged_value: array<f32, K>;
    var merged_index: array<u32, K>;
    let own_count = top_count;
    let other_count = partner_count[slot];
    let base = slot * K;
    let total = min(own_count + other_count, K);
    var a = 0u;
    var b = 0u;
    for (var j = 0u; j < total; j = j + 1u) {
        var take_own = b >= other_count;
        if (a < own_count && b < other_count) {
            take_own = better(
                Candidate(top_value[a], top_index[a]),
                Candidate(partner_value[base + b], partner_index[base + b])
            );
        }
        if (take_own) {
            merged_value[j] = top_value[a];
            merged_index[j] = top_index[a];
            a = a + 1u;
        } else {
            merged_value[j] = partner_value[base + b];
            merged_index[j] = partner_index[base + b];
            b = b + 1u;
        }
    }
    for (var j = 0u; j < total; j = j + 1u) {
        top_value[j] = merged_value[j];
        top_index[j] = merged_index[j];
    }
    top_count = total;
}

// Pairwise merges of the lanes' sorted lists, log2(WG) levels with two barriers each (CPU
// adapters pay dearly per barrier); lane 0 ends with the workgroup's best K.
fn merge_lists(lane: u32) {
    for (var stride = WG / 2u; stride > 0u; stride = stride / 2u) {
        if (lane >= stride && lane < 2u * stride) {
            let slot = lane - stride;
            for (var j = 0u; j < top_count; j = j + 1u) {
                partner_value[slot * K + j] = top_value[j];
                partner_index[slot * K + j] = top_index[j];
            }
            partner_count[slot] = top_count;
        }
        workgroupBarrier();
        if (lane < stride) {
            merge_with_partner(lane);
        }
        workgroupBarrier();
    }
}

// Leaves the best K of [begin, end) in lane 0's list.
fn collect(begin: u32, end: u32, lane: u32) {
    top_count = 0u;
    var lowest = no_candidate();
    if (K > 1u) {
        find_threshold(begin, end, lane);
        lowest = threshold;
    }
    for (var i = begin + lane; i < end; i = i + WG) {
        let candidate = load(i);
        if (!better(lowest, candidate)) {
            insert(candidate);
        }
    }
    merge_lists(lane);
}

@compute @workgroup_size(WG)
fn select_partial(
    @builtin(workgroup_id) group: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
    @builtin(local_invocation_index) lane: u32,
) {
    row_base = group.y * params.n;
    let begin = group.x * params.chunk;
    collect(begin, min(begin + params.chunk, params.n), lane);
    if (lane == 0u) {
        let list = group.y * groups.x + group.x;
        for (var j = 0u; j < K; j = j + 1u) {
            let entry = list_entry(j);
            out_a[(list * K + j) * 2u] = bitcast<u32>(entry.value);
            out_a[(list * K + j) * 2u + 1u] = entry.index;
        }
    }
}

// The partial lists' padding entries are "no candidate": they rank below every real one.
@compute @workgroup_size(WG)
fn select_final(@builtin(local_invocation_index) lane: u32) {
    row_base = 0u;
    collect(0u, params.n, lane);
    if (lane == 0u) {
        for (var j = 0u; j < K; j = j + 1u) {
            let entry = list_entry(j);
            out_a[j] = entry.index;
            out_b[j] = bitcast<u32>(entry.value);
        }
    }
}

@compute @workgroup_size(WG)
fn argmax_final(@builtin(workgroup_id) group: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    row_base = group.y * params.n;
    collect(0u, params.n, lane);
    if (lane == 0u) {
        out_a[group.y] = list_entry(0u).index;
    }
}
