// Rotary position embedding in place on [tokens, heads * head_dim], one invocation per rotated
// pair. Only the first rope_dims values of each head rotate; the rest are never touched.
// Normal layout (llama) rotates (2i, 2i + 1); NeoX (qwen2, gemma3) rotates (i, i + rope_dims/2).
// f32 in every variant: angles reach thousands of radians.

struct Params {
    tokens: u32,
    heads: u32,
    head_dim: u32,
    rope_dims: u32,
    start_pos: u32,
    neox: u32,
    // base^(-2 / rope_dims), computed on the host with the same powf as ggml.
    theta_scale: f32,
    freq_scale: f32,
    groups_x: u32,
    pad0: u32,
    pad1: u32,
    pad2: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;

// 2*pi split so that k * TWO_PI_HI is exact for k < 2^16 (Cody-Waite reduction): GPU sin/cos
// are only accurate near [-pi, pi], and the angles here are far larger.
const TWO_PI_HI: f32 = 6.28125;
const TWO_PI_MID: f32 = 0.0019353071693331003;
const TWO_PI_LO: f32 = 1.0253131677018246e-11;
const INV_TWO_PI: f32 = 0.15915493667125702;

fn reduce_angle(angle: f32) -> f32 {
    let k = round(angle * INV_TWO_PI);
    return ((angle - k * TWO_PI_HI) - k * TWO_PI_MID) - k * TWO_PI_LO;
}

// ggml builds theta by repeated multiplication (theta_0 = pos, theta_{i+1} = theta_i * scale),
// not by pow; the same f32 products give bit-identical angles.
fn pair_theta(pos: u32, pair: u32) -> f32 {
    var theta = f32(pos);
    for (var i = 0u; i < pair; i = i + 1u) {
        theta = theta * params.theta_scale;
    }
    return params.freq_scale * theta;
}

@compute @workgroup_size(WG)
fn rope(@builtin(workgroup_id) group: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    let pairs = params.rope_dims / 2u;
    let index = (group.y * params.groups_x + group.x) * WG + lane;
    if (index >= params.tokens * params.heads * pairs) {
        return;
    }
    let pair = index % pairs;
    let token_head = index / pairs;
    let token = token_head / params.heads;
    let angle = reduce_angle(pair_theta(params.start_pos + token, pair));
    let c = cos(angle);
    let s = sin(angle);
    var first = token_head * params.head_dim;
    var second = first;
    if (params.neox != 0u) {
        first = first + pair;
        second = first + pairs;
    } else {
        first = first + 2u * pair;
        second = first + 1u;
    }
    let x0 = x[first];
    let x1 = x[second];
    x[first] = x0 * c - x1 * s;
    x[second] = x0 * s + x1 * c;
}
