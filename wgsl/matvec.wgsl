// Matrix-vector product for one token: out[first_row + r] = dot(W[r, :], x).
//
// A workgroup owns ROWS rows; the TPR = WG / ROWS threads of a row take its 32-value units in
// turn (thread t: units t, t + TPR, ...), so neighbouring threads read neighbouring bytes.
// Each thread keeps one partial sum; a row's partials are added once at the end, with a
// single barrier for the whole workgroup (CPU adapters pay dearly for each barrier).

struct Params {
    rows: u32,
    first_row: u32,
    row_bytes: u32,
    blocks_per_row: u32,
    groups_x: u32,
    cols: u32,
    tokens: u32,
    out_stride: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> weights: array<u32>;
@group(0) @binding(2) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

const TPR: u32 = WG / ROWS;

var<workgroup> partials: array<f32, WG>;

fn matvec_row(group: vec3<u32>, lane: u32) -> u32 {
    return (group.x + group.y * params.groups_x) * ROWS + lane / TPR;
}

// This thread's share of dot(W[row, :], x).
fn row_partial(row: u32, thread: u32) -> f32 {
    if (row >= params.rows) {
        return 0.0;
    }
    let units = params.blocks_per_row * UNITS;
    let row_start = row * params.row_bytes;
    var acc = vec4<f32>(0.0);
    for (var unit = thread; unit < units; unit = unit + TPR) {
        let block = unit / UNITS;
        let u = unit % UNITS;
        let values = dequant_unit(row_start + block * BLOCK_BYTES, u);
        let x_block = block * (BLOCK / 4u);
        for (var i = 0u; i < 8u; i = i + 1u) {
            acc = fma(values[i], x[x_block + block_element(u, i) / 4u], acc);
        }
    }
    return (acc.x + acc.y) + (acc.z + acc.w);
}

@compute @workgroup_size(WG)
fn matvec(@builtin(workgroup_id) group: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    let row = matvec_row(group, lane);
    partials[lane] = row_partial(row, lane % TPR);
    workgroupBarrier();
    if (lane % TPR == 0u && row < params.rows) {
        var total = 0.0;
        for (var i = 0u; i < TPR; i = i + 1u) {
            total = total + partials[lane + i];
        }
        out[params.first_row + row] = total;
    }
}
