// kv_write: copies `tokens` rows of new keys and values into one layer of the KV cache.
// A layer is [pos][kv_head][head_dim] f32, which is exactly the row-major layout of the
// projected k/v activations [tokens, kv_heads * head_dim], so the write is one contiguous run
// of vec4s starting at start_pos. The cache bindings are that layer's slice only.

struct Params {
    // vec4s to copy: tokens * kv_heads * head_dim / 4.
    count: u32,
    // First destination vec4 inside the layer: start_pos * kv_heads * head_dim / 4.
    dst_offset: u32,
    // Workgroups along x; the grid is 2-D when one dimension would exceed the device limit.
    groups_x: u32,
    pad0: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> k_src: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> v_src: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> k_dst: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read_write> v_dst: array<vec4<f32>>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) group: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    let index = (group.y * params.groups_x + group.x) * WG + lane;
    if (index < params.count) {
        k_dst[params.dst_offset + index] = k_src[index];
        v_dst[params.dst_offset + index] = v_src[index];
    }
}
