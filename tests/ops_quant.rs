//! Quantized products and the embedding gather: every kernel against the CPU references (which
//! `quant_reference` checks against hand-worked blocks) on every device and variant, in every
//! prefill tile, on split tensors, and on tensors read from the real models.

use std::sync::Arc;

use webshard::gpu::{self, testing, Gpu, GpuOptions, Recorder, Variant, WeightTensor};
use webshard::ops::quant::testing::random_weights;
use webshard::ops::quant::{
    dequant_row_reference, embed, matmul, matmul_product, matmul_reference, MatmulTile,
    QuantMatrix, QuantType,
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

/// A product as the library routes it (`matmul`) or through the prefill tiles alone
/// (`matmul_product`).
type Product = fn(&mut Recorder, &QuantMatrix, &wgpu::Buffer, &wgpu::Buffer, u32);

fn gpu_matmul(gpu: &Gpu, variant: Variant, case: &Case, x: &[f32], tokens: usize) -> Vec<f32> {
    gpu_product(matmul, gpu, variant, case, x, tokens)
}

fn gpu_product(
    product: Product,
    gpu: &Gpu,
    variant: Variant,
    case: &Case,
    x: &[f32],
    tokens: usize,
) -> Vec<f32> {
    let tensor = upload_weights(gpu, "w", case.bytes, case.rows);
    let w = QuantMatrix::new(&tensor, case.quant, case.cols as u32, case.rows as u32).unwrap();
    let x_buffer = gpu::upload_f32(gpu, "x", x);
    let out_bytes = (tokens * case.rows * 4) as u64;
    let out = gpu::storage_buffer(gpu, "out", out_bytes);
    gpu::poison_f32(gpu, &out);
    let mut rec = Recorder::with_variant(gpu, variant);
    product(&mut rec, &w, &x_buffer, &out, tokens as u32);
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
fn devices_and_splits() -> Vec<Arc<Gpu>> {
    pollster::block_on(testing::devices_both_splits()).expect("devices under test")
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

/// How much cancellation magnifies summation error: the largest sum of |w·x| terms of any
/// output over the largest output (at least 1). A single row of 96 random terms can sum to
/// ~1% of its terms' magnitudes, where rounding in any order is ~1e-5 of the result
/// (2.4e-5 at seed 1796406744687644919, one row of 96 f32 columns, on the CPU split).
fn cancellation(
    quant: QuantType,
    bytes: &[u8],
    rows: usize,
    cols: usize,
    x: &[f32],
    want: &[f32],
) -> f32 {
    let magnitudes: Vec<f32> = x.iter().map(|v| v.abs()).collect();
    let row_bytes = quant.row_bytes(cols as u64) as usize;
    let mut row = vec![0.0f32; cols];
    let mut terms = 0.0f32;
    for n in 0..rows {
        dequant_row_reference(quant, &bytes[n * row_bytes..(n + 1) * row_bytes], &mut row);
        for activations in magnitudes.chunks(cols) {
            let sum: f32 = row.iter().zip(activations).map(|(w, a)| w.abs() * a).sum();
            terms = terms.max(sum);
        }
    }
    let largest = want.iter().fold(1e-6f32, |m, v| m.max(v.abs()));
    (terms / largest).max(1.0)
}

// ---------------------------------------------------------------------------------------------
// GPU against the references

/// Shapes of one token (the matvec kernels) and of several (the tiled product; a few tokens
/// take the matvec kernels in the GPU work split), with rows and columns that leave tiles and
/// blocks partly filled.
const SINGLE_TOKEN_SHAPES: [(usize, bool, usize); 4] =
    [(1, false, 1), (300, false, 1), (129, true, 1), (7, true, 1)];
const MULTI_TOKEN_SHAPES: [(usize, bool, usize); 5] = [
    (7, true, 3),
    (129, false, 17),
    (300, true, 64),
    (7, false, 64),
    (1, true, 17),
];

/// Every shape on every device and work split, each in one of the device's variants in turn
/// (`testing::variant_for_case`): every variant runs one-token and several-token products.
fn check_products(quant: QuantType) {
    let seed = testing::fresh_seed();
    let [narrow, wide] = awkward_cols(quant);
    let mut worst = 0.0f32;
    for gpu in devices_and_splits() {
        let variants = gpu.caps.all_variants();
        for (group, shapes) in [&SINGLE_TOKEN_SHAPES[..], &MULTI_TOKEN_SHAPES[..]]
            .into_iter()
            .enumerate()
        {
            for (index, &(rows, is_wide, tokens)) in shapes.iter().enumerate() {
                let variant = testing::variant_for_case(&variants, index, seed);
                let cols = if is_wide { wide } else { narrow };
                let case_seed = seed.wrapping_add((group * 100 + index) as u64 * 7919);
                let bytes = random_weights(quant, rows, cols, case_seed);
                let x = testing::random_f32(tokens * cols, case_seed ^ 0xa11ce);
                let case = Case {
                    quant,
                    bytes: &bytes,
                    rows,
                    cols,
                };
                let want = matmul_reference(quant, &bytes, rows, cols, &x, tokens);
                let conditioning = cancellation(quant, &bytes, rows, cols, &x, &want);
                let got = gpu_matmul(&gpu, variant, &case, &x, tokens);
                let what = format!(
                    "{quant:?} {} {variant} cpu_split={} rows={rows} cols={cols} tokens={tokens} \
                     seed={seed}",
                    gpu.caps.adapter, gpu.caps.cpu_work_split
                );
                testing::assert_close(&got, &want, tolerance(quant) * conditioning, &what);
                worst = worst.max(testing::relative_error(&got, &want) / conditioning);
            }
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
    q2_k: Q2_K, q3_k: Q3_K, iq4_nl: IQ4_NL, iq4_xs: IQ4_XS,
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
    for quant in [
        QuantType::Q4_0,
        QuantType::Q6_K,
        QuantType::F16,
        QuantType::Q3_K,
    ] {
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
            // One token through the matrix-vector kernel, 17 through the prefill tiles.
            for tokens in [1, 17] {
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
/// and variant (each type in one variant, in turn): 2 to 8 lanes along rows, 2 to 16 along
/// tokens, 4 × 4 and 8 × 8 outputs a lane, activations staged 32 to 128 columns at a time, with
/// columns and tokens that leave every tile partly filled. Through the tiled product itself:
/// `matmul` hands a few tokens to the matrix-vector kernel, which `products` tests.
/// `MatmulTile::GPU` (16 × 16 lanes) needs more workgroup memory than lavapipe and llvmpipe
/// have (43 of 32 KiB); only its constants differ from the tiles that run here.
#[test]
fn every_matmul_tile_matches_the_reference() {
    let seed = testing::fresh_seed();
    let tiles = [
        MatmulTile::CPU,
        MatmulTile::GPU_32K,
        MatmulTile::SMALL,
        MatmulTile::new([16, 64, 64, 4]),
        MatmulTile::new([16, 32, 128, 4]),
        MatmulTile::new([32, 16, 64, 8]),
    ];
    let backends = pollster::block_on(testing::devices_under_test()).expect("devices under test");
    let mut ran = [0; 6];
    for device in backends {
        for (tile_index, tile) in tiles.into_iter().enumerate() {
            let options = GpuOptions {
                backend: gpu::BackendChoice::parse(&device.caps.backend).unwrap_or_default(),
                matmul_tile: Some([tile.rows, tile.tokens, tile.staged_cols, tile.lane]),
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
            let variants = gpu.caps.all_variants();
            for (type_index, (quant, cols)) in tile_types().into_iter().enumerate() {
                let rows = 131;
                let bytes = random_weights(quant, rows, cols, seed);
                let case = Case {
                    quant,
                    bytes: &bytes,
                    rows,
                    cols,
                };
                let variant = testing::variant_for_case(&variants, type_index + tile_index, seed);
                for tokens in [2, 70] {
                    let x = testing::random_f32(tokens * cols, seed ^ tokens as u64);
                    let want = matmul_reference(quant, &bytes, rows, cols, &x, tokens);
                    let got = gpu_product(matmul_product, &gpu, variant, &case, &x, tokens);
                    let what = format!(
                        "{tile:?} {quant:?} {} {variant} tokens={tokens} seed={seed}",
                        gpu.caps.adapter
                    );
                    testing::assert_close(&got, &want, tolerance(quant), &what);
                }
            }
        }
    }
    assert!(
        ran.iter().all(|&n| n > 0),
        "devices that ran each tile: {ran:?}"
    );
}

/// The types every tile runs: the legacy and K-quant layouts, and those of Q2_K, Q3_K (only
/// 2-byte aligned), IQ4_NL and IQ4_XS.
fn tile_types() -> [(QuantType, usize); 6] {
    [
        (QuantType::Q4_1, 800),
        (QuantType::Q6_K, 768),
        (QuantType::Q2_K, 768),
        (QuantType::Q3_K, 768),
        (QuantType::IQ4_NL, 800),
        (QuantType::IQ4_XS, 768),
    ]
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
    caps.matmul_tile = Some([64, 64, 128, 4]);
    assert_eq!(
        MatmulTile::for_device(&caps),
        MatmulTile::new([64, 64, 128, 4])
    );
    caps.max_workgroup_storage = MatmulTile::GPU.workgroup_bytes();
    assert_eq!(MatmulTile::for_device(&caps), MatmulTile::GPU);
    caps.max_workgroup_storage = 32 << 10;
    assert_eq!(MatmulTile::for_device(&caps), MatmulTile::GPU_32K);
    assert!(MatmulTile::new([64, 128, 32, 4]).check().is_err());
    assert!(MatmulTile::new([16, 18, 32, 4]).check().is_err());
    assert!(MatmulTile::new([16, 16, 48, 4]).check().is_err());
    assert!(MatmulTile::new([16, 12, 32, 8]).check().is_err());
    assert!(MatmulTile::new([16, 16, 32, 6]).check().is_err());
    assert!(MatmulTile::new([128, 128, 32, 8]).check().is_ok());
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
        // One token through the matrix-vector kernel, 17 through the prefill tiles.
        for tokens in [1, 17] {
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
