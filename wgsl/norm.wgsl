// RMSNorm, one workgroup per row: out = x / sqrt(mean(x^2) + eps) * weight.
// LayerNorm (layer_norm), the same way: out = (x - mean) / sqrt(var + eps) * weight + bias.
// f32 in every variant: the sum of squares needs the range and the precision.
// The weight multiplies the normalised value last, in ggml's order (rms_norm, then mul).
// ADD = 1 adds the result to out instead of storing it (a post-norm joining the residual).

struct Params {
    rows: u32,
    cols: u32,
    eps: f32,
    groups_x: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> weight: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(WG)
fn rms_norm(@builtin(workgroup_id) group: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    // Uniform per workgroup, so every lane reaches the reduction below or none does.
    let row = group.y * params.groups_x + group.x;
    if (row >= params.rows) {
        return;
    }
    let start = row * params.cols;
    var squares = 0.0;
    for (var c = lane; c < params.cols; c = c + WG) {
        let value = x[start + c];
        squares = squares + value * value;
    }
    let total = reduce_sum(squares, lane);
    let scale = 1.0 / sqrt(total / f32(params.cols) + params.eps);
    for (var c = lane; c < params.cols; c = c + WG) {
        let value = (x[start + c] * scale) * weight[c];
        if (ADD == 1u) {
            out[start + c] = out[start + c] + value;
        } else {
            out[start + c] = value;
        }
    }
}

// layer_norm: BERT's norms, with ggml's order: centre, scale by the variance of the centred
// values (two passes, so a large mean costs no precision), then mul and add.
@group(0) @binding(3) var<storage, read> bias: array<f32>;
@group(0) @binding(4) var<storage, read_write> ln_out: array<f32>;

@compute @workgroup_size(WG)
fn layer_norm(@builtin(workgroup_id) group: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    let row = group.y * params.groups_x + group.x;
    if (row >= params.rows) {
        return;
    }
    let start = row * params.cols;
    let n = f32(params.cols);
    var sum = 0.0;
    for (var c = lane; c < params.cols; c = c + WG) {
        sum = sum + x[start + c];
    }
    let mean = reduce_sum(sum, lane) / n;
    var squares = 0.0;
    for (var c = lane; c < params.cols; c = c + WG) {
        let centred = x[start + c] - mean;
        squares = squares + centred * centred;
    }
    let scale = 1.0 / sqrt(reduce_sum(squares, lane) / n + params.eps);
    for (var c = lane; c < params.cols; c = c + WG) {
        ln_out[start + c] = ((x[start + c] - mean) * scale) * weight[c] + bias[c];
    }
}
