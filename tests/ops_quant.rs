//! Quantized products and the embedding gather: the CPU references against hand-worked blocks
//! and each other, then every kernel against the references on every device and variant, on
//! split tensors, and on tensors read from the real models.

use std::sync::Arc;

use half::{bf16, f16};
use webshard::gpu::{self, testing, Gpu, Recorder, Variant, WeightTensor};
use webshard::ops::quant::{
    dequant_row_reference, embed, matmul, matmul_reference, QuantMatrix, QuantType,
};

// ---------------------------------------------------------------------------------------------
// Inputs and GPU plumbing

/// Random but valid GGUF rows: random quant bits, and finite, small f16 scales (raw random
/// bits could be NaN or infinite).
fn random_weights(quant: QuantType, rows: usize, cols: usize, seed: u64) -> Vec<u8> {
    let count = rows * cols;
    let values = testing::random_f32(count, seed);
    match quant {
        QuantType::F32 => return values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        QuantType::F16 => {
            return values
                .iter()
                .flat_map(|&v| f16::from_f32(v).to_le_bytes())
                .collect()
        }
        QuantType::BF16 => {
            return values
                .iter()
                .flat_map(|&v| bf16::from_f32(v).to_le_bytes())
                .collect()
        }
        _ => {}
    }
    let block_bytes = quant.block_bytes() as usize;
    let mut bytes = testing::random_bytes(rows * quant.row_bytes(cols as u64) as usize, seed);
    let scales = testing::random_f32(bytes.len() / block_bytes * 2, seed ^ 0x5ca1e);
    let scale_fields: &[usize] = match quant {
        QuantType::Q4_0 | QuantType::Q5_0 | QuantType::Q8_0 => &[0],
        QuantType::Q6_K => &[208],
        _ => &[0, 2],
    };
    for (block, pair) in bytes.chunks_exact_mut(block_bytes).zip(scales.chunks(2)) {
        for (&field, &scale) in scale_fields.iter().zip(pair) {
            let value = f16::from_f32(scale * 0.05);
            block[field..field + 2].copy_from_slice(&value.to_le_bytes());
        }
    }
    bytes
}

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
    let devices = pollster::block_on(testing::devices_under_test()).expect("devices under test");
    devices
        .into_iter()
        .flat_map(|gpu| {
            let variants = gpu.caps.all_variants();
            variants.into_iter().map(move |v| (gpu.clone(), v))
        })
        .collect()
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
    for (gpu, variant) in devices_and_variants() {
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
                "{quant:?} {} {variant} rows={rows} cols={cols} tokens={tokens} seed={seed}",
                gpu.caps.adapter
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
