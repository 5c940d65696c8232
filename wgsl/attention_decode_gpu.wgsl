// Decode attention for discrete GPUs with every key already in the cache: q comes from a
// buffer. The work is attention_decode_core.wgsl's `attend`.

@group(0) @binding(1) var<storage, read> q: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> k_cache: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> v_cache: array<vec4<f32>>;

// The vec4 where position `pos`'s cache row begins: every key of this entry's cache is at
// its own position of the bound layer.
fn cache_row(region: u32, pos: u32) -> u32 {
    return region + pos * params.kv_heads * HD4;
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    let row = wg.z * params.heads + wg.y;
    for (var i = lane; i < HD4; i = i + WG) {
        q_row[i] = q[row * HD4 + i] * params.scale;
    }
    workgroupBarrier();
    attend(wg.x, wg.y, wg.z, params.start_pos + wg.z, 0u, lane, false);
}
