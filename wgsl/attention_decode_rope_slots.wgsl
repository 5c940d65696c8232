// attention_decode_rope.wgsl over one sequence's contiguous cache: the vec4 where position
// `pos`'s row begins in the bound layer (region is 0: one sequence).
fn cache_row(region: u32, pos: u32) -> u32 {
    return region + pos * params.kv_heads * HD4;
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    rope_attend(wg.x, wg.y, 0u, params.start_pos, 0u, lane);
}
