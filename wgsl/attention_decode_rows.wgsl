// Decode attention of a batched step (continuous batching): row r is one sequence's query at
// its own position, attending over its own slot of a KV pool or its own pages. The k and v
// bindings are one layer of the whole pool; words 2r and 2r + 1 of `rows` give row r's
// position and its region: with PAGED = 0 the vec4 where its slot begins, with PAGED = 1 the
// word of `rows` where its page table begins (the pool's page tables follow the row words in
// the same buffer), position p being in page table[p / PAGE]. The work is
// attention_decode_core.wgsl's `attend`, grid (split, head, row).

@group(0) @binding(1) var<storage, read> q: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> k_cache: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> v_cache: array<vec4<f32>>;
// (position, region) per row; with PAGED = 1, the page tables after them.
@group(0) @binding(7) var<storage, read> rows: array<u32>;

// PAGED = 1: the cache rows of the keys this workgroup attends, looked up once before `attend`
// (`look_up_keys`) rather than in each pass: a lookup per key and pass made llvmpipe's 4- and
// 8-row steps 8-11% slower. ROWS_HELD is KPS then, 1 otherwise.
var<workgroup> key_rows: array<u32, ROWS_HELD>;
// The position of key_rows[0].
var<private> first_key: u32;

fn cache_row(region: u32, pos: u32) -> u32 {
    if (PAGED == 0u) {
        return region + pos * params.kv_heads * HD4;
    }
    return key_rows[pos - first_key];
}

// Fills key_rows for split `split` of a query at `position`: the share of its keys `attend`
// takes (`split_keys`), each through its page. At most KPS keys: the host splits so.
fn look_up_keys(split: u32, position: u32, region: u32, lane: u32) {
    let keys = split_keys(split, position);
    first_key = keys.x;
    let row_stride = params.kv_heads * HD4;
    for (var i = lane; i < keys.y; i = i + WG) {
        let pos = keys.x + i;
        key_rows[i] = (rows[region + pos / PAGE] * PAGE + pos % PAGE) * row_stride;
    }
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    let position = rows[2u * wg.z];
    let region = rows[2u * wg.z + 1u];
    let row = wg.z * params.heads + wg.y;
    for (var i = lane; i < HD4; i = i + WG) {
        q_row[i] = q[row * HD4 + i] * params.scale;
    }
    if (PAGED == 1u) {
        look_up_keys(wg.x, position, region, lane);
    }
    workgroupBarrier();
    attend(wg.x, wg.y, wg.z, position, region, lane, false);
}
