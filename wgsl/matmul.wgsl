// Matrix-matrix product for prefill: out[t, first_row + r] = dot(W[r, :], x[t, :]).
//
// A workgroup computes a tile of TT tokens x TR rows. K is walked in steps of BK = 128
// elements (a whole number of units for every type: K-quant units span 64 or 128 elements).
// Each step dequantizes the tile's TR x BK weights into workgroup memory once, every unit by
// one thread; the activations are staged there too, XK elements of TT tokens at a time. Each
// thread computes 4 rows x 4 tokens as one mat4x4 product per 4 columns: a fixed shape, so
// every operand and sum lives in registers (per-thread arrays indexed in loops may not).
// Both tiles' rows are padded by one vec4: lanes reading different rows at the same k then
// fall in different banks instead of all in one.

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
const W_STRIDE4: u32 = BK4 + 1u;
const XK4: u32 = XK / 4u;
const X_STRIDE4: u32 = XK4 + 1u;
const ROW_THREADS: u32 = TR / 4u;
const TOKEN_THREADS: u32 = TT / 4u;

var<workgroup> w_tile: array<vec4<f32>, TR * W_STRIDE4>;
var<workgroup> x_tile: array<vec4<f32>, TT * X_STRIDE4>;

// Stores a unit's values at their places in a tile row starting at vec4 `base` (written out:
// CPU compilers keep constant-indexed arrays in registers).
fn store_unit(base: u32, u: u32, values: Unit) {
    w_tile[base + block_element(u, 0u) / 4u] = values[0];
    w_tile[base + block_element(u, 1u) / 4u] = values[1];
    w_tile[base + block_element(u, 2u) / 4u] = values[2];
    w_tile[base + block_element(u, 3u) / 4u] = values[3];
    w_tile[base + block_element(u, 4u) / 4u] = values[4];
    w_tile[base + block_element(u, 5u) / 4u] = values[5];
    w_tile[base + block_element(u, 6u) / 4u] = values[6];
    w_tile[base + block_element(u, 7u) / 4u] = values[7];
}

// Dequantizes rows first_tile_row .. + TR, elements k0 .. k0 + BK into `w_tile`.
fn load_weights(first_tile_row: u32, k0: u32, lane: u32) {
    for (var slot = lane; slot < TR * UNITS_PER_STEP; slot = slot + WG) {
        let tile_row = slot / UNITS_PER_STEP;
        let row = first_tile_row + tile_row;
        let unit = k0 / 32u + slot % UNITS_PER_STEP;
        let block = unit / UNITS;
        if (row < params.rows && block < params.blocks_per_row) {
            let u = unit % UNITS;
            // May wrap below zero for a block that starts before k0; its unit's elements
            // bring it back in range (u32 arithmetic is modular and every term is a multiple of 4).
            let base = tile_row * W_STRIDE4 + block * (BLOCK / 4u) - k0 / 4u;
            store_unit(base, u, dequant_unit((params.buffer_row + row) * params.row_bytes + block * BLOCK_BYTES, u));
        }
    }
}

// Copies elements 4 * k4 .. + XK of tokens first_token .. + TT into `x_tile`; tokens past the
// end repeat the last one (their outputs are not stored).
fn load_activations(first_token: u32, k4: u32, lane: u32) {
    let cols4 = params.cols / 4u;
    for (var slot = lane; slot < TT * XK4; slot = slot + WG) {
        let tile_token = slot / XK4;
        let k = slot % XK4;
        let token = min(first_token + tile_token, params.tokens - 1u);
        if (k4 + k < cols4) {
            x_tile[tile_token * X_STRIDE4 + k] = x[token * cols4 + k4 + k];
        }
    }
}

// Stores one row's sums for tokens first_token + t * TOKEN_THREADS.
fn store_sums(row: u32, first_token: u32, sums: vec4<f32>) {
    for (var t = 0u; t < 4u; t = t + 1u) {
        let token = first_token + t * TOKEN_THREADS;
        if (row < params.rows && token < params.tokens) {
            out[token * params.out_stride + params.first_row + row] = sums[t];
        }
    }
}

@compute @workgroup_size(WG)
fn matmul(@builtin(workgroup_id) group: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    let first_tile_row = (group.x + group.y * params.groups_x) * TR;
    let first_token = group.z * TT;
    let row_thread = lane % ROW_THREADS;
    let token_thread = lane / ROW_THREADS;
    // Column r holds row r's sums for the thread's 4 tokens.
    var acc = mat4x4<f32>();
    for (var k0 = 0u; k0 < params.cols; k0 = k0 + BK) {
        load_weights(first_tile_row, k0, lane);
        let width = min(BK, params.cols - k0);
        for (var kx = 0u; kx < width; kx = kx + XK) {
            load_activations(first_token, (k0 + kx) / 4u, lane);
            workgroupBarrier();
            let steps = min(XK, width - kx) / 4u;
            for (var k = 0u; k < steps; k = k + 1u) {
                let w_at = row_thread * W_STRIDE4 + kx / 4u + k;
                let x_at = token_thread * X_STRIDE4 + k;
                let w = mat4x4<f32>(
                    w_tile[w_at],
                    w_tile[w_at + ROW_THREADS * W_STRIDE4],
                    w_tile[w_at + 2u * ROW_THREADS * W_STRIDE4],
                    w_tile[w_at + 3u * ROW_THREADS * W_STRIDE4],
                );
                let activations = mat4x4<f32>(
                    x_tile[x_at],
                    x_tile[x_at + TOKEN_THREADS * X_STRIDE4],
                    x_tile[x_at + 2u * TOKEN_THREADS * X_STRIDE4],
                    x_tile[x_at + 3u * TOKEN_THREADS * X_STRIDE4],
                );
                acc = acc + transpose(activations) * w;
            }
            workgroupBarrier();
        }
    }
    // Constant column indices: a dynamic one could move the whole matrix out of registers.
    let row = first_tile_row + row_thread;
    let token = first_token + token_thread;
    store_sums(row, token, acc[0]);
    store_sums(row + ROW_THREADS, token, acc[1]);
    store_sums(row + 2u * ROW_THREADS, token, acc[2]);
    store_sums(row + 3u * ROW_THREADS, token, acc[3]);
}
