// x ([tokens, cols] f32) to the 8-bit activations of matvec_int8.wgsl, one workgroup a token:
// per block of 32 values, d = max|v| / 127 and q = round(v / d); per 8 values (a quarter) one
// vec4<u32> of the quarter's q as signed bytes (xy), d (z) and d * sum(q) (w). With NORM = 1
// the values are rms_norm(x) * norm_w first, as rms_norm computes them (the norm that a
// product's input takes, done here once for all of its rows instead of in every product).

struct Params {
    cols: u32,
    eps: f32,
    tokens: u32,
    groups_x: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> norm_w: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> xq: array<vec4<u32>>;

const_assert WG > 0u;

// 1 / rms of the token's row at vec4 `base` (every lane calls it: uniform control flow).
fn norm_factor(base: u32, lane: u32) -> f32 {
    var squares = 0.0;
    for (var i = lane; i < params.cols / 4u; i = i + WG) {
        let v = x[base + i];
        squares = squares + dot(v, v);
    }
    let total = reduce_sum(squares, lane);
    return 1.0 / sqrt(total / f32(params.cols) + params.eps);
}

fn value(base: u32, i: u32, factor: f32) -> vec4<f32> {
    if (NORM == 1u) {
        return (x[base + i] * factor) * norm_w[i];
    }
    return x[base + i];
}

fn max4(v: vec4<f32>) -> f32 {
    let a = abs(v);
    return max(max(a.x, a.y), max(a.z, a.w));
}

fn quarter(a: vec4<f32>, b: vec4<f32>, inverse: f32, d: f32) -> vec4<u32> {
    let qa = vec4<i32>(round(a * inverse));
    let qb = vec4<i32>(round(b * inverse));
    let sum = qa + qb;
    return vec4<u32>(pack4xI8(qa), pack4xI8(qb), bitcast<u32>(d),
                     bitcast<u32>(d * f32((sum.x + sum.y) + (sum.z + sum.w))));
}

@compute @workgroup_size(WG)
fn quantize_int8(@builtin(workgroup_id) group: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    let token = group.x + group.y * params.groups_x;
    if (token >= params.tokens) {
        return;
    }
    let base = token * (params.cols / 4u);
    var factor = 1.0;
    if (NORM == 1u) {
        factor = norm_factor(base, lane);
    }
    for (var block = lane; block < params.cols / 32u; block = block + WG) {
        let at = 8u * block;
        let v0 = value(base, at, factor);
        let v1 = value(base, at + 1u, factor);
        let v2 = value(base, at + 2u, factor);
        let v3 = value(base, at + 3u, factor);
        let v4 = value(base, at + 4u, factor);
        let v5 = value(base, at + 5u, factor);
        let v6 = value(base, at + 6u, factor);
        let v7 = value(base, at + 7u, factor);
        let largest = max(max(max(max4(v0), max4(v1)), max(max4(v2), max4(v3))),
                          max(max(max4(v4), max4(v5)), max(max4(v6), max4(v7))));
        let d = largest / 127.0;
        let inverse = select(0.0, 127.0 / largest, largest > 0.0);
        let out = token * (params.cols / 8u) + 4u * block;
        xq[out] = quarter(v0, v1, inverse, d);
        xq[out + 1u] = quarter(v2, v3, inverse, d);
        xq[out + 2u] = quarter(v4, v5, inverse, d);
        xq[out + 3u] = quarter(v6, v7, inverse, d);
    }
}
