// Matrix-vector product for one token: out[first_row + r] = dot(W[r, :], x).
//
// Each thread accumulates RPT consecutive rows at once, so every activation it loads serves
// RPT rows (on CPU adapters every storage load is a per-lane scalar loop, and activation
// loads would otherwise outnumber weight loads several times). TPR threads share a group of
// rows along K, taking its 32-value units in turn (thread t: units t, t + TPR, ...), so
// neighbouring threads read neighbouring bytes. A workgroup holds WG / TPR such groups, and
// the partial sums meet once at the end: one barrier per workgroup, or none with subgroups.
//
// Fusions, chosen by constants, spare a decode step whole dispatches:
// - NORM = 1: x is RMS-normalised on the fly, (x / rms(x)) * norm_w as rms_norm computes it;
//   every workgroup sums x's squares itself (x is one short row, read from cache).
// - EPILOGUE: 0 stores the dot product; 1 adds aux[row] (a bias); 2 adds it to out[row] (the
//   residual stream); 3 and 4 store silu(aux[row]) or gelu(aux[row]) times it (aux holds the
//   gate projection, this matrix is the up projection).

struct Params {
    rows: u32,
    first_row: u32,
    row_bytes: u32,
    blocks_per_row: u32,
    groups_x: u32,
    cols: u32,
    eps: f32,
    pad: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> weights: array<u32>;
@group(0) @binding(2) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
@group(0) @binding(4) var<storage, read> weights4: array<vec4<u32>>;
@group(0) @binding(5) var<storage, read> aux: array<f32>;
@group(0) @binding(6) var<storage, read> norm_w: array<vec4<f32>>;

const ROW_GROUPS: u32 = WG / TPR;

var<workgroup> partials: array<f32, WG * RPT>;
var<private> norm_scale: f32;

// Sets norm_scale for NORM = 1. Every lane of the workgroup must call it.
fn prepare_norm(lane: u32) {
    if (NORM == 0u) {
        return;
    }
    var squares = 0.0;
    for (var i = lane; i < params.cols / 4u; i = i + WG) {
        let v = x[i];
        squares = squares + dot(v, v);
    }
    let total = reduce_sum(squares, lane);
    norm_scale = 1.0 / sqrt(total / f32(params.cols) + params.eps);
}

fn activation(i: u32) -> vec4<f32> {
    if (NORM == 1u) {
        return (x[i] * norm_scale) * norm_w[i];
    }
    return x[i];
}

// The first of the RPT rows this thread works on.
fn first_thread_row(group: vec3<u32>, lane: u32) -> u32 {
    return ((group.x + group.y * params.groups_x) * ROW_GROUPS + lane / TPR) * RPT;
}

// The activations unit `u` of the block starting at vec4 `x_block` of x multiplies.
fn unit_activations(x_block: u32, u: u32) -> Unit {
    return Unit(activation(x_block + block_element(u, 0u) / 4u),
                activation(x_block + block_element(u, 1u) / 4u),
                activation(x_block + block_element(u, 2u) / 4u),
                activation(x_block + block_element(u, 3u) / 4u),
                activation(x_block + block_element(u, 4u) / 4u),
                activation(x_block + block_element(u, 5u) / 4u),
                activation(x_block + block_element(u, 6u) / 4u),
                activation(x_block + block_element(u, 7u) / 4u));
}

// This thread's shares of dot(W[first + r, :], x) for r < RPT. Rows past the part repeat its
// last row (keeping control flow uniform); their sums are never written.
fn thread_partials(first: u32, thread: u32) -> array<f32, RPT> {
    var row_start: array<u32, RPT>;
    for (var r = 0u; r < RPT; r = r + 1u) {
        row_start[r] = min(first + r, params.rows - 1u) * params.row_bytes;
    }
    var acc: array<vec4<f32>, RPT>;
    let units = params.blocks_per_row * UNITS;
    for (var unit = thread; unit < units; unit = unit + TPR) {
        let block = unit / UNITS;
        let u = unit % UNITS;
        let x_block = block * (BLOCK / 4u);
        let activations = unit_activations(x_block, u);
        for (var r = 0u; r < RPT; r = r + 1u) {
            acc[r] = acc[r] + unit_dot(dequant_unit(row_start[r] + block * BLOCK_BYTES, u), activations);
        }
    }
    var sums: array<f32, RPT>;
    for (var r = 0u; r < RPT; r = r + 1u) {
        sums[r] = (acc[r].x + acc[r].y) + (acc[r].z + acc[r].w);
    }
    return sums;
}

fn write_row(row: u32, value: f32) {
    if (row >= params.rows) {
        return;
    }
    let i = params.first_row + row;
    switch EPILOGUE {
        case 1u: { out[i] = value + aux[i]; }
        case 2u: { out[i] = out[i] + value; }
        case 3u: { out[i] = silu(aux[i]) * value; }
        case 4u: { out[i] = gelu_tanh(aux[i]) * value; }
        default: { out[i] = value; }
    }
}

@compute @workgroup_size(WG)
fn matvec(@builtin(workgroup_id) group: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    prepare_norm(lane);
    let first = first_thread_row(group, lane);
    let thread = lane % TPR;
    let sums = thread_partials(first, thread);
    if (TPR == 1u) {
        for (var r = 0u; r < RPT; r = r + 1u) {
            write_row(first + r, sums[r]);
        }
        return;
    }
    for (var r = 0u; r < RPT; r = r + 1u) {
        partials[lane * RPT + r] = sums[r];
    }
    workgroupBarrier();
    // Thread t of a group adds up rows t, t + TPR, ... of it.
    let group_lane = lane - thread;
    for (var r = thread; r < RPT; r = r + TPR) {
        var total = 0.0;
        for (var j = 0u; j < TPR; j = j + 1u) {
            total = total + partials[(group_lane + j) * RPT + r];
        }
        write_row(first + r, total);
    }
}
