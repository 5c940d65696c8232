//! The CPU references of the quantized products against hand-worked GGUF blocks (the ggml
//! formulas) and against llama.cpp's own gguf-py dequantizers (fixtures made by
//! `.ci/make_quant_fixtures.py`), against each other on rows every type represents exactly, and
//! the type table against the GGUF reader's. The kernels are checked against these references in `ops_quant`.

use half::{bf16, f16};
use webshard::gpu::testing;
use webshard::ops::quant::testing::random_weights;
use webshard::ops::quant::{dequant_row_reference, matmul_reference, QuantType};

fn f16_le(value: f32) -> [u8; 2] {
    f16::from_f32(value).to_le_bytes()
}

fn dequant(quant: QuantType, bytes: &[u8]) -> Vec<f32> {
    let elements = bytes.len() / quant.block_bytes() as usize * quant.block_size() as usize;
    let mut out = vec![f32::NAN; elements];
    dequant_row_reference(quant, bytes, &mut out);
    out
}

#[test]
fn legacy_blocks_dequantize_by_the_ggml_formulas() {
    // Q4_0: (q - 8) * d; qs[j] low nibble is element j, high nibble element j + 16.
    let mut q4_0 = [0u8; 18];
    q4_0[..2].copy_from_slice(&f16_le(0.5));
    q4_0[2] = 0x3a;
    let v = dequant(QuantType::Q4_0, &q4_0);
    assert_eq!(
        (v[0], v[16], v[1]),
        ((10.0 - 8.0) * 0.5, (3.0 - 8.0) * 0.5, -4.0)
    );
    // Q4_1: q * d + m.
    let mut q4_1 = [0u8; 20];
    q4_1[..2].copy_from_slice(&f16_le(0.25));
    q4_1[2..4].copy_from_slice(&f16_le(-1.0));
    q4_1[4 + 5] = 0xf0;
    let v = dequant(QuantType::Q4_1, &q4_1);
    assert_eq!((v[5], v[21]), (-1.0, 15.0 * 0.25 - 1.0));
    // Q5_0: bit j of qh is the fifth bit of element j, bit j + 16 that of element j + 16.
    let mut q5_0 = [0u8; 22];
    q5_0[..2].copy_from_slice(&f16_le(1.0));
    q5_0[2..6].copy_from_slice(&((1u32 << 3) | (1 << 19)).to_le_bytes());
    q5_0[6 + 3] = 0x21;
    let v = dequant(QuantType::Q5_0, &q5_0);
    assert_eq!((v[3], v[19], v[4]), (17.0 - 16.0, 18.0 - 16.0, -16.0));
    // Q5_1: q * d + m with the same fifth bits.
    let mut q5_1 = [0u8; 24];
    q5_1[..2].copy_from_slice(&f16_le(2.0));
    q5_1[2..4].copy_from_slice(&f16_le(0.5));
    q5_1[4..8].copy_from_slice(&1u32.to_le_bytes());
    q5_1[8] = 0x0f;
    let v = dequant(QuantType::Q5_1, &q5_1);
    assert_eq!((v[0], v[16]), (31.0 * 2.0 + 0.5, 0.5));
    // Q8_0: signed bytes times d.
    let mut q8_0 = [0u8; 34];
    q8_0[..2].copy_from_slice(&f16_le(2.0));
    q8_0[2 + 7] = (-3i8) as u8;
    assert_eq!(dequant(QuantType::Q8_0, &q8_0)[7], -6.0);
    // Plain floats.
    assert_eq!(dequant(QuantType::BF16, &0x3fc0u16.to_le_bytes()), [1.5]);
    assert_eq!(dequant(QuantType::F16, &0x3c00u16.to_le_bytes()), [1.0]);
    assert_eq!(dequant(QuantType::F32, &2.25f32.to_le_bytes()), [2.25]);
}

#[test]
fn k_quant_blocks_dequantize_by_the_ggml_formulas() {
    // Q4_K: d = 1, dmin = 0.5. Sub-block 0: scale 3, min 2 (scales[0], scales[4]). Sub-block 5:
    // scale 37 = 0b10_0101, min 50 = 0b11_0010: low four bits in scales[9], top two bits in
    // bits 6..7 of scales[1] (scale) and scales[5] (min).
    let mut q4_k = [0u8; 144];
    q4_k[..2].copy_from_slice(&f16_le(1.0));
    q4_k[2..4].copy_from_slice(&f16_le(0.5));
    let scales = &mut q4_k[4..16];
    scales[0] = 3;
    scales[4] = 2;
    scales[9] = (2 << 4) | 5;
    scales[1] = 2 << 6;
    scales[5] = 3 << 6;
    q4_k[16] = 0x0c; // element 0 (sub-block 0, low nibble)
    q4_k[16 + 64 + 7] = 0x90; // element 160 + 7 (sub-block 5 = pair 2, high nibble)
    let v = dequant(QuantType::Q4_K, &q4_k);
    assert_eq!(v[0], 3.0 * 12.0 - 0.5 * 2.0);
    assert_eq!(v[167], 37.0 * 9.0 - 0.5 * 50.0);
    assert_eq!(v[160], -0.5 * 50.0);
    assert_eq!(v[32], 0.0, "sub-block 1 has scale 0 and min 0");
    // Q5_K: element 64 + 3 is sub-block 2 (pair 1, low nibble): fifth bit = bit 2 of qh[3].
    let mut q5_k = [0u8; 176];
    q5_k[..2].copy_from_slice(&f16_le(1.0));
    q5_k[2..4].copy_from_slice(&f16_le(1.0));
    q5_k[4 + 2] = 4;
    q5_k[4 + 6] = 1;
    q5_k[16 + 3] = 1 << 2;
    q5_k[48 + 32 + 3] = 0x07;
    assert_eq!(dequant(QuantType::Q5_K, &q5_k)[67], 4.0 * 23.0 - 1.0);
    // Q6_K: d = 0.5 (bytes 208..210). Element 128 + 20 is half 1, l = 20, quarter 0: low
    // nibble of ql[64 + 20], bits 0..1 of qh[32 + 20], scale[8 + 20 / 16]. Element 128 + 116
    // is quarter 3: high nibble of ql[64 + 52], bits 6..7 of the same qh, scale[8 + 1 + 6].
    let mut q6_k = [0u8; 210];
    q6_k[208..].copy_from_slice(&f16_le(0.5));
    q6_k[64 + 20] = 0x05;
    q6_k[64 + 52] = 0x10;
    q6_k[128 + 52] = 0b1100_0010;
    q6_k[192 + 9] = (-3i8) as u8;
    q6_k[192 + 15] = 4;
    let v = dequant(QuantType::Q6_K, &q6_k);
    assert_eq!(v[148], 0.5 * -3.0 * ((5 | (2 << 4)) as f32 - 32.0));
    assert_eq!(v[244], 0.5 * 4.0 * ((1 | (3 << 4)) as f32 - 32.0));
    assert_eq!(v[0], 0.0, "scale 0");
}

/// Small integers every type represents exactly: each must dequantize to the same row.
#[test]
fn references_agree_across_types_on_exactly_representable_rows() {
    let seed = testing::fresh_seed();
    let ints: Vec<i8> = testing::random_bytes(64, seed)
        .into_iter()
        .map(|b| (b % 16) as i8 - 8)
        .collect();
    let want: Vec<f32> = ints.iter().map(|&i| f32::from(i)).collect();
    let floats = |f: fn(f32) -> [u8; 2]| -> Vec<u8> { want.iter().flat_map(|&v| f(v)).collect() };
    let f32_bytes: Vec<u8> = want.iter().flat_map(|v| v.to_le_bytes()).collect();
    let mut rows = vec![
        (QuantType::F32, f32_bytes.clone()),
        (QuantType::F16, floats(|v| f16::from_f32(v).to_le_bytes())),
        (QuantType::BF16, floats(|v| bf16::from_f32(v).to_le_bytes())),
    ];
    let (mut q4_0, mut q4_1, mut q5_0, mut q5_1, mut q8_0) =
        (vec![], vec![], vec![], vec![], vec![]);
    for block in ints.chunks(32) {
        let nibbles = |offset: i8| -> Vec<u8> {
            (0..16)
                .map(|j| {
                    ((block[j] + offset) as u8 & 15) | (((block[j + 16] + offset) as u8 & 15) << 4)
                })
                .collect()
        };
        // q5 with offset 16: values 8..23, so the fifth bit is set exactly where value >= 16.
        let qh: u32 = (0..32)
            .filter(|&j| block[j] + 16 >= 16)
            .map(|j| 1u32 << j)
            .sum();
        q4_0.extend(f16_le(1.0).into_iter().chain(nibbles(8)));
        q4_1.extend(
            f16_le(1.0)
                .into_iter()
                .chain(f16_le(-8.0))
                .chain(nibbles(8)),
        );
        q5_0.extend(
            f16_le(1.0)
                .into_iter()
                .chain(qh.to_le_bytes())
                .chain(nibbles(16)),
        );
        q5_1.extend(
            [f16_le(1.0), f16_le(-16.0)]
                .concat()
                .into_iter()
                .chain(qh.to_le_bytes())
                .chain(nibbles(16)),
        );
        q8_0.extend(
            f16_le(1.0)
                .into_iter()
                .chain(block.iter().map(|&i| i as u8)),
        );
    }
    rows.extend([
        (QuantType::Q4_0, q4_0),
        (QuantType::Q4_1, q4_1),
        (QuantType::Q5_0, q5_0),
        (QuantType::Q5_1, q5_1),
        (QuantType::Q8_0, q8_0),
    ]);
    for (quant, bytes) in &rows {
        assert_eq!(dequant(*quant, bytes), want, "{quant:?} seed={seed}");
    }
    // matmul_reference over F32 rows is the plain dot product.
    let x = testing::random_f32(64 * 2, seed);
    let got = matmul_reference(QuantType::F32, &f32_bytes, 1, 64, &x, 2);
    for t in 0..2 {
        let dot: f64 = (0..64)
            .map(|k| f64::from(want[k]) * f64::from(x[t * 64 + k]))
            .sum();
        assert_eq!(got[t], dot as f32, "token {t}");
    }
}

/// Q5_K with every fifth bit clear is Q4_K with the same scales and quants; with every bit set
/// each value grows by 16 * d * scale.
#[test]
fn q5_k_reduces_to_q4_k() {
    let seed = testing::fresh_seed();
    let q4_k = random_weights(QuantType::Q4_K, 1, 256, seed);
    let q5_k_with = |qh: u8| -> Vec<u8> { [&q4_k[..16], &[qh; 32], &q4_k[16..]].concat() };
    let base = dequant(QuantType::Q4_K, &q4_k);
    assert_eq!(dequant(QuantType::Q5_K, &q5_k_with(0)), base, "seed={seed}");
    let raised = dequant(QuantType::Q5_K, &q5_k_with(0xff));
    let d = f16::from_le_bytes([q4_k[0], q4_k[1]]).to_f32();
    for (sub_block, (high, low)) in raised.chunks(32).zip(base.chunks(32)).enumerate() {
        let scale = scale_of(&q4_k[4..16], sub_block);
        for (h, l) in high.iter().zip(low) {
            assert!(
                (h - l - 16.0 * d * scale).abs() <= 1e-3 * h.abs().max(1.0),
                "seed={seed}"
            );
        }
    }
}

/// The 6-bit scale of a Q4_K/Q5_K sub-block, written out independently of the reference.
fn scale_of(scales: &[u8], j: usize) -> f32 {
    let bits = if j < 4 {
        scales[j] & 63
    } else {
        (scales[j + 4] & 15) | ((scales[j - 4] >> 6) << 4)
    };
    f32::from(bits)
}

#[test]
fn type_table_matches_the_gguf_reader() {
    use webshard::gguf::GgmlType;
    use webshard::ops::quant::ENGINE_SUPPORTED;
    assert_eq!(ENGINE_SUPPORTED.len(), QuantType::ALL.len());
    for ggml in ENGINE_SUPPORTED {
        let quant = QuantType::from_ggml_name(ggml.name()).unwrap_or_else(|| panic!("{ggml}"));
        let lower = QuantType::from_ggml_name(&ggml.name().to_lowercase());
        assert_eq!(lower, Some(quant));
        assert_eq!(u64::from(quant.block_size()), ggml.block_size(), "{ggml}");
        assert_eq!(u64::from(quant.block_bytes()), ggml.type_size(), "{ggml}");
    }
    assert_eq!(QuantType::from_ggml_name("IQ2_XXS"), None);
    assert!(matches!(GgmlType::from_id(12), Some(GgmlType::Q4_K)));
}

// ---------------------------------------------------------------------------------------------
// Q2_K, Q3_K, IQ4_NL and IQ4_XS against llama.cpp's gguf-py

fn hex_bytes(hex: &str) -> Vec<u8> {
    assert!(hex.len().is_multiple_of(2), "odd hex length");
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex digit"))
        .collect()
}

/// Seeded random blocks and the values gguf-py's numpy dequantizer gives them, bit for bit.
fn check_fixture(quant: QuantType, json: &str) {
    let fixture: serde_json::Value = serde_json::from_str(json).expect("fixture JSON");
    assert_eq!(fixture["type"], quant.ggml_name());
    let bytes = hex_bytes(fixture["bytes"].as_str().expect("bytes"));
    let want: Vec<f32> = hex_bytes(fixture["values"].as_str().expect("values"))
        .chunks_exact(4)
        .map(|v| f32::from_le_bytes([v[0], v[1], v[2], v[3]]))
        .collect();
    let blocks = fixture["blocks"].as_u64().expect("blocks") as usize;
    assert_eq!(bytes.len(), blocks * quant.block_bytes() as usize);
    let got = dequant(quant, &bytes);
    assert_eq!(got.len(), want.len(), "{quant:?}");
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(
            g.to_bits(),
            w.to_bits(),
            "{quant:?} element {i}: {g} != {w}"
        );
    }
    assert!(
        want.iter().any(|&v| v != 0.0),
        "{quant:?}: an all-zero fixture"
    );
}

#[test]
fn q2_k_matches_gguf_py() {
    check_fixture(QuantType::Q2_K, include_str!("fixtures/quant/q2_k.json"));
}

#[test]
fn q3_k_matches_gguf_py() {
    check_fixture(QuantType::Q3_K, include_str!("fixtures/quant/q3_k.json"));
}

#[test]
fn iq4_nl_matches_gguf_py() {
    check_fixture(
        QuantType::IQ4_NL,
        include_str!("fixtures/quant/iq4_nl.json"),
    );
}

#[test]
fn iq4_xs_matches_gguf_py() {
    check_fixture(
        QuantType::IQ4_XS,
        include_str!("fixtures/quant/iq4_xs.json"),
    );
}

/// IQ4_XS whose eight sub-block scales are all 33 (scale - 32 = 1) is IQ4_NL, block by block,
/// with IQ4_XS's d in every block.
#[test]
fn iq4_xs_with_unit_scales_is_iq4_nl() {
    let seed = testing::fresh_seed();
    let mut xs = random_weights(QuantType::IQ4_XS, 1, 256, seed);
    // 33 = 0b10_0001: low nibbles 1 in scales_l, top bits 0b10 in each 2-bit field of scales_h.
    xs[2..4].copy_from_slice(&0xaaaau16.to_le_bytes());
    xs[4..8].copy_from_slice(&[0x11; 4]);
    let nl: Vec<u8> = xs[8..]
        .chunks(16)
        .flat_map(|qs| xs[..2].iter().chain(qs).copied())
        .collect();
    assert_eq!(
        dequant(QuantType::IQ4_XS, &xs),
        dequant(QuantType::IQ4_NL, &nl),
        "seed={seed}"
    );
}
