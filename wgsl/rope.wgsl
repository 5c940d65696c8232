// Rotary position embedding in place on [tokens, heads * head_dim], one invocation per rotated
// pair. Only the first rope_dims values of each head rotate; the rest are never touched.
// Normal layout (llama) rotates (2i, 2i + 1); NeoX (qwen2, gemma3) rotates (i, i + rope_dims/2).
// f32 in every variant: angles reach thousands of radians. The angle arithmetic is Lib::Rotary's.

struct Params {
    tokens: u32,
    heads: u32,
    head_dim: u32,
    rope_dims: u32,
    start_pos: u32,
    neox: u32,
    // base^(-2 / rope_dims), computed on the host with the same powf as ggml.
    theta_scale: f32,
    freq_scale: f32,
    groups_x: u32,
    // rope_store only: kv heads, whether q and k rows are RMS-normalised first (Gemma 3's
    // per-head norms), the norm's epsilon, and the cache element where position start_pos
    // begins in the layer.
    kv_heads: u32,
    norm: u32,
    eps: f32,
    cache_offset: u32,
    // rope_store only: where q, k and v begin in their bindings (one buffer may hold all three).
    q_offset: u32,
    k_offset: u32,
    v_offset: u32,
    // 1: pair i's angle is multiplied by inverse_factors[i], 1 / ggml's freq_factors[i]
    // (Llama 3's rope_freqs, Phi-3's long or short factors; see RopeScaling); 0: by 1, unread.
    scaled: u32,
    // Magnitude of cos and sin (ggml's attn_factor, Phi-3's long-context factor); 1 without.
    mscale: f32,
    pad0: u32,
    pad1: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read> inverse_factors: array<f32>;

// (cos, sin) of `pair` at `pos` with this dispatch's frequency factor and magnitude.
fn scaled_turn(pos: u32, pair: u32) -> vec2<f32> {
    var inverse = 1.0;
    if (params.scaled == 1u) {
        inverse = inverse_factors[pair];
    }
    return pair_turn(pos, pair, params.theta_scale, params.freq_scale, inverse, params.mscale);
}

@compute @workgroup_size(WG)
fn rope(@builtin(workgroup_id) group: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    let pairs = params.rope_dims / 2u;
    let index = (group.y * params.groups_x + group.x) * WG + lane;
    if (index >= params.tokens * params.heads * pairs) {
        return;
    }
    let pair = index % pairs;
    let token_head = index / pairs;
    let token = token_head / params.heads;
    let turn = scaled_turn(params.start_pos + token, pair);
    let dims = token_head * params.head_dim + pair_dims(pair, pairs, params.neox != 0u);
    let values = turned(vec2<f32>(x[dims.x], x[dims.y]), turn);
    x[dims.x] = values.x;
    x[dims.y] = values.y;
}

// rope_store: a decode step's whole q/k/v epilogue in one dispatch. Workgroup (row, token)
// takes one head row: rows [0, heads) are q heads, rotated in place in x; the next kv_heads
// rows are k heads, rotated and written into the layer's key cache; the last kv_heads rows are
// v heads, copied into the value cache. With norm = 1, q and k rows are first RMS-normalised
// with their per-head weights, as rms_norm computes it. The rotation is the rope entry's.
// With PACKED = 1, k and v are sections of x's buffer (a decode step's q/k/v land in one), read
// through x: WebGPU refuses a buffer bound twice in a dispatch when one binding is writable.
// The rope_store_rows entry is the same for a batched decode step: token t is row t, at its own
// position in its own slot of a KV pool (the caches bound are the pool's whole layers):
// row_table[2t] is the position, row_table[2t + 1] the slot's first vec4 (`attention::row_table`),
// or with PAGED = 1 where the row's page table begins in row_table (position p in page
// table[p / PAGE] of PAGE positions); start_pos and cache_offset are unused. Only that entry binds the table, so rope_store stays
// within WebGPU's default of 8 storage buffers.
@group(0) @binding(3) var<storage, read> k_new: array<f32>;
@group(0) @binding(4) var<storage, read> v_new: array<f32>;

fn k_at(i: u32) -> f32 {
    if (PACKED == 1u) {
        return x[params.k_offset + i];
    }
    return k_new[params.k_offset + i];
}

fn v_at(i: u32) -> f32 {
    if (PACKED == 1u) {
        return x[params.v_offset + i];
    }
    return v_new[params.v_offset + i];
}
@group(0) @binding(5) var<storage, read_write> k_cache: array<f32>;
@group(0) @binding(6) var<storage, read_write> v_cache: array<f32>;
@group(0) @binding(7) var<storage, read> q_norm: array<f32>;
@group(0) @binding(8) var<storage, read> k_norm: array<f32>;
@group(0) @binding(9) var<storage, read> row_table: array<u32>;

// A q row's value d, normalised when asked.
fn q_value(base: u32, d: u32, scale: f32) -> f32 {
    if (params.norm == 1u) {
        return (x[params.q_offset + base + d] * scale) * q_norm[d];
    }
    return x[params.q_offset + base + d];
}

fn k_value(base: u32, d: u32, scale: f32) -> f32 {
    if (params.norm == 1u) {
        return (k_at(base + d) * scale) * k_norm[d];
    }
    return k_at(base + d);
}

// Lanes whose strided partial sums make a norm's sum of squares, the same in
// attention_decode_rope.wgsl: a head normalised here (a batched step's rows) and there (its
// single step) then has the same bits, which integer products need (a last-bit difference can
// round a value of x to the next integer).
const NORM_LANES: u32 = 64u;
const_assert WG >= NORM_LANES;

// The RMS scale of a q (is_q) or k row; every lane of the workgroup must call it.
fn row_scale(is_q: bool, base: u32, lane: u32) -> f32 {
    if (params.norm == 0u) {
        return 1.0;
    }
    var squares = 0.0;
    for (var d = lane; d < params.head_dim && lane < NORM_LANES; d = d + NORM_LANES) {
        let value = select(k_at(base + d), x[params.q_offset + base + d], is_q);
        squares = squares + value * value;
    }
    let total = reduce_sum(squares, lane);
    return 1.0 / sqrt(total / f32(params.head_dim) + params.eps);
}

@compute @workgroup_size(WG)
fn rope_store(@builtin(workgroup_id) group: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    let token = group.y;
    let kv_row = params.kv_heads * params.head_dim;
    let place = vec2<u32>(params.start_pos + token, params.cache_offset + token * kv_row);
    store_head_row(group.x, token, place, lane);
}

@compute @workgroup_size(WG)
fn rope_store_rows(@builtin(workgroup_id) group: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    let token = group.y;
    let kv_row = params.kv_heads * params.head_dim;
    let pos = row_table[2u * token];
    let region = row_table[2u * token + 1u];
    var row = region * 4u + pos * kv_row;
    if (PAGED == 1u) {
        row = (row_table[region + pos / PAGE] * PAGE + pos % PAGE) * kv_row;
    }
    let place = vec2<u32>(pos, row);
    store_head_row(group.x, token, place, lane);
}

// rope_store on a seat of a paged pool (a prompt or a lone token through the HTTP API):
// row_table is the seat's page table, position p in page row_table[p / PAGE]; cache_offset is
// unused. An entry of its own, so that rope_store binds no table.
@compute @workgroup_size(WG)
fn rope_store_pages(@builtin(workgroup_id) group: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    let token = group.y;
    let kv_row = params.kv_heads * params.head_dim;
    let pos = params.start_pos + token;
    let row = (row_table[pos / PAGE] * PAGE + pos % PAGE) * kv_row;
    store_head_row(group.x, token, vec2<u32>(pos, row), lane);
}

// Head row `row` of token `token` (q rotated in place, k rotated into the cache, v copied into
// it), the token at position place.x with its k and v rows at cache element place.y.
fn store_head_row(row: u32, token: u32, place: vec2<u32>, lane: u32) {
    let hd = params.head_dim;
    let kv_row = params.kv_heads * hd;
    if (row >= params.heads + params.kv_heads) {
        let head = row - params.heads - params.kv_heads;
        let src = token * kv_row + head * hd;
        for (var d = lane; d < hd; d = d + WG) {
            v_cache[place.y + head * hd + d] = v_at(src + d);
        }
        return;
    }
    let is_q = row < params.heads;
    let head = select(row - params.heads, row, is_q);
    let base = select(token * kv_row + head * hd, (token * params.heads + head) * hd, is_q);
    // Uniform per workgroup, so the reduction's barriers are reached by every lane or none.
    let scale = row_scale(is_q, base, lane);
    let pairs = params.rope_dims / 2u;
    let pos = place.x;
    for (var pair = lane; pair < hd / 2u; pair = pair + WG) {
        let dims = pair_slots(pair, params.rope_dims, params.neox != 0u);
        let x0 = select(k_value(base, dims.x, scale), q_value(base, dims.x, scale), is_q);
        let x1 = select(k_value(base, dims.y, scale), q_value(base, dims.y, scale), is_q);
        var results = vec2<f32>(x0, x1);
        if (pair < pairs) {
            results = turned(results, scaled_turn(pos, pair));
        }
        if (is_q) {
            x[params.q_offset + base + dims.x] = results.x;
            x[params.q_offset + base + dims.y] = results.y;
        } else {
            k_cache[place.y + head * hd + dims.x] = results.x;
            k_cache[place.y + head * hd + dims.y] = results.y;
        }
    }
}
