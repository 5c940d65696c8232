//! The join probe: how long this GPU takes for one average layer of one decode token.
//!
//! Decode reads every weight once per token, so a layer's time is about one pass over its
//! bytes. The probe times matrix-vector products over a Q8_0 matrix the size of a small
//! model's layer (4 MiB); the planner only compares donors with one another, so the reference
//! size matters less than measuring every donor the same way.

use crate::gpu::{storage_buffer, Gpu, Recorder, WeightTensor};
use crate::model::ModelError;
use crate::ops::quant::{self, QuantMatrix, QuantType};

const PROBE_ROWS: u32 = 4096;
const PROBE_COLS: u32 = 1024;
/// Timed products after one untimed warm-up (pipeline compilation, first allocation).
const PROBE_RUNS: u32 = 4;

/// Milliseconds of one reference layer on `gpu`, measured now (a fraction of a second).
pub async fn probe_ms_per_layer(gpu: &Gpu) -> Result<f32, ModelError> {
    let row_bytes = QuantType::Q8_0.row_bytes(u64::from(PROBE_COLS));
    // Zeroed weights: the time of a product does not depend on the values.
    let weights = WeightTensor::allocate(gpu, "probe.weight", u64::from(PROBE_ROWS), row_bytes)?;
    let matrix = QuantMatrix::new(&weights, QuantType::Q8_0, PROBE_COLS, PROBE_ROWS)
        .map_err(|err| ModelError::Plan(format!("probe matrix: {err}")))?;
    let x = storage_buffer(gpu, "probe.x", u64::from(PROBE_COLS) * 4);
    let out = storage_buffer(gpu, "probe.out", u64::from(PROBE_ROWS) * 4);
    run_once(gpu, &matrix, &x, &out).await?;
    // The fastest run, not the mean: on a shared machine a run the scheduler interrupted
    // measures the load, not the GPU, and the plan would leave a good donor out.
    let mut ms = f64::INFINITY;
    for _ in 0..PROBE_RUNS {
        let started = web_time::Instant::now();
        run_once(gpu, &matrix, &x, &out).await?;
        ms = ms.min(started.elapsed().as_secs_f64() * 1000.0);
    }
    // A clock too coarse to see the work still has to give the planner a positive figure.
    Ok((ms as f32).max(1e-3))
}

async fn run_once(
    gpu: &Gpu,
    matrix: &QuantMatrix<'_>,
    x: &wgpu::Buffer,
    out: &wgpu::Buffer,
) -> Result<(), ModelError> {
    let mut rec = Recorder::new(gpu);
    quant::matmul(&mut rec, matrix, x, out, 1);
    rec.submit_and_read(out, 0, 4).await?;
    Ok(())
}
