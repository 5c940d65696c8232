//! CPU references: GGUF blocks dequantized exactly as ggml's `dequantize_row_*` defines them.
//!
//! These are the ground truth the GPU kernels are tested against, so they follow the block
//! layouts of `ggml-common.h` literally, one short function per type, without any cleverness.

use super::QuantType;

fn f16_at(bytes: &[u8], at: usize) -> f32 {
    half::f16::from_le_bytes([bytes[at], bytes[at + 1]]).to_f32()
}

/// Dequantizes one row (`row_bytes` holds whole blocks) into `out`, one value per element.
///
/// Panics if `out.len()` does not match the number of elements `row_bytes` encodes: callers
/// size both from the same shape.
pub fn dequant_row_reference(quant: QuantType, row_bytes: &[u8], out: &mut [f32]) {
    let block = quant.block_size() as usize;
    let block_bytes = quant.block_bytes() as usize;
    assert_eq!(row_bytes.len() % block_bytes, 0, "{quant:?}: partial block");
    assert_eq!(
        row_bytes.len() / block_bytes * block,
        out.len(),
        "{quant:?}: output length"
    );
    let dequant_block = quant.reference();
    for (bytes, values) in row_bytes
        .chunks_exact(block_bytes)
        .zip(out.chunks_exact_mut(block))
    {
        dequant_block(bytes, values);
    }
}

/// `out[t, n] = sum_k x[t, k] * W[n, k]` with `W` given as raw GGUF rows; sums in f64.
pub fn matmul_reference(
    quant: QuantType,
    w_bytes: &[u8],
    rows: usize,
    cols: usize,
    x: &[f32],
    tokens: usize,
) -> Vec<f32> {
    let row_bytes = quant.row_bytes(cols as u64) as usize;
    assert_eq!(w_bytes.len(), rows * row_bytes, "{quant:?}: weight bytes");
    assert_eq!(x.len(), tokens * cols, "activation length");
    let mut out = vec![0.0f32; tokens * rows];
    let mut row = vec![0.0f32; cols];
    for n in 0..rows {
        dequant_row_reference(
            quant,
            &w_bytes[n * row_bytes..(n + 1) * row_bytes],
            &mut row,
        );
        for t in 0..tokens {
            let activations = &x[t * cols..(t + 1) * cols];
            let sum: f64 = row
                .iter()
                .zip(activations)
                .map(|(&w, &a)| f64::from(w) * f64::from(a))
                .sum();
            out[t * rows + n] = sum as f32;
        }
    }
    out
}

pub(super) fn dequant_f32(bytes: &[u8], out: &mut [f32]) {
    out[0] = f32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
}

pub(super) fn dequant_f16(bytes: &[u8], out: &mut [f32]) {
    out[0] = f16_at(bytes, 0);
}

pub(super) fn dequant_bf16(bytes: &[u8], out: &mut [f32]) {
    out[0] = half::bf16::from_le_bytes([bytes[0], bytes[1]]).to_f32();
}

/// block_q4_0: d (f16), qs[16]; element j is the low nibble of qs[j], element j + 16 the high.
pub(super) fn dequant_q4_0(bytes: &[u8], out: &mut [f32]) {
    let d = f16_at(bytes, 0);
    for j in 0..16 {
        let q = bytes[2 + j];
        out[j] = (f32::from(q & 0x0f) - 8.0) * d;
        out[j + 16] = (f32::from(q >> 4) - 8.0) * d;
    }
}

/// block_q4_1: d, m (f16), qs[16]; value = q * d + m.
pub(super) fn dequant_q4_1(bytes: &[u8], out: &mut [f32]) {
    let (d, m) = (f16_at(bytes, 0), f16_at(bytes, 2));
    for j in 0..16 {
        let q = bytes[4 + j];
        out[j] = f32::from(q & 0x0f) * d + m;
        out[j + 16] = f32::from(q >> 4) * d + m;
    }
}

/// The 5-bit quants of block j of Q5_0/Q5_1: bit j of qh is the fifth bit of element j,
/// bit j + 16 that of element j + 16.
fn q5_pair(qh: u32, qs: u8, j: usize) -> (u8, u8) {
    let high_low = (((qh >> j) & 1) << 4) as u8;
    let high_high = (((qh >> (j + 16)) & 1) << 4) as u8;
    ((qs & 0x0f) | high_low, (qs >> 4) | high_high)
}

/// block_q5_0: d (f16), qh[4], qs[16]; value = (q - 16) * d.
pub(super) fn dequant_q5_0(bytes: &[u8], out: &mut [f32]) {
    let d = f16_at(bytes, 0);
    let qh = u32::from_le_bytes([bytes[2], bytes[3], bytes[4], bytes[5]]);
    for j in 0..16 {
        let (low, high) = q5_pair(qh, bytes[6 + j], j);
        out[j] = (f32::from(low) - 16.0) * d;
        out[j + 16] = (f32::from(high) - 16.0) * d;
    }
}

/// block_q5_1: d, m (f16), qh[4], qs[16]; value = q * d + m.
pub(super) fn dequant_q5_1(bytes: &[u8], out: &mut [f32]) {
    let (d, m) = (f16_at(bytes, 0), f16_at(bytes, 2));
    let qh = u32::from_le_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]);
    for j in 0..16 {
        let (low, high) = q5_pair(qh, bytes[8 + j], j);
        out[j] = f32::from(low) * d + m;
        out[j + 16] = f32::from(high) * d + m;
    }
}

/// block_q8_0: d (f16), qs[32] signed bytes.
pub(super) fn dequant_q8_0(bytes: &[u8], out: &mut [f32]) {
    let d = f16_at(bytes, 0);
    for j in 0..32 {
        out[j] = f32::from(bytes[2 + j] as i8) * d;
    }
}

/// ggml's `get_scale_min_k4`: the 6-bit scale and min of sub-block `j` (0..8) packed in the
/// 12 scale bytes of Q4_K/Q5_K.
pub(crate) fn scale_min_k4(j: usize, scales: &[u8]) -> (u8, u8) {
    if j < 4 {
        (scales[j] & 63, scales[j + 4] & 63)
    } else {
        let scale = (scales[j + 4] & 0x0f) | ((scales[j - 4] >> 6) << 4);
        let min = (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4);
        (scale, min)
    }
}

/// block_q4_K: d, dmin (f16), scales[12], qs[128]. Each 64 elements share 32 qs bytes: low
/// nibbles are sub-block 2i, high nibbles sub-block 2i + 1; value = d * scale * q - dmin * min.
pub(super) fn dequant_q4_k(bytes: &[u8], out: &mut [f32]) {
    let (d, dmin) = (f16_at(bytes, 0), f16_at(bytes, 2));
    let scales = &bytes[4..16];
    let qs = &bytes[16..144];
    for pair in 0..4 {
        let (scale_low, min_low) = scale_min_k4(2 * pair, scales);
        let (scale_high, min_high) = scale_min_k4(2 * pair + 1, scales);
        for l in 0..32 {
            let q = qs[32 * pair + l];
            out[64 * pair + l] =
                d * f32::from(scale_low) * f32::from(q & 0x0f) - dmin * f32::from(min_low);
            out[64 * pair + 32 + l] =
                d * f32::from(scale_high) * f32::from(q >> 4) - dmin * f32::from(min_high);
        }
    }
}

/// block_q5_K: d, dmin (f16), scales[12], qh[32], qs[128]. Like Q4_K, with the fifth bit of
/// element l of pair i in bit 2i (low nibbles) or 2i + 1 (high nibbles) of qh[l].
pub(super) fn dequant_q5_k(bytes: &[u8], out: &mut [f32]) {
    let (d, dmin) = (f16_at(bytes, 0), f16_at(bytes, 2));
    let scales = &bytes[4..16];
    let qh = &bytes[16..48];
    let qs = &bytes[48..176];
    for pair in 0..4 {
        let (scale_low, min_low) = scale_min_k4(2 * pair, scales);
        let (scale_high, min_high) = scale_min_k4(2 * pair + 1, scales);
        for l in 0..32 {
            let q = qs[32 * pair + l];
            let low = (q & 0x0f) | (((qh[l] >> (2 * pair)) & 1) << 4);
            let high = (q >> 4) | (((qh[l] >> (2 * pair + 1)) & 1) << 4);
            out[64 * pair + l] =
                d * f32::from(scale_low) * f32::from(low) - dmin * f32::from(min_low);
            out[64 * pair + 32 + l] =
                d * f32::from(scale_high) * f32::from(high) - dmin * f32::from(min_high);
        }
    }
}

/// block_q6_K: ql[128], qh[64], scales[16] (i8), d (f16). Each half of 128 elements uses 64
/// ql bytes, 32 qh bytes and 8 scales; value = d * scale * (q - 32).
pub(super) fn dequant_q6_k(bytes: &[u8], out: &mut [f32]) {
    let d = f16_at(bytes, 208);
    for half in 0..2 {
        let ql = &bytes[64 * half..64 * half + 64];
        let qh = &bytes[128 + 32 * half..128 + 32 * half + 32];
        let scales = &bytes[192 + 8 * half..192 + 8 * half + 8];
        let out = &mut out[128 * half..128 * half + 128];
        for l in 0..32 {
            let is = l / 16;
            let quants = [
                (ql[l] & 0x0f) | ((qh[l] & 3) << 4),
                (ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4),
                (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4),
                (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4),
            ];
            for (quarter, q) in quants.into_iter().enumerate() {
                let scale = f32::from(scales[is + 2 * quarter] as i8);
                out[l + 32 * quarter] = d * scale * (f32::from(q) - 32.0);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Q2_K, Q3_K, IQ4_NL and IQ4_XS

/// llama.cpp's `kvalues_iq4nl`: the 16 levels of the non-linear 4-bit types (IQ4_NL, IQ4_XS).
/// The one copy: the kernels get it from `IQ4_NL_CODEBOOK_CONSTS`.
pub const IQ4_NL_CODEBOOK: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// The codebook as the kernel constants `IQ4_NL_CODEBOOK0..3`, four i8 levels to a word
/// (level 4k + b in byte b of word k), as `wgsl/dequant.wgsl` unpacks them.
pub(super) const IQ4_NL_CODEBOOK_CONSTS: &[(&str, u32)] = &[
    ("IQ4_NL_CODEBOOK0", codebook_word(0)),
    ("IQ4_NL_CODEBOOK1", codebook_word(1)),
    ("IQ4_NL_CODEBOOK2", codebook_word(2)),
    ("IQ4_NL_CODEBOOK3", codebook_word(3)),
];

const fn codebook_word(k: usize) -> u32 {
    u32::from_le_bytes([
        IQ4_NL_CODEBOOK[4 * k] as u8,
        IQ4_NL_CODEBOOK[4 * k + 1] as u8,
        IQ4_NL_CODEBOOK[4 * k + 2] as u8,
        IQ4_NL_CODEBOOK[4 * k + 3] as u8,
    ])
}

/// block_q2_K: scales[16], qs[64], d, dmin (f16). Element 128n + 32j + 16h + l (half n,
/// shift j, l < 16) is bits 2j..2j + 1 of qs[32n + 16h + l]; its scale byte is
/// scales[8n + 2j + h], the low nibble its scale and the high nibble its min:
/// value = d * scale * q - dmin * min.
pub(super) fn dequant_q2_k(bytes: &[u8], out: &mut [f32]) {
    let (d, dmin) = (f16_at(bytes, 80), f16_at(bytes, 82));
    let qs = &bytes[16..80];
    for n in 0..2 {
        for j in 0..4 {
            for h in 0..2 {
                let packed = bytes[8 * n + 2 * j + h];
                let scale = d * f32::from(packed & 0x0f);
                let min = dmin * f32::from(packed >> 4);
                for l in 0..16 {
                    let q = (qs[32 * n + 16 * h + l] >> (2 * j)) & 3;
                    out[128 * n + 32 * j + 16 * h + l] = scale * f32::from(q) - min;
                }
            }
        }
    }
}

/// The 6-bit scale `s` (0..16) of Q3_K, from its 12 packed bytes: the low four bits are
/// nibble s / 8 of byte s % 8, the top two bits are bits 2 * (s / 4) of byte 8 + s % 4;
/// stored with an offset of 32.
fn q3_k_scale(scales: &[u8], s: usize) -> i32 {
    let low = (scales[s % 8] >> (4 * (s / 8))) & 0x0f;
    let high = (scales[8 + s % 4] >> (2 * (s / 4))) & 3;
    i32::from(low | (high << 4)) - 32
}

/// block_q3_K: hmask[32], qs[64], scales[12], d (f16). Element 128n + 32j + 16h + l has its
/// low two bits in bits 2j..2j + 1 of qs[32n + 16h + l] and its third bit in bit 4n + j of
/// hmask[16h + l]; a clear third bit subtracts 4. value = d * scale(8n + 2j + h) * q.
pub(super) fn dequant_q3_k(bytes: &[u8], out: &mut [f32]) {
    let d = f16_at(bytes, 108);
    let (hmask, qs, scales) = (&bytes[..32], &bytes[32..96], &bytes[96..108]);
    for n in 0..2 {
        for j in 0..4 {
            for h in 0..2 {
                let scale = d * q3_k_scale(scales, 8 * n + 2 * j + h) as f32;
                for l in 0..16 {
                    let low = i32::from((qs[32 * n + 16 * h + l] >> (2 * j)) & 3);
                    let high_set = (hmask[16 * h + l] >> (4 * n + j)) & 1 == 1;
                    let q = if high_set { low } else { low - 4 };
                    out[128 * n + 32 * j + 16 * h + l] = scale * q as f32;
                }
            }
        }
    }
}

fn iq4_level(nibble: u8) -> f32 {
    f32::from(IQ4_NL_CODEBOOK[usize::from(nibble)])
}

/// block_iq4_nl: d (f16), qs[16]; Q4_0's nibble order, value = d * codebook[q].
pub(super) fn dequant_iq4_nl(bytes: &[u8], out: &mut [f32]) {
    let d = f16_at(bytes, 0);
    for j in 0..16 {
        let q = bytes[2 + j];
        out[j] = d * iq4_level(q & 0x0f);
        out[j + 16] = d * iq4_level(q >> 4);
    }
}

/// block_iq4_xs: d (f16), scales_h (u16), scales_l[4], qs[128]. Sub-block b (32 elements,
/// qs[16b..16b + 16] in Q4_0's nibble order) has the 6-bit scale whose low four bits are
/// nibble b % 2 of scales_l[b / 2] and top two bits bits 2b..2b + 1 of scales_h, stored
/// with an offset of 32: value = d * (scale - 32) * codebook[q].
pub(super) fn dequant_iq4_xs(bytes: &[u8], out: &mut [f32]) {
    let d = f16_at(bytes, 0);
    let scales_h = u16::from_le_bytes([bytes[2], bytes[3]]);
    for b in 0..8 {
        let low = (bytes[4 + b / 2] >> (4 * (b % 2))) & 0x0f;
        let high = ((scales_h >> (2 * b)) & 3) as u8;
        let scale = d * (i32::from(low | (high << 4)) - 32) as f32;
        let qs = &bytes[8 + 16 * b..8 + 16 * b + 16];
        let out = &mut out[32 * b..32 * b + 32];
        for j in 0..16 {
            out[j] = scale * iq4_level(qs[j] & 0x0f);
            out[j + 16] = scale * iq4_level(qs[j] >> 4);
        }
    }
}
