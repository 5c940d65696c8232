// Integer products of a few tokens (a batched decode step's rows): out[t, row] = epilogue(
// dot(W[row, :], x_t)) with x quantized to 8 bits by quantize_int8.wgsl and the weights decoded
// to 8-bit integers (dequant_int8.wgsl), each quarter's 8 products summed by two dot4I8Packed.
//
// Why: a batched step's f32 products decode every weight once per token, and decoding costs
// more than the multiply-adds it feeds (docs/perf.md, sessions 16-31), while decoding it once
// for several tokens in f32 kept 32 values and every token's activations in flight (slower on
// the H200, session 21). Here a decoded unit is 8 words and 8 scales, shared by all TPW tokens
// of the workgroup, and each token costs 8 integer dot products and four 16-byte loads a unit
// (x at 2 bytes a value). As llama.cpp's mmvq does on CUDA.
//
// Work split: TPR threads share a row along K (units in turn), WG / TPR rows a workgroup, one
// row a thread (and, GLU, its up row). Workgroup x takes tokens x * TPW .. + TPW - 1 (past
// `tokens`, the last one again, never written); each thread keeps TPW / 4 vec4s of sums per
// row, each four tokens' (vec4s, not an array: the H200's driver keeps private arrays indexed
// in loops in memory, docs/perf.md, session 20). The partial sums meet in workgroup memory.
//
// x's layout (quantize_int8.wgsl): per token, per 8 values (a quarter) one vec4<u32>: the 8
// values as signed bytes (xy), their scale d (z) and d times the sum of the 8 integers (w), so
// value = d * q and an offset o adds o * (w) to the quarter's dot product.
// EPILOGUE as in matvec.wgsl: 0 store, 1 bias, 2 accumulate, 3/4 gated by silu/gelu(aux),
// 5/6 GLU (HALVES = 2, the up rows at up_buffer_row).

struct Params {
    rows: u32,
    first_row: u32,
    row_bytes: u32,
    blocks_per_row: u32,
    groups_x: u32,
    cols: u32,
    buffer_row: u32,
    up_buffer_row: u32,
    out_offset: u32,
    out_stride: u32,
    tokens: u32,
    pad: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> weights: array<u32>;
@group(0) @binding(2) var<storage, read> xq: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
@group(0) @binding(4) var<storage, read> weights4: array<vec4<u32>>;
@group(0) @binding(5) var<storage, read> aux: array<f32>;

const ROW_GROUPS: u32 = WG / TPR;
// Vec4s of (up to) four tokens' sums per row, and the tokens each holds: TPW is 1 (a lone
// decode step) or a multiple of 4.
const VECS: u32 = max(TPW / 4u, 1u);
const PER_VEC: u32 = min(TPW, 4u);
const SUMS: u32 = VECS * HALVES;
// Loop strides (the pipeline drops naga's loop bounding), and the reduction's VECS lanes.
const_assert TPR > 0u && ROW_GROUPS > 0u && VECS <= 4u && TPR >= VECS;
const_assert TPW == 1u || TPW == 4u * VECS;

var<workgroup> partials: array<vec4<f32>, WG * SUMS>;
// The workgroup's first token.
var<private> first_token: u32;

// Token t's quarter `quarter` of x (past the last token, the last one's).
fn x_quarter(t: u32, quarter: u32) -> vec4<u32> {
    let token = min(first_token + t, params.tokens - 1u);
    return xq[token * (params.cols / 8u) + quarter];
}

// One quarter's dot product: 8 weights `w` (value = scale * q + offset) with x's quarter `a`.
fn quarter_dot(w: vec2<u32>, scale: f32, offset: f32, a: vec4<u32>) -> f32 {
    let q = dot4I8Packed(w.x, a.x) + dot4I8Packed(w.y, a.y);
    return bitcast<f32>(a.z) * scale * f32(q) + offset * bitcast<f32>(a.w);
}

// Unit `unit`'s dot product with token t, its quarters at x quarters `at`.
fn token_dot(unit: IntUnit, at: vec4<u32>, t: u32) -> f32 {
    return quarter_dot(unit.low.xy, unit.scale.x, unit.offset.x, x_quarter(t, at.x))
        + quarter_dot(unit.low.zw, unit.scale.y, unit.offset.y, x_quarter(t, at.y))
        + quarter_dot(unit.high.xy, unit.scale.z, unit.offset.z, x_quarter(t, at.z))
        + quarter_dot(unit.high.zw, unit.scale.w, unit.offset.w, x_quarter(t, at.w));
}

// The same for tokens t0 .. t0 + 3, spelled out (a vec4 indexed in a loop may live in memory).
fn unit_dots(unit: IntUnit, at: vec4<u32>, t0: u32) -> vec4<f32> {
    if (TPW == 1u) {
        return vec4<f32>(token_dot(unit, at, t0), 0.0, 0.0, 0.0);
    }
    return vec4<f32>(token_dot(unit, at, t0), token_dot(unit, at, t0 + 1u),
                     token_dot(unit, at, t0 + 2u), token_dot(unit, at, t0 + 3u));
}

// A thread's sums: vec4 v holds tokens 4v .. 4v + 3 of its row (a0 .. a3) and its up row (u0 .. u3).
struct Sums {
    a0: vec4<f32>,
    a1: vec4<f32>,
    a2: vec4<f32>,
    a3: vec4<f32>,
    u0: vec4<f32>,
    u1: vec4<f32>,
    u2: vec4<f32>,
    u3: vec4<f32>,
}

fn add_unit(sums: ptr<function, Sums>, unit: IntUnit, at: vec4<u32>, up: bool) {
    if (up) {
        (*sums).u0 = (*sums).u0 + unit_dots(unit, at, 0u);
        if (VECS > 1u) { (*sums).u1 = (*sums).u1 + unit_dots(unit, at, 4u); }
        if (VECS > 2u) { (*sums).u2 = (*sums).u2 + unit_dots(unit, at, 8u); }
        if (VECS > 3u) { (*sums).u3 = (*sums).u3 + unit_dots(unit, at, 12u); }
        return;
    }
    (*sums).a0 = (*sums).a0 + unit_dots(unit, at, 0u);
    if (VECS > 1u) { (*sums).a1 = (*sums).a1 + unit_dots(unit, at, 4u); }
    if (VECS > 2u) { (*sums).a2 = (*sums).a2 + unit_dots(unit, at, 8u); }
    if (VECS > 3u) { (*sums).a3 = (*sums).a3 + unit_dots(unit, at, 12u); }
}

// This thread's share of row `row` (past the part, its last row: uniform control flow).
fn thread_sums(row: u32, thread: u32) -> Sums {
    let clamped = min(row, params.rows - 1u);
    let row_start = (params.buffer_row + clamped) * params.row_bytes;
    let up_start = (params.up_buffer_row + clamped) * params.row_bytes;
    var sums = Sums();
    let units = params.blocks_per_row * UNITS;
    for (var unit = thread; unit < units; unit = unit + TPR) {
        let block = unit / UNITS;
        let u = unit % UNITS;
        let first = block * BLOCK;
        let at = vec4<u32>(first + block_element(u, 0u), first + block_element(u, 2u),
                           first + block_element(u, 4u), first + block_element(u, 6u)) / 8u;
        add_unit(&sums, int_unit(row_start + block * BLOCK_BYTES, u), at, false);
        if (HALVES == 2u) {
            add_unit(&sums, int_unit(up_start + block * BLOCK_BYTES, u), at, true);
        }
    }
    return sums;
}

fn sums_vec(sums: Sums, v: u32) -> vec4<f32> {
    switch v {
        case 0u: { return sums.a0; }
        case 1u: { return sums.a1; }
        case 2u: { return sums.a2; }
        case 3u: { return sums.a3; }
        case 4u: { return sums.u0; }
        case 5u: { return sums.u1; }
        case 6u: { return sums.u2; }
        default: { return sums.u3; }
    }
}

// Writes row `row` of token t from its dot product and (GLU) its up row's.
fn write_row(t: u32, row: u32, value: f32, up: f32) {
    if (row >= params.rows || first_token + t >= params.tokens) {
        return;
    }
    let i = (first_token + t) * params.out_stride + params.out_offset + params.first_row + row;
    switch EPILOGUE {
        case 1u: { out[i] = value + aux[params.out_offset + params.first_row + row]; }
        case 2u: { out[i] = out[i] + value; }
        case 3u: { out[i] = silu(aux[i]) * value; }
        case 4u: { out[i] = gelu_tanh(aux[i]) * value; }
        case 5u: { out[i] = silu(value) * up; }
        case 6u: { out[i] = gelu_tanh(value) * up; }
        default: { out[i] = value; }
    }
}

@compute @workgroup_size(WG)
fn matvec_int8(@builtin(workgroup_id) group: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    first_token = group.x * TPW;
    let thread = lane % TPR;
    let row = (group.y + group.z * params.groups_x) * ROW_GROUPS + lane / TPR;
    let sums = thread_sums(row, thread);
    for (var v = 0u; v < VECS; v = v + 1u) {
        partials[lane * SUMS + v] = sums_vec(sums, v);
        if (HALVES == 2u) {
            partials[lane * SUMS + VECS + v] = sums_vec(sums, 4u + v);
        }
    }
    workgroupBarrier();
    // Thread v < VECS of a row adds up its tokens 4v .. 4v + 3 over the row's TPR threads.
    if (thread >= VECS) {
        return;
    }
    let group_lane = lane - thread;
    var total = vec4<f32>(0.0);
    var up = vec4<f32>(0.0);
    for (var j = 0u; j < TPR; j = j + 1u) {
        total = total + partials[(group_lane + j) * SUMS + thread];
        if (HALVES == 2u) {
            up = up + partials[(group_lane + j) * SUMS + VECS + thread];
        }
    }
    for (var c = 0u; c < PER_VEC; c = c + 1u) {
        write_row(4u * thread + c, row, total[c], up[c]);
    }
}
