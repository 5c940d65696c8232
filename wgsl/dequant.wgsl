// Dequantization of GGUF blocks read straight from their raw bytes.
//
// The kernel declares `weights: array<u32>` and `weights4: array<vec4<u32>>`, both bound to the
// bytes of one weight part (the second is read only by types whose rows are whole vec4s:
// on CPU adapters each load instruction costs a per-lane loop, so wide loads pay), and the constants
// QUANT (the type's code: one of the QUANT_<NAME> constants, ggml ids, that the header
// declares from src/ops/quant/table.rs), BLOCK (elements per block; 32 for float types),
// BLOCK_BYTES, UNITS (= BLOCK / 32) and IQ4_NL_CODEBOOK0..3 (the non-linear levels, from
// dequant::IQ4_NL_CODEBOOK_CONSTS). A block is cut into UNITS "units" of 32 values each:
// `dequant_unit(block_byte, unit)` returns them as 8 vec4s, and vec4 `i` holds the 4
// consecutive elements starting at `block_element(unit, i)` of the block. The units of a block
// are chosen so that each reads a contiguous slice of bytes and both nibbles of each byte it
// loads; for K-quants that makes a unit's elements non-contiguous.
//
// Blocks of 18, 22, 34, 110 and 210 bytes are only 2-byte aligned, so those loads funnel two words.

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

// The 16 bytes at a 16-byte aligned byte offset.
fn vec4_at(byte: u32) -> vec4<u32> {
    return weights4[byte >> 4u];
}

fn unit_f32(block: u32) -> Unit {
    let v = block >> 4u;
    return Unit(bitcast<vec4<f32>>(weights4[v]), bitcast<vec4<f32>>(weights4[v + 1u]),
                bitcast<vec4<f32>>(weights4[v + 2u]), bitcast<vec4<f32>>(weights4[v + 3u]),
                bitcast<vec4<f32>>(weights4[v + 4u]), bitcast<vec4<f32>>(weights4[v + 5u]),
                bitcast<vec4<f32>>(weights4[v + 6u]), bitcast<vec4<f32>>(weights4[v + 7u]));
}

fn f16x4(words: vec2<u32>) -> vec4<f32> {
    return vec4<f32>(unpack2x16float(words.x), unpack2x16float(words.y));
}

fn unit_f16(block: u32) -> Unit {
    let v = block >> 4u;
    let a = weights4[v];
    let b = weights4[v + 1u];
    let c = weights4[v + 2u];
    let d = weights4[v + 3u];
    return Unit(f16x4(a.xy), f16x4(a.zw), f16x4(b.xy), f16x4(b.zw),
                f16x4(c.xy), f16x4(c.zw), f16x4(d.xy), f16x4(d.zw));
}

fn bf16_pair(word: u32) -> vec2<f32> {
    return vec2<f32>(bitcast<f32>(word << 16u), bitcast<f32>(word & 0xffff0000u));
}

fn bf16x4(words: vec2<u32>) -> vec4<f32> {
    return vec4<f32>(bf16_pair(words.x), bf16_pair(words.y));
}

fn unit_bf16(block: u32) -> Unit {
    let v = block >> 4u;
    let a = weights4[v];
    let b = weights4[v + 1u];
    let c = weights4[v + 2u];
    let d = weights4[v + 3u];
    return Unit(bf16x4(a.xy), bf16x4(a.zw), bf16x4(b.xy), bf16x4(b.zw),
                bf16x4(c.xy), bf16x4(c.zw), bf16x4(d.xy), bf16x4(d.zw));
}

// A unit as four quarters of 8 integer values (4 to a word, as bytes) with one scale and one
// offset each: value = scale[j] * q + offset[j]. Every integer type but Q8_0 and the IQ4
// codebooks (signed bytes) decodes through it, for the f32 products (`unit_of_quarters`) and
// the integer ones (wgsl/dequant_int8.wgsl) alike. Quarter j is vec4s 2j and 2j + 1 of the Unit.
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

// The f32 values of a unit of unsigned integer quarters.
fn unit_of_quarters(u: IntUnit) -> Unit {
    return Unit(fma(bytes_of(u.low.x), vec4<f32>(u.scale.x), vec4<f32>(u.offset.x)),
                fma(bytes_of(u.low.y), vec4<f32>(u.scale.x), vec4<f32>(u.offset.x)),
                fma(bytes_of(u.low.z), vec4<f32>(u.scale.y), vec4<f32>(u.offset.y)),
                fma(bytes_of(u.low.w), vec4<f32>(u.scale.y), vec4<f32>(u.offset.y)),
                fma(bytes_of(u.high.x), vec4<f32>(u.scale.z), vec4<f32>(u.offset.z)),
                fma(bytes_of(u.high.y), vec4<f32>(u.scale.z), vec4<f32>(u.offset.z)),
                fma(bytes_of(u.high.z), vec4<f32>(u.scale.w), vec4<f32>(u.offset.w)),
                fma(bytes_of(u.high.w), vec4<f32>(u.scale.w), vec4<f32>(u.offset.w)));
}

fn words4_at2(byte: u32) -> vec4<u32> {
    return vec4<u32>(word_at2(byte), word_at2(byte + 4u), word_at2(byte + 8u), word_at2(byte + 12u));
}

fn words4_at(byte: u32) -> vec4<u32> {
    let w = byte >> 2u;
    return vec4<u32>(weights[w], weights[w + 1u], weights[w + 2u], weights[w + 3u]);
}

// Bits 4k..4k + 3 of `qh` for k = 0..3, each spread to the fifth bit of four bytes.
fn fifth_bits4(qh: u32) -> vec4<u32> {
    let nibbles = vec4<u32>(qh, qh >> 4u, qh >> 8u, qh >> 12u) & vec4<u32>(0xfu);
    return ((nibbles * 0x00204081u) & vec4<u32>(0x01010101u)) << vec4<u32>(4u);
}

// Q4_0: d, qs[16]; value = d * q - 8d. Word k of qs holds elements 4k.. (low nibbles) and
// 16 + 4k.. (high): quarters 0 and 1 are the low nibbles, 2 and 3 the high ones.
fn int_q4_0(block: u32) -> IntUnit {
    let d = f16_at(block);
    let q = words4_at2(block + 2u);
    return IntUnit(nibbles_low(q), nibbles_high(q), vec4<f32>(d), vec4<f32>(-8.0 * d));
}

// Q4_1: d, m, qs[16]; value = d * q + m.
fn int_q4_1(block: u32) -> IntUnit {
    let dm = unpack2x16float(word_at(block));
    let q = words4_at(block + 4u);
    return IntUnit(nibbles_low(q), nibbles_high(q), vec4<f32>(dm.x), vec4<f32>(dm.y));
}

// Q5_0: d, qh (32 fifth bits), qs[16]; value = d * q - 16d, q with its fifth bit.
fn int_q5_0(block: u32) -> IntUnit {
    let d = f16_at(block);
    let qh = word_at2(block + 2u);
    let q = words4_at2(block + 6u);
    return IntUnit(nibbles_low(q) | fifth_bits4(qh), nibbles_high(q) | fifth_bits4(qh >> 16u),
                   vec4<f32>(d), vec4<f32>(-16.0 * d));
}

// Q5_1: d, m, qh, qs[16]; value = d * q + m.
fn int_q5_1(block: u32) -> IntUnit {
    let dm = unpack2x16float(word_at(block));
    let qh = word_at(block + 4u);
    let q = words4_at(block + 8u);
    return IntUnit(nibbles_low(q) | fifth_bits4(qh), nibbles_high(q) | fifth_bits4(qh >> 16u),
                   vec4<f32>(dm.x), vec4<f32>(dm.y));
}

fn unit_q4_0(block: u32) -> Unit {
    return unit_of_quarters(int_q4_0(block));
}

fn unit_q4_1(block: u32) -> Unit {
    return unit_of_quarters(int_q4_1(block));
}

fn unit_q5_0(block: u32) -> Unit {
    return unit_of_quarters(int_q5_0(block));
}

fn unit_q5_1(block: u32) -> Unit {
    return unit_of_quarters(int_q5_1(block));
}

fn i8x4(word: u32, d: f32) -> vec4<f32> {
    return vec4<f32>(unpack4xI8(word)) * d;
}

// Q8_0: d, qs[32] signed.
fn unit_q8_0(block: u32) -> Unit {
    let d = f16_at(block);
    let a = words4_at2(block + 2u);
    let b = words4_at2(block + 18u);
    return Unit(i8x4(a.x, d), i8x4(a.y, d), i8x4(a.z, d), i8x4(a.w, d),
                i8x4(b.x, d), i8x4(b.y, d), i8x4(b.z, d), i8x4(b.w, d));
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

// Q4_K and Q5_K unit u: pair p = u / 2 of sub-blocks (2p in the low nibbles, 2p + 1 in the
// high ones), half u % 2 of the pair's 32 qs bytes: elements 64p + 16h + 0..16 and
// 64p + 32 + 16h + 0..16. Q4_K: d, dmin, scales[12], qs[128]; value = d * scale * q - dmin * min.
// Q5_K: Q4_K's layout plus qh[32]; the fifth bit of element l of pair p is bit 2p (low
// nibbles) or 2p + 1 (high nibbles) of qh[l].
// Q6_K: ql[128], qh[64], scales[16] (i8), d. Unit u covers half n = u / 4 and l in
// l0 = 8 * (u % 4) .. l0 + 8, i.e. elements 128n + l0 + 32j + 0..8 for the quarters j = 0..3
// (value = s_j * q - 32 s_j); the 6-bit quants are assembled four at a time with byte-parallel
// word operations.
// Q2_K: scales[16], qs[64], d, dmin. Q6_K's units: bytes qs[32n + l0 .. + 8] hold quarter j in
// bits 2j..2j + 1, with scale byte 8n + 2j + l0 / 16 (low nibble scale, high nibble min).
// Q3_K: hmask[32], qs[64], scales[12], d. Q2_K's units and element order; the third bit of
// quarter j of half n is bit 4n + j of hmask[l0 .. l0 + 8]: value = d * scale * (q - 4).
// The signed 6-bit scale s of Q3_K from its 12 packed bytes: the low four bits are nibble
// s / 8 of byte s % 8, the top two bits bits 2 * (s / 4) of byte 8 + s % 4; offset 32.
fn q3_k_scale(scales: vec3<u32>, s: u32) -> f32 {
    let low = (scale_byte(scales, s % 8u) >> (4u * (s / 8u))) & 0xfu;
    let high = (scale_byte(scales, 8u + s % 4u) >> (2u * (s / 4u))) & 3u;
    return f32(i32(low | (high << 4u)) - 32);
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

fn unit_q4_k(block: u32, unit: u32) -> Unit {
    return unit_of_quarters(int_q4_k(block, unit));
}

fn unit_q5_k(block: u32, unit: u32) -> Unit {
    return unit_of_quarters(int_q5_k(block, unit));
}

fn unit_q6_k(block: u32, unit: u32) -> Unit {
    return unit_of_quarters(int_q6_k(block, unit));
}

fn unit_q2_k(block: u32, unit: u32) -> Unit {
    return unit_of_quarters(int_q2_k(block, unit));
}

fn unit_q3_k(block: u32, unit: u32) -> Unit {
    return unit_of_quarters(int_q3_k(block, unit));
}

// Level `nibble` of the non-linear codebook: byte nibble % 4 of word nibble / 4, sign-extended.
// Selects rather than a dynamically indexed constant: every backend lowers them alike.
fn iq4_level(nibble: u32) -> f32 {
    let low = select(IQ4_NL_CODEBOOK0, IQ4_NL_CODEBOOK1, nibble >= 4u);
    let high = select(IQ4_NL_CODEBOOK2, IQ4_NL_CODEBOOK3, nibble >= 12u);
    let word = select(low, high, nibble >= 8u);
    return f32(extractBits(bitcast<i32>(word), 8u * (nibble & 3u), 8u));
}

// The levels of the four nibbles held one per byte of `nibbles`, times `scale`.
fn iq4_levels(nibbles: u32, scale: f32) -> vec4<f32> {
    return scale * vec4<f32>(iq4_level(nibbles & 0xfu), iq4_level((nibbles >> 8u) & 0xfu),
                             iq4_level((nibbles >> 16u) & 0xfu), iq4_level(nibbles >> 24u));
}

// 32 codebook values from 16 bytes of nibbles in Q4_0's order (low nibbles first).
fn iq4_unit(q: vec4<u32>, scale: f32) -> Unit {
    let low = q & vec4<u32>(0x0f0f0f0fu);
    let high = (q >> vec4<u32>(4u)) & vec4<u32>(0x0f0f0f0fu);
    return Unit(iq4_levels(low.x, scale), iq4_levels(low.y, scale),
                iq4_levels(low.z, scale), iq4_levels(low.w, scale),
                iq4_levels(high.x, scale), iq4_levels(high.y, scale),
                iq4_levels(high.z, scale), iq4_levels(high.w, scale));
}

// IQ4_NL: d, qs[16]; value = d * codebook[q].
fn unit_iq4_nl(block: u32) -> Unit {
    return iq4_unit(words4_at2(block + 2u), f16_at(block));
}

// IQ4_XS: d, scales_h (u16), scales_l[4], qs[128]. Unit u is sub-block u (elements 32u..,
// qs[16u..16u + 16]); its 6-bit scale has the low four bits at bit 4u of scales_l and the top
// two at bit 2u of scales_h; value = d * (scale - 32) * codebook[q].
fn unit_iq4_xs(block: u32, unit: u32) -> Unit {
    let header = word_at(block);
    let low = (word_at(block + 4u) >> (4u * unit)) & 0xfu;
    let high = (header >> (16u + 2u * unit)) & 3u;
    let scale = unpack2x16float(header).x * f32(i32(low | (high << 4u)) - 32);
    return iq4_unit(words4_at(block + 8u + 16u * unit), scale);
}

// The 32 values of unit `unit` of the block starting at byte `block` of `weights`.
fn dequant_unit(block: u32, unit: u32) -> Unit {
    switch QUANT {
        case QUANT_F32: { return unit_f32(block); }
        case QUANT_F16: { return unit_f16(block); }
        case QUANT_BF16: { return unit_bf16(block); }
        case QUANT_Q4_0: { return unit_q4_0(block); }
        case QUANT_Q4_1: { return unit_q4_1(block); }
        case QUANT_Q5_0: { return unit_q5_0(block); }
        case QUANT_Q5_1: { return unit_q5_1(block); }
        case QUANT_Q8_0: { return unit_q8_0(block); }
        case QUANT_Q4_K: { return unit_q4_k(block, unit); }
        case QUANT_Q5_K: { return unit_q5_k(block, unit); }
        case QUANT_Q6_K: { return unit_q6_k(block, unit); }
        case QUANT_Q2_K: { return unit_q2_k(block, unit); }
        case QUANT_Q3_K: { return unit_q3_k(block, unit); }
        case QUANT_IQ4_NL: { return unit_iq4_nl(block); }
        case QUANT_IQ4_XS: { return unit_iq4_xs(block, unit); }
        // Unreachable: QUANT is always a code of the table, and a table test checks that
        // each has its case above.
        default: { return Unit(); }
    }
}

// Element index, inside its block, of the first of the 4 values in vec4 `i` of unit `unit`:
// types whose units are not 32 consecutive elements have their case here.
fn block_element(unit: u32, i: u32) -> u32 {
    switch QUANT {
        case QUANT_Q4_K, QUANT_Q5_K: { return 64u * (unit / 2u) + 16u * (unit % 2u) + 32u * (i / 4u) + 4u * (i % 4u); }
        case QUANT_Q6_K, QUANT_Q2_K, QUANT_Q3_K: { return 128u * (unit / 4u) + 8u * (unit % 4u) + 32u * (i / 2u) + 4u * (i % 2u); }
        case QUANT_IQ4_XS: { return 32u * unit + 4u * i; }
        default: { return 4u * i; }
    }
}

// dot(values, a) as four partial sums.
fn unit_dot(values: Unit, a: Unit) -> vec4<f32> {
    var acc = values[0] * a[0];
    acc = fma(values[1], a[1], acc);
    acc = fma(values[2], a[2], acc);
    acc = fma(values[3], a[3], acc);
    acc = fma(values[4], a[4], acc);
    acc = fma(values[5], a[5], acc);
    acc = fma(values[6], a[6], acc);
    return fma(values[7], a[7], acc);
}
