//! The prefill product on cooperative matrices (`wgsl/matmul_coop.wgsl`) against the CPU
//! reference, on every device under test that has them, and the capability probe that chooses
//! between it and the tiled kernel everywhere.
//!
//! CI cannot run the cooperative-matrix kernel: its devices are lavapipe (Mesa 22.3, no
//! `VK_KHR_cooperative_matrix`) and llvmpipe's GL (no such feature in wgpu's GL backend), and
//! wgpu 30's browser backend reports no configurations. There this test checks that the probe
//! says so and that prefill products take the tiled kernel, whose own tests are in
//! `ops_quant.rs`. The kernel itself is checked on the H200 (Vulkan, NVIDIA), where the run
//! sets `WEBSHARD_REQUIRE_COOP_MATRIX=1`: then a run that found no such device fails instead
//! of passing on the fallback alone (docs/ci.md).

use std::sync::Arc;

use half::f16;
use webshard::gpu::{
    self, testing, BackendChoice, Gpu, GpuOptions, Recorder, Variant, WeightTensor,
};
use webshard::ops::quant::testing::random_weights;
use webshard::ops::quant::{
    coop_k_splits, dequant_row_reference, matmul_product, matmul_reference, uses_coop_matrix,
    QuantMatrix, QuantType,
};

fn upload_weights(gpu: &Gpu, bytes: &[u8], rows: usize) -> WeightTensor {
    let row_bytes = (bytes.len() / rows) as u64;
    let tensor = WeightTensor::allocate(gpu, "w", rows as u64, row_bytes).expect("allocate");
    for piece in tensor.upload_pieces(1 << 20) {
        let start = piece.tensor_offset as usize;
        tensor.write_piece(gpu, &piece, &bytes[start..start + piece.bytes as usize]);
    }
    tensor
}

struct Case {
    quant: QuantType,
    bytes: Vec<u8>,
    rows: usize,
    cols: usize,
    x: Vec<f32>,
    tokens: usize,
}

impl Case {
    fn random(quant: QuantType, rows: usize, cols: usize, tokens: usize, seed: u64) -> Case {
        Case {
            quant,
            bytes: random_weights(quant, rows, cols, seed),
            rows,
            cols,
            x: testing::random_f32(tokens * cols, seed ^ 0xa11ce),
            tokens,
        }
    }

    fn gpu_product(&self, gpu: &Gpu, variant: Variant) -> Vec<f32> {
        let tensor = upload_weights(gpu, &self.bytes, self.rows);
        let w = QuantMatrix::new(&tensor, self.quant, self.cols as u32, self.rows as u32)
            .expect("matrix");
        let x = gpu::upload_f32(gpu, "x", &self.x);
        let out_bytes = (self.tokens * self.rows * 4) as u64;
        let out = gpu::storage_buffer(gpu, "out", out_bytes);
        gpu::poison_f32(gpu, &out);
        let mut rec = Recorder::with_variant(gpu, variant);
        // The prefill product itself: `matmul` hands few tokens to the per-token products on
        // GPUs (f32 operands), which would leave the small shapes' kernel unchecked.
        matmul_product(&mut rec, &w, &x, &out, self.tokens as u32);
        let bytes = pollster::block_on(rec.submit_and_read(&out, 0, out_bytes)).expect("read");
        bytemuck::pod_collect_to_vec(&bytes)
    }

    /// The product of the operands as the kernel sees them: weights and activations rounded
    /// to f16, products summed exactly.
    fn f16_operand_reference(&self) -> Vec<f32> {
        let to_f16 = |v: f32| f64::from(f16::from_f32(v).to_f32());
        let row_bytes = self.quant.row_bytes(self.cols as u64) as usize;
        let x: Vec<f64> = self.x.iter().map(|&v| to_f16(v)).collect();
        let mut row = vec![0.0f32; self.cols];
        let mut out = vec![0.0f32; self.tokens * self.rows];
        for n in 0..self.rows {
            dequant_row_reference(
                self.quant,
                &self.bytes[n * row_bytes..][..row_bytes],
                &mut row,
            );
            let w: Vec<f64> = row.iter().map(|&v| to_f16(v)).collect();
            for (t, activations) in x.chunks_exact(self.cols).enumerate() {
                let sum: f64 = w.iter().zip(activations).map(|(a, b)| a * b).sum();
                out[t * self.rows + n] = sum as f32;
            }
        }
        out
    }
}

/// Shapes with partial tiles of rows and tokens (a batched step's or a verification's few
/// tokens among them) and K steps of 32 to 128 columns.
fn shapes(quant: QuantType) -> [(usize, usize, usize); 7] {
    let [narrow, wide] = if quant.block_size() == 256 {
        [256, 768]
    } else {
        [96, 800]
    };
    [
        (1, narrow, 2),
        (300, narrow, 9),
        (129, wide, 16),
        (129, wide, 17),
        (300, narrow, 64),
        (64, wide, 65),
        (7, wide, 130),
    ]
}

/// Every shape's grid is small enough that the built-in rule splits K wherever it has more than
/// one step (2 to 7 ways); the same cases run again on the same adapter with splitting turned
/// off (`coop_k_splits` 1).
fn check_coop_device(gpu: &Arc<Gpu>, seed: u64) {
    let variant = gpu.caps.best_variant();
    assert!(variant.coop_matrix && uses_coop_matrix(&gpu.caps, variant));
    let options = GpuOptions {
        backend: BackendChoice::parse(&gpu.caps.backend).unwrap_or_default(),
        coop_k_splits: Some(1),
        ..Default::default()
    };
    let unsplit = pollster::block_on(Gpu::new(&options)).expect("device");
    let mut worst = [0.0f32; 2];
    for quant in QuantType::ALL {
        for (index, (rows, cols, tokens)) in shapes(quant).into_iter().enumerate() {
            let case_seed = seed.wrapping_add(index as u64 * 7919 + quant as u64 * 104_729);
            let case = Case::random(quant, rows, cols, tokens, case_seed);
            // Exactly the f16-operand product, up to f32 summation order, which is within f16
            // rounding of the f32 product.
            let f16_reference = case.f16_operand_reference();
            let exact = matmul_reference(quant, &case.bytes, rows, cols, &case.x, tokens);
            let shape = [rows as u32, cols as u32];
            let splits = coop_k_splits(&gpu.caps, shape, tokens as u32);
            assert_eq!(splits > 1, cols > 128, "{rows}x{cols} at {tokens} tokens");
            assert_eq!(coop_k_splits(&unsplit.caps, shape, tokens as u32), 1);
            for (device, k_splits) in [(gpu.as_ref(), splits), (&unsplit, 1)] {
                let got = case.gpu_product(device, variant);
                let what = format!(
                    "{quant:?} {} {variant} rows={rows} cols={cols} tokens={tokens} \
                     k_splits={k_splits} seed={seed}",
                    gpu.caps.adapter
                );
                testing::assert_close(&got, &f16_reference, 1e-4, &what);
                testing::assert_close(&got, &exact, 5e-3, &what);
                worst[0] = worst[0].max(testing::relative_error(&got, &f16_reference));
                worst[1] = worst[1].max(testing::relative_error(&got, &exact));
            }
        }
    }
    eprintln!(
        "{}: cooperative-matrix products, worst relative error {:e} against the f16-operand \
         reference, {:e} against the f32 one",
        gpu.caps.adapter, worst[0], worst[1]
    );
}

/// The built-in split of K: grids under 64 workgroups get enough workgroups along K to reach
/// about 128, at most one per 128-column step and 8; larger grids none.
#[test]
fn small_cooperative_grids_split_k() {
    let gpu = pollster::block_on(Gpu::new(&Default::default())).expect("gpu");
    let caps = &gpu.caps;
    // Qwen2.5 at 512 tokens: k and v 2 x 8 workgroups (7 steps), q and o 14 x 8, gate and up
    // 76 x 8; SmolLM2's k and v 3 x 8 (5 steps); a 16-row step's 151,936-row head.
    assert_eq!(coop_k_splits(caps, [128, 896], 512), 7);
    assert_eq!(coop_k_splits(caps, [192, 576], 512), 5);
    assert_eq!(coop_k_splits(caps, [896, 896], 512), 1);
    assert_eq!(coop_k_splits(caps, [896, 4864], 512), 1);
    assert_eq!(coop_k_splits(caps, [4864, 896], 512), 1);
    assert_eq!(coop_k_splits(caps, [151_936, 896], 16), 1);
    // Its down product in a 16-row step (14 workgroups).
    assert_eq!(coop_k_splits(caps, [896, 4864], 16), 8);
    assert_eq!(coop_k_splits(caps, [64, 4096], 64), 8);
    assert_eq!(coop_k_splits(caps, [64, 100], 64), 1);
    assert_eq!(coop_k_splits(caps, [64, 4096], 0), 8);
    assert_eq!(coop_k_splits(caps, [63 * 64, 4096], 64), 3);
}

/// A device without cooperative matrices takes the tiled kernel in its best variant, and gets
/// the same product as the reference.
fn check_fallback_device(gpu: &Arc<Gpu>, seed: u64) {
    let variant = gpu.caps.best_variant();
    assert!(!gpu.caps.coop_matrix && !variant.coop_matrix);
    assert!(!uses_coop_matrix(&gpu.caps, variant));
    let case = Case::random(QuantType::Q4_1, 70, 96, 5, seed);
    let got = case.gpu_product(gpu, variant);
    let want = matmul_reference(case.quant, &case.bytes, 70, 96, &case.x, 5);
    let what = format!("{} {variant} fallback seed={seed}", gpu.caps.adapter);
    testing::assert_close(&got, &want, 1e-4, &what);
    eprintln!(
        "{}: no cooperative matrices; the tiled kernel ran",
        gpu.caps.adapter
    );
}

#[test]
fn prefill_products_on_cooperative_matrices_match_the_reference() {
    let seed = testing::fresh_seed();
    let devices = pollster::block_on(testing::devices_under_test()).expect("devices under test");
    let mut coop_devices = 0;
    for gpu in &devices {
        if gpu.caps.coop_matrix {
            check_coop_device(gpu, seed);
            coop_devices += 1;
        } else {
            check_fallback_device(gpu, seed);
        }
    }
    if std::env::var("WEBSHARD_REQUIRE_COOP_MATRIX").is_ok_and(|v| v == "1") {
        assert!(
            coop_devices > 0,
            "WEBSHARD_REQUIRE_COOP_MATRIX=1 but no device under test has cooperative matrices"
        );
    }
}

/// `--matmul-tile` measures the tiled kernel, so a configured tile turns the cooperative one
/// off; and only the best variant asks for it.
#[test]
fn the_probe_chooses_the_kernel() {
    let gpu = pollster::block_on(Gpu::new(&Default::default())).expect("gpu");
    let mut caps = gpu.caps.clone();
    caps.coop_matrix = true;
    let coop = Variant {
        f16: true,
        subgroups: true,
        coop_matrix: true,
    };
    assert!(uses_coop_matrix(&caps, coop));
    assert!(caps.all_variants().iter().all(|v| !v.coop_matrix));
    caps.matmul_tile = Some([64, 64, 32, 4]);
    assert!(!uses_coop_matrix(&caps, coop));
    caps.matmul_tile = None;
    caps.coop_matrix = false;
    assert!(!uses_coop_matrix(&caps, coop));
    assert!(!caps.best_variant().coop_matrix);
}
