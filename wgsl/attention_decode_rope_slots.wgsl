// attention_decode_rope.wgsl over one sequence's contiguous cache: the vec4 where position
// `pos`'s row begins in the bound layer (region is 0: one sequence).
fn cache_row(region: u32, pos: u32) -> u32 {
    return region + pos * params.kv_heads * HD4;
}
