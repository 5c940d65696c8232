// Causal attention for many query positions (prefill, chunked prefill after start_pos > 0);
// with CAUSAL = 0, bidirectional attention (encoders): every query sees every key of the call;
// with SEGMENTS = 1 as well, the call packs several sequences (an encoder's batch) and each
// query sees only the keys of its own sequence, segments[token] (first and last key).
// Workgroup (row_block, kv_group, split): the rows are (token, head) pairs of the query heads that
// share kv head `kv_group`, token-major, WG rows per workgroup, one row per lane. Keys and
// values stream through workgroup memory in tiles of BK keys (half_t in f16 variants, which
// doubles the tile); each lane keeps its query and output accumulator in registers and
// applies the online softmax once per tile (rescale by the tile max, then accumulate).
// Two barriers per tile and none elsewhere: CPU adapters pay dearly for each barrier.
//
// Long key ranges are split over workgroups (z): llvmpipe ends every loop of an invocation
// after 65535 back-edges in total, so one invocation must not walk too many keys; the splits
// also spread chunked prefill with few tokens over the GPU. With one split the workgroup
// writes the normalised output; otherwise the same partial results as attention_decode.wgsl,
// merged by attention_combine.wgsl. The head_dim loops take four vec4s per iteration for the
// same reason (head_dim is a multiple of 16).
//
// With PAGED = 1 the cache is a pool of pages of PAGE positions, and key j lives in page
// pages[j / PAGE] (the sequence's page table): only the tile loads change.
//
// Constants: WG (rows per workgroup), HD (head_dim), BK (keys per tile), CAUSAL (1 or 0),
// SEGMENTS (1 or 0; 1 only with CAUSAL 0), PAGED (1 or 0), PAGE (positions per page).

const HD4: u32 = HD / 4u;

var<workgroup> k_tile: array<half4_t, BK * HD4>;
var<workgroup> v_tile: array<half4_t, BK * HD4>;

// Loads keys tile_start..tile_start + BK (those <= last_key) of `kv_group` into the tiles.
fn load_tile(tile_start: u32, last_key: u32, kv_group: u32, lane: u32) {
    let row_stride = params.kv_heads * HD4;
    for (var i = lane; i < BK * HD4; i = i + WG) {
        let key = tile_start + i / HD4;
        if (key <= last_key) {
            let index = cache_row(key) * row_stride + kv_group * HD4 + i % HD4;
            k_tile[i] = half4_t(k_cache[index]);
            v_tile[i] = half4_t(v_cache[index]);
        }
    }
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) group: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    let kv_group = group.y;
    let split = group.z;
    let group_size = params.heads / params.kv_heads;
    let first_row = group.x * WG;
    let row = first_row + lane;
    let in_range = row < params.tokens * group_size;
    let last_token = min(params.tokens - 1u, (first_row + WG - 1u) / group_size);
    // Keys any row of this workgroup can see.
    let lo = visible_keys(first_row / group_size).x;
    let hi = visible_keys(last_token).y;
    let tiles = (hi - lo) / BK + 1u;
    let split_start = lo + split * tiles / params.splits * BK;
    let split_end = lo + (split + 1u) * tiles / params.splits * BK;

    let token = min(row / group_size, params.tokens - 1u);
    let head = kv_group * group_size + row % group_size;
    let row_keys = visible_keys(token);
    let row_lo = row_keys.x;
    let row_hi = row_keys.y;
    let q_base = (token * params.heads + head) * HD4;
    var query: array<vec4<f32>, HD4>;
    if (in_range) {
        for (var d4 = 0u; d4 < HD4; d4 = d4 + 1u) {
            query[d4] = q[q_base + d4] * params.scale;
        }
    }
    var acc: array<vec4<f32>, HD4>;
    var run_max = NEG;
    var run_sum = 0.0;
    var tile_scores: array<f32, BK>;

    for (var tile_start = split_start; tile_start < split_end; tile_start = tile_start + BK) {
        load_tile(tile_start, hi, kv_group, lane);
        workgroupBarrier();
        let first_key = max(row_lo, tile_start);
        let last_key = min(row_hi, tile_start + BK - 1u);
        if (in_range && first_key <= last_key) {
            var tile_max = run_max;
            for (var key = first_key; key <= last_key; key = key + 1u) {
                let t = (key - tile_start) * HD4;
                var score = 0.0;
                for (var d4 = 0u; d4 < HD4; d4 = d4 + 4u) {
                    score = score + dot(query[d4], vec4<f32>(k_tile[t + d4]))
                        + dot(query[d4 + 1u], vec4<f32>(k_tile[t + d4 + 1u]))
                        + dot(query[d4 + 2u], vec4<f32>(k_tile[t + d4 + 2u]))
                        + dot(query[d4 + 3u], vec4<f32>(k_tile[t + d4 + 3u]));
                }
                score = capped(score, params.softcap);
                tile_scores[key - tile_start] = score;
                tile_max = max(tile_max, score);
            }
            let correction = exp(run_max - tile_max);
            run_sum = run_sum * correction;
            for (var d4 = 0u; d4 < HD4; d4 = d4 + 4u) {
                acc[d4] = acc[d4] * correction;
                acc[d4 + 1u] = acc[d4 + 1u] * correction;
                acc[d4 + 2u] = acc[d4 + 2u] * correction;
                acc[d4 + 3u] = acc[d4 + 3u] * correction;
            }
            for (var key = first_key; key <= last_key; key = key + 1u) {
                let p = exp(tile_scores[key - tile_start] - tile_max);
                run_sum = run_sum + p;
                let t = (key - tile_start) * HD4;
                for (var d4 = 0u; d4 < HD4; d4 = d4 + 4u) {
                    acc[d4] = acc[d4] + p * vec4<f32>(v_tile[t + d4]);
                    acc[d4 + 1u] = acc[d4 + 1u] + p * vec4<f32>(v_tile[t + d4 + 1u]);
                    acc[d4 + 2u] = acc[d4 + 2u] + p * vec4<f32>(v_tile[t + d4 + 2u]);
                    acc[d4 + 3u] = acc[d4 + 3u] + p * vec4<f32>(v_tile[t + d4 + 3u]);
                }
            }
            run_max = tile_max;
        }
        workgroupBarrier();
    }

    if (!in_range) {
        return;
    }
    if (params.splits == 1u) {
        let inverse = 1.0 / run_sum;
        for (var d4 = 0u; d4 < HD4; d4 = d4 + 1u) {
            out[q_base + d4] = acc[d4] * inverse;
        }
        return;
    }
    let slot = (token * params.heads + head) * params.splits + split;
    for (var d4 = 0u; d4 < HD4; d4 = d4 + 1u) {
        partial_acc[slot * HD4 + d4] = acc[d4];
    }
    partial_stats[slot] = vec2<f32>(run_max, run_sum);
}
