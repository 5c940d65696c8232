// Rotary position embedding arithmetic (Lib::Rotary), shared by rope.wgsl and
// attention_decode_rope.wgsl so that both rotate to bit-identical values.

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
// not by pow; the same f32 products give bit-identical angles. `inverse` is 1 / the pair's
// frequency factor (ggml's freq_factors: Llama 3's rope_freqs, Phi-3's long/short factors; 1
// without), multiplying theta before the linear scale where ggml divides: WGSL's division may
// be 2.5 ulp off, a product is exact (and x * 1 changes nothing).
fn pair_theta(pos: u32, pair: u32, theta_scale: f32, freq_scale: f32, inverse: f32) -> f32 {
    var theta = f32(pos);
    for (var i = 0u; i < pair; i = i + 1u) {
        theta = theta * theta_scale;
    }
    return freq_scale * (theta * inverse);
}

// The two dims of `pair` in a head: (2i, 2i + 1) in the normal layout (llama), (i, i + pairs)
// in NeoX's (qwen2, gemma3).
fn pair_dims(pair: u32, pairs: u32, neox: bool) -> vec2<u32> {
    if (neox) {
        return vec2<u32>(pair, pair + pairs);
    }
    return vec2<u32>(2u * pair, 2u * pair + 1u);
}

// The two dims the lane for `pair` handles: a rotated pair by layout while pair < rope_dims / 2,
// else two neighbouring dims past rope_dims, which keep their values.
fn pair_slots(pair: u32, rope_dims: u32, neox: bool) -> vec2<u32> {
    let pairs = rope_dims / 2u;
    if (pair < pairs) {
        return pair_dims(pair, pairs, neox);
    }
    let d = rope_dims + 2u * (pair - pairs);
    return vec2<u32>(d, d + 1u);
}

// (cos, sin) of `pair`'s angle at position `pos`, times `mscale` (ggml's attn_factor; 1 is exact).
fn pair_turn(pos: u32, pair: u32, theta_scale: f32, freq_scale: f32, inverse: f32,
             mscale: f32) -> vec2<f32> {
    return angle_turn(pair_theta(pos, pair, theta_scale, freq_scale, inverse), mscale);
}

// (cos, sin) of `angle` (as pair_theta gives it), times `mscale`.
fn angle_turn(angle: f32, mscale: f32) -> vec2<f32> {
    let reduced = reduce_angle(angle);
    return vec2<f32>(cos(reduced) * mscale, sin(reduced) * mscale);
}

// (x0, x1) turned by (cos, sin), in ggml's order of operations.
fn turned(x: vec2<f32>, turn: vec2<f32>) -> vec2<f32> {
    return vec2<f32>(x.x * turn.x - x.y * turn.y, x.x * turn.y + x.y * turn.x);
}
