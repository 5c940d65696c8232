// What both prefill attention kernels (attention_prefill.wgsl, FP32, and
// attention_prefill_coop.wgsl, cooperative matrices) share: their bindings, which keys a query
// sees, and where a position lives in the cache. Reads attention_params.wgsl's parameters, the
// constants SEGMENTS, CAUSAL, PAGED and PAGE, and attention_mask.wgsl's first_visible.

@group(0) @binding(1) var<storage, read> q: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> k_cache: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> v_cache: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read_write> out: array<vec4<f32>>;
@group(0) @binding(5) var<storage, read_write> partial_acc: array<vec4<f32>>;
@group(0) @binding(6) var<storage, read_write> partial_stats: array<vec2<f32>>;
// SEGMENTS = 1: the first and last key of each token's sequence; a placeholder otherwise.
@group(0) @binding(7) var<storage, read> segments: array<vec2<u32>>;
// PAGED = 1: the sequence's pages; a placeholder otherwise.
@group(0) @binding(8) var<storage, read> pages: array<u32>;

// The first and last key the query of `token` sees. Both grow with the token in every mode
// (sequences are packed in order), so a workgroup's keys run from its first token's first key
// to its last token's last key.
fn visible_keys(token: u32) -> vec2<u32> {
    if (SEGMENTS == 1u) {
        return segments[token];
    }
    let pos = params.start_pos + token;
    let all_keys = params.start_pos + params.tokens - 1u;
    return vec2<u32>(first_visible(pos, params.window), select(all_keys, pos, CAUSAL == 1u));
}

// The cache row of position `pos`.
fn cache_row(pos: u32) -> u32 {
    if (PAGED == 0u) {
        return pos;
    }
    return pages[pos / PAGE] * PAGE + pos % PAGE;
}
