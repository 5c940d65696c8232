// Embedding gather: out[t, :] = dequant(table row ids[t]) * scale, for the tokens whose id
// falls in this part's rows (a split table runs one dispatch per part). Each thread
// dequantizes one 32-value unit; workgroups along x cover a row, along y the tokens.

struct Params {
    rows: u32,
    first_row: u32,
    row_bytes: u32,
    blocks_per_row: u32,
    cols: u32,
    scale: f32,
    first_token: u32,
    // The part buffer's row holding row first_row.
    buffer_row: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> weights: array<u32>;
@group(0) @binding(2) var<storage, read> ids: array<u32>;
@group(0) @binding(3) var<storage, read_write> out: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read> weights4: array<vec4<u32>>;

@compute @workgroup_size(WG)
fn embed(@builtin(workgroup_id) group: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    let token = params.first_token + group.y;
    let unit = group.x * WG + lane;
    let id = ids[token];
    if (id < params.first_row || id - params.first_row >= params.rows || unit >= params.blocks_per_row * UNITS) {
        return;
    }
    let block = unit / UNITS;
    let u = unit % UNITS;
    let values = dequant_unit((params.buffer_row + id - params.first_row) * params.row_bytes + block * BLOCK_BYTES, u);
    let out_base = (token * params.cols + block * BLOCK) / 4u;
    for (var i = 0u; i < 8u; i = i + 1u) {
        out[out_base + block_element(u, i) / 4u] = values[i] * params.scale;
    }
}
