// Decode attention of a batched step (continuous batching): row r is one sequence's query at
// its own position, attending over its own slot of a KV pool. The k and v bindings are one
// layer of the whole pool; `rows[r]` gives row r's position and the vec4 where its slot's
// region begins. The work is attention_decode_core.wgsl's `attend`, grid (split, head, row).

struct Params {
    kv_heads: u32,
    heads: u32,
    start_pos: u32,
    // Rows of the step.
    tokens: u32,
    // Keys j with pos - j < window are visible; u32 max when there is no sliding window.
    window: u32,
    splits: u32,
    scale: f32,
    // tanh logit soft-capping when > 0.
    softcap: f32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> q: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> k_cache: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> v_cache: array<vec4<f32>>;
// (position, first vec4 of the row's slot region) per row.
@group(0) @binding(7) var<storage, read> rows: array<vec2<u32>>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    let entry = rows[wg.z];
    let row = wg.z * params.heads + wg.y;
    for (var i = lane; i < HD4; i = i + WG) {
        q_row[i] = q[row * HD4 + i] * params.scale;
    }
    workgroupBarrier();
    attend(wg.x, wg.y, wg.z, entry.x, entry.y, lane, false);
}
