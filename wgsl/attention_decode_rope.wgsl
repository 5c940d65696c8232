// Decode attention for one token with the step's q/k/v epilogue fused in, sparing rope_store's
// dispatch and the barrier between it and attention. Each workgroup RMS-normalises (Gemma 3's
// per-head norms, when `norm` = 1) and rotates its own query head into q_row; the workgroups of
// the last split, whose share ends at the position being decoded, also normalise and rotate
// their kv head's new key and attend to it and its value from workgroup memory (fresh_k,
// fresh_v), since nothing orders them after the cache write. The first query head of each kv
// group writes that key and value into the cache for the steps after this one. The arithmetic
// is rope_store's, in the same order, so both give the same values. q, k and v are sections of
// one buffer (the decode step's packed q/k/v) at element offsets. The work is
// attention_decode_core.wgsl's `attend`.

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
    // base^(-2 / rope_dims), computed on the host with the same powf as ggml.
    theta_scale: f32,
    freq_scale: f32,
    norm: u32,
    eps: f32,
    q_offset: u32,
    k_offset: u32,
    v_offset: u32,
    pad0: u32,
    pad1: u32,
    pad2: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> qkv: array<f32>;
@group(0) @binding(2) var<storage, read_write> k_cache: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> v_cache: array<vec4<f32>>;
@group(0) @binding(7) var<storage, read> q_norm: array<f32>;
@group(0) @binding(8) var<storage, read> k_norm: array<f32>;

// The RMS scale of the head row at element `base`; every lane of the workgroup must call it.
fn row_scale(base: u32, lane: u32) -> f32 {
    if (params.norm == 0u) {
        return 1.0;
    }
    var squares = 0.0;
    for (var d = lane; d < HD; d = d + WG) {
        let value = qkv[base + d];
        squares = squares + value * value;
    }
    let total = reduce_sum(squares, lane);
    return 1.0 / sqrt(total / f32(HD) + params.eps);
}

// Value d of the head row at `base`, normalised when asked.
fn normed(base: u32, d: u32, scale: f32, is_q: bool) -> f32 {
    if (params.norm == 1u) {
        return (qkv[base + d] * scale) * select(k_norm[d], q_norm[d], is_q);
    }
    return qkv[base + d];
}

// Dims 4i .. 4i + 3 of the head row at `base`, normalised and rotated to position `pos`.
fn rotated_unit(base: u32, i: u32, scale: f32, is_q: bool, pos: u32) -> vec4<f32> {
    let pairs = params.rope_dims / 2u;
    let neox = params.neox != 0u;
    var unit: vec4<f32>;
    for (var j = 0u; j < 4u; j = j + 1u) {
        let d = 4u * i + j;
        let value = normed(base, d, scale, is_q);
        unit[j] = value;
        if (d < params.rope_dims) {
            let second = select((d & 1u) == 1u, d >= pairs, neox);
            let pair = select(d / 2u, d - select(0u, pairs, second), neox);
            let dims = pair_dims(pair, pairs, neox);
            let partner = normed(base, select(dims.y, dims.x, second), scale, is_q);
            let angle = reduce_angle(pair_theta(pos, pair, params.theta_scale, params.freq_scale));
            let c = cos(angle);
            let s = sin(angle);
            unit[j] = select(value * c - partner * s, partner * s + value * c, second);
        }
    }
    return unit;
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    let split = wg.x;
    let head = wg.y;
    let group_size = params.heads / params.kv_heads;
    let kv_head = head / group_size;
    let pos = params.start_pos;

    let q_base = params.q_offset + head * HD;
    let q_scale = row_scale(q_base, lane);
    for (var i = lane; i < HD4; i = i + WG) {
        q_row[i] = rotated_unit(q_base, i, q_scale, true, pos) * params.scale;
    }
    // Uniform per workgroup, so row_scale's barriers are reached by every lane or none.
    let fresh = split == params.splits - 1u;
    if (fresh) {
        let k_base = params.k_offset + kv_head * HD;
        let v_base = params.v_offset + kv_head * HD;
        let k_scale = row_scale(k_base, lane);
        let at = (pos * params.kv_heads + kv_head) * HD4;
        for (var i = lane; i < HD4; i = i + WG) {
            let k = rotated_unit(k_base, i, k_scale, false, pos);
            let v = vec4<f32>(qkv[v_base + 4u * i], qkv[v_base + 4u * i + 1u],
                              qkv[v_base + 4u * i + 2u], qkv[v_base + 4u * i + 3u]);
            fresh_k[i] = k;
            fresh_v[i] = v;
            if (head % group_size == 0u) {
                k_cache[at + i] = k;
                v_cache[at + i] = v;
            }
        }
    }
    workgroupBarrier();
    attend(split, head, 0u, lane, fresh);
}
