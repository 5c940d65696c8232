//! Test inputs for the quantized kernels, natively and in the browser.

use half::{bf16, f16};

use super::QuantType;

/// Random but valid GGUF rows: random quant bits, and finite, small f16 scales (raw random
/// bits could be NaN or infinite).
pub fn random_weights(quant: QuantType, rows: usize, cols: usize, seed: u64) -> Vec<u8> {
    let count = rows * cols;
    let values = crate::gpu::testing::random_f32(count, seed);
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
    let mut bytes =
        crate::gpu::testing::random_bytes(rows * quant.row_bytes(cols as u64) as usize, seed);
    let scales = crate::gpu::testing::random_f32(bytes.len() / block_bytes * 2, seed ^ 0x5ca1e);
    let scale_fields = quant.f16_scale_offsets();
    for (block, pair) in bytes.chunks_exact_mut(block_bytes).zip(scales.chunks(2)) {
        for (&field, &scale) in scale_fields.iter().zip(pair) {
            let value = f16::from_f32(scale * 0.05);
            block[field..field + 2].copy_from_slice(&value.to_le_bytes());
        }
    }
    bytes
}
