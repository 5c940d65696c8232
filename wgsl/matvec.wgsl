// Matrix-vector product: out[out_offset + first_row + r] = dot(W[r, :], x), W's row r at row
// buffer_row + r of the bound part (a part may hold several matrices' rows). Workgroup z is
// the token: a dispatch of several z does one product per row of x ([tokens, cols], row z at
// vec4 z * x_stride) into out's row z (at z * out_stride, aux likewise), which a GPU runs far
// wider than the tiled product for the few rows of a batched decode step; its extra weight
// reads stay in cache.
//
// Each thread accumulates RPT consecutive rows at once, so every activation it loads serves
// RPT rows (on CPU adapters every storage load is a per-lane scalar loop, and activation
// loads would otherwise outnumber weight loads several times). TPR threads share a group of
// rows along K, taking its 32-value units in turn (thread t: units t, t + TPR, ...), so
// neighbouring threads read neighbouring bytes. A workgroup holds WG / TPR such groups, and
// the partial sums meet once at the end: one barrier per workgroup, or none with subgroups.
//
// Fusions, chosen by constants, spare a decode step whole dispatches:
// - NORM = 1: x is RMS-normalised on the fly, as rms_norm computes it. Since 1 / rms(x) is one
//   factor of the whole row, W · ((x / rms(x)) * norm_w) = (W · (x * norm_w)) / rms(x): the
//   threads sum x's squares from the same loads as the dot products and the factor is applied
//   at the end, so the weight loads never wait on a reduction (a row group's threads together
//   read all of x once).
// - EPILOGUE: 0 stores the dot product; 1 adds aux[row] (a bias); 2 adds it to out[row] (the
//   residual stream); 3 and 4 store silu(aux[row]) or gelu(aux[row]) times it (aux holds the
//   gate projection, this matrix is the up projection); 5 and 6 (GLU, HALVES = 2) also take
//   the dot product with row up_buffer_row + r of the same part (the up projection) and store
//   silu(dot) or gelu(dot) times that. aux is indexed like out.
// Each thread keeps SLOTS = RPT * HALVES sums: its rows' dot products, then (GLU) their up
// rows'. The thread that writes a row holds both of its sums.

struct Params {
    rows: u32,
    first_row: u32,
    row_bytes: u32,
    blocks_per_row: u32,
    groups_x: u32,
    cols: u32,
    eps: f32,
    buffer_row: u32,
    up_buffer_row: u32,
    out_offset: u32,
    x_stride: u32,
    out_stride: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> weights: array<u32>;
@group(0) @binding(2) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
@group(0) @binding(4) var<storage, read> weights4: array<vec4<u32>>;
@group(0) @binding(5) var<storage, read> aux: array<f32>;
@group(0) @binding(6) var<storage, read> norm_w: array<vec4<f32>>;

const ROW_GROUPS: u32 = WG / TPR;
const SLOTS: u32 = RPT * HALVES;
// The thread's sums: SLOTS dot products, then (NORM) the sum of the squares of x it read.
const SUMS: u32 = SLOTS + NORM;

var<workgroup> partials: array<f32, WG * SUMS>;
var<private> squares: f32;
// Where this workgroup's token starts in x (vec4s) and in out and aux (values).
var<private> x_base: u32;
var<private> out_base: u32;

fn enter_token(token: u32) {
    x_base = token * params.x_stride;
    out_base = token * params.out_stride;
}

fn activation(i: u32) -> vec4<f32> {
    let v = x[x_base + i];
    if (NORM == 1u) {
        squares = squares + dot(v, v);
        return v * norm_w[i];
    }
    return v;
}

// The factor that completes the fused norm, from the sum of all of x's squares.
fn norm_factor(total_squares: f32) -> f32 {
    if (NORM == 0u) {
        return 1.0;
    }
    return 1.0 / sqrt(total_squares / f32(params.cols) + params.eps);
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

// This thread's shares of dot(W[first + r, :], x) for r < RPT, then (GLU) of the up rows',
// then (NORM) of x's squares. Rows past the part repeat its last row (keeping control flow
// uniform); their sums are never written.
fn thread_partials(first: u32, thread: u32) -> array<f32, SUMS> {
    var row_start: array<u32, SLOTS>;
    for (var s = 0u; s < SLOTS; s = s + 1u) {
        let base = select(params.buffer_row, params.up_buffer_row, s >= RPT);
        row_start[s] = (base + min(first + s % RPT, params.rows - 1u)) * params.row_bytes;
    }
    var acc: array<vec4<f32>, SLOTS>;
    let units = params.blocks_per_row * UNITS;
    for (var unit = thread; unit < units; unit = unit + TPR) {
        let block = unit / UNITS;
        let u = unit % UNITS;
        let x_block = block * (BLOCK / 4u);
        let activations = unit_activations(x_block, u);
        for (var s = 0u; s < SLOTS; s = s + 1u) {
            acc[s] = acc[s] + unit_dot(dequant_unit(row_start[s] + block * BLOCK_BYTES, u), activations);
        }
    }
    var sums: array<f32, SUMS>;
    for (var s = 0u; s < SLOTS; s = s + 1u) {
        sums[s] = (acc[s].x + acc[s].y) + (acc[s].z + acc[s].w);
    }
    if (NORM == 1u) {
        // SUMS - 1 is SLOTS here; naga rejects a constant index past the end even in a dead branch.
        sums[SUMS - 1u] = squares;
    }
    return sums;
}

// Writes row `row` from its dot product and (GLU) its up row's, both still to be multiplied by
// `factor` (the fused norm's).
fn write_row(row: u32, dot_sum: f32, up_sum: f32, factor: f32) {
    if (row >= params.rows) {
        return;
    }
    let value = dot_sum * factor;
    let up = up_sum * factor;
    let i = out_base + params.out_offset + params.first_row + row;
    switch EPILOGUE {
        case 1u: { out[i] = value + aux[i]; }
        case 2u: { out[i] = out[i] + value; }
        case 3u: { out[i] = silu(aux[i]) * value; }
        case 4u: { out[i] = gelu_tanh(aux[i]) * value; }
        case 5u: { out[i] = silu(value) * up; }
        case 6u: { out[i] = gelu_tanh(value) * up; }
        default: { out[i] = value; }
    }
}

// The slot of row r's up sum (r's own slot without GLU).
fn up_slot(r: u32) -> u32 {
    return (HALVES - 1u) * RPT + r;
}

@compute @workgroup_size(WG)
fn matvec(@builtin(workgroup_id) group: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    enter_token(group.z);
    let first = first_thread_row(group, lane);
    let thread = lane % TPR;
    let sums = thread_partials(first, thread);
    if (TPR == 1u) {
        let factor = norm_factor(sums[SUMS - 1u]);
        for (var r = 0u; r < RPT; r = r + 1u) {
            write_row(first + r, sums[r], sums[up_slot(r)], factor);
        }
        return;
    }
    for (var s = 0u; s < SUMS; s = s + 1u) {
        partials[lane * SUMS + s] = sums[s];
    }
    workgroupBarrier();
    // Thread t of a group adds up rows t, t + TPR, ... of it, every sum of each.
    let group_lane = lane - thread;
    for (var r = thread; r < RPT; r = r + TPR) {
        var total = 0.0;
        var up = 0.0;
        var total_squares = 0.0;
        for (var j = 0u; j < TPR; j = j + 1u) {
            let at = (group_lane + j) * SUMS;
            total = total + partials[at + r];
            if (HALVES == 2u) {
                up = up + partials[at + up_slot(r)];
            }
            if (NORM == 1u) {
                total_squares = total_squares + partials[at + SUMS - 1u];
            }
        }
        write_row(first + r, total, up, norm_factor(total_squares));
    }
}
