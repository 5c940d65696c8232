// Weight units as 8-bit integers, for the integer products (matvec_int8.wgsl). Appended after
// dequant.wgsl, which defines the unit geometry (unit `unit` of a block is 32 values in four
// quarters of 8, quarter j being vec4s 2j and 2j + 1 of dequant_unit's Unit, elements
// block_element(unit, 2j) .. + 8) and `IntUnit`, the quarters as integers with a scale and an
// offset each, with the integer decodings of every type whose integers are unsigned (its f32
// units are those through `unit_of_quarters`). Here: the signed ones (Q8_0's bytes, the IQ4
// codebook levels) and `int_unit`, the switch over every integer type. With 8-bit activations
// a quarter's dot product is exact in integers (dot4I8Packed) and its scale applies once.
// Float types have no case: the host keeps them on the f32 products.

// Q8_0: the bytes are the integers already.
fn int_q8_0(block: u32) -> IntUnit {
    let d = f16_at(block);
    return IntUnit(words4_at2(block + 2u), words4_at2(block + 18u), vec4<f32>(d), vec4<f32>(0.0));
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
