// attention_decode_rope.wgsl over a seat of a paged pool: the seat's page table (its ninth
// storage binding), and the vec4 where position `pos`'s row begins in the bound layer, in page
// pages[pos / PAGE] (region is 0: one sequence).
@group(0) @binding(9) var<storage, read> pages: array<u32>;

fn cache_row(region: u32, pos: u32) -> u32 {
    return (pages[pos / PAGE] * PAGE + pos % PAGE) * params.kv_heads * HD4;
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    rope_attend(wg.x, wg.y, 0u, params.start_pos, 0u, lane);
}
