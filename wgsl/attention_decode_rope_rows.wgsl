// attention_decode_rope.wgsl over a batched step's rows, grid (split, head, row): row r is one
// sequence's new token at its own position in its own slot or seat of one pool (the caches
// bound are the pool's whole layers), found through the row table (attention_rows_table.wgsl),
// its ninth storage binding. The rows must be of distinct sequences: a row's new key reaches
// the cache only as this dispatch ends, so another row of its sequence would not see it.
@group(0) @binding(9) var<storage, read> rows: array<u32>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    let position = rows[2u * wg.z];
    let region = rows[2u * wg.z + 1u];
    if (PAGED == 1u) {
        look_up_keys(wg.x, position, region, lane);
    }
    // rope_attend's first barrier comes before its first `cache_row`.
    rope_attend(wg.x, wg.y, wg.z, position, region, lane);
}
