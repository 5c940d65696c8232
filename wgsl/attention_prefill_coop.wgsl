// Prefill attention on cooperative matrices (tensor cores): what attention_prefill.wgsl computes,
// with the same bindings, masks, grid (row_block, kv_group, split) and partial results, so the
// same host code and attention_combine.wgsl serve both.
//
// Rows are (token, head) pairs of the query heads sharing kv head `kv_group`, token-major, as
// there. A subgroup owns 16 rows and up to four 16-wide blocks of head_dim (64 values): DSPLIT
// subgroups cover one row group's head_dim, and a workgroup holds ROW_GROUPS row groups (64 rows
// at head_dim 64, 16 at 256). Keys and values stream through workgroup memory in tiles of BK
// keys (f16), shared by every subgroup; each subgroup multiplies 16 keys at a time.
//
// Two passes over the split's keys instead of the online softmax: the output accumulators are
// cooperative matrices, opaque to a lane, so they cannot be rescaled row by row when the running
// maximum grows. The first pass finds each row's maximum score (S = Q K^T on the tensor cores,
// staged through workgroup memory so lanes can mask and reduce it); the second recomputes S,
// turns it into P = exp(S - max) (f16, masked keys 0) and accumulates O += P V with the final
// maximum, exactly. Recomputing S costs a second multiply of Q by K, cheap on tensor cores
// beside the staging each pass needs anyway.
//
// A lane's share of a 16 x 16 score block is half a row: row lane / 2, columns (lane % 2) * 8
// and the 7 after. Both halves' maxima and sums meet through one subgroup shuffle.
//
// In cooperative-matrix terms: S (rows x keys) = A (Q, rows x head_dim, row-major in `q_tile`)
// times B (K^T, head_dim x keys: key rows of `k_tile`, column-major); O (rows x head_dim) =
// A (P, row-major in `p_stage`) times B (V, keys x head_dim, row-major in `v_tile`). Tile rows
// are padded by 8 halves to spread a subgroup's loads over the banks and keep them 16-byte
// aligned.
//
// Indices in range (`Lib::IndicesInRange`: no bounds checks on Vulkan): every workgroup-memory
// index comes from the lane, the subgroup's id (< SUBGROUPS) and loop counters under constant
// bounds (ROWS * HD4, BK * HD4, HD16, BK / 16, 8), never from the parameters.
//
// Constants: HD (head_dim, a multiple of 16, at most 256), BK (keys per tile, a multiple of 16),
// CAUSAL, SEGMENTS, PAGED, PAGE (as attention_prefill.wgsl). Needs subgroups of 32 lanes and
// 16 x 16 x 16 f16 x f16 + f32 matrices (the capability probe in src/gpu/device.rs).

const HD4: u32 = HD / 4u;
const HD16: u32 = HD / 16u;
// Subgroups sharing one row group's head_dim, four 16-wide blocks each.
const DSPLIT: u32 = (HD16 + 3u) / 4u;
const ROW_GROUPS: u32 = 4u / DSPLIT;
const SUBGROUPS: u32 = ROW_GROUPS * DSPLIT;
const SUBGROUP: u32 = 32u;
const WG: u32 = SUBGROUPS * SUBGROUP;
const ROWS: u32 = ROW_GROUPS * 16u;
const STRIDE: u32 = HD + 8u;
const P_STRIDE: u32 = 24u;
const BLOCK: u32 = 256u;

var<workgroup> q_tile: array<f16, ROWS * STRIDE>;
var<workgroup> k_tile: array<f16, BK * STRIDE>;
var<workgroup> v_tile: array<f16, BK * STRIDE>;
// Per subgroup: one 16 x 16 f32 block (scores, then outputs) and one 16 x 16 f16 block of P.
var<workgroup> s_stage: array<f32, SUBGROUPS * BLOCK>;
var<workgroup> p_stage: array<f16, SUBGROUPS * 16u * P_STRIDE>;

// (Two functions: naga passes no workgroup pointers to functions.)
fn store_key4(at: u32, v: vec4<f32>) {
    k_tile[at] = f16(v.x);
    k_tile[at + 1u] = f16(v.y);
    k_tile[at + 2u] = f16(v.z);
    k_tile[at + 3u] = f16(v.w);
}

fn store_value4(at: u32, v: vec4<f32>) {
    v_tile[at] = f16(v.x);
    v_tile[at + 1u] = f16(v.y);
    v_tile[at + 2u] = f16(v.z);
    v_tile[at + 3u] = f16(v.w);
}

// The workgroup's query rows, scaled, as f16 (rows past the call are zeros).
fn load_queries(first_row: u32, kv_group: u32, lane: u32) {
    let group_size = params.heads / params.kv_heads;
    for (var i = lane; i < ROWS * HD4; i = i + WG) {
        let row = first_row + i / HD4;
        var v = vec4<f32>(0.0);
        if (row < params.tokens * group_size) {
            let head = kv_group * group_size + row % group_size;
            v = q[((row / group_size) * params.heads + head) * HD4 + i % HD4] * params.scale;
        }
        let at = (i / HD4) * STRIDE + 4u * (i % HD4);
        q_tile[at] = f16(v.x);
        q_tile[at + 1u] = f16(v.y);
        q_tile[at + 2u] = f16(v.z);
        q_tile[at + 3u] = f16(v.w);
    }
}

// Keys tile_start.. tile_start + BK of `kv_group` (values too when `with_values`); keys past
// `last_key` are zeros, so that masked products stay finite.
fn load_tile(tile_start: u32, last_key: u32, kv_group: u32, lane: u32, with_values: bool) {
    let row_stride = params.kv_heads * HD4;
    for (var i = lane; i < BK * HD4; i = i + WG) {
        let key = tile_start + i / HD4;
        var k = vec4<f32>(0.0);
        var v = vec4<f32>(0.0);
        if (key <= last_key) {
            let index = cache_row(key) * row_stride + kv_group * HD4 + i % HD4;
            k = k_cache[index];
            if (with_values) {
                v = v_cache[index];
            }
        }
        let at = (i / HD4) * STRIDE + 4u * (i % HD4);
        store_key4(at, k);
        if (with_values) {
            store_value4(at, v);
        }
    }
}

// S for the subgroup's 16 rows (row group `rg`) and keys slice * 16.. of the tile, staged
// row-major at `stage`; every subgroup calls it (barrier inside).
fn stage_scores(rg: u32, slice: u32, stage: u32) {
    var s = coop_mat16x16<f32, C>();
    for (var d = 0u; d < HD16; d = d + 1u) {
        let a = coopLoadT<coop_mat16x16<f16, A>>(&q_tile[rg * 16u * STRIDE + d * 16u], STRIDE);
        let b = coopLoad<coop_mat16x16<f16, B>>(&k_tile[slice * 16u * STRIDE + d * 16u], STRIDE);
        s = coopMultiplyAdd(a, b, s);
    }
    coopStoreT(s, &s_stage[stage], 16u);
    workgroupBarrier();
}

// What a lane needs of its row: whether it is in the call, its visible keys, and its slot.
struct Row {
    live: bool,
    keys: vec2<u32>,
    token: u32,
    head: u32,
}

fn lane_row(first_row: u32, rg: u32, sub_lane: u32, kv_group: u32) -> Row {
    let group_size = params.heads / params.kv_heads;
    let row = first_row + rg * 16u + sub_lane / 2u;
    let token = min(row / group_size, params.tokens - 1u);
    return Row(row < params.tokens * group_size, visible_keys(token), token,
               kv_group * group_size + row % group_size);
}

// The score of this lane's column c of the staged block, or NEG where the key is masked.
fn masked_score(row: Row, stage: u32, sub_lane: u32, c: u32, first_key: u32) -> f32 {
    let column = (sub_lane % 2u) * 8u + c;
    let key = first_key + column;
    if (!row.live || key < row.keys.x || key > row.keys.y) {
        return NEG;
    }
    return capped(s_stage[stage + (sub_lane / 2u) * 16u + column], params.softcap);
}

// Writes the outputs of head_dim block `block` (staged at `stage`) for this lane's half row:
// normalised with one split, else the partial sums for attention_combine.
fn write_block(o: coop_mat16x16<f32, C>, block: u32, live_block: bool, row: Row, stage: u32,
               sub_lane: u32, sum: f32, split: u32) {
    coopStoreT(o, &s_stage[stage], 16u);
    workgroupBarrier();
    if (row.live && live_block) {
        let at = stage + (sub_lane / 2u) * 16u + (sub_lane % 2u) * 8u;
        let lo = vec4<f32>(s_stage[at], s_stage[at + 1u], s_stage[at + 2u], s_stage[at + 3u]);
        let hi = vec4<f32>(s_stage[at + 4u], s_stage[at + 5u], s_stage[at + 6u], s_stage[at + 7u]);
        let d4 = block * 4u + (sub_lane % 2u) * 2u;
        if (params.splits == 1u) {
            let base = (row.token * params.heads + row.head) * HD4 + d4;
            out[base] = lo / sum;
            out[base + 1u] = hi / sum;
        } else {
            let slot = (row.token * params.heads + row.head) * params.splits + split;
            partial_acc[slot * HD4 + d4] = lo;
            partial_acc[slot * HD4 + d4 + 1u] = hi;
        }
    }
    workgroupBarrier();
}

@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) group: vec3<u32>,
    @builtin(local_invocation_index) lane: u32,
    @builtin(subgroup_id) subgroup: u32,
    @builtin(subgroup_invocation_id) sub_lane: u32,
) {
    let kv_group = group.y;
    let split = group.z;
    let group_size = params.heads / params.kv_heads;
    let first_row = group.x * ROWS;
    let last_token = min(params.tokens - 1u, (first_row + ROWS - 1u) / group_size);
    let lo = visible_keys(min(first_row / group_size, params.tokens - 1u)).x;
    let hi = visible_keys(last_token).y;
    let tiles = (hi - lo) / BK + 1u;
    let split_start = lo + split * tiles / params.splits * BK;
    let split_end = lo + (split + 1u) * tiles / params.splits * BK;
    let rg = subgroup / DSPLIT;
    // The subgroup's head_dim blocks; past HD16 they repeat the last (same work, never written).
    let first_block = (subgroup % DSPLIT) * 4u;
    let b0 = min(first_block, HD16 - 1u);
    let b1 = min(first_block + 1u, HD16 - 1u);
    let b2 = min(first_block + 2u, HD16 - 1u);
    let b3 = min(first_block + 3u, HD16 - 1u);
    let stage = subgroup * BLOCK;
    let p_at = subgroup * 16u * P_STRIDE;
    let row = lane_row(first_row, rg, sub_lane, kv_group);

    load_queries(first_row, kv_group, lane);
    // Pass 1: each row's largest visible score in the split.
    var best = NEG;
    for (var tile_start = split_start; tile_start < split_end; tile_start = tile_start + BK) {
        load_tile(tile_start, hi, kv_group, lane, false);
        workgroupBarrier();
        for (var slice = 0u; slice < BK / 16u; slice = slice + 1u) {
            stage_scores(rg, slice, stage);
            for (var c = 0u; c < 8u; c = c + 1u) {
                best = max(best, masked_score(row, stage, sub_lane, c, tile_start + slice * 16u));
            }
            workgroupBarrier();
        }
    }
    best = max(best, subgroupShuffleXor(best, 1u));

    // Pass 2: P = exp(S - best), its row sums, and O += P V.
    var sum = 0.0;
    var o0 = coop_mat16x16<f32, C>();
    var o1 = coop_mat16x16<f32, C>();
    var o2 = coop_mat16x16<f32, C>();
    var o3 = coop_mat16x16<f32, C>();
    for (var tile_start = split_start; tile_start < split_end; tile_start = tile_start + BK) {
        load_tile(tile_start, hi, kv_group, lane, true);
        workgroupBarrier();
        for (var slice = 0u; slice < BK / 16u; slice = slice + 1u) {
            stage_scores(rg, slice, stage);
            for (var c = 0u; c < 8u; c = c + 1u) {
                let score = masked_score(row, stage, sub_lane, c, tile_start + slice * 16u);
                let p = f16(select(exp(score - best), 0.0, score == NEG));
                sum = sum + f32(p);
                p_stage[p_at + (sub_lane / 2u) * P_STRIDE + (sub_lane % 2u) * 8u + c] = p;
            }
            workgroupBarrier();
            let p = coopLoadT<coop_mat16x16<f16, A>>(&p_stage[p_at], P_STRIDE);
            let v_at = slice * 16u * STRIDE;
            o0 = coopMultiplyAdd(p, coopLoadT<coop_mat16x16<f16, B>>(&v_tile[v_at + b0 * 16u], STRIDE), o0);
            o1 = coopMultiplyAdd(p, coopLoadT<coop_mat16x16<f16, B>>(&v_tile[v_at + b1 * 16u], STRIDE), o1);
            o2 = coopMultiplyAdd(p, coopLoadT<coop_mat16x16<f16, B>>(&v_tile[v_at + b2 * 16u], STRIDE), o2);
            o3 = coopMultiplyAdd(p, coopLoadT<coop_mat16x16<f16, B>>(&v_tile[v_at + b3 * 16u], STRIDE), o3);
        }
        workgroupBarrier();
    }
    sum = sum + subgroupShuffleXor(sum, 1u);

    write_block(o0, b0, first_block < HD16, row, stage, sub_lane, sum, split);
    write_block(o1, b1, first_block + 1u < HD16, row, stage, sub_lane, sum, split);
    write_block(o2, b2, first_block + 2u < HD16, row, stage, sub_lane, sum, split);
    write_block(o3, b3, first_block + 3u < HD16, row, stage, sub_lane, sum, split);
    if (params.splits > 1u && row.live && first_block == 0u && sub_lane % 2u == 0u) {
        let slot = (row.token * params.heads + row.head) * params.splits + split;
        partial_stats[slot] = vec2<f32>(best, sum);
    }
}
