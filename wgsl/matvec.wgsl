// Matrix-vector product: out[out_offset + first_row + r] = dot(W[r, :], x), W's row r at row
// buffer_row + r of the bound part (a part may hold several matrices' rows). Several tokens
// (the rows of a batched decode step) are several products, one per row of x ([tokens, cols],
// row t at vec4 t * x_stride) into out's row t (at t * out_stride, aux likewise): workgroup x
// takes tokens x * TPW .. x * TPW + TPW - 1 (the last repeated past `tokens`, never written),
// and y and z the rows. Tokens vary fastest, so the workgroups of one row group run together
// over the same weights (on the H200 neither faster nor slower than rows first: docs/perf.md,
// session 16). TPW > 1 gives a batch of B rows B / TPW times one token's workgroups instead
// of B times, each decoding a weight unit once for its TPW tokens.
//
// Each thread accumulates RPT consecutive rows at once, so every activation it loads serves
// RPT rows (on CPU adapters every storage load is a per-lane scalar loop, and activation
// loads would otherwise outnumber weight loads several times). TPR threads share a group of
// rows along K, taking its 32-value units in turn (thread t: units t, t + TPR, ...), so
// neighbouring threads read neighbouring bytes. A workgroup holds WG / TPR such groups, and
// the partial sums meet once at the end: one barrier per workgroup, or none with subgroups.
//
// The one-token staging reads its input through `staging_scale` and `staged_input`: from x as it
// is (matvec_input.wgsl), or (matvec_residual.wgsl) as x plus a sub-block's output through its
// own RMS norm, a post-norm joining the residual stream inside the next product.
//
// Fusions, chosen by constants, spare a decode step whole dispatches:
// - NORM = 1: x is RMS-normalised on the fly, as rms_norm computes it. Since 1 / rms(x) is one
//   factor of the whole row, W · ((x / rms(x)) * norm_w) = (W · (x * norm_w)) / rms(x): the
//   threads sum x's squares from the same loads as the dot products and the factor is applied
//   at the end, so the weight loads never wait on a reduction (a row group's threads together
//   read all of x once).
// - EPILOGUE: 0 stores the dot product; 1 adds aux[row] (a bias, the same for every token);
//   2 adds it to out[row] (the residual stream); 3 and 4 store silu(aux[row]) or
//   gelu(aux[row]) times it (aux holds the gate projection, this matrix is the up
//   projection); 5 and 6 (GLU, HALVES = 2) also take the dot product with row
//   up_buffer_row + r of the same part (the up projection) and store silu(dot) or gelu(dot)
//   times that. aux is indexed like out (per token), but for a bias.
// Each thread keeps SLOTS = RPT * HALVES sums per token: its rows' dot products, then (GLU)
// their up rows'. The thread that writes a row holds both of its sums.
//
// Registers, not arrays: with one token and at most four slots (every GPU split), a thread's
// sums are variables of their own, reduced as one vec4 (`Shares`): the H200's driver keeps a
// private array indexed in a loop in memory (decode 699 -> 778 tok/s on Qwen2.5 when they
// moved: docs/perf.md, session 21). CPU adapters' wider splits and several tokens a workgroup
// keep the arrays.

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
    tokens: u32,
    // The residual fold's post-norm epsilon (matvec_residual.wgsl).
    post_eps: f32,
    // SECTIONS = 1: where the output's sections end (`out_index`).
    section_end0: u32,
    section_end1: u32,
    section_end2: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> weights: array<u32>;
@group(0) @binding(2) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
@group(0) @binding(4) var<storage, read> weights4: array<vec4<u32>>;
@group(0) @binding(5) var<storage, read> aux: array<f32>;
@group(0) @binding(6) var<storage, read> norm_w: array<vec4<f32>>;

const ROW_GROUPS: u32 = WG / TPR;
// A loop stride: every loop must end (the pipeline drops naga's loop bounding).
const_assert TPR > 0u && ROW_GROUPS > 0u;
const SLOTS: u32 = RPT * HALVES;
// A token's sums: SLOTS dot products, then (NORM) the sum of the squares of x it read.
const PER_TOKEN: u32 = SLOTS + NORM;
const SUMS: u32 = TPW * PER_TOKEN;

var<workgroup> partials: array<f32, WG * SUMS>;
// STAGE = 1 (GPUs, rows of at most TPR units): the one-token loop reads x (and the norm's
// weights) from these, staged once by the whole workgroup, instead of every row group loading
// x itself, each lane a 128-byte unit (32 distinct lines a warp-wide load). STAGED = 8 * (TPR
// + 1) vec4s, 1 when unused.
var<workgroup> staged_x: array<vec4<f32>, STAGED>;
var<workgroup> staged_w: array<vec4<f32>, STAGED>;
var<private> squares: array<f32, TPW>;
// The workgroup's first token.
var<private> first_token: u32;
// Whether this is the dispatch's first workgroup (the residual fold's writer).
var<private> first_group: bool;

// Where the workgroup's token t starts in x (vec4s); past the last token, the last again.
fn x_base(t: u32) -> u32 {
    return min(first_token + t, params.tokens - 1u) * params.x_stride;
}

fn activation(t: u32, i: u32) -> vec4<f32> {
    let v = x[x_base(t) + i];
    if (NORM == 1u) {
        squares[t] = squares[t] + dot(v, v);
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
    return ((group.y + group.z * params.groups_x) * ROW_GROUPS + lane / TPR) * RPT;
}

// The activations of token t that unit `u` of the block starting at vec4 `x_block` multiplies.
fn unit_activations(t: u32, x_block: u32, u: u32) -> Unit {
    return Unit(activation(t, x_block + block_element(u, 0u) / 4u),
                activation(t, x_block + block_element(u, 1u) / 4u),
                activation(t, x_block + block_element(u, 2u) / 4u),
                activation(t, x_block + block_element(u, 3u) / 4u),
                activation(t, x_block + block_element(u, 4u) / 4u),
                activation(t, x_block + block_element(u, 5u) / 4u),
                activation(t, x_block + block_element(u, 6u) / 4u),
                activation(t, x_block + block_element(u, 7u) / 4u));
}

// One token's shares with at most four slots (every GPU split): the slots' dot products as
// one vec4 and x's squares, each slot's accumulator a variable of its own. Loops over a private
// array's slots leave the array in memory on the H200's driver rather than in registers (the
// private array of activations of session 17 cost 6% of a decode step: docs/perf.md, session 20).
struct Shares {
    dots: vec4<f32>,
    squares: f32,
}

const REGISTER_SHARES: bool = TPW == 1u && SLOTS <= 4u;

// Where slot s's row starts, in bytes: the thread's row first + s % RPT, or its up row.
fn slot_row_start(first: u32, s: u32) -> u32 {
    let base = select(params.buffer_row, params.up_buffer_row, s >= RPT);
    return (base + min(first + s % RPT, params.rows - 1u)) * params.row_bytes;
}

fn sum4(v: vec4<f32>) -> f32 {
    return (v.x + v.y) + (v.z + v.w);
}

// Slots past SLOTS repeat the last one's row; their sums are never read. `lane` is the
// thread's index in the workgroup (its row group's thread is lane % TPR).
fn one_token_shares(first: u32, lane: u32) -> Shares {
    let row0 = slot_row_start(first, 0u);
    let row1 = slot_row_start(first, min(1u, SLOTS - 1u));
    let row2 = slot_row_start(first, min(2u, SLOTS - 1u));
    let row3 = slot_row_start(first, min(3u, SLOTS - 1u));
    var acc0 = vec4<f32>(0.0);
    var acc1 = vec4<f32>(0.0);
    var acc2 = vec4<f32>(0.0);
    var acc3 = vec4<f32>(0.0);
    let thread = lane % TPR;
    let units = params.blocks_per_row * UNITS;
    if (STAGE == 1u) {
        stage_units(units, lane);
    }
    for (var unit = thread; unit < units; unit = unit + TPR) {
        let block = unit / UNITS;
        let u = unit % UNITS;
        let at = block * BLOCK_BYTES;
        let activations = one_token_activations(unit, block, u);
        acc0 = acc0 + unit_dot(dequant_unit(row0 + at, u), activations);
        if (SLOTS > 1u) {
            acc1 = acc1 + unit_dot(dequant_unit(row1 + at, u), activations);
        }
        if (SLOTS > 2u) {
            acc2 = acc2 + unit_dot(dequant_unit(row2 + at, u), activations);
        }
        if (SLOTS > 3u) {
            acc3 = acc3 + unit_dot(dequant_unit(row3 + at, u), activations);
        }
    }
    return Shares(vec4<f32>(sum4(acc0), sum4(acc1), sum4(acc2), sum4(acc3)), squares[0]);
}

// Where vec4 i of staged unit c lies: one row of TPR + 1 vec4s per i, so the threads of a row
// group reading their units' vec4 i touch consecutive vec4s, and the stagers writing one
// unit's eight vec4s land in eight different banks.
fn staged_index(c: u32, i: u32) -> u32 {
    return i * (TPR + 1u) + c;
}

// The first token's x (and the norm's weights), all `units` of it (at most TPR: the host
// stages only rows that short), into workgroup memory, neighbouring lanes loading
// neighbouring vec4s of a unit. Every lane of the workgroup calls it (uniform control flow).
fn stage_units(units: u32, lane: u32) {
    let scale = staging_scale(lane);
    for (var index = lane; index < units * 8u; index = index + WG) {
        let c = index / 8u;
        let i = index % 8u;
        let at = (c / UNITS) * (BLOCK / 4u) + block_element(c % UNITS, i) / 4u;
        staged_x[staged_index(c, i)] = staged_input(at, scale);
        if (NORM == 1u) {
            staged_w[staged_index(c, i)] = norm_w[at];
        }
    }
    workgroupBarrier();
}

// The activations that unit u of block `block` multiplies: staged unit c's, or x's own.
fn one_token_activations(c: u32, block: u32, u: u32) -> Unit {
    if (STAGE == 1u) {
        return Unit(staged_activation(c, 0u), staged_activation(c, 1u),
                    staged_activation(c, 2u), staged_activation(c, 3u),
                    staged_activation(c, 4u), staged_activation(c, 5u),
                    staged_activation(c, 6u), staged_activation(c, 7u));
    }
    return unit_activations(0u, block * (BLOCK / 4u), u);
}

// Vec4 i of staged unit c; with NORM, normed, and its square added to the token's.
fn staged_activation(c: u32, i: u32) -> vec4<f32> {
    let v = staged_x[staged_index(c, i)];
    if (NORM == 1u) {
        squares[0] = squares[0] + dot(v, v);
        return v * staged_w[staged_index(c, i)];
    }
    return v;
}

// This thread's shares, per token t < TPW (at t * PER_TOKEN), of dot(W[first + r, :], x_t)
// for r < RPT, then (GLU) of the up rows', then (NORM) of x_t's squares. Rows past the part
// repeat its last row (keeping control flow uniform); their sums are never written.
fn thread_partials(first: u32, lane: u32) -> array<f32, SUMS> {
    let thread = lane % TPR;
    var sums: array<f32, SUMS>;
    if (REGISTER_SHARES) {
        let shares = one_token_shares(first, lane);
        for (var s = 0u; s < SLOTS; s = s + 1u) {
            sums[s] = shares.dots[s];
        }
        if (NORM == 1u) {
            sums[PER_TOKEN - 1u] = shares.squares;
        }
        return sums;
    }
    var row_start: array<u32, SLOTS>;
    for (var s = 0u; s < SLOTS; s = s + 1u) {
        row_start[s] = slot_row_start(first, s);
    }
    var acc: array<vec4<f32>, TPW * SLOTS>;
    let units = params.blocks_per_row * UNITS;
    for (var unit = thread; unit < units; unit = unit + TPR) {
        let block = unit / UNITS;
        let u = unit % UNITS;
        let x_block = block * (BLOCK / 4u);
        if (TPW == 1u) {
            // One token: its activations stay in registers (in a private array of Units, the
            // H200's driver decoded Qwen2.5 at 654 tok/s instead of 694: docs/perf.md, session 20).
            let activations = unit_activations(0u, x_block, u);
            for (var s = 0u; s < SLOTS; s = s + 1u) {
                let values = dequant_unit(row_start[s] + block * BLOCK_BYTES, u);
                acc[s] = acc[s] + unit_dot(values, activations);
            }
            continue;
        }
        // Each token's activations serve all of its rows, and each decoded weight unit all
        // of the workgroup's tokens: decoding costs more than the multiply-adds it feeds.
        var activations: array<Unit, TPW>;
        for (var t = 0u; t < TPW; t = t + 1u) {
            activations[t] = unit_activations(t, x_block, u);
        }
        for (var s = 0u; s < SLOTS; s = s + 1u) {
            let values = dequant_unit(row_start[s] + block * BLOCK_BYTES, u);
            for (var t = 0u; t < TPW; t = t + 1u) {
                acc[t * SLOTS + s] = acc[t * SLOTS + s] + unit_dot(values, activations[t]);
            }
        }
    }
    for (var t = 0u; t < TPW; t = t + 1u) {
        for (var s = 0u; s < SLOTS; s = s + 1u) {
            sums[t * PER_TOKEN + s] = sum4(acc[t * SLOTS + s]);
        }
        if (NORM == 1u) {
            sums[t * PER_TOKEN + PER_TOKEN - 1u] = squares[t];
        }
    }
    return sums;
}

// Where output row g (numbered from the output's start) of token `token` goes: at
// token * out_stride + g, or with SECTIONS = 1 (a batched step's q, k and v in one product:
// docs/perf.md, session 37) in its section's own [tokens, length] block, the three sections
// (ending at rows section_end0, 1 and 2) one block after another, as the attention kernels
// read q, k and v. One token's index is g either way.
fn out_index(token: u32, g: u32) -> u32 {
    if (SECTIONS == 0u) {
        return token * params.out_stride + g;
    }
    var start = 0u;
    var end = params.section_end0;
    if (g >= params.section_end0) {
        start = params.section_end0;
        end = params.section_end1;
    }
    if (g >= params.section_end1) {
        start = params.section_end1;
        end = params.section_end2;
    }
    return params.tokens * start + token * (end - start) + (g - start);
}

// Writes row `row` of token t from its dot product and (GLU) its up row's, both still to be
// multiplied by `factor` (the fused norm's).
fn write_row(t: u32, row: u32, dot_sum: f32, up_sum: f32, factor: f32) {
    if (row >= params.rows || first_token + t >= params.tokens) {
        return;
    }
    let value = dot_sum * factor;
    let up = up_sum * factor;
    let i = out_index(first_token + t, params.out_offset + params.first_row + row);
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

// Where row r's dot sum and up sum lie among a token's sums (the same slot without GLU).
fn up_slot(r: u32) -> u32 {
    return (HALVES - 1u) * RPT + r;
}

// Writes every row of this thread's group from `sums` (all of the group's shares added up).
fn write_rows(first: u32, sums: array<f32, SUMS>) {
    for (var t = 0u; t < TPW; t = t + 1u) {
        let at = t * PER_TOKEN;
        let factor = norm_factor(sums[at + PER_TOKEN - 1u]);
        for (var r = 0u; r < RPT; r = r + 1u) {
            write_row(t, first + r, sums[at + r], sums[at + up_slot(r)], factor);
        }
    }
}

// Writes the rows of this thread's group from one token's shares, all added up.
fn write_shares(first: u32, shares: Shares) {
    let factor = norm_factor(shares.squares);
    for (var r = 0u; r < RPT; r = r + 1u) {
        write_row(0u, first + r, shares.dots[r], shares.dots[up_slot(r)], factor);
    }
}

@compute @workgroup_size(WG)
fn matvec(@builtin(workgroup_id) group: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    first_token = group.x * TPW;
    first_group = all(group == vec3<u32>(0u));
    let first = first_thread_row(group, lane);
    let thread = lane % TPR;
    let sums = thread_partials(first, lane);
    if (TPR == 1u) {
        write_rows(first, sums);
        return;
    }
    for (var s = 0u; s < SUMS; s = s + 1u) {
        partials[lane * SUMS + s] = sums[s];
    }
    workgroupBarrier();
    // Thread i of a group adds up (token, row) pairs i, i + TPR, ... of it, every sum of each.
    let group_lane = lane - thread;
    for (var pair = thread; pair < TPW * RPT; pair = pair + TPR) {
        let t = pair / RPT;
        let r = pair % RPT;
        var total = 0.0;
        var up = 0.0;
        var total_squares = 0.0;
        for (var j = 0u; j < TPR; j = j + 1u) {
            let at = (group_lane + j) * SUMS + t * PER_TOKEN;
            total = total + partials[at + r];
            if (HALVES == 2u) {
                up = up + partials[at + up_slot(r)];
            }
            if (NORM == 1u) {
                total_squares = total_squares + partials[at + PER_TOKEN - 1u];
            }
        }
        write_row(t, first + r, total, up, norm_factor(total_squares));
    }
}
