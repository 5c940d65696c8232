// Where a batched step's rows keep their keys (attention_decode_rows.wgsl and
// attention_decode_rope_rows.wgsl, which declare the `rows` binding): words 2r and 2r + 1 of
// `rows` give row r's position and its region: with PAGED = 0 the vec4 where its slot begins in
// the bound layer of the pool, with PAGED = 1 the word of `rows` where its page table begins
// (the pool's page tables follow the row words in the same buffer), position p being in page
// table[p / PAGE].

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
// takes (`split_keys`), each through its page. At most KPS keys: the host splits so. Every
// lane must call it, and a barrier must follow before `cache_row`.
fn look_up_keys(split: u32, position: u32, region: u32, lane: u32) {
    let keys = split_keys(split, position);
    first_key = keys.x;
    let row_stride = params.kv_heads * HD4;
    for (var i = lane; i < keys.y; i = i + WG) {
        let pos = keys.x + i;
        key_rows[i] = (rows[region + pos / PAGE] * PAGE + pos % PAGE) * row_stride;
    }
}
