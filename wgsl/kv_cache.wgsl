// kv_write: copies `tokens` rows of new keys and values into one layer of the KV cache.
// A layer is [pos][kv_head][head_dim] f32, which is exactly the row-major layout of the
// projected k/v activations [tokens, kv_heads * head_dim], so the write is one contiguous run
// of vec4s starting at start_pos. The cache bindings are that layer's slice only. With
// PAGED = 1 the layer is a pool of pages of PAGE positions and position p lives in page
// pages[p / PAGE] (the sequence's own page table), so each row goes where its page is.

struct Params {
    // vec4s to copy: tokens * kv_heads * head_dim / 4.
    count: u32,
    // First destination vec4 inside the layer: start_pos * kv_heads * head_dim / 4.
    dst_offset: u32,
    // Workgroups along x; the grid is 2-D when one dimension would exceed the device limit.
    groups_x: u32,
    // vec4s of one position's row: kv_heads * head_dim / 4.
    row_vec4s: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> k_src: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> v_src: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> k_dst: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read_write> v_dst: array<vec4<f32>>;
// PAGED = 1: the sequence's pages; a placeholder otherwise.
@group(0) @binding(5) var<storage, read> pages: array<u32>;

// Where vec4 `index` of the rows written lands in the layer.
fn destination(index: u32) -> u32 {
    if (PAGED == 0u) {
        return params.dst_offset + index;
    }
    let pos = params.dst_offset / params.row_vec4s + index / params.row_vec4s;
    let row = pages[pos / PAGE] * PAGE + pos % PAGE;
    return row * params.row_vec4s + index % params.row_vec4s;
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) group: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    let index = (group.y * params.groups_x + group.x) * WG + lane;
    if (index < params.count) {
        let to = destination(index);
        k_dst[to] = k_src[index];
        v_dst[to] = v_src[index];
    }
}
