// x ([tokens, cols] f32) to the 8-bit activations of matvec_int8.wgsl, one workgroup a token:
// per 8 values (a quarter) one vec4<u32> of q = round(v / d) as signed bytes (xy), the
// quarter's scale d = max|v| / 127 (z) and d * sum(q) (w). With NORM = 1
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

// Eight values as a quarter: their own scale d = max|v| / 127 (one outlier coarsens only its
// own quarter), q = round(v / d) as signed bytes, and d * sum(q).
fn quarter(a: vec4<f32>, b: vec4<f32>) -> vec4<u32> {
    let largest = max(max4(a), max4(b));
    let d = largest / 127.0;
    let inverse = select(0.0, 127.0 / largest, largest > 0.0);
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
    for (var q = lane; q < params.cols / 8u; q = q + WG) {
        let at = 2u * q;
        xq[token * (params.cols / 8u) + q] = quarter(value(base, at, factor), value(base, at + 1u, factor));
    }
}
