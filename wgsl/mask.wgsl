// Constrained decoding on the GPU: every logit whose token the allowed set leaves out becomes
// -inf, so the argmax and top-k kernels that follow pick among the allowed tokens only and the
// host reads back just their result. The allowed set is a bitset: bit i % 32 of word i / 32
// allows token i; ids at or past `n` are never touched. One lane per word, so a whole word of
// allowed ids (most of the vocabulary inside a JSON string) costs one load.

struct Params {
    // Logits (the vocabulary, padded heads included).
    n: u32,
    pad0: u32,
    pad1: u32,
    pad2: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
// n.div_ceil(32) words.
@group(0) @binding(1) var<storage, read> allowed: array<u32>;
@group(0) @binding(2) var<storage, read_write> logits: array<f32>;

@compute @workgroup_size(64)
fn mask_logits(@builtin(global_invocation_id) id: vec3<u32>) {
    let begin = id.x * 32u;
    if (begin >= params.n) {
        return;
    }
    let bits = allowed[id.x];
    if (bits == 0xffffffffu) {
        return;
    }
    // Through a variable: WGSL forbids infinities in const-expressions (Tint enforces it).
    var negative_infinity = 0xff800000u;
    let end = min(begin + 32u, params.n);
    for (var i = begin; i < end; i = i + 1u) {
        if ((bits & (1u << (i - begin))) == 0u) {
            logits[i] = bitcast<f32>(negative_infinity);
        }
    }
}
