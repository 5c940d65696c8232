// Matrix-matrix product for prefill: out[t, first_row + r] = dot(W[r, :], x[t, :]).
//
// A workgroup computes a tile of TT tokens x TR rows. K is walked in steps of BK = 128
// elements (a whole number of units for every type: K-quant units span 64 or 128 elements).
// Each step dequantizes the tile's TR x BK weights into workgroup memory once, every unit by
// one thread, then each thread multiplies RPT rows by TPT tokens from it. Two barriers per
// step; activations are read straight from storage (they are few and cached).

struct Params {
    rows: u32,
    first_row: u32,
    row_bytes: u32,
    blocks_per_row: u32,
    groups_x: u32,
    cols: u32,
    tokens: u32,
    out_stride: u32,
    // The part buffer's row holding row first_row.
    buffer_row: u32,
    pad0: u32,
    pad1: u32,
    pad2: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> weights: array<u32>;
@group(0) @binding(2) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
@group(0) @binding(4) var<storage, read> weights4: array<vec4<u32>>;

const BK: u32 = 128u;
const BK4: u32 = BK / 4u;
const UNITS_PER_STEP: u32 = BK / 32u;
const ROW_THREADS: u32 = TR / RPT;

var<workgroup> tile: array<vec4<f32>, TR * BK4>;

// Stores a unit's values at their places in a tile row starting at vec4 `base` (written out:
// CPU compilers keep constant-indexed arrays in registers).
fn store_unit(base: u32, u: u32, values: Unit) {
    tile[base + block_element(u, 0u) / 4u] = values[0];
    tile[base + block_element(u, 1u) / 4u] = values[1];
    tile[base + block_element(u, 2u) / 4u] = values[2];
    tile[base + block_element(u, 3u) / 4u] = values[3];
    tile[base + block_element(u, 4u) / 4u] = values[4];
    tile[base + block_element(u, 5u) / 4u] = values[5];
    tile[base + block_element(u, 6u) / 4u] = values[6];
    tile[base + block_element(u, 7u) / 4u] = values[7];
}

// Dequantizes rows first_tile_row .. + TR, elements k0 .. k0 + BK into `tile`.
fn load_tile(first_tile_row: u32, k0: u32, lane: u32) {
    for (var slot = lane; slot < TR * UNITS_PER_STEP; slot = slot + WG) {
        let tile_row = slot / UNITS_PER_STEP;
        let row = first_tile_row + tile_row;
        let unit = k0 / 32u + slot % UNITS_PER_STEP;
        let block = unit / UNITS;
        if (row < params.rows && block < params.blocks_per_row) {
            let u = unit % UNITS;
            // May wrap below zero for a block that starts before k0; its unit's elements
            // bring it back in range (u32 arithmetic is modular and every term is a multiple of 4).
            let base = tile_row * BK4 + block * (BLOCK / 4u) - k0 / 4u;
            store_unit(base, u, dequant_unit((params.buffer_row + row) * params.row_bytes + block * BLOCK_BYTES, u));
        }
    }
}

@compute @workgroup_size(WG)
fn matmul(@builtin(workgroup_id) group: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    let first_tile_row = (group.x + group.y * params.groups_x) * TR;
    let first_token = group.z * TT;
    let row_thread = lane % ROW_THREADS;
    let token_thread = lane / ROW_THREADS;
    let cols4 = params.cols / 4u;
    var token_base: array<u32, TPT>;
    for (var t = 0u; t < TPT; t = t + 1u) {
        let token = min(first_token + token_thread + t * (TT / TPT), params.tokens - 1u);
        token_base[t] = token * cols4;
    }
    var acc: array<vec4<f32>, RPT * TPT>;
    for (var k0 = 0u; k0 < params.cols; k0 = k0 + BK) {
        load_tile(first_tile_row, k0, lane);
        workgroupBarrier();
        let steps = min(BK, params.cols - k0) / 4u;
        for (var k = 0u; k < steps; k = k + 1u) {
            var w: array<vec4<f32>, RPT>;
            for (var r = 0u; r < RPT; r = r + 1u) {
                w[r] = tile[(row_thread + r * ROW_THREADS) * BK4 + k];
            }
            for (var t = 0u; t < TPT; t = t + 1u) {
                let activations = x[token_base[t] + k0 / 4u + k];
                for (var r = 0u; r < RPT; r = r + 1u) {
                    acc[r * TPT + t] = fma(w[r], activations, acc[r * TPT + t]);
                }
            }
        }
        workgroupBarrier();
    }
    for (var r = 0u; r < RPT; r = r + 1u) {
        let row = first_tile_row + row_thread + r * ROW_THREADS;
        for (var t = 0u; t < TPT; t = t + 1u) {
            let token = first_token + token_thread + t * (TT / TPT);
            if (row < params.rows && token < params.tokens) {
                let sum = acc[r * TPT + t];
                out[token * params.out_stride + params.first_row + row] = (sum.x + sum.y) + (sum.z + sum.w);
            }
        }
    }
}
