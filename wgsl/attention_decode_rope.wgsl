// Decode attention with the step's q/k/v epilogue fused in, sparing rope_store's dispatch and
// the barrier between it and attention: one token, or a batched step's rows of distinct
// sequences. Each workgroup RMS-normalises (Gemma 3's per-head norms, when `norm` = 1) and
// rotates its own query head into q_row; the workgroups of the last split, whose share ends at
// the position being decoded, also normalise and rotate their kv head's new key and attend to
// it and its value from workgroup memory (fresh_k, fresh_v), since nothing orders them after
// the cache write. The first query head of each kv group writes that key and value into the
// cache for the steps after this one. The arithmetic is rope_store's, in the same order, so
// both give the same values. q, k and v are sections of one buffer (the step's packed q/k/v)
// at element offsets, row r's heads after row r - 1's in each. Where the rows of the cache lie
// and the entry point come after this file: attention_decode_rope_slots.wgsl (one sequence's
// contiguous cache), attention_decode_rope_pages.wgsl (a seat of a paged pool, a serving
// sequence alone in its step: position p in page pages[p / PAGE], for the write as for every
// key read), which alone with the rows entry declares a ninth binding, so the contiguous
// kernel fits WebGPU's default of 8 storage bindings, or attention_decode_rope_rows.wgsl (a
// batched step's rows, each in its own slot or seat of one pool: rope_store_rows's work too).
// The work is attention_decode_core.wgsl's `attend`.
//
// HOST_THETAS = 1 (one token): `thetas` holds the angles; 0 (rows, each at its own position):
// each lane builds its pair's angle (`pair_theta`, the same products, so the same bits).

struct Params {
    kv_heads: u32,
    heads: u32,
    start_pos: u32,
    tokens: u32,
    window: u32,
    splits: u32,
    scale: f32,
    softcap: f32,
    rope_dims: u32,
    neox: u32,
    freq_scale: f32,
    norm: u32,
    eps: f32,
    q_offset: u32,
    k_offset: u32,
    v_offset: u32,
    // base^(-2 / rope_dims), for the angles built here (HOST_THETAS = 0).
    theta_scale: f32,
    pad1: u32,
    pad2: u32,
    pad3: u32,
    // Pair p's theta at this position, pos * theta_scale^p as ggml builds it (repeated f32
    // products), from the host: the chain of up to 127 dependent products per lane cost Gemma
    // 3's decode attention ~2.5 µs a dispatch on the H200, and an unrolled chain was
    // reassociated by its compiler (docs/perf.md, session 24). PAIRS4 = ceil(pairs / 4) (1,
    // unread, with HOST_THETAS = 0).
    thetas: array<vec4<f32>, PAIRS4>,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> qkv: array<f32>;
@group(0) @binding(2) var<storage, read_write> k_cache: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> v_cache: array<vec4<f32>>;
@group(0) @binding(7) var<storage, read> q_norm: array<f32>;
@group(0) @binding(8) var<storage, read> k_norm: array<f32>;

// rope.wgsl's: its lanes' strided partials, whatever this workgroup's width, so that a head
// normalised here and by rope_store_rows (the batched step) has the same bits. The lanes past
// NORM_LANES add zeros, which the reductions keep exact.
const NORM_LANES: u32 = 64u;
const_assert WG >= NORM_LANES;

// The RMS scale of the head row at element `base`; every lane of the workgroup must call it.
fn row_scale(base: u32, lane: u32) -> f32 {
    if (params.norm == 0u) {
        return 1.0;
    }
    var squares = 0.0;
    for (var d = lane; d < HD && lane < NORM_LANES; d = d + NORM_LANES) {
        let value = qkv[base + d];
        squares = squares + value * value;
    }
    let total = reduce_sum(squares, lane);
    return 1.0 / sqrt(total / f32(HD) + params.eps);
}

// Normalised and rotated q and k of the new token, before they are packed into vec4s.
var<workgroup> rotated_q: array<f32, HD>;
var<workgroup> rotated_k: array<f32, HD>;

// Value d of the head row at `base`, normalised when asked.
fn normed(base: u32, d: u32, scale: f32, is_q: bool) -> f32 {
    if (params.norm == 1u) {
        return (qkv[base + d] * scale) * select(k_norm[d], q_norm[d], is_q);
    }
    return qkv[base + d];
}

// Dims `dims` of the head row at `base`, normalised.
fn normed_pair(base: u32, dims: vec2<u32>, scale: f32, is_q: bool) -> vec2<f32> {
    return vec2<f32>(normed(base, dims.x, scale, is_q), normed(base, dims.y, scale, is_q));
}

// Dims past rope_dims keep their values exactly.
fn turned_if(x: vec2<f32>, turn: vec2<f32>, rotate: bool) -> vec2<f32> {
    if (rotate) {
        return turned(x, turn);
    }
    return x;
}

// The (cos, sin) of `pair`'s angle at `pos`.
fn pair_angle(pos: u32, pair: u32) -> vec2<f32> {
    if (HOST_THETAS == 1u) {
        let theta = params.thetas[pair / 4u][pair % 4u];
        return angle_turn(params.freq_scale * theta, 1.0);
    }
    return pair_turn(pos, pair, params.theta_scale, params.freq_scale, 1.0, 1.0);
}

// Row `row` of the step at position `pos`, whose cache rows are in `region` (`cache_row`):
// query head `head` normalised and rotated, with split `split` of its keys, the new key among
// them in the last split. Uniform control flow.
fn rope_attend(split: u32, head: u32, row: u32, pos: u32, region: u32, lane: u32) {
    let group_size = params.heads / params.kv_heads;
    let kv_head = head / group_size;
    let q_base = params.q_offset + (row * params.heads + head) * HD;
    let kv_row = (row * params.kv_heads + kv_head) * HD;
    let k_base = params.k_offset + kv_row;
    let v_base = params.v_offset + kv_row;

    // Uniform per workgroup, so row_scale's barriers are reached by every lane or none.
    let fresh = split == params.splits - 1u;
    let q_scale = row_scale(q_base, lane);
    var k_scale = 1.0;
    if (fresh) {
        k_scale = row_scale(k_base, lane);
    }
    // Lane p turns pair p of q and of k by the same angle.
    let pairs = params.rope_dims / 2u;
    for (var pair = lane; pair < HD / 2u; pair = pair + WG) {
        let dims = pair_slots(pair, params.rope_dims, params.neox != 0u);
        let rotate = pair < pairs;
        var turn = vec2<f32>(1.0, 0.0);
        if (rotate) {
            turn = pair_angle(pos, pair);
        }
        let q = turned_if(normed_pair(q_base, dims, q_scale, true), turn, rotate);
        rotated_q[dims.x] = q.x;
        rotated_q[dims.y] = q.y;
        if (fresh) {
            let k = turned_if(normed_pair(k_base, dims, k_scale, false), turn, rotate);
            rotated_k[dims.x] = k.x;
            rotated_k[dims.y] = k.y;
        }
    }
    workgroupBarrier();

    let at = cache_row(region, pos) + kv_head * HD4;
    for (var i = lane; i < HD4; i = i + WG) {
        let d = 4u * i;
        let q = vec4<f32>(rotated_q[d], rotated_q[d + 1u], rotated_q[d + 2u], rotated_q[d + 3u]);
        q_row[i] = q * params.scale;
        if (fresh) {
            let k = vec4<f32>(rotated_k[d], rotated_k[d + 1u], rotated_k[d + 2u], rotated_k[d + 3u]);
            let v = vec4<f32>(qkv[v_base + d], qkv[v_base + d + 1u], qkv[v_base + d + 2u],
                              qkv[v_base + d + 3u]);
            fresh_k[i] = k;
            fresh_v[i] = v;
            if (head % group_size == 0u) {
                k_cache[at + i] = k;
                v_cache[at + i] = v;
            }
        }
    }
    workgroupBarrier();
    attend(split, head, row, pos, region, lane, fresh);
}
