//! Quantized products and the embedding gather: the CPU references against hand-worked blocks
//! and each other, then every kernel against the references on every device and variant, on
//! split tensors, and on tensors read from the real models.

use std::sync::Arc;

use half::{bf16, f16};
use webshard::gpu::{self, testing, Gpu, GpuOptions, Recorder, Variant, WeightTensor};
use webshard::ops::quant::testing::random_weights;
use webshard::ops::quant::{
    dequant_row_reference, embed, matmul, matmul_reference, MatmulTile, QuantMatrix, QuantType,
};

// ---------------------------------------------------------------------------------------------
// Inputs and GPU plumbing

fn upload_weights(gpu: &Gpu, name: &str, bytes: &[u8], rows: usize) -> WeightTensor {
    let row_bytes = (bytes.len() / rows) as u64;
    let tensor = WeightTensor::allocate(gpu, name, rows as u64, row_bytes).expect("allocate");
    for piece in tensor.upload_pieces(1 << 20) {
        let start = piece.tensor_offset as usize;
        tensor.write_piece(gpu, &piece, &bytes[start..start + piece.bytes as usize]);
    }
    tensor
}

struct Case<'a> {
    quant: QuantType,
    bytes: &'a [u8],
    rows: usize,
    cols: usize,
}

fn gpu_matmul(gpu: &Gpu, variant: Variant, case: &Case, x: &[f32], tokens: usize) -> Vec<f32> {
    let tensor = upload_weights(gpu, "w", case.bytes, case.rows);
    let w = QuantMatrix::new(&tensor, case.quant, case.cols as u32, case.rows as u32).unwrap();
    let x_buffer = gpu::upload_f32(gpu, "x", x);
    let out_bytes = (tokens * case.rows * 4) as u64;
    let out = gpu::storage_buffer(gpu, "out", out_bytes);
    gpu::poison_f32(gpu, &out);
    let mut rec = Recorder::with_variant(gpu, variant);
    matmul(&mut rec, &w, &x_buffer, &out, tokens as u32);
    let bytes = pollster::block_on(rec.submit_and_read(&out, 0, out_bytes)).expect("read");
    bytemuck::pod_collect_to_vec(&bytes)
}

fn gpu_embed(gpu: &Gpu, variant: Variant, case: &Case, ids: &[u32], scale: f32) -> Vec<f32> {
    let tensor = upload_weights(gpu, "table", case.bytes, case.rows);
    let table = QuantMatrix::new(&tensor, case.quant, case.cols as u32, case.rows as u32).unwrap();
    let ids_buffer = gpu::upload_u32(gpu, "ids", ids);
    let out_bytes = (ids.len() * case.cols * 4) as u64;
    let out = gpu::storage_buffer(gpu, "out", out_bytes);
    gpu::poison_f32(gpu, &out);
    let mut rec = Recorder::with_variant(gpu, variant);
    embed(&mut rec, &table, &ids_buffer, &out, ids.len() as u32, scale);
    let bytes = pollster::block_on(rec.submit_and_read(&out, 0, out_bytes)).expect("read");
    bytemuck::pod_collect_to_vec(&bytes)
}

fn embed_reference(case: &Case, ids: &[u32], scale: f32) -> Vec<f32> {
    let row_bytes = case.quant.row_bytes(case.cols as u64) as usize;
    let mut out = vec![0.0; ids.len() * case.cols];
    for (&id, values) in ids.iter().zip(out.chunks_exact_mut(case.cols)) {
        let id = id as usize;
        dequant_row_reference(
            case.quant,
            &case.bytes[id * row_bytes..][..row_bytes],
            values,
        );
        values.iter_mut().for_each(|v| *v *= scale);
    }
    out
}

fn devices_and_variants() -> Vec<(Arc<Gpu>, Variant)> {
    pollster::block_on(testing::device_variants()).expect("devices under test")
}

/// Products split their work by adapter kind: CPU adapters run the GPU split too.
fn devices_variants_and_splits() -> Vec<(Arc<Gpu>, Variant)> {
    pollster::block_on(testing::device_variants_both_splits()).expect("devices under test")
}

/// Kernels and references differ only in summation order and fused multiply-adds.
fn tolerance(quant: QuantType) -> f32 {
    match quant {
        QuantType::F32 | QuantType::F16 | QuantType::BF16 => 2e-5,
        _ => 1e-4,
    }
}

/// Columns per type: K-quants need multiples of 256, the rest multiples of 32.
fn awkward_cols(quant: QuantType) -> [usize; 2] {
    if quant.block_size() == 256 {
        [256, 768]
    } else {
        [96, 800]
    }
}

// ---------------------------------------------------------------------------------------------
// GPU against the references

fn check_products(quant: QuantType) {
    let seed = testing::fresh_seed();
    let [narrow, wide] = awkward_cols(quant);
    let shapes = [
        (1, narrow, 1),
        (7, wide, 3),
        (129, narrow, 17),
        (300, wide, 64),
        (300, narrow, 1),
        (129, wide, 1),
        (7, narrow, 64),
        (1, wide, 17),
    ];
    let mut worst = 0.0f32;
    for (gpu, variant) in devices_variants_and_splits() {
        for (index, &(rows, cols, tokens)) in shapes.iter().enumerate() {
            let case_seed = seed.wrapping_add(index as u64 * 7919);
            let bytes = random_weights(quant, rows, cols, case_seed);
            let x = testing::random_f32(tokens * cols, case_seed ^ 0xa11ce);
            let case = Case {
                quant,
                bytes: &bytes,
                rows,
                cols,
            };
            let want = matmul_reference(quant, &bytes, rows, cols, &x, tokens);
            let got = gpu_matmul(&gpu, variant, &case, &x, tokens);
            let what = format!(
                "{quant:?} {} {variant} cpu_split={} rows={rows} cols={cols} tokens={tokens} \
                 seed={seed}",
                gpu.caps.adapter, gpu.caps.cpu_work_split
            );
            testing::assert_close(&got, &want, tolerance(quant), &what);
            worst = worst.max(testing::relative_error(&got, &want));
        }
    }
    eprintln!("{quant:?}: products worst relative error {worst:e}");
}

fn check_embed(quant: QuantType) {
    let seed = testing::fresh_seed();
    for (gpu, variant) in devices_and_variants() {
        for (index, cols) in awkward_cols(quant).into_iter().enumerate() {
            let rows = 300;
            let bytes = random_weights(quant, rows, cols, seed.wrapping_add(index as u64));
            let case = Case {
                quant,
                bytes: &bytes,
                rows,
                cols,
            };
            let ids: Vec<u32> = [0, 299, 17, 17, 150, 1, 298]
                .into_iter()
                .chain(testing::random_bytes(10, seed).into_iter().map(u32::from))
                .collect();
            let scale = 1.0 + testing::random_f32(1, seed)[0].abs();
            let got = gpu_embed(&gpu, variant, &case, &ids, scale);
            let want = embed_reference(&case, &ids, scale);
            let what = format!(
                "{quant:?} embed {} {variant} cols={cols} seed={seed}",
                gpu.caps.adapter
            );
            testing::assert_close(&got, &want, 1e-6, &what);
        }
    }
}

macro_rules! per_type_tests {
    ($($name:ident: $quant:ident,)*) => {
        mod products {
            $(#[test] fn $name() { super::check_products(super::QuantType::$quant); })*
        }
        mod embedding {
            $(#[test] fn $name() { super::check_embed(super::QuantType::$quant); })*
        }
    };
}

per_type_tests! {
    f32: F32, f16: F16, bf16: BF16, q4_0: Q4_0, q4_1: Q4_1, q5_0: Q5_0, q5_1: Q5_1,
    q8_0: Q8_0, q4_k: Q4_K, q5_k: Q5_K, q6_k: Q6_K,
}

// ---------------------------------------------------------------------------------------------
// The references against hand-worked blocks and against each other

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
    use webshard::gguf::{GgmlType, ENGINE_SUPPORTED};
    assert_eq!(ENGINE_SUPPORTED.len(), QuantType::ALL.len());
    for ggml in ENGINE_SUPPORTED {
        let quant = QuantType::from_ggml_name(ggml.name()).unwrap_or_else(|| panic!("{ggml}"));
        let lower = QuantType::from_ggml_name(&ggml.name().to_lowercase());
        assert_eq!(lower, Some(quant));
        assert_eq!(u64::from(quant.block_size()), ggml.block_size(), "{ggml}");
        assert_eq!(u64::from(quant.block_bytes()), ggml.type_size(), "{ggml}");
    }
    assert_eq!(QuantType::from_ggml_name("Q2_K"), None);
    assert!(matches!(GgmlType::from_id(12), Some(GgmlType::Q4_K)));
}

// ---------------------------------------------------------------------------------------------
// Split tensors and real models

/// Under a 64 KiB binding limit the matrix and the table split into several parts; products
/// and gathers must equal, bit for bit, those over the unsplit tensor.
#[test]
fn split_tensors_give_identical_results() {
    let seed = testing::fresh_seed();
    let whole = pollster::block_on(Gpu::new(&GpuOptions::default())).expect("gpu");
    let options = GpuOptions {
        max_binding_override: Some(64 << 10),
        ..Default::default()
    };
    let split = pollster::block_on(Gpu::new(&options)).expect("gpu with a small binding limit");
    for quant in [QuantType::Q4_0, QuantType::Q6_K, QuantType::F16] {
        let (rows, cols) = (300, 768);
        let bytes = random_weights(quant, rows, cols, seed);
        let case = Case {
            quant,
            bytes: &bytes,
            rows,
            cols,
        };
        let row_bytes = quant.row_bytes(cols as u64);
        let parts = WeightTensor::allocate(&split, "w", rows as u64, row_bytes)
            .unwrap()
            .parts;
        assert!(parts.len() >= 2, "{quant:?}: {} part(s)", parts.len());
        let what = format!("{quant:?} split into {} parts, seed={seed}", parts.len());
        for variant in split.caps.all_variants() {
            for tokens in [1, 5] {
                let x = testing::random_f32(tokens * cols, seed ^ tokens as u64);
                let got = gpu_matmul(&split, variant, &case, &x, tokens);
                let want = gpu_matmul(&whole, variant, &case, &x, tokens);
                assert_eq!(got, want, "{what} {variant} tokens={tokens}");
                let reference = matmul_reference(quant, &bytes, rows, cols, &x, tokens);
                testing::assert_close(&got, &reference, tolerance(quant), &what);
            }
            let ids: Vec<u32> = vec![0, 299, 150, 151, 152, 104, 103, 208, 1];
            let got = gpu_embed(&split, variant, &case, &ids, 0.5);
            assert_eq!(
                got,
                gpu_embed(&whole, variant, &case, &ids, 0.5),
                "{what} embed"
            );
            testing::assert_close(&got, &embed_reference(&case, &ids, 0.5), 1e-6, &what);
        }
    }
}

/// Every prefill tile the kernel is built with, and some it may be asked for, on every device
/// and variant: 4 to 8 lanes along rows, 4 to 16 along tokens, activations staged 32 to 128
/// columns at a time, with columns and tokens that leave every tile partly filled.
/// `MatmulTile::GPU` (16 × 16 lanes) needs more workgroup memory than lavapipe and llvmpipe
/// have (43 of 32 KiB); only its constants differ from the tiles that run here.
#[test]
fn every_matmul_tile_matches_the_reference() {
    let seed = testing::fresh_seed();
    let tiles = [
        MatmulTile::CPU,
        MatmulTile::GPU_32K,
        MatmulTile::SMALL,
        MatmulTile::new([16, 64, 64]),
        MatmulTile::new([16, 32, 128]),
    ];
    let backends = pollster::block_on(testing::devices_under_test()).expect("devices under test");
    let mut ran = [0; 5];
    for device in backends {
        for (tile_index, tile) in tiles.into_iter().enumerate() {
            let options = GpuOptions {
                backend: gpu::BackendChoice::parse(&device.caps.backend).unwrap_or_default(),
                matmul_tile: Some([tile.rows, tile.tokens, tile.staged_cols]),
                ..Default::default()
            };
            let gpu = pollster::block_on(Gpu::new(&options)).expect("gpu");
            // A tile the device cannot hold falls back (checked below); it is run elsewhere.
            if tile.workgroup_bytes() > gpu.caps.max_workgroup_storage {
                assert_ne!(MatmulTile::for_device(&gpu.caps), tile);
                continue;
            }
            assert_eq!(
                MatmulTile::for_device(&gpu.caps),
                tile,
                "{}",
                gpu.caps.adapter
            );
            ran[tile_index] += 1;
            for (quant, cols) in [(QuantType::Q4_1, 800), (QuantType::Q6_K, 768)] {
                let rows = 131;
                let bytes = random_weights(quant, rows, cols, seed);
                let case = Case {
                    quant,
                    bytes: &bytes,
                    rows,
                    cols,
                };
                for variant in gpu.caps.all_variants() {
                    for tokens in [2, 70] {
                        let x = testing::random_f32(tokens * cols, seed ^ tokens as u64);
                        let want = matmul_reference(quant, &bytes, rows, cols, &x, tokens);
                        let got = gpu_matmul(&gpu, variant, &case, &x, tokens);
                        let what = format!(
                            "{tile:?} {quant:?} {} {variant} tokens={tokens} seed={seed}",
                            gpu.caps.adapter
                        );
                        testing::assert_close(&got, &want, tolerance(quant), &what);
                    }
                }
            }
        }
    }
    assert!(
        ran.iter().all(|&n| n > 0),
        "devices that ran each tile: {ran:?}"
    );
}

/// A device with only WebGPU's minimum workgroup memory gets the small tile, and a tile the
/// device cannot hold is not used.
#[test]
fn matmul_tiles_fit_the_workgroup_memory() {
    let gpu = pollster::block_on(Gpu::new(&GpuOptions::default())).expect("gpu");
    let mut caps = gpu.caps.clone();
    caps.max_workgroup_storage = 16 << 10;
    assert_eq!(MatmulTile::for_device(&caps), MatmulTile::SMALL);
    assert!(MatmulTile::SMALL.workgroup_bytes() <= 16 << 10);
    caps.max_workgroup_storage = 1 << 20;
    caps.cpu_work_split = false;
    caps.matmul_tile = Some([64, 64, 128]);
    assert_eq!(
        MatmulTile::for_device(&caps),
        MatmulTile::new([64, 64, 128])
    );
    caps.max_workgroup_storage = MatmulTile::GPU.workgroup_bytes();
    assert_eq!(MatmulTile::for_device(&caps), MatmulTile::GPU);
    caps.max_workgroup_storage = 32 << 10;
    assert_eq!(MatmulTile::for_device(&caps), MatmulTile::GPU_32K);
    assert!(MatmulTile::new([64, 128, 32]).check().is_err());
    assert!(MatmulTile::new([16, 18, 32]).check().is_err());
    assert!(MatmulTile::new([16, 16, 48]).check().is_err());
}

fn model_path(file: &str) -> std::path::PathBuf {
    let dir = std::env::var_os("WEBSHARD_MODELS")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models"));
    let path = dir.join(file);
    assert!(
        path.is_file(),
        "model {} is missing (set WEBSHARD_MODELS)",
        path.display()
    );
    path
}

/// The first `max_rows` rows of the first 2-D tensor of type `quant` in a model file.
fn real_rows(file: &str, quant: QuantType, max_rows: u64) -> (String, Vec<u8>, usize, usize) {
    use webshard::gguf::{read_header, FileSource, RangeSource};
    let source = FileSource::open(model_path(file)).expect("open model");
    let header = pollster::block_on(read_header(&source)).expect("header");
    let tensor = header
        .tensors
        .iter()
        .find(|t| t.shape.len() == 2 && t.ggml_type.name() == quant.ggml_name())
        .unwrap_or_else(|| panic!("{file} has no 2-D {quant:?} tensor"));
    let rows = tensor.rows().min(max_rows);
    let offset = tensor.offset;
    let bytes = pollster::block_on(source.read_range(offset, rows * tensor.row_bytes()))
        .expect("tensor bytes");
    (
        tensor.name.clone(),
        bytes,
        rows as usize,
        tensor.shape[0] as usize,
    )
}

fn check_real_tensor(file: &str, quant: QuantType) {
    let seed = testing::fresh_seed();
    let (name, bytes, rows, cols) = real_rows(file, quant, 96);
    let case = Case {
        quant,
        bytes: &bytes,
        rows,
        cols,
    };
    let values = embed_reference(&case, &(0..rows as u32).collect::<Vec<_>>(), 1.0);
    let rms = (values.iter().map(|v| v * v).sum::<f32>() / values.len() as f32).sqrt();
    assert!(
        values.iter().all(|v| v.is_finite() && v.abs() < 64.0) && rms > 1e-3,
        "{file} {name}: implausible weights (rms {rms})"
    );
    for (gpu, variant) in devices_and_variants() {
        let what = format!(
            "{file} {name} {quant:?} {} {variant} seed={seed}",
            gpu.caps.adapter
        );
        for tokens in [1, 5] {
            let x = testing::random_f32(tokens * cols, seed ^ tokens as u64);
            let got = gpu_matmul(&gpu, variant, &case, &x, tokens);
            let want = matmul_reference(quant, &bytes, rows, cols, &x, tokens);
            testing::assert_close(
                &got,
                &want,
                tolerance(quant),
                &format!("{what} tokens={tokens}"),
            );
        }
        let ids = [0, rows as u32 - 1, 7, 7, 40];
        let got = gpu_embed(&gpu, variant, &case, &ids, 1.25);
        testing::assert_close(&got, &embed_reference(&case, &ids, 1.25), 1e-6, &what);
    }
}

const SMOLLM2: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
const QWEN: &str = "qwen2.5-coder-0.5b-instruct-awq.Q4_K_M.gguf";

#[test]
fn real_smollm2_q4_1_and_q8_0_tensors() {
    check_real_tensor(SMOLLM2, QuantType::Q4_1);
    check_real_tensor(SMOLLM2, QuantType::Q8_0);
}

#[test]
fn real_qwen_k_quant_tensors() {
    check_real_tensor(QWEN, QuantType::Q4_K);
    check_real_tensor(QWEN, QuantType::Q6_K);
}

#[test]
fn real_qwen_q5_0_and_q8_0_tensors() {
    check_real_tensor(QWEN, QuantType::Q5_0);
    check_real_tensor(QWEN, QuantType::Q8_0);
}
