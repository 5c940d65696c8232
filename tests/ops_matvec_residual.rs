//! The decode matvec's residual fold (Gemma 3's post-norms joining the stream inside the next
//! product): the product reads `x + rms_norm(delta) · post_w`, normalises it with its own input
//! norm, and its first workgroup writes the new stream into a second buffer. Against the CPU
//! references (`rms_norm_reference`, `matvec_reference`), with both outputs poisoned first, in
//! every variant of every device that runs the GPU work split (CPU adapters too, with it), for
//! a plain product and a GLU one; CPU work splits must refuse the fold.

use webshard::gpu::{self, testing, Gpu, Recorder, Variant, WeightTensor};
use webshard::ops::elementwise::{activation_reference, Activation};
use webshard::ops::norm::rms_norm_reference;
use webshard::ops::quant::testing::random_weights;
use webshard::ops::quant::{
    matvec, matvec_reference, residual_fold_supported, Epilogue, Fusion, QuantMatrix, QuantType,
    ReferenceEpilogue, Residual,
};

const EPS: f32 = 1e-6;
const POST_EPS: f32 = 1e-5;
/// Gate rows (and as many up rows after them in the same tensor, for the GLU case).
const ROWS: usize = 75;

struct Case {
    quant: QuantType,
    cols: usize,
    bytes: Vec<u8>,
    x: Vec<f32>,
    delta: Vec<f32>,
    post_w: Vec<f32>,
    norm_w: Vec<f32>,
}

impl Case {
    fn new(quant: QuantType, cols: usize, seed: u64) -> Case {
        let scaled = |values: Vec<f32>, by: f32| values.iter().map(|v| v * by).collect();
        Case {
            quant,
            cols,
            bytes: random_weights(quant, 2 * ROWS, cols, seed),
            x: testing::random_f32(cols, seed ^ 1),
            // A sub-block's output far from unit scale, as attention outputs are.
            delta: scaled(testing::random_f32(cols, seed ^ 2), 30.0),
            post_w: testing::random_f32(cols, seed ^ 3),
            norm_w: testing::random_f32(cols, seed ^ 4),
        }
    }

    /// The stream after the fold, and the product (GLU: act(gate · h') · (up · h')).
    fn reference(&self, glu: Option<Activation>) -> (Vec<f32>, Vec<f32>) {
        let joined = rms_norm_reference(&self.delta, &self.post_w, POST_EPS);
        let stream: Vec<f32> = self.x.iter().zip(&joined).map(|(x, d)| x + d).collect();
        let product = |rows: std::ops::Range<usize>| {
            let row_bytes = self.bytes.len() / (2 * ROWS);
            let bytes = &self.bytes[rows.start * row_bytes..rows.end * row_bytes];
            let mut out = vec![0.0; rows.len()];
            let norm = Some((self.norm_w.as_slice(), EPS));
            let store = ReferenceEpilogue::Store;
            matvec_reference(self.quant, bytes, ROWS, &stream, norm, store, &[], &mut out);
            out
        };
        let gate = product(0..ROWS);
        let out = match glu {
            None => gate,
            Some(act) => {
                let up = product(ROWS..2 * ROWS);
                let gated = gate.iter().map(|&g| activation_reference(g, act));
                gated.zip(up).map(|(g, u)| g * u).collect()
            }
        };
        (stream, out)
    }

    /// Runs the folded product; `None` where the device refuses the fold.
    fn run(
        &self,
        gpu: &Gpu,
        variant: Variant,
        glu: Option<Activation>,
    ) -> Option<(Vec<f32>, Vec<f32>)> {
        let row_bytes = (self.bytes.len() / (2 * ROWS)) as u64;
        let tensor = WeightTensor::allocate(gpu, "w", 2 * ROWS as u64, row_bytes).expect("w");
        for piece in tensor.upload_pieces(1 << 20) {
            let start = piece.tensor_offset as usize;
            let bytes = &self.bytes[start..start + piece.bytes as usize];
            tensor.write_piece(gpu, &piece, bytes);
        }
        let cols = self.cols as u32;
        let all = QuantMatrix::new(&tensor, self.quant, cols, 2 * ROWS as u32).expect("matrix");
        let gate = all.rows(0..ROWS as u32);
        let epilogue = match glu {
            Some(act) => Epilogue::Glu(all.rows(ROWS as u32..2 * ROWS as u32), act),
            None => Epilogue::Store,
        };
        let mut rec = Recorder::with_variant(gpu, variant);
        if !residual_fold_supported(&rec, &gate, &epilogue) {
            return None;
        }
        let upload = |label, values: &[f32]| gpu::upload_f32(gpu, label, values);
        let (x, delta) = (upload("x", &self.x), upload("delta", &self.delta));
        let (post_w, norm_w) = (upload("post", &self.post_w), upload("norm", &self.norm_w));
        let stream = upload("stream", &self.x);
        let out = upload("out", &vec![0.0; ROWS]);
        gpu::poison_f32(gpu, &stream);
        gpu::poison_f32(gpu, &out);
        let fusion = Fusion {
            residual: Some(Residual {
                delta: &delta,
                weight: &post_w,
                eps: POST_EPS,
                out: &stream,
            }),
            norm: Some((&norm_w, EPS)),
            epilogue,
            out_offset: 0,
        };
        matvec(&mut rec, &gate, &x, &out, &fusion);
        let product = rec.submit_and_read(&out, 0, (ROWS * 4) as u64);
        let product: Vec<f32> = bytemuck::pod_collect_to_vec(&pollster::block_on(product).ok()?);
        let rec = Recorder::with_variant(gpu, variant);
        let written = rec.submit_and_read(&stream, 0, (self.cols * 4) as u64);
        let written = bytemuck::pod_collect_to_vec(&pollster::block_on(written).ok()?);
        Some((written, product))
    }
}

#[test]
fn a_folded_post_norm_matches_norm_add_then_the_product() {
    let seed = testing::fresh_seed();
    let devices = pollster::block_on(testing::devices_both_splits()).expect("devices");
    // Rows of at most 8 units of 32, so that subgroups of 8 (lavapipe's) stage them too.
    let cases = [
        (QuantType::Q4_K, 256),
        (QuantType::Q8_0, 224),
        (QuantType::Q5_0, 160),
        (QuantType::Q6_K, 256),
        (QuantType::F32, 96),
    ];
    let mut folded = 0;
    for (index, (quant, cols)) in cases.into_iter().enumerate() {
        let case = Case::new(quant, cols, seed.wrapping_add(index as u64));
        let glu = [None, Some(Activation::GeluTanh)][index % 2];
        let (want_stream, want) = case.reference(glu);
        for gpu in &devices {
            for variant in gpu.caps.all_variants() {
                let what = format!(
                    "{quant:?} cols {cols} glu {glu:?} on {} {variant} cpu_split={} seed {seed}",
                    gpu.caps.adapter, gpu.caps.cpu_work_split
                );
                let Some((stream, got)) = case.run(gpu, variant, glu) else {
                    assert!(gpu.caps.cpu_work_split, "{what}: the fold was refused");
                    continue;
                };
                assert!(!gpu.caps.cpu_work_split, "{what}: a CPU split folded");
                testing::assert_close(&stream, &want_stream, 1e-5, &format!("{what}: stream"));
                testing::assert_close(&got, &want, 2e-4, &format!("{what}: product"));
                folded += 1;
            }
        }
    }
    assert!(folded > 0, "no device ran the fold (seed {seed})");
}
