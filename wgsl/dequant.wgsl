// Dequantization of GGUF blocks read straight from their raw bytes.
//
// The kernel declares `weights: array<u32>` (the bytes of one weight part) and the constants
// QUANT (type code, see QuantType::code), BLOCK (elements per block; 32 for float types),
// BLOCK_BYTES and UNITS (= BLOCK / 32). A block is cut into UNITS "units" of 32 values each:
// `dequant_unit(block_byte, unit)` returns them as 8 vec4s, and vec4 `i` holds the 4
// consecutive elements starting at `block_element(unit, i)` of the block. The units of a block
// are chosen so that each reads a contiguous slice of bytes and both nibbles of each byte it
// loads; for K-quants that makes a unit's elements non-contiguous.
//
// Blocks of 18, 22, 34 and 210 bytes are only 2-byte aligned, so those loads funnel two words.

alias Unit = array<vec4<f32>, 8>;

// The u32 starting at a 4-byte aligned byte offset.
fn word_at(byte: u32) -> u32 {
    return weights[byte >> 2u];
}

// The u32 starting at a 2-byte aligned byte offset.
fn word_at2(byte: u32) -> u32 {
    let index = byte >> 2u;
    let low = weights[index];
    if ((byte & 2u) == 0u) {
        return low;
    }
    return (low >> 16u) | (weights[index + 1u] << 16u);
}

// The f16 at a 2-byte aligned byte offset.
fn f16_at(byte: u32) -> f32 {
    return unpack2x16float(weights[byte >> 2u] >> ((byte & 2u) * 8u)).x;
}

fn bytes_of(word: u32) -> vec4<f32> {
    return vec4<f32>(unpack4xU8(word));
}

fn low_nibbles(word: u32) -> u32 {
    return word & 0x0f0f0f0fu;
}

fn high_nibbles(word: u32) -> u32 {
    return (word >> 4u) & 0x0f0f0f0fu;
}

// Bits 0..3 of `bits`, moved to bit 4 of bytes 0..3 (the fifth bit of four 5-bit quants).
fn fifth_bits(bits: u32) -> u32 {
    return (((bits & 0xfu) * 0x00204081u) & 0x01010101u) << 4u;
}

fn unit_f32(block: u32) -> Unit {
    let base = block >> 2u;
    var v: Unit;
    for (var i = 0u; i < 8u; i = i + 1u) {
        let w = base + 4u * i;
        v[i] = bitcast<vec4<f32>>(vec4<u32>(weights[w], weights[w + 1u], weights[w + 2u], weights[w + 3u]));
    }
    return v;
}

fn unit_f16(block: u32) -> Unit {
    let base = block >> 2u;
    var v: Unit;
    for (var i = 0u; i < 8u; i = i + 1u) {
        let w = base + 2u * i;
        v[i] = vec4<f32>(unpack2x16float(weights[w]), unpack2x16float(weights[w + 1u]));
    }
    return v;
}

fn bf16_pair(word: u32) -> vec2<f32> {
    return vec2<f32>(bitcast<f32>(word << 16u), bitcast<f32>(word & 0xffff0000u));
}

fn unit_bf16(block: u32) -> Unit {
    let base = block >> 2u;
    var v: Unit;
    for (var i = 0u; i < 8u; i = i + 1u) {
        let w = base + 2u * i;
        v[i] = vec4<f32>(bf16_pair(weights[w]), bf16_pair(weights[w + 1u]));
    }
    return v;
}

// Q4_0: d, qs[16]; value = (q - 8) * d. Word k of qs holds elements 4k.. (low) and 16 + 4k..
fn unit_q4_0(block: u32) -> Unit {
    let d = f16_at(block);
    let offset = -8.0 * d;
    var v: Unit;
    for (var k = 0u; k < 4u; k = k + 1u) {
        let q = word_at2(block + 2u + 4u * k);
        v[k] = fma(bytes_of(low_nibbles(q)), vec4<f32>(d), vec4<f32>(offset));
        v[k + 4u] = fma(bytes_of(high_nibbles(q)), vec4<f32>(d), vec4<f32>(offset));
    }
    return v;
}

// Q4_1: d, m, qs[16]; value = q * d + m.
fn unit_q4_1(block: u32) -> Unit {
    let dm = unpack2x16float(word_at(block));
    var v: Unit;
    for (var k = 0u; k < 4u; k = k + 1u) {
        let q = word_at(block + 4u + 4u * k);
        v[k] = fma(bytes_of(low_nibbles(q)), vec4<f32>(dm.x), vec4<f32>(dm.y));
        v[k + 4u] = fma(bytes_of(high_nibbles(q)), vec4<f32>(dm.x), vec4<f32>(dm.y));
    }
    return v;
}

// Q5_0: d, qh (32 fifth bits), qs[16]; value = (q - 16) * d.
fn unit_q5_0(block: u32) -> Unit {
    let d = f16_at(block);
    let offset = -16.0 * d;
    let qh = word_at2(block + 2u);
    var v: Unit;
    for (var k = 0u; k < 4u; k = k + 1u) {
        let q = word_at2(block + 6u + 4u * k);
        let low = low_nibbles(q) | fifth_bits(qh >> (4u * k));
        let high = high_nibbles(q) | fifth_bits(qh >> (16u + 4u * k));
        v[k] = fma(bytes_of(low), vec4<f32>(d), vec4<f32>(offset));
        v[k + 4u] = fma(bytes_of(high), vec4<f32>(d), vec4<f32>(offset));
    }
    return v;
}

// Q5_1: d, m, qh, qs[16]; value = q * d + m.
fn unit_q5_1(block: u32) -> Unit {
    let dm = unpack2x16float(word_at(block));
    let qh = word_at(block + 4u);
    var v: Unit;
    for (var k = 0u; k < 4u; k = k + 1u) {
        let q = word_at(block + 8u + 4u * k);
        let low = low_nibbles(q) | fifth_bits(qh >> (4u * k));
        let high = high_nibbles(q) | fifth_bits(qh >> (16u + 4u * k));
        v[k] = fma(bytes_of(low), vec4<f32>(dm.x), vec4<f32>(dm.y));
        v[k + 4u] = fma(bytes_of(high), vec4<f32>(dm.x), vec4<f32>(dm.y));
    }
    return v;
}

// Q8_0: d, qs[32] signed.
fn unit_q8_0(block: u32) -> Unit {
    let d = f16_at(block);
    var v: Unit;
    for (var k = 0u; k < 8u; k = k + 1u) {
        v[k] = vec4<f32>(unpack4xI8(word_at2(block + 2u + 4u * k))) * d;
    }
    return v;
}

fn scale_byte(scales: vec3<u32>, index: u32) -> u32 {
    return (scales[index / 4u] >> (8u * (index % 4u))) & 0xffu;
}

// ggml's get_scale_min_k4: (scale, min) of sub-block j from the 12 packed scale bytes.
fn scale_min_k4(scales: vec3<u32>, j: u32) -> vec2<f32> {
    if (j < 4u) {
        return vec2<f32>(f32(scale_byte(scales, j) & 63u), f32(scale_byte(scales, j + 4u) & 63u));
    }
    let packed = scale_byte(scales, j + 4u);
    let scale = (packed & 0xfu) | ((scale_byte(scales, j - 4u) >> 6u) << 4u);
    let min = (packed >> 4u) | ((scale_byte(scales, j) >> 6u) << 4u);
    return vec2<f32>(f32(scale), f32(min));
}

// Q4_K unit u: pair p = u / 2 of sub-blocks (2p low nibbles, 2p + 1 high nibbles), half h =
// u % 2 of its 32 qs bytes. Elements 64p + 16h + 0..16 and 64p + 32 + 16h + 0..16.
fn unit_q4_k(block: u32, unit: u32) -> Unit {
    let dm = unpack2x16float(word_at(block));
    let scales = vec3<u32>(word_at(block + 4u), word_at(block + 8u), word_at(block + 12u));
    let pair = unit / 2u;
    let low = scale_min_k4(scales, 2u * pair) * dm;
    let high = scale_min_k4(scales, 2u * pair + 1u) * dm;
    let qs = block + 16u + 32u * pair + 16u * (unit % 2u);
    var v: Unit;
    for (var k = 0u; k < 4u; k = k + 1u) {
        let q = word_at(qs + 4u * k);
        v[k] = fma(bytes_of(low_nibbles(q)), vec4<f32>(low.x), vec4<f32>(-low.y));
        v[k + 4u] = fma(bytes_of(high_nibbles(q)), vec4<f32>(high.x), vec4<f32>(-high.y));
    }
    return v;
}

// Q5_K: Q4_K's layout plus qh[32]; the fifth bit of element l of pair p is bit 2p (low
// nibbles) or 2p + 1 (high nibbles) of qh[l].
fn unit_q5_k(block: u32, unit: u32) -> Unit {
    let dm = unpack2x16float(word_at(block));
    let scales = vec3<u32>(word_at(block + 4u), word_at(block + 8u), word_at(block + 12u));
    let pair = unit / 2u;
    let low = scale_min_k4(scales, 2u * pair) * dm;
    let high = scale_min_k4(scales, 2u * pair + 1u) * dm;
    let qh = block + 16u + 16u * (unit % 2u);
    let qs = block + 48u + 32u * pair + 16u * (unit % 2u);
    var v: Unit;
    for (var k = 0u; k < 4u; k = k + 1u) {
        let q = word_at(qs + 4u * k);
        let h = word_at(qh + 4u * k) >> (2u * pair);
        let q_low = low_nibbles(q) | ((h & 0x01010101u) << 4u);
        let q_high = high_nibbles(q) | (((h >> 1u) & 0x01010101u) << 4u);
        v[k] = fma(bytes_of(q_low), vec4<f32>(low.x), vec4<f32>(-low.y));
        v[k + 4u] = fma(bytes_of(q_high), vec4<f32>(high.x), vec4<f32>(-high.y));
    }
    return v;
}

// Q6_K: ql[128], qh[64], scales[16] (i8), d. Unit u covers half n = u / 4 and l in
// l0 = 8 * (u % 4) .. l0 + 8, i.e. elements 128n + l0 + 32j + 0..8 for the quarters j = 0..3.
// The 6-bit quants are assembled four at a time with byte-parallel word operations.
fn unit_q6_k(block: u32, unit: u32) -> Unit {
    let d = f16_at(block + 208u);
    let half = unit / 4u;
    let l0 = 8u * (unit % 4u);
    let is = l0 / 16u;
    let scales_low = unpack4xI8(word_at2(block + 192u + 8u * half));
    let scales_high = unpack4xI8(word_at2(block + 196u + 8u * half));
    let scale = d * vec4<f32>(f32(scales_low[is]), f32(scales_low[is + 2u]),
                              f32(scales_high[is]), f32(scales_high[is + 2u]));
    let offset = -32.0 * scale;
    var v: Unit;
    for (var i = 0u; i < 2u; i = i + 1u) {
        let l = l0 + 4u * i;
        let a = word_at2(block + 64u * half + l);
        let b = word_at2(block + 64u * half + 32u + l);
        let h = word_at2(block + 128u + 32u * half + l);
        let q1 = low_nibbles(a) | ((h & 0x03030303u) << 4u);
        let q2 = low_nibbles(b) | (((h >> 2u) & 0x03030303u) << 4u);
        let q3 = high_nibbles(a) | (((h >> 4u) & 0x03030303u) << 4u);
        let q4 = high_nibbles(b) | (((h >> 6u) & 0x03030303u) << 4u);
        v[i] = fma(bytes_of(q1), vec4<f32>(scale.x), vec4<f32>(offset.x));
        v[i + 2u] = fma(bytes_of(q2), vec4<f32>(scale.y), vec4<f32>(offset.y));
        v[i + 4u] = fma(bytes_of(q3), vec4<f32>(scale.z), vec4<f32>(offset.z));
        v[i + 6u] = fma(bytes_of(q4), vec4<f32>(scale.w), vec4<f32>(offset.w));
    }
    return v;
}

// The 32 values of unit `unit` of the block starting at byte `block` of `weights`.
fn dequant_unit(block: u32, unit: u32) -> Unit {
    switch QUANT {
        case 0u: { return unit_f32(block); }
        case 1u: { return unit_f16(block); }
        case 2u: { return unit_bf16(block); }
        case 3u: { return unit_q4_0(block); }
        case 4u: { return unit_q4_1(block); }
        case 5u: { return unit_q5_0(block); }
        case 6u: { return unit_q5_1(block); }
        case 7u: { return unit_q8_0(block); }
        case 8u: { return unit_q4_k(block, unit); }
        case 9u: { return unit_q5_k(block, unit); }
        default: { return unit_q6_k(block, unit); }
    }
}

// Element index, inside its block, of the first of the 4 values in vec4 `i` of unit `unit`.
fn block_element(unit: u32, i: u32) -> u32 {
    switch QUANT {
        case 8u, 9u: { return 64u * (unit / 2u) + 16u * (unit % 2u) + 32u * (i / 4u) + 4u * (i % 4u); }
        case 10u: { return 128u * (unit / 4u) + 8u * (unit % 4u) + 32u * (i / 2u) + 4u * (i % 2u); }
        default: { return 4u * i; }
    }
}
