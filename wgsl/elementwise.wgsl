// Element-wise kernels over flat f32 buffers. They stay f32 in every variant: each element is
// read and written once, so f16 arithmetic would only cost accuracy.
// Large buffers are dispatched as a 2-D grid of `groups_x` columns (one dimension of a dispatch
// is limited to 65535 workgroups); `element` recovers the flat index.

struct Params {
    n: u32,
    cols: u32,
    groups_x: u32,
    // gated_activation and activate only: 0 = SiLU, 1 = GELU (tanh approximation).
    act: u32,
}

@group(0) @binding(0) var<uniform> params: Params;

fn element(group: vec3<u32>, lane: u32) -> u32 {
    return (group.y * params.groups_x + group.x) * WG + lane;
}

// add: out = a + b
@group(0) @binding(1) var<storage, read> add_a: array<f32>;
@group(0) @binding(2) var<storage, read> add_b: array<f32>;
@group(0) @binding(3) var<storage, read_write> add_out: array<f32>;

@compute @workgroup_size(WG)
fn add(@builtin(workgroup_id) group: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    let i = element(group, lane);
    if (i < params.n) {
        add_out[i] = add_a[i] + add_b[i];
    }
}

// add_in_place: acc += b; add_bias: acc[r, c] += b[c] for rows of `cols`.
@group(0) @binding(1) var<storage, read_write> acc: array<f32>;
@group(0) @binding(2) var<storage, read> addend: array<f32>;

@compute @workgroup_size(WG)
fn add_in_place(@builtin(workgroup_id) group: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    let i = element(group, lane);
    if (i < params.n) {
        acc[i] = acc[i] + addend[i];
    }
}

@compute @workgroup_size(WG)
fn add_bias(@builtin(workgroup_id) group: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    let i = element(group, lane);
    if (i < params.n) {
        acc[i] = acc[i] + addend[i % params.cols];
    }
}

fn activated(x: f32) -> f32 {
    if (params.act == 0u) {
        return silu(x);
    }
    return gelu_tanh(x);
}

// activate: acc = act(acc) (BERT's feed-forward GELU).
@compute @workgroup_size(WG)
fn activate(@builtin(workgroup_id) group: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    let i = element(group, lane);
    if (i < params.n) {
        acc[i] = activated(acc[i]);
    }
}

// gated_activation: out = act(gate) * up.
@group(0) @binding(1) var<storage, read> gate: array<f32>;
@group(0) @binding(2) var<storage, read> up: array<f32>;
@group(0) @binding(3) var<storage, read_write> gated_out: array<f32>;

@compute @workgroup_size(WG)
fn gated_activation(@builtin(workgroup_id) group: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    let i = element(group, lane);
    if (i < params.n) {
        gated_out[i] = activated(gate[i]) * up[i];
    }
}

// sum_slices: out[i] = the sum over s < cols of parts[s * n + i], in order of s (the slices of a
// product split along K).
@group(0) @binding(1) var<storage, read> slices: array<f32>;
@group(0) @binding(2) var<storage, read_write> slice_sum: array<f32>;

@compute @workgroup_size(WG)
fn sum_slices(@builtin(workgroup_id) group: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    let i = element(group, lane);
    if (i < params.n) {
        var total = slices[i];
        for (var s = 1u; s < params.cols; s = s + 1u) {
            total = total + slices[s * params.n + i];
        }
        slice_sum[i] = total;
    }
}
