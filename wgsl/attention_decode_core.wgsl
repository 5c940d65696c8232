// Decode attention for discrete GPUs, the part every entry shares: few query positions against
// a KV cache, split over the keys (flash-decoding), with every phase spread over the lanes of
// the workgroup. The entries (attention_decode_gpu.wgsl: q from a buffer, every key cached;
// attention_decode_rope.wgsl: q and the newest key rotated in the same dispatch;
// attention_decode_rows.wgsl: a batched step's rows, each in its own slot of a pool or its own
// pages) declare `params`, `k_cache` and `v_cache` and `cache_row(region, pos)`, the vec4
// where position pos's row begins in a region (a slot, or a page table), and fill `q_row`
// before calling `attend`.
//
// Workgroup (split, head, token) owns one query head and a contiguous share of at most KPS of
// its token's visible keys:
//   1. scores: LPK lanes share a key, each summing q·k over every LPK-th vec4 of head_dim
//      (LPK = 1 below head_dim 128, so lane i scores keys i, i + WG, ... alone); with LPK > 1
//      the parts meet in workgroup memory, KPP = WG / LPK keys a pass. The scores stay in
//      workgroup memory;
//   2. softmax: a workgroup max reduction, exp(score - max) in place, a sum reduction
//      (`reduce_max`/`reduce_sum` of Lib::Reduce: subgroups where the variant has them);
//   3. values: lanes form (key group g, vec4 d4 of head_dim), GROUPS = WG / HD4 groups; lane
//      (g, d4) accumulates p·v[d4] over keys g, g + GROUPS, ... (four independent loads per
//      iteration, coalesced across the d4 lanes of a group), and the groups are summed through
//      workgroup memory.
// With one split the workgroup writes the normalised output itself (no combine dispatch);
// otherwise it leaves the partial result (max, sum of exponentials, unnormalised values) that
// attention_combine.wgsl merges, exactly as attention_decode.wgsl does.
//
// A "fresh" share ends with a key that is not read from the cache but from `fresh_k` and
// `fresh_v` in workgroup memory: the key and value of the position being decoded, which
// another workgroup of the same dispatch is writing into the cache.
//
// Why not attention_decode.wgsl: that kernel is built for CPU adapters, where every lane is a
// loop iteration and barriers are costly: one lane per query head runs a tile's max and exp
// serially, and every lane walks all keys of a tile with a dependent value load per key. On a
// GPU those serial walks are chains of dependent memory latencies; here each lane's loads are
// independent and the serial parts are short (KPS / WG keys to score, KPS / GROUPS to weight).
// The host bounds KPS, so one invocation also stays far below llvmpipe's 65535 loop
// back-edges.
//
// Constants: WG (lanes, a power of two), HD (head_dim, HD / 4 <= WG), KPS (keys per split at
// most), LPK (lanes per key, a power of two dividing HD / 16).

@group(0) @binding(4) var<storage, read_write> out: array<vec4<f32>>;
@group(0) @binding(5) var<storage, read_write> partial_acc: array<vec4<f32>>;
@group(0) @binding(6) var<storage, read_write> partial_stats: array<vec2<f32>>;

const HD4: u32 = HD / 4u;
const GROUPS: u32 = WG / HD4;
const KPP: u32 = WG / LPK;
// Loop strides: every loop must end (the pipeline drops naga's loop bounding: gpu/pipeline.rs).
const_assert GROUPS > 0u && KPP > 0u;

// The query row, already multiplied by the attention scale.
var<workgroup> q_row: array<vec4<f32>, HD4>;
var<workgroup> probs: array<f32, KPS>;
var<workgroup> group_acc: array<vec4<f32>, WG>;
var<workgroup> fresh_k: array<vec4<f32>, HD4>;
var<workgroup> fresh_v: array<vec4<f32>, HD4>;
// Each lane's part of a key's q·k (LPK > 1).
var<workgroup> key_parts: array<f32, WG>;

// Part `part` of q·k for the cached key whose vec4s begin at `base`: vec4s part, part + LPK, ...
fn key_part(base: u32, part: u32) -> f32 {
    var d = vec4<f32>(0.0);
    for (var c = part; c < HD4; c = c + 4u * LPK) {
        d = d + q_row[c] * k_cache[base + c];
        d = d + q_row[c + LPK] * k_cache[base + c + LPK];
        d = d + q_row[c + 2u * LPK] * k_cache[base + c + 2u * LPK];
        d = d + q_row[c + 3u * LPK] * k_cache[base + c + 3u * LPK];
    }
    return d.x + d.y + d.z + d.w;
}

// Scores of the first `cached` keys from `begin` into probs, LPK lanes a key; returns this
// lane's maximum. Uniform control flow (barriers in the pass loop).
fn shared_scores(region: u32, begin: u32, head: u32, cached: u32, lane: u32) -> f32 {
    let part = lane % LPK;
    let slot = lane / LPK;
    var local_max = NEG;
    for (var done = 0u; done < cached; done = done + KPP) {
        var d = 0.0;
        if (done + slot < cached) {
            d = key_part(cache_row(region, begin + done + slot) + head, part);
        }
        key_parts[lane] = d;
        workgroupBarrier();
        if (lane < KPP && done + lane < cached) {
            var sum = 0.0;
            for (var p = 0u; p < LPK; p = p + 1u) {
                sum = sum + key_parts[lane * LPK + p];
            }
            let score = capped(sum, params.softcap);
            probs[done + lane] = score;
            local_max = max(local_max, score);
        }
        workgroupBarrier();
    }
    return local_max;
}

// The fresh key's q·k in a cached key's order (key_part's parts, summed as shared_scores sums
// them), so that a key scores the same bits fresh or read back from the cache, as a batched
// step's rows read theirs (integer products round x: a last-bit difference could move a value
// of it a whole step).
fn fresh_score() -> f32 {
    var sum = 0.0;
    for (var part = 0u; part < LPK; part = part + 1u) {
        var d = vec4<f32>(0.0);
        for (var c = part; c < HD4; c = c + 4u * LPK) {
            d = d + q_row[c] * fresh_k[c];
            d = d + q_row[c + LPK] * fresh_k[c + LPK];
            d = d + q_row[c + 2u * LPK] * fresh_k[c + 2u * LPK];
            d = d + q_row[c + 3u * LPK] * fresh_k[c + 3u * LPK];
        }
        sum = sum + (d.x + d.y + d.z + d.w);
    }
    return capped(sum, params.softcap);
}

// Lane (g, d4)'s share of the probability-weighted values of the first `cached` keys from
// `begin`, whose kv head begins `head` vec4s into each cache row.
fn weighted_values(region: u32, begin: u32, head: u32, cached: u32, g: u32, d4: u32) -> vec4<f32> {
    var acc = vec4<f32>(0.0);
    let at = head + d4;
    var i = g;
    for (; i + 3u * GROUPS < cached; i = i + 4u * GROUPS) {
        let v0 = v_cache[cache_row(region, begin + i) + at];
        let v1 = v_cache[cache_row(region, begin + i + GROUPS) + at];
        let v2 = v_cache[cache_row(region, begin + i + 2u * GROUPS) + at];
        let v3 = v_cache[cache_row(region, begin + i + 3u * GROUPS) + at];
        acc = acc + probs[i] * v0 + probs[i + GROUPS] * v1;
        acc = acc + probs[i + 2u * GROUPS] * v2 + probs[i + 3u * GROUPS] * v3;
    }
    for (; i < cached; i = i + GROUPS) {
        acc = acc + probs[i] * v_cache[cache_row(region, begin + i) + at];
    }
    return acc;
}

// The first key and the number of keys of split `split` of a query at position `pos`.
fn split_keys(split: u32, pos: u32) -> vec2<u32> {
    let lo = first_visible(pos, params.window);
    let visible = pos + 1u - lo;
    let begin = lo + split * visible / params.splits;
    return vec2<u32>(begin, lo + (split + 1u) * visible / params.splits - begin);
}

// Attends query head `head` of `token` (q_row, visible to every lane) at position `pos` over
// split `split` of its keys, in cache region `region` (`cache_row`); with `fresh`, the split's
// last key is fresh_k/fresh_v. Uniform control flow.
fn attend(split: u32, head: u32, token: u32, pos: u32, region: u32, lane: u32, fresh: bool) {
    let kv_group = head / (params.heads / params.kv_heads);
    let keys = split_keys(split, pos);
    let begin = keys.x;
    let count = keys.y;
    let cached = count - u32(fresh);
    let kv_at = kv_group * HD4;

    // Phase 1: scores, one lane a key (keys lane, lane + WG, ...) or LPK.
    var local_max = NEG;
    if (LPK == 1u) {
        for (var i = lane; i < cached; i = i + WG) {
            let score = capped(key_part(cache_row(region, begin + i) + kv_at, 0u), params.softcap);
            probs[i] = score;
            local_max = max(local_max, score);
        }
    } else {
        local_max = shared_scores(region, begin, kv_at, cached, lane);
    }
    if (fresh && lane == cached % WG) {
        let score = fresh_score();
        probs[cached] = score;
        local_max = max(local_max, score);
    }
    // The reductions begin and end with barriers, so every score is visible after this.
    let m = reduce_max(local_max, lane);

    // Phase 2: probabilities (unnormalised) in place.
    var local_sum = 0.0;
    for (var i = lane; i < count; i = i + WG) {
        let p = exp(probs[i] - m);
        probs[i] = p;
        local_sum = local_sum + p;
    }
    let total = reduce_sum(local_sum, lane);

    // Phase 3: lane (g, d4) weights the values of keys g, g + GROUPS, ...
    let g = lane / HD4;
    let d4 = lane % HD4;
    var acc = vec4<f32>(0.0);
    if (g < GROUPS) {
        acc = weighted_values(region, begin, kv_at, cached, g, d4);
        if (fresh && g == cached % GROUPS) {
            acc = acc + probs[cached] * fresh_v[d4];
        }
    }
    group_acc[lane] = acc;
    workgroupBarrier();

    if (lane < HD4) {
        var sum = group_acc[lane];
        for (var k = 1u; k < GROUPS; k = k + 1u) {
            sum = sum + group_acc[k * HD4 + lane];
        }
        let row = token * params.heads + head;
        if (params.splits == 1u) {
            out[row * HD4 + lane] = sum / total;
        } else {
            let slot = row * params.splits + split;
            partial_acc[slot * HD4 + lane] = sum;
            if (lane == 0u) {
                partial_stats[slot] = vec2<f32>(m, total);
            }
        }
    }
}
