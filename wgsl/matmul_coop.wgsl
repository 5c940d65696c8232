// Matrix-matrix product for prefill on cooperative matrices (tensor cores):
// out[t, first_row + r] = dot(W[r, :], x[t, :]), as `matmul.wgsl` computes it on the FP32 cores.
//
// A workgroup of WG = 4 subgroups computes a tile of TT = 64 tokens x TR = 64 rows. K is walked
// in steps of BK = 128 elements (a whole number of units for every type, as in `matmul.wgsl`).
// Each step dequantizes the tile's 64 x 128 weights to f16 in workgroup memory, every unit by one
// lane, and converts the 64 tokens' activations to f16 beside them; each lane issues all its
// loads of a step at once (two units, 16 vec4s) before storing any. Holding the next step's
// loads in registers across this step's multiplies made every product 15-25% slower on the
// H200 (docs/perf.md, session 27: 128 floats a lane live through the multiplies). Each subgroup owns a
// 32 x 32 quarter of the outputs as 2 x 2 f32 accumulators of 16 x 16 and multiplies 16-column
// slices of both tiles into them. In cooperative-matrix terms A is the activations (tokens x k,
// row-major in `x_tile`), B the transposed weights (k x rows, column-major in `w_tile`) and C the
// outputs (tokens x rows). Tile rows are padded by 8 halves (16 bytes): rows 272 bytes apart
// spread a subgroup's loads over the banks, and every load stays 16-byte aligned.
//
// Split K (`k_splits` > 1, chosen by the host for grids too small to fill the GPU): workgroup z
// = token group * k_splits + split, and split s walks its share of the K steps and stores its
// partial sums as slice s of `out` ([k_splits, tokens, out_stride]), which the host adds up
// after the product (`elementwise::sum_slices`). A 896-row product at 512 tokens is 14 x 8
// workgroups, one per SM, each walking all of K: latency, not throughput (docs/perf.md,
// session 30).
//
// Indices in range (`Lib::IndicesInRange`: no bounds checks on Vulkan): a lane's weight slots
// are < 2 * WG, so their tile rows are < TR; a unit's 32 values lie inside the step's BK columns
// for every type (BK is a whole number of blocks or units, and `ops_matmul_coop` checks every
// type's products); activation slots < 16 * WG give token rows < TT; a subgroup's stage and
// quarter are fixed by its id (< WG / SUBGROUP), and a lane's stage entries by its index.
//
// Needs 16 x 16 x 16 f16 x f16 + f32 matrices at subgroup scope and subgroups of exactly 32
// lanes (the capability probe in src/gpu/device.rs), which the header enables with
// `enable wgpu_cooperative_matrix;`.

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
    // Workgroups along K, each with its share of the steps (1: one walks all of K).
    k_splits: u32,
    pad1: u32,
    pad2: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> weights: array<u32>;
@group(0) @binding(2) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
@group(0) @binding(4) var<storage, read> weights4: array<vec4<u32>>;

const TR: u32 = 64u;
const TT: u32 = 64u;
const WG: u32 = 128u;
const SUBGROUP: u32 = 32u;
const BK: u32 = 128u;
const BK4: u32 = BK / 4u;
const UNITS_PER_STEP: u32 = BK / 32u;
const STRIDE: u32 = BK + 8u;
// `load_step` is written out for two weight units and 16 activation vec4s per lane.
const_assert TR * UNITS_PER_STEP == 2u * WG;
const_assert TT * BK4 == 16u * WG;
// One 16 x 16 f32 matrix per subgroup, staged on its way out (outputs at the tile's edges must
// not be stored, and a cooperative store writes all or nothing).
const STAGE: u32 = 256u;

var<workgroup> w_tile: array<f16, TR * STRIDE>;
var<workgroup> x_tile: array<f16, TT * STRIDE>;
var<workgroup> c_stage: array<f32, (WG / SUBGROUP) * STAGE>;

fn store_half4(at: u32, values: vec4<f32>) {
    w_tile[at] = f16(values.x);
    w_tile[at + 1u] = f16(values.y);
    w_tile[at + 2u] = f16(values.z);
    w_tile[at + 3u] = f16(values.w);
}

// Stores a unit's values at their places in a tile row starting at element `base` (written out:
// a constant index keeps `values` in registers).
fn store_unit(base: u32, u: u32, values: Unit) {
    store_half4(base + block_element(u, 0u), values[0]);
    store_half4(base + block_element(u, 1u), values[1]);
    store_half4(base + block_element(u, 2u), values[2]);
    store_half4(base + block_element(u, 3u), values[3]);
    store_half4(base + block_element(u, 4u), values[4]);
    store_half4(base + block_element(u, 5u), values[5]);
    store_half4(base + block_element(u, 6u), values[6]);
    store_half4(base + block_element(u, 7u), values[7]);
}

// The unit of weight `slot` of the step at k0, dequantized (zeros past the last row: the
// multiply reads whole 16-row slices).
fn load_unit(first_tile_row: u32, k0: u32, slot: u32) -> Unit {
    let row = first_tile_row + slot / UNITS_PER_STEP;
    let unit = k0 / 32u + slot % UNITS_PER_STEP;
    let block = unit / UNITS;
    if (row < params.rows && block < params.blocks_per_row) {
        return dequant_unit((params.buffer_row + row) * params.row_bytes + block * BLOCK_BYTES, unit % UNITS);
    }
    return Unit();
}

fn store_weight_unit(k0: u32, slot: u32, values: Unit) {
    let unit = k0 / 32u + slot % UNITS_PER_STEP;
    let block = unit / UNITS;
    if (block < params.blocks_per_row) {
        // May wrap below zero for a block that starts before k0; its unit's elements bring it
        // back in range (u32 arithmetic is modular).
        store_unit((slot / UNITS_PER_STEP) * STRIDE + block * BLOCK - k0, unit % UNITS, values);
    }
}

// Whether activation vec4 `slot` of a step belongs to a token of the call: a batched step's
// 16 rows fill a quarter of the tile, and the rest is neither loaded nor stored (its outputs
// are never written, and a warp's 32 slots are one token, so the test does not diverge).
fn live_token(first_token: u32, slot: u32) -> bool {
    return first_token + slot / BK4 < params.tokens;
}

// Activation vec4 `slot` of the step at k4 (columns past the end repeat the last column: always
// a valid load; `store_activation` skips those columns).
fn load_activation(first_token: u32, k4: u32, slot: u32) -> vec4<f32> {
    if (!live_token(first_token, slot)) {
        return vec4<f32>(0.0);
    }
    let cols4 = params.cols / 4u;
    let token = first_token + slot / BK4;
    return x[token * cols4 + min(k4 + slot % BK4, cols4 - 1u)];
}

fn store_activation(first_token: u32, k4: u32, slot: u32, v: vec4<f32>) {
    if (live_token(first_token, slot) && k4 + slot % BK4 < params.cols / 4u) {
        let at = (slot / BK4) * STRIDE + 4u * (slot % BK4);
        x_tile[at] = f16(v.x);
        x_tile[at + 1u] = f16(v.y);
        x_tile[at + 2u] = f16(v.z);
        x_tile[at + 3u] = f16(v.w);
    }
}

// Eight of a lane's activation vec4s of the step at k4, slots s, s + WG, ..., as one `Unit`
// (built with constant indices, so it stays in registers).
fn load_activations(first_token: u32, k4: u32, s: u32) -> Unit {
    return Unit(
        load_activation(first_token, k4, s),
        load_activation(first_token, k4, s + WG),
        load_activation(first_token, k4, s + 2u * WG),
        load_activation(first_token, k4, s + 3u * WG),
        load_activation(first_token, k4, s + 4u * WG),
        load_activation(first_token, k4, s + 5u * WG),
        load_activation(first_token, k4, s + 6u * WG),
        load_activation(first_token, k4, s + 7u * WG),
    );
}

fn store_activations(first_token: u32, k4: u32, s: u32, v: Unit) {
    store_activation(first_token, k4, s, v[0]);
    store_activation(first_token, k4, s + WG, v[1]);
    store_activation(first_token, k4, s + 2u * WG, v[2]);
    store_activation(first_token, k4, s + 3u * WG, v[3]);
    store_activation(first_token, k4, s + 4u * WG, v[4]);
    store_activation(first_token, k4, s + 5u * WG, v[5]);
    store_activation(first_token, k4, s + 6u * WG, v[6]);
    store_activation(first_token, k4, s + 7u * WG, v[7]);
}

// What one lane brings to a step: two weight units and 16 activation vec4s, loaded together
// before they are stored into the tiles.
struct Staged {
    w0: Unit,
    w1: Unit,
    x0: Unit,
    x1: Unit,
}

fn load_step(first_tile_row: u32, first_token: u32, k0: u32, lane: u32) -> Staged {
    return Staged(
        load_unit(first_tile_row, k0, lane),
        load_unit(first_tile_row, k0, lane + WG),
        load_activations(first_token, k0 / 4u, lane),
        load_activations(first_token, k0 / 4u, lane + 8u * WG),
    );
}

fn store_step(first_token: u32, k0: u32, lane: u32, staged: Staged) {
    store_weight_unit(k0, lane, staged.w0);
    store_weight_unit(k0, lane + WG, staged.w1);
    store_activations(first_token, k0 / 4u, lane, staged.x0);
    store_activations(first_token, k0 / 4u, lane + 8u * WG, staged.x1);
}

// Stores one 16 x 16 accumulator (tokens x rows, from token `token0` and tile row `row0`)
// through the subgroup's stage into slice `split` of `out`, each lane 8 of its values.
fn store_outputs(acc: coop_mat16x16<f32, C>, stage: u32, token0: u32, row0: u32, split: u32, lane: u32) {
    coopStoreT(acc, &c_stage[stage], 16u);
    workgroupBarrier();
    let slice = split * params.tokens * params.out_stride + params.first_row;
    for (var i = lane; i < STAGE; i = i + SUBGROUP) {
        let token = token0 + i / 16u;
        let row = row0 + i % 16u;
        if (row < params.rows && token < params.tokens) {
            out[slice + token * params.out_stride + row] = c_stage[stage + i];
        }
    }
    workgroupBarrier();
}

@compute @workgroup_size(WG)
fn matmul(
    @builtin(workgroup_id) group: vec3<u32>,
    @builtin(local_invocation_index) lane: u32,
    @builtin(subgroup_id) subgroup: u32,
    @builtin(subgroup_invocation_id) subgroup_lane: u32,
) {
    let first_tile_row = (group.x + group.y * params.groups_x) * TR;
    let split = group.z % params.k_splits;
    let first_token = (group.z / params.k_splits) * TT;
    let steps = (params.cols + BK - 1u) / BK;
    let k_begin = (split * steps / params.k_splits) * BK;
    let k_end = min(((split + 1u) * steps / params.k_splits) * BK, params.cols);
    // The subgroup's quarter: rows (subgroup % 2) * 32, tokens (subgroup / 2) * 32.
    let w_at = (subgroup % 2u) * 32u * STRIDE;
    let x_at = (subgroup / 2u) * 32u * STRIDE;
    var c00 = coop_mat16x16<f32, C>();
    var c01 = coop_mat16x16<f32, C>();
    var c10 = coop_mat16x16<f32, C>();
    var c11 = coop_mat16x16<f32, C>();
    for (var k0 = k_begin; k0 < k_end; k0 = k0 + BK) {
        store_step(first_token, k0, lane, load_step(first_tile_row, first_token, k0, lane));
        workgroupBarrier();
        let width = min(BK, params.cols - k0);
        for (var k = 0u; k < width; k = k + 16u) {
            let a0 = coopLoadT<coop_mat16x16<f16, A>>(&x_tile[x_at + k], STRIDE);
            let a1 = coopLoadT<coop_mat16x16<f16, A>>(&x_tile[x_at + 16u * STRIDE + k], STRIDE);
            let b0 = coopLoad<coop_mat16x16<f16, B>>(&w_tile[w_at + k], STRIDE);
            let b1 = coopLoad<coop_mat16x16<f16, B>>(&w_tile[w_at + 16u * STRIDE + k], STRIDE);
            c00 = coopMultiplyAdd(a0, b0, c00);
            c01 = coopMultiplyAdd(a0, b1, c01);
            c10 = coopMultiplyAdd(a1, b0, c10);
            c11 = coopMultiplyAdd(a1, b1, c11);
        }
        workgroupBarrier();
    }
    let stage = subgroup * STAGE;
    let token0 = first_token + (subgroup / 2u) * 32u;
    let row0 = first_tile_row + (subgroup % 2u) * 32u;
    store_outputs(c00, stage, token0, row0, split, subgroup_lane);
    store_outputs(c01, stage, token0, row0 + 16u, split, subgroup_lane);
    store_outputs(c10, stage, token0 + 16u, row0, split, subgroup_lane);
    store_outputs(c11, stage, token0 + 16u, row0 + 16u, split, subgroup_lane);
}
