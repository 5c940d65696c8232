// Matrix-matrix product for prefill: out[t, first_row + r] = dot(W[r, :], x[t, :]).
//
// A workgroup computes a tile of TT tokens x TR rows. K is walked in steps of BK = 128
// elements (a whole number of units for every type: K-quant units span 64 or 128 elements).
// Each step dequantizes the tile's TR x BK weights into workgroup memory once, every unit by
// one thread; the activations are staged there too, XK elements of TT tokens at a time. Each
// thread computes LANE rows x LANE tokens (LANE = 4 or 8) as mat4x4 products per 4 columns: a
// fixed shape, so every operand and sum lives in registers (per-thread arrays indexed in loops
// may not). LANE = 8 serves CPU adapters, where each lane's every workgroup-memory load is a
// loop over the SIMD lanes: four blocks from two rows' and two tokens' loads halve the loads
// per product.
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
// A loop stride: every loop must end (the pipeline drops naga's loop bounding).
const_assert XK4 > 0u;
const X_STRIDE4: u32 = XK4 + 1u;
const ROW_THREADS: u32 = TR / LANE;
const TOKEN_THREADS: u32 = TT / LANE;
// Tile offsets between a lane's blocks of 4 rows and of 4 tokens.
const W_BLOCK4: u32 = 4u * ROW_THREADS * W_STRIDE4;
const X_BLOCK4: u32 = 4u * TOKEN_THREADS * X_STRIDE4;

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

// Stores a block of sums: column r holds row row + r * ROW_THREADS's (constant column indices:
// a dynamic one could move the whole matrix out of registers).
fn store_block(row: u32, token: u32, block: mat4x4<f32>) {
    store_sums(row, token, block[0]);
    store_sums(row + ROW_THREADS, token, block[1]);
    store_sums(row + 2u * ROW_THREADS, token, block[2]);
    store_sums(row + 3u * ROW_THREADS, token, block[3]);
}

// Four rows' weights from w_tile, one row a column.
fn weight_block(at: u32) -> mat4x4<f32> {
    let step = ROW_THREADS * W_STRIDE4;
    return mat4x4<f32>(w_tile[at], w_tile[at + step], w_tile[at + 2u * step], w_tile[at + 3u * step]);
}

// Four tokens' activations from x_tile, one token a row.
fn activation_block(at: u32) -> mat4x4<f32> {
    let step = TOKEN_THREADS * X_STRIDE4;
    return transpose(mat4x4<f32>(x_tile[at], x_tile[at + step], x_tile[at + 2u * step], x_tile[at + 3u * step]));
}

@compute @workgroup_size(WG)
fn matmul(@builtin(workgroup_id) group: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    let first_tile_row = (group.x + group.y * params.groups_x) * TR;
    let first_token = group.z * TT;
    let row_thread = lane % ROW_THREADS;
    let token_thread = lane / ROW_THREADS;
    // acc_rt: the thread's row block r and token block t; column c holds row c's sums for the
    // block's 4 tokens. Blocks 1 exist only when LANE = 8.
    var acc_00 = mat4x4<f32>();
    var acc_01 = mat4x4<f32>();
    var acc_10 = mat4x4<f32>();
    var acc_11 = mat4x4<f32>();
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
                let w_0 = weight_block(w_at);
                let x_0 = activation_block(x_at);
                acc_00 = acc_00 + x_0 * w_0;
                if (LANE == 8u) {
                    let w_1 = weight_block(w_at + W_BLOCK4);
                    let x_1 = activation_block(x_at + X_BLOCK4);
                    acc_01 = acc_01 + x_1 * w_0;
                    acc_10 = acc_10 + x_0 * w_1;
                    acc_11 = acc_11 + x_1 * w_1;
                }
            }
            workgroupBarrier();
        }
    }
    let row = first_tile_row + row_thread;
    let token = first_token + token_thread;
    store_block(row, token, acc_00);
    if (LANE == 8u) {
        store_block(row, token + 4u * TOKEN_THREADS, acc_01);
        store_block(row + 4u * ROW_THREADS, token, acc_10);
        store_block(row + 4u * ROW_THREADS, token + 4u * TOKEN_THREADS, acc_11);
    }
}
