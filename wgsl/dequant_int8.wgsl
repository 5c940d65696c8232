// Weight units as 8-bit integers, for the integer products (matvec_int8.wgsl). Appended after
// dequant.wgsl, whose loads and scale helpers it shares, and which defines the unit geometry:
// unit `unit` of a block is 32 values in four quarters of 8, quarter j being vec4s 2j and 2j + 1
// of dequant_unit's Unit (elements block_element(unit, 2j) .. + 8, consecutive in every type).
//
// An IntUnit holds each quarter's 8 values as integers q (4 to a word, signed bytes) with one
// scale and one offset: value = scale[j] * q + offset[j]. That is every integer type's own form
// (K-quants' sub-block scales and mins, the -8 and -16 of Q4_0 and Q5_0, a codebook's levels),
// so the dot product with 8-bit activations is exact in integers (dot4I8Packed) and the scales
// apply once per quarter. Float types have no case: the host keeps them on the f32 products.

struct IntUnit {
    // Words of quarters 0 and 1 (xy, zw), then of quarters 2 and 3.
    low: vec4<u32>,
    high: vec4<u32>,
    scale: vec4<f32>,
    offset: vec4<f32>,
}

fn nibbles_low(q: vec4<u32>) -> vec4<u32> {
    return q & vec4<u32>(0x0f0f0f0fu);
}

fn nibbles_high(q: vec4<u32>) -> vec4<u32> {
    return (q >> vec4<u32>(4u)) & vec4<u32>(0x0f0f0f0fu);
}

// Q4_0: value = d * q - 8d.
fn int_q4_0(block: u32) -> IntUnit {
    let d = f16_at(block);
    let q = words4_at2(block + 2u);
    return IntUnit(nibbles_low(q), nibbles_high(q), vec4<f32>(d), vec4<f32>(-8.0 * d));
}

// Q4_1: value = d * q + m.
fn int_q4_1(block: u32) -> IntUnit {
    let dm = unpack2x16float(word_at(block));
    let q = words4_at(block + 4u);
    return IntUnit(nibbles_low(q), nibbles_high(q), vec4<f32>(dm.x), vec4<f32>(dm.y));
}

// Q5_0: value = d * q - 16d, q with its fifth bit.
fn int_q5_0(block: u32) -> IntUnit {
    let d = f16_at(block);
    let qh = word_at2(block + 2u);
    let q = words4_at2(block + 6u);
    return IntUnit(nibbles_low(q) | fifth_bits4(qh), nibbles_high(q) | fifth_bits4(qh >> 16u),
                   vec4<f32>(d), vec4<f32>(-16.0 * d));
}

// Q5_1: value = d * q + m.
fn int_q5_1(block: u32) -> IntUnit {
    let dm = unpack2x16float(word_at(block));
    let qh = word_at(block + 4u);
    let q = words4_at(block + 8u);
    return IntUnit(nibbles_low(q) | fifth_bits4(qh), nibbles_high(q) | fifth_bits4(qh >> 16u),
                   vec4<f32>(dm.x), vec4<f32>(dm.y));
}

// Q8_0: the bytes are the integers already.
fn int_q8_0(block: u32) -> IntUnit {
    let d = f16_at(block);
    return IntUnit(words4_at2(block + 2u), words4_at2(block + 18u), vec4<f32>(d), vec4<f32>(0.0));
}

// Q4_K and Q5_K: quarters 0 and 1 are sub-block 2p's (low nibbles), 2 and 3 sub-block 2p + 1's.
fn int_k_quant(header: vec4<u32>, pair: u32, low: vec4<u32>, high: vec4<u32>) -> IntUnit {
    let dm = unpack2x16float(header.x);
    let scale_low = scale_min_k4(header.yzw, 2u * pair) * dm;
    let scale_high = scale_min_k4(header.yzw, 2u * pair + 1u) * dm;
    return IntUnit(low, high, vec4<f32>(scale_low.xx, scale_high.xx),
                   -vec4<f32>(scale_low.yy, scale_high.yy));
}

fn int_q4_k(block: u32, unit: u32) -> IntUnit {
    let pair = unit / 2u;
    let q = vec4_at(block + 16u + 32u * pair + 16u * (unit % 2u));
    return int_k_quant(vec4_at(block), pair, nibbles_low(q), nibbles_high(q));
}

fn int_q5_k(block: u32, unit: u32) -> IntUnit {
    let pair = unit / 2u;
    let q = vec4_at(block + 48u + 32u * pair + 16u * (unit % 2u));
    let h = vec4_at(block + 16u + 16u * (unit % 2u)) >> vec4<u32>(2u * pair);
    let ones = vec4<u32>(0x01010101u);
    let low = nibbles_low(q) | ((h & ones) << vec4<u32>(4u));
    let high = nibbles_high(q) | (((h >> vec4<u32>(1u)) & ones) << vec4<u32>(4u));
    return int_k_quant(vec4_at(block), pair, low, high);
}

// Q6_K: quarter j is shift j of the unit's bytes, with its own scale: value = s * q - 32s.
fn int_q6_k(block: u32, unit: u32) -> IntUnit {
    let d = f16_at(block + 208u);
    let half = unit / 4u;
    let l0 = 8u * (unit % 4u);
    let is = l0 / 16u;
    let scales_low = unpack4xI8(word_at2(block + 192u + 8u * half));
    let scales_high = unpack4xI8(word_at2(block + 196u + 8u * half));
    let scale = d * vec4<f32>(f32(scales_low[is]), f32(scales_low[is + 2u]),
                              f32(scales_high[is]), f32(scales_high[is + 2u]));
    let ql = block + 64u * half + l0;
    let a = vec2<u32>(word_at2(ql), word_at2(ql + 4u));
    let b = vec2<u32>(word_at2(ql + 32u), word_at2(ql + 36u));
    let qh = block + 128u + 32u * half + l0;
    let h = vec2<u32>(word_at2(qh), word_at2(qh + 4u));
    let nibble = vec2<u32>(0x0f0f0f0fu);
    let two = vec2<u32>(0x03030303u);
    let q1 = (a & nibble) | ((h & two) << vec2<u32>(4u));
    let q2 = (b & nibble) | (((h >> vec2<u32>(2u)) & two) << vec2<u32>(4u));
    let q3 = ((a >> vec2<u32>(4u)) & nibble) | (((h >> vec2<u32>(4u)) & two) << vec2<u32>(4u));
    let q4 = ((b >> vec2<u32>(4u)) & nibble) | (((h >> vec2<u32>(6u)) & two) << vec2<u32>(4u));
    return IntUnit(vec4<u32>(q1, q2), vec4<u32>(q3, q4), scale, -32.0 * scale);
}

// Q2_K: quarter j is shift 2j of the unit's bytes: value = d * scale * q - dmin * min.
fn int_q2_k(block: u32, unit: u32) -> IntUnit {
    let dm = unpack2x16float(word_at(block + 80u));
    let half = unit / 4u;
    let l0 = 8u * (unit % 4u);
    let q = vec2<u32>(word_at(block + 16u + 32u * half + l0), word_at(block + 20u + 32u * half + l0));
    let s = vec2<u32>(word_at(block + 8u * half), word_at(block + 8u * half + 4u));
    let at = 8u * (l0 / 16u);
    let packed = vec4<u32>(s.x >> at, s.x >> (at + 16u), s.y >> at, s.y >> (at + 16u)) & vec4<u32>(0xffu);
    let three = vec2<u32>(0x03030303u);
    let q0 = q & three;
    let q1 = (q >> vec2<u32>(2u)) & three;
    let q2 = (q >> vec2<u32>(4u)) & three;
    let q3 = (q >> vec2<u32>(6u)) & three;
    return IntUnit(vec4<u32>(q0, q1), vec4<u32>(q2, q3), dm.x * vec4<f32>(packed & vec4<u32>(0xfu)),
                   -dm.y * vec4<f32>(packed >> vec4<u32>(4u)));
}

// Q3_K: Q2_K's quarters with the third bit: value = d * scale * q - 4 * d * scale.
fn int_q3_k(block: u32, unit: u32) -> IntUnit {
    let d = f16_at(block + 108u);
    let half = unit / 4u;
    let l0 = 8u * (unit % 4u);
    let scales = vec3<u32>(word_at2(block + 96u), word_at2(block + 100u), word_at2(block + 104u));
    let first = 8u * half + l0 / 16u;
    let scale = d * vec4<f32>(q3_k_scale(scales, first), q3_k_scale(scales, first + 2u),
                              q3_k_scale(scales, first + 4u), q3_k_scale(scales, first + 6u));
    let qs = block + 32u + 32u * half + l0;
    let q = vec2<u32>(word_at2(qs), word_at2(qs + 4u));
    let h = vec2<u32>(word_at2(block + l0), word_at2(block + l0 + 4u)) >> vec2<u32>(4u * half);
    let three = vec2<u32>(0x03030303u);
    let ones = vec2<u32>(0x01010101u);
    let q0 = (q & three) | ((h & ones) << vec2<u32>(2u));
    let q1 = ((q >> vec2<u32>(2u)) & three) | (((h >> vec2<u32>(1u)) & ones) << vec2<u32>(2u));
    let q2 = ((q >> vec2<u32>(4u)) & three) | (((h >> vec2<u32>(2u)) & ones) << vec2<u32>(2u));
    let q3 = ((q >> vec2<u32>(6u)) & three) | (((h >> vec2<u32>(3u)) & ones) << vec2<u32>(2u));
    return IntUnit(vec4<u32>(q0, q1), vec4<u32>(q2, q3), scale, -4.0 * scale);
}

// The codebook levels of the four nibbles held one per byte of `nibbles`, as signed bytes.
fn iq4_level_bytes(nibbles: u32) -> u32 {
    return pack4xI8(vec4<i32>(vec4<f32>(iq4_level(nibbles & 0xfu), iq4_level((nibbles >> 8u) & 0xfu),
                                        iq4_level((nibbles >> 16u) & 0xfu), iq4_level(nibbles >> 24u))));
}

fn iq4_int_unit(q: vec4<u32>, scale: f32) -> IntUnit {
    let low = nibbles_low(q);
    let high = nibbles_high(q);
    return IntUnit(vec4<u32>(iq4_level_bytes(low.x), iq4_level_bytes(low.y),
                             iq4_level_bytes(low.z), iq4_level_bytes(low.w)),
                   vec4<u32>(iq4_level_bytes(high.x), iq4_level_bytes(high.y),
                             iq4_level_bytes(high.z), iq4_level_bytes(high.w)),
                   vec4<f32>(scale), vec4<f32>(0.0));
}

fn int_iq4_nl(block: u32) -> IntUnit {
    return iq4_int_unit(words4_at2(block + 2u), f16_at(block));
}

fn int_iq4_xs(block: u32, unit: u32) -> IntUnit {
    let header = word_at(block);
    let low = (word_at(block + 4u) >> (4u * unit)) & 0xfu;
    let high = (header >> (16u + 2u * unit)) & 3u;
    let scale = unpack2x16float(header).x * f32(i32(low | (high << 4u)) - 32);
    return iq4_int_unit(words4_at(block + 8u + 16u * unit), scale);
}

// Unit `unit` of the block starting at byte `block`, as integers.
fn int_unit(block: u32, unit: u32) -> IntUnit {
    switch QUANT {
        case QUANT_Q4_0: { return int_q4_0(block); }
        case QUANT_Q4_1: { return int_q4_1(block); }
        case QUANT_Q5_0: { return int_q5_0(block); }
        case QUANT_Q5_1: { return int_q5_1(block); }
        case QUANT_Q8_0: { return int_q8_0(block); }
        case QUANT_Q4_K: { return int_q4_k(block, unit); }
        case QUANT_Q5_K: { return int_q5_k(block, unit); }
        case QUANT_Q6_K: { return int_q6_k(block, unit); }
        case QUANT_Q2_K: { return int_q2_k(block, unit); }
        case QUANT_Q3_K: { return int_q3_k(block, unit); }
        case QUANT_IQ4_NL: { return int_iq4_nl(block); }
        case QUANT_IQ4_XS: { return int_iq4_xs(block, unit); }
        // Float types: the host never runs them here (`int8::integer_type`), and a table test
        // checks that every other type has its case above.
        default: { return IntUnit(); }
    }
}
