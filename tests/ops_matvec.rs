//! The decode matvec with its fusions (input RMS norm; bias, residual-accumulate and gated
//! epilogues) against the CPU reference, on every device and variant, in both work splits
//! (CPU adapters run the GPU split too, so CI covers what discrete GPUs run).

use std::sync::Arc;

use webshard::gpu::{self, testing, Gpu, Recorder, Variant, WeightTensor};
use webshard::ops::elementwise::Activation;
use webshard::ops::quant::testing::random_weights;
use webshard::ops::quant::{
    matvec, matvec_reference, Epilogue, Fusion, QuantMatrix, QuantType, ReferenceEpilogue,
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

fn devices() -> Vec<(Arc<Gpu>, Variant)> {
    pollster::block_on(testing::device_variants_both_splits()).expect("devices under test")
}

/// One product's inputs: the matrix, x, the norm weight, aux (bias or gate values) and the
/// output's previous contents (what Accumulate adds to).
struct Inputs {
    quant: QuantType,
    rows: usize,
    cols: usize,
    bytes: Vec<u8>,
    x: Vec<f32>,
    norm_weight: Vec<f32>,
    aux: Vec<f32>,
    previous: Vec<f32>,
}

impl Inputs {
    fn new(quant: QuantType, rows: usize, cols: usize, seed: u64) -> Inputs {
        Inputs {
            quant,
            rows,
            cols,
            bytes: random_weights(quant, rows, cols, seed),
            x: testing::random_f32(cols, seed ^ 1),
            norm_weight: testing::random_f32(cols, seed ^ 2),
            aux: testing::random_f32(rows, seed ^ 3),
            previous: testing::random_f32(rows, seed ^ 4),
        }
    }
}

fn run_gpu(
    gpu: &Gpu,
    variant: Variant,
    inputs: &Inputs,
    norm: bool,
    epilogue: ReferenceEpilogue,
) -> Vec<f32> {
    let tensor = upload_weights(gpu, &inputs.bytes, inputs.rows);
    let w = QuantMatrix::new(
        &tensor,
        inputs.quant,
        inputs.cols as u32,
        inputs.rows as u32,
    )
    .expect("matrix");
    let x = gpu::upload_f32(gpu, "x", &inputs.x);
    let norm_weight = gpu::upload_f32(gpu, "norm", &inputs.norm_weight);
    let aux = gpu::upload_f32(gpu, "aux", &inputs.aux);
    let out = gpu::upload_f32(gpu, "out", &inputs.previous);
    if !matches!(epilogue, ReferenceEpilogue::Accumulate) {
        gpu::poison_f32(gpu, &out);
    }
    let fusion = Fusion {
        norm: norm.then_some((&norm_weight, 1e-5)),
        epilogue: match epilogue {
            ReferenceEpilogue::Store => Epilogue::Store,
            ReferenceEpilogue::Bias => Epilogue::Bias(&aux),
            ReferenceEpilogue::Accumulate => Epilogue::Accumulate,
            ReferenceEpilogue::Gated(act) => Epilogue::Gated(&aux, act),
        },
    };
    let mut rec = Recorder::with_variant(gpu, variant);
    matvec(&mut rec, &w, &x, &out, &fusion);
    let bytes = (inputs.rows * 4) as u64;
    let read = pollster::block_on(rec.submit_and_read(&out, 0, bytes)).expect("read");
    bytemuck::pod_collect_to_vec(&read)
}

fn check(inputs: &Inputs, norm: bool, epilogue: ReferenceEpilogue, seed: u64) {
    let mut want = inputs.previous.clone();
    let norm_ref = norm.then_some((inputs.norm_weight.as_slice(), 1e-5));
    matvec_reference(
        inputs.quant,
        &inputs.bytes,
        inputs.rows,
        &inputs.x,
        norm_ref,
        epilogue,
        &inputs.aux,
        &mut want,
    );
    for (gpu, variant) in devices() {
        let got = run_gpu(&gpu, variant, inputs, norm, epilogue);
        let what = format!(
            "{:?} {} {variant} cpu_split={} rows={} cols={} norm={norm} {epilogue:?} seed={seed}",
            inputs.quant, gpu.caps.adapter, gpu.caps.cpu_work_split, inputs.rows, inputs.cols
        );
        testing::assert_close(&got, &want, 2e-4, &what);
    }
}

#[test]
fn fused_matvec_matches_the_reference() {
    let seed = testing::fresh_seed();
    let epilogues = [
        ReferenceEpilogue::Store,
        ReferenceEpilogue::Bias,
        ReferenceEpilogue::Accumulate,
        ReferenceEpilogue::Gated(Activation::Silu),
        ReferenceEpilogue::Gated(Activation::GeluTanh),
    ];
    for (index, quant) in [QuantType::Q4_1, QuantType::Q4_K, QuantType::Q6_K]
        .into_iter()
        .enumerate()
    {
        let cols = if quant.block_size() == 256 { 512 } else { 576 };
        let inputs = Inputs::new(quant, 75, cols, seed.wrapping_add(index as u64));
        for (e, epilogue) in epilogues.into_iter().enumerate() {
            check(&inputs, e % 2 == 0, epilogue, seed);
            check(&inputs, e % 2 == 1, epilogue, seed);
        }
    }
}

#[test]
fn gpu_work_split_matvec_covers_every_type() {
    let seed = testing::fresh_seed();
    for (index, quant) in QuantType::ALL.into_iter().enumerate() {
        let cols = if quant.block_size() == 256 { 768 } else { 96 };
        let inputs = Inputs::new(quant, 129, cols, seed.wrapping_add(index as u64));
        check(&inputs, true, ReferenceEpilogue::Store, seed);
    }
}
