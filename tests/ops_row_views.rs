//! Matrices that are rows of a larger tensor (a model's q, k and v, or gate and up, loaded into
//! one tensor): the prefill product and the embedding gather on such views, against the CPU
//! references on the views' own rows, on every device and variant, and on a tensor split into
//! several parts with views that straddle them.

use std::ops::Range;
use std::sync::Arc;

use webshard::gpu::{self, testing, Gpu, GpuOptions, Recorder, Variant, WeightTensor};
use webshard::ops::quant::testing::random_weights;
use webshard::ops::quant::{
    dequant_row_reference, embed, matmul, matmul_reference, QuantMatrix, QuantType,
};

const COLS: usize = 768;
const ROWS: usize = 300;

struct Tensor {
    quant: QuantType,
    bytes: Vec<u8>,
}

impl Tensor {
    fn row_bytes(&self) -> usize {
        self.bytes.len() / ROWS
    }

    fn rows(&self, rows: &Range<u32>) -> &[u8] {
        let row_bytes = self.row_bytes();
        &self.bytes[rows.start as usize * row_bytes..rows.end as usize * row_bytes]
    }

    fn upload(&self, gpu: &Gpu) -> WeightTensor {
        let row_bytes = self.row_bytes() as u64;
        let tensor = WeightTensor::allocate(gpu, "w", ROWS as u64, row_bytes).expect("allocate");
        for piece in tensor.upload_pieces(1 << 20) {
            let start = piece.tensor_offset as usize;
            tensor.write_piece(
                gpu,
                &piece,
                &self.bytes[start..start + piece.bytes as usize],
            );
        }
        tensor
    }
}

/// Runs `op` on rows `rows` of the tensor and reads back `out_floats` values of a poisoned
/// output.
fn run_on_view(
    gpu: &Gpu,
    variant: Variant,
    tensor: &Tensor,
    rows: &Range<u32>,
    out_floats: usize,
    op: impl FnOnce(&mut Recorder, &QuantMatrix, &wgpu::Buffer),
) -> Vec<f32> {
    let weights = tensor.upload(gpu);
    let all = QuantMatrix::new(&weights, tensor.quant, COLS as u32, ROWS as u32).expect("matrix");
    let out_bytes = (out_floats * 4) as u64;
    let out = gpu::storage_buffer(gpu, "out", out_bytes);
    gpu::poison_f32(gpu, &out);
    let mut rec = Recorder::with_variant(gpu, variant);
    op(&mut rec, &all.rows(rows.clone()), &out);
    let bytes = pollster::block_on(rec.submit_and_read(&out, 0, out_bytes)).expect("read");
    bytemuck::pod_collect_to_vec(&bytes)
}

fn check_view(gpu: &Gpu, variant: Variant, tensor: &Tensor, rows: Range<u32>, seed: u64) {
    let quant = tensor.quant;
    let what = format!(
        "{quant:?} rows {rows:?} of {ROWS} on {} ({} part(s)) {variant} seed={seed}",
        gpu.caps.adapter,
        tensor.upload(gpu).parts.len()
    );
    let n = rows.len();
    for tokens in [1, 5] {
        let x = testing::random_f32(tokens * COLS, seed ^ tokens as u64);
        let x_buffer = gpu::upload_f32(gpu, "x", &x);
        let got = run_on_view(gpu, variant, tensor, &rows, tokens * n, |rec, w, out| {
            matmul(rec, w, &x_buffer, out, tokens as u32)
        });
        let want = matmul_reference(quant, tensor.rows(&rows), n, COLS, &x, tokens);
        testing::assert_close(&got, &want, 1e-4, &format!("matmul tokens={tokens} {what}"));
    }
    let ids: Vec<u32> = [0, n - 1, n / 2, n / 2 + 1, 3]
        .map(|i| (i % n) as u32)
        .to_vec();
    let ids_buffer = gpu::upload_u32(gpu, "ids", &ids);
    let got = run_on_view(
        gpu,
        variant,
        tensor,
        &rows,
        ids.len() * COLS,
        |rec, w, out| embed(rec, w, &ids_buffer, out, ids.len() as u32, 0.5),
    );
    let member = tensor.rows(&rows);
    let mut want = vec![0.0; ids.len() * COLS];
    for (&id, values) in ids.iter().zip(want.chunks_exact_mut(COLS)) {
        let row = &member[id as usize * tensor.row_bytes()..][..tensor.row_bytes()];
        dequant_row_reference(quant, row, values);
        values.iter_mut().for_each(|v| *v *= 0.5);
    }
    testing::assert_close(&got, &want, 1e-6, &format!("embed {what}"));
}

fn tensors(seed: u64) -> Vec<Tensor> {
    [QuantType::Q5_0, QuantType::Q4_K, QuantType::F16]
        .into_iter()
        .map(|quant| Tensor {
            quant,
            bytes: random_weights(quant, ROWS, COLS, seed),
        })
        .collect()
}

#[test]
fn products_and_gathers_read_rows_of_a_larger_tensor() {
    let seed = testing::fresh_seed();
    let devices: Vec<(Arc<Gpu>, Variant)> =
        pollster::block_on(testing::device_variants()).expect("devices under test");
    for tensor in tensors(seed) {
        for (gpu, variant) in &devices {
            check_view(gpu, *variant, &tensor, 37..261, seed);
        }
    }
}

/// Under a 64 KiB binding limit the tensor splits into several parts; views starting and
/// ending inside parts, and spanning several, must still read their own rows.
#[test]
fn views_straddle_the_parts_of_a_split_tensor() {
    let seed = testing::fresh_seed();
    let options = GpuOptions {
        max_binding_override: Some(64 << 10),
        ..Default::default()
    };
    let split = pollster::block_on(Gpu::new(&options)).expect("gpu with a small binding limit");
    for tensor in tensors(seed) {
        let parts = tensor.upload(&split).parts.len();
        assert!(parts >= 2, "{:?}: {parts} part(s)", tensor.quant);
        for variant in split.caps.all_variants() {
            for rows in [37..261, 150..151, 0..ROWS as u32] {
                check_view(&split, variant, &tensor, rows, seed);
            }
        }
    }
}
