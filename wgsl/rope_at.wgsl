// Rotary position embedding in place on [tokens, heads * head_dim] with each token's position
// read from `positions`: several sequences packed into one call (an encoder's batch), each
// counting from 0. The rope entry of rope.wgsl otherwise (one invocation per rotated pair, the
// angle arithmetic Lib::Rotary's, f32 in every variant, no frequency factors); a file of its
// own because rope.wgsl's rope_store already uses the eight storage bindings WebGPU grants.

struct Params {
    tokens: u32,
    heads: u32,
    head_dim: u32,
    rope_dims: u32,
    neox: u32,
    // base^(-2 / rope_dims), computed on the host with the same powf as ggml.
    theta_scale: f32,
    freq_scale: f32,
    groups_x: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read> positions: array<u32>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) group: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    let pairs = params.rope_dims / 2u;
    let index = (group.y * params.groups_x + group.x) * WG + lane;
    if (index >= params.tokens * params.heads * pairs) {
        return;
    }
    let pair = index % pairs;
    let token_head = index / pairs;
    let token = token_head / params.heads;
    let turn = pair_turn(positions[token], pair, params.theta_scale, params.freq_scale, 1.0, 1.0);
    let dims = token_head * params.head_dim + pair_dims(pair, pairs, params.neox != 0u);
    let values = turned(vec2<f32>(x[dims.x], x[dims.y]), turn);
    x[dims.x] = values.x;
    x[dims.y] = values.y;
}
