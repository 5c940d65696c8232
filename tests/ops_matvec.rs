//! The decode matvec with its fusions (input RMS norm; bias, residual-accumulate, gated and
//! GLU epilogues), and on matrices that are rows of a larger tensor, against the CPU
//! reference, on every device and variant, in both work splits (CPU adapters run the GPU split
//! too, so CI covers what discrete GPUs run). Each case runs in one of a device's variants, in
//! turn from a seed-chosen start (`testing::variant_for_case`); every test has at least as many
//! cases as a device has variants.

use std::ops::Range;
use std::sync::Arc;

use webshard::gpu::{
    self, testing, BackendChoice, Gpu, GpuOptions, Recorder, Variant, WeightTensor,
};
use webshard::ops::elementwise::{activation_reference, Activation};
use webshard::ops::quant::testing::random_weights;
use webshard::ops::quant::{
    matmul, matvec, matvec_reference, matvec_sections, matvec_tokens, Epilogue, Fusion,
    QuantMatrix, QuantType, ReferenceEpilogue,
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

/// Every device in both work splits, each with the variant that case number `turn` runs in
/// (`testing::variant_for_case`): a test's cases together cover every variant.
fn devices_for_case(turn: usize, seed: u64) -> Vec<(Arc<Gpu>, Variant)> {
    let devices = pollster::block_on(testing::devices_both_splits()).expect("devices under test");
    devices
        .into_iter()
        .map(|gpu| {
            let variant = testing::variant_for_case(&gpu.caps.all_variants(), turn, seed);
            (gpu, variant)
        })
        .collect()
}

/// The first device under test again with each batched work split that puts several tokens
/// in a workgroup (lanes, lanes per row, rows per lane, tokens per workgroup; the kernel's
/// `TPW`), with the GPU work split.
fn batch_split_devices(turn: usize, seed: u64) -> Vec<(Arc<Gpu>, Variant)> {
    let first = pollster::block_on(testing::devices_under_test()).expect("devices under test");
    let backend = BackendChoice::parse(&first[0].caps.backend).unwrap_or_default();
    [[64, 8, 2, 4], [128, 16, 1, 2], [128, 32, 1, 4]]
        .into_iter()
        .map(|split| {
            let options = GpuOptions {
                backend,
                gpu_work_split: true,
                matvec_batch_split: Some(split),
                ..Default::default()
            };
            let gpu = pollster::block_on(Gpu::new(&options)).expect("device");
            let variant = testing::variant_for_case(&gpu.caps.all_variants(), turn, seed);
            (gpu, variant)
        })
        .collect()
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
        residual: None,
        norm: norm.then_some((&norm_weight, 1e-5)),
        epilogue: match epilogue {
            ReferenceEpilogue::Store => Epilogue::Store,
            ReferenceEpilogue::Bias => Epilogue::Bias(&aux),
            ReferenceEpilogue::Accumulate => Epilogue::Accumulate,
            ReferenceEpilogue::Gated(act) => Epilogue::Gated(&aux, act),
        },
        out_offset: 0,
    };
    let mut rec = Recorder::with_variant(gpu, variant);
    matvec(&mut rec, &w, &x, &out, &fusion);
    let bytes = (inputs.rows * 4) as u64;
    let read = pollster::block_on(rec.submit_and_read(&out, 0, bytes)).expect("read");
    bytemuck::pod_collect_to_vec(&read)
}

/// Checks one product on every device, in the variant of case number `turn`.
fn check(inputs: &Inputs, norm: bool, epilogue: ReferenceEpilogue, turn: usize, seed: u64) {
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
    for (gpu, variant) in devices_for_case(turn, seed) {
        let got = run_gpu(&gpu, variant, inputs, norm, epilogue);
        let what = format!(
            "{:?} {} {variant} cpu_split={} rows={} cols={} norm={norm} {epilogue:?} seed={seed}",
            inputs.quant, gpu.caps.adapter, gpu.caps.cpu_work_split, inputs.rows, inputs.cols
        );
        testing::assert_close(&got, &want, 2e-4, &what);
    }
}

/// Every type with every epilogue, the input norm on or off: a pairwise cover of the three
/// (each type and each epilogue meets both norm settings, `(type + epilogue) % 2` choosing),
/// since the norm prologue, the epilogue and the type's decode are separate parts of the
/// kernel. Each case is a pipeline of its own to compile on every device (CI's time: docs/ci.md,
/// session 41).
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
    let types = [
        QuantType::Q4_1,
        QuantType::Q4_K,
        QuantType::Q6_K,
        QuantType::Q2_K,
        QuantType::Q3_K,
        QuantType::IQ4_NL,
        QuantType::IQ4_XS,
    ];
    for (index, quant) in types.into_iter().enumerate() {
        let cols = if quant.block_size() == 256 { 512 } else { 576 };
        let inputs = Inputs::new(quant, 75, cols, seed.wrapping_add(index as u64));
        for (e, epilogue) in epilogues.into_iter().enumerate() {
            let turn = index * epilogues.len() + e;
            check(&inputs, (index + e) % 2 == 0, epilogue, turn, seed);
        }
    }
}

#[test]
fn gpu_work_split_matvec_covers_every_type() {
    let seed = testing::fresh_seed();
    for (index, quant) in QuantType::ALL.into_iter().enumerate() {
        let cols = if quant.block_size() == 256 { 768 } else { 96 };
        let inputs = Inputs::new(quant, 129, cols, seed.wrapping_add(index as u64));
        check(&inputs, true, ReferenceEpilogue::Store, index, seed);
    }
}

/// Output heads (16384 rows and more) take GPUs' wide work split, four rows per lane; a row
/// count that is no multiple of the workgroup's rows checks the tail.
#[test]
fn head_sized_matvec_matches_the_reference() {
    let seed = testing::fresh_seed();
    for (index, quant) in [QuantType::Q8_0, QuantType::Q6_K].into_iter().enumerate() {
        let cols = quant.block_size() as usize;
        let inputs = Inputs::new(quant, 16384 + 77, cols, seed.wrapping_add(index as u64));
        for turn in [index * 2, index * 2 + 1] {
            check(&inputs, true, ReferenceEpilogue::Store, turn, seed);
        }
    }
}

/// Runs `matvec` on rows `rows` of the inputs' tensor, with the input norm, with a bias or
/// (given up's rows and the activation) the GLU epilogue, from element `out_offset` of a
/// poisoned output; returns the rows written.
fn run_view(
    gpu: &Gpu,
    variant: Variant,
    inputs: &Inputs,
    rows: Range<u32>,
    glu: Option<(Range<u32>, Activation)>,
    out_offset: u32,
) -> Vec<f32> {
    let tensor = upload_weights(gpu, &inputs.bytes, inputs.rows);
    let all = QuantMatrix::new(
        &tensor,
        inputs.quant,
        inputs.cols as u32,
        inputs.rows as u32,
    )
    .expect("matrix");
    let w = all.rows(rows.clone());
    let x = gpu::upload_f32(gpu, "x", &inputs.x);
    let norm_weight = gpu::upload_f32(gpu, "norm", &inputs.norm_weight);
    let aux = gpu::upload_f32(gpu, "aux", &inputs.aux);
    let out = gpu::upload_f32(gpu, "out", &inputs.previous);
    gpu::poison_f32(gpu, &out);
    let fusion = Fusion {
        residual: None,
        norm: Some((&norm_weight, 1e-5)),
        epilogue: match glu {
            Some((up, act)) => Epilogue::Glu(all.rows(up), act),
            None => Epilogue::Bias(&aux),
        },
        out_offset,
    };
    let mut rec = Recorder::with_variant(gpu, variant);
    matvec(&mut rec, &w, &x, &out, &fusion);
    let bytes = u64::from(rows.len() as u32 * 4);
    let read = rec.submit_and_read(&out, u64::from(out_offset) * 4, bytes);
    bytemuck::pod_collect_to_vec(&pollster::block_on(read).expect("read"))
}

/// The reference products of rows `rows` of the inputs' tensor with the normalised x.
fn reference_rows(inputs: &Inputs, rows: Range<u32>) -> Vec<f32> {
    let row_bytes = inputs.bytes.len() / inputs.rows;
    let bytes = &inputs.bytes[rows.start as usize * row_bytes..rows.end as usize * row_bytes];
    let mut dots = vec![0.0; rows.len()];
    let norm = Some((inputs.norm_weight.as_slice(), 1e-5));
    let (store, quant) = (ReferenceEpilogue::Store, inputs.quant);
    matvec_reference(
        quant,
        bytes,
        rows.len(),
        &inputs.x,
        norm,
        store,
        &[],
        &mut dots,
    );
    dots
}

/// Types with rows of whole words and with rows that are not (Q5_0, Q6_K, Q3_K, IQ4_NL at
/// these widths).
fn view_types() -> [(QuantType, usize); 9] {
    [
        (QuantType::Q4_1, 576),
        (QuantType::Q5_0, 96),
        (QuantType::Q8_0, 64),
        (QuantType::Q6_K, 256),
        (QuantType::F32, 64),
        (QuantType::Q2_K, 256),
        (QuantType::Q3_K, 256),
        (QuantType::IQ4_NL, 96),
        (QuantType::IQ4_XS, 256),
    ]
}

#[test]
fn matvec_reads_rows_of_a_larger_tensor() {
    let seed = testing::fresh_seed();
    for (index, (quant, cols)) in view_types().into_iter().enumerate() {
        let inputs = Inputs::new(quant, 90, cols, seed.wrapping_add(index as u64));
        let (rows, out_offset) = (7..72, 11);
        let bias = &inputs.aux[out_offset as usize..][..rows.len()];
        let want: Vec<f32> = reference_rows(&inputs, rows.clone())
            .iter()
            .zip(bias)
            .map(|(dot, b)| dot + b)
            .collect();
        for (gpu, variant) in devices_for_case(index, seed) {
            let got = run_view(&gpu, variant, &inputs, rows.clone(), None, out_offset);
            let what = format!(
                "{quant:?} {} {variant} cpu_split={} rows {rows:?} of 90 seed={seed}",
                gpu.caps.adapter, gpu.caps.cpu_work_split
            );
            testing::assert_close(&got, &want, 2e-4, &what);
        }
    }
}

#[test]
fn glu_matvec_matches_gate_and_up_references() {
    let seed = testing::fresh_seed();
    let acts = [Activation::Silu, Activation::GeluTanh];
    for (index, (quant, cols)) in view_types().into_iter().enumerate() {
        // Rows: 3 of another matrix, then gate's ff rows, then up's. The first type also
        // takes GPUs' wide GLU split (4096 gate rows and more), with a tail.
        let ff = if index == 0 { 4099 } else { 67 };
        let inputs = Inputs::new(quant, 3 + 2 * ff, cols, seed.wrapping_add(index as u64));
        let (gate, up) = (3..3 + ff as u32, 3 + ff as u32..3 + 2 * ff as u32);
        let act = acts[index % 2];
        let (gate_dots, up_dots) = (
            reference_rows(&inputs, gate.clone()),
            reference_rows(&inputs, up.clone()),
        );
        let want: Vec<f32> = gate_dots
            .iter()
            .zip(&up_dots)
            .map(|(&g, &u)| activation_reference(g, act) * u)
            .collect();
        for (gpu, variant) in devices_for_case(index, seed) {
            let glu = Some((up.clone(), act));
            let got = run_view(&gpu, variant, &inputs, gate.clone(), glu, 0);
            let what = format!(
                "GLU {act:?} {quant:?} {} {variant} cpu_split={} ff={ff} seed={seed}",
                gpu.caps.adapter, gpu.caps.cpu_work_split
            );
            testing::assert_close(&got, &want, 2e-4, &what);
        }
    }
}

/// `matvec_tokens` runs one product per row of x into the same row of a poisoned output, with
/// each row's own norm and the bias of every row, and likewise into sections (`matvec_sections`,
/// two products of rows of the matrix); `quant::matmul` takes it for a GPU's few-token products
/// (and the tiled kernel on CPU adapters): all against the reference, row by row; and the GLU
/// epilogue (gate and up rows of one matrix) over the same tokens.
/// The token counts give workgroups of 4 tokens (the last one short: 5, 7) and of 2 (2, 3).
#[test]
fn matvec_over_several_tokens_matches_the_reference_per_row() {
    let seed = testing::fresh_seed();
    for (index, (quant, tokens)) in [
        (QuantType::Q4_1, 5),
        (QuantType::Q4_K, 2),
        (QuantType::IQ4_XS, 7),
        (QuantType::F16, 3),
    ]
    .into_iter()
    .enumerate()
    {
        let cols = if quant.block_size() == 256 { 512 } else { 192 };
        let rows = 75;
        let bytes = random_weights(quant, rows, cols, seed.wrapping_add(index as u64));
        let x = testing::random_f32(tokens * cols, seed ^ 11);
        let aux = testing::random_f32(rows, seed ^ 12);
        let norm_weight = testing::random_f32(cols, seed ^ 13);
        let mut want_bias = vec![0.0; tokens * rows];
        let mut want_plain = vec![0.0; tokens * rows];
        let mut want_normed = vec![0.0; tokens * rows];
        for t in 0..tokens {
            let (x_row, aux_row) = (&x[t * cols..][..cols], &aux[..]);
            let norm = Some((norm_weight.as_slice(), 1e-5));
            let out = &mut want_bias[t * rows..][..rows];
            let bias = ReferenceEpilogue::Bias;
            matvec_reference(quant, &bytes, rows, x_row, norm, bias, aux_row, out);
            let out = &mut want_plain[t * rows..][..rows];
            let store = ReferenceEpilogue::Store;
            matvec_reference(quant, &bytes, rows, x_row, None, store, aux_row, out);
            let out = &mut want_normed[t * rows..][..rows];
            matvec_reference(quant, &bytes, rows, x_row, norm, store, aux_row, out);
        }
        // GLU over the matrix's first GLU_ROWS rows (gate) and the next as many (up).
        let act = [Activation::Silu, Activation::GeluTanh][index % 2];
        let want_glu: Vec<f32> = (0..tokens * GLU_ROWS)
            .map(|i| {
                let normed = &want_normed[i / GLU_ROWS * rows..];
                let r = i % GLU_ROWS;
                activation_reference(normed[r], act) * normed[GLU_ROWS + r]
            })
            .collect();
        let mut devices = devices_for_case(index, seed);
        devices.extend(batch_split_devices(index, seed));
        for (gpu, variant) in devices {
            let tensor = upload_weights(&gpu, &bytes, rows);
            let w = QuantMatrix::new(&tensor, quant, cols as u32, rows as u32).expect("matrix");
            let x_buf = gpu::upload_f32(&gpu, "x", &x);
            let aux_buf = gpu::upload_f32(&gpu, "aux", &aux);
            let norm_buf = gpu::upload_f32(&gpu, "norm", &norm_weight);
            let what = format!(
                "{quant:?} {} {variant} cpu_split={} batch_split={:?} tokens={tokens} seed={seed}",
                gpu.caps.adapter, gpu.caps.cpu_work_split, gpu.caps.matvec_batch_split
            );
            let fusion = Fusion {
                residual: None,
                norm: Some((&norm_buf, 1e-5)),
                epilogue: Epilogue::Bias(&aux_buf),
                out_offset: 0,
            };
            let got = run_tokens(&gpu, variant, tokens * rows, |rec, out| {
                matvec_tokens(rec, &w, &x_buf, out, &fusion, tokens as u32)
            });
            testing::assert_close(&got, &want_bias, 2e-4, &format!("matvec_tokens {what}"));
            let got = run_tokens(&gpu, variant, tokens * rows, |rec, out| {
                for (run, out_offset) in [
                    (w.rows(0..SPLIT_ROW), 0),
                    (w.rows(SPLIT_ROW..75), SPLIT_ROW),
                ] {
                    let fusion = Fusion {
                        out_offset,
                        ..fusion
                    };
                    matvec_sections(rec, &run, &x_buf, out, &fusion, tokens as u32, SECTION_ENDS);
                }
            });
            let want = in_sections(&want_bias, tokens);
            testing::assert_close(&got, &want, 2e-4, &format!("matvec_sections {what}"));
            let got = run_tokens(&gpu, variant, tokens * rows, |rec, out| {
                matmul(rec, &w, &x_buf, out, tokens as u32)
            });
            testing::assert_close(&got, &want_plain, 2e-4, &format!("matmul {what}"));
            let glu = Fusion {
                residual: None,
                norm: Some((&norm_buf, 1e-5)),
                epilogue: Epilogue::Glu(w.rows(GLU_ROWS as u32..2 * GLU_ROWS as u32), act),
                out_offset: 0,
            };
            let gate = w.rows(0..GLU_ROWS as u32);
            let got = run_tokens(&gpu, variant, tokens * GLU_ROWS, |rec, out| {
                matvec_tokens(rec, &gate, &x_buf, out, &glu, tokens as u32)
            });
            testing::assert_close(&got, &want_glu, 2e-4, &format!("GLU {act:?} {what}"));
        }
    }
}

/// The gate rows of the several-token GLU product (up's follow them; the matrix has 75).
const GLU_ROWS: usize = 37;

/// The 75 rows as a batched step's q, k and v (`matvec_sections`), written by two products
/// split at `SPLIT_ROW` (the first spans q and k, as where q and k share a tensor and v not).
const SECTION_ENDS: [u32; 3] = [41, 58, 75];
const SPLIT_ROW: u32 = 50;

/// Rows of tokens (`[tokens, 75]`) laid out as `matvec_sections` writes them: each section a
/// `[tokens, length]` block, one after another.
fn in_sections(by_token: &[f32], tokens: usize) -> Vec<f32> {
    let rows = SECTION_ENDS[2] as usize;
    let mut starts = vec![0];
    starts.extend(SECTION_ENDS[..2].iter().map(|&end| end as usize));
    let mut out = Vec::with_capacity(by_token.len());
    for (&start, &end) in starts.iter().zip(&SECTION_ENDS) {
        for t in 0..tokens {
            out.extend_from_slice(&by_token[t * rows + start..t * rows + end as usize]);
        }
    }
    out
}

/// Records `body` into a poisoned output of `len` values and reads it back.
fn run_tokens(
    gpu: &Gpu,
    variant: Variant,
    len: usize,
    body: impl FnOnce(&mut Recorder, &wgpu::Buffer),
) -> Vec<f32> {
    let out = gpu::upload_f32(gpu, "out", &vec![0.0; len]);
    gpu::poison_f32(gpu, &out);
    let mut rec = Recorder::with_variant(gpu, variant);
    body(&mut rec, &out);
    let read = pollster::block_on(rec.submit_and_read(&out, 0, (len * 4) as u64)).expect("read");
    bytemuck::pod_collect_to_vec(&read)
}
