// Row-wise softmax in place: one workgroup per row, three sweeps (max, sum, scale).

struct Params {
    rows: u32,
    cols: u32,
    // Workgroups along x; rows beyond the per-dimension limit continue along y.
    groups_x: u32,
    pad0: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) group: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    // `row` is the same for the whole workgroup, so the early return keeps barriers uniform.
    let row = group.y * params.groups_x + group.x;
    if (row >= params.rows) {
        return;
    }
    let base = row * params.cols;
    var local_max = -3.4028234e38;
    for (var c = lane; c < params.cols; c = c + WG) {
        local_max = max(local_max, x[base + c]);
    }
    let row_max = reduce_max(local_max, lane);
    var local_sum = 0.0;
    for (var c = lane; c < params.cols; c = c + WG) {
        local_sum = local_sum + exp(x[base + c] - row_max);
    }
    let inverse = 1.0 / reduce_sum(local_sum, lane);
    for (var c = lane; c < params.cols; c = c + WG) {
        x[base + c] = exp(x[base + c] - row_max) * inverse;
    }
}
