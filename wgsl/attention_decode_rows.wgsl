// Decode attention of a batched step (continuous batching): row r is one sequence's query at
// its own position, attending over its own slot of a KV pool or its own pages
// (attention_rows_table.wgsl). The k and v bindings are one layer of the whole pool. The work
// is attention_decode_core.wgsl's `attend`, grid (split, head, row).

@group(0) @binding(1) var<storage, read> q: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> k_cache: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> v_cache: array<vec4<f32>>;
// (position, region) per row; with PAGED = 1, the page tables after them.
@group(0) @binding(7) var<storage, read> rows: array<u32>;

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
