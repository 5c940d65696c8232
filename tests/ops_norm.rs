//! RMSNorm and LayerNorm against their CPU references on every device and variant, in both
//! work splits.

use std::sync::Arc;

use webshard::gpu::{self, testing, Gpu, Recorder, Variant};
use webshard::ops::norm;

fn each_variant() -> Vec<(Arc<Gpu>, Variant)> {
    pollster::block_on(testing::device_variants_both_splits()).expect("gpu devices")
}

/// Runs rms_norm on fresh inputs; returns (gpu result, reference).
fn run_case(
    gpu: &Gpu,
    variant: Variant,
    rows: usize,
    cols: usize,
    eps: f32,
    seed: u64,
) -> (Vec<f32>, Vec<f32>) {
    // An offset and a spread of magnitudes, as hidden states have.
    let x: Vec<f32> = testing::random_f32(rows * cols, seed)
        .into_iter()
        .enumerate()
        .map(|(i, v)| v * (1.0 + (i % 7) as f32 * 3.0) + 0.25)
        .collect();
    let weight: Vec<f32> = testing::random_f32(cols, seed ^ 0x5eed)
        .into_iter()
        .map(|v| v * 2.0)
        .collect();
    let guard = 5;
    let out = gpu::storage_buffer(gpu, "out", ((rows * cols + guard) * 4) as u64);
    gpu::poison_f32(gpu, &out);
    let mut rec = Recorder::with_variant(gpu, variant);
    let (x_buf, w_buf) = (
        gpu::upload_f32(gpu, "x", &x),
        gpu::upload_f32(gpu, "w", &weight),
    );
    norm::rms_norm(
        &mut rec,
        &x_buf,
        &w_buf,
        &out,
        rows as u32,
        cols as u32,
        eps,
    );
    rec.submit();
    let all =
        pollster::block_on(gpu::read_f32(gpu, &out, 0, (rows * cols + guard) as u64)).unwrap();
    assert!(
        all[rows * cols..]
            .iter()
            .all(|v| v.to_bits() == gpu::POISON),
        "rms_norm wrote past rows * cols"
    );
    (
        all[..rows * cols].to_vec(),
        norm::rms_norm_reference(&x, &weight, eps),
    )
}

#[test]
fn rms_norm_matches_reference() {
    let seed = testing::fresh_seed();
    for (gpu, variant) in each_variant() {
        for rows in [1usize, 5, 33] {
            for cols in [3usize, 64, 256, 576, 640, 896, 1000, 1152] {
                for eps in [1e-6f32, 1e-5] {
                    let case_seed = seed + (rows * 10_000 + cols) as u64;
                    let (got, want) = run_case(&gpu, variant, rows, cols, eps, case_seed);
                    let what = format!(
                        "rms_norm {rows}x{cols} eps={eps} {} ({}) {variant} seed={case_seed}",
                        gpu.caps.adapter, gpu.caps.backend
                    );
                    eprintln!(
                        "{what}: relative error {:e}",
                        testing::relative_error(&got, &want)
                    );
                    testing::assert_close(&got, &want, 2e-6, &what);
                }
            }
        }
    }
}

#[test]
fn rms_norm_of_many_short_rows() {
    // Per-head q/k norms: tokens * heads rows of head_dim.
    let seed = testing::fresh_seed();
    for (gpu, variant) in each_variant() {
        let (got, want) = run_case(&gpu, variant, 2 * 512 + 3, 256, 1e-6, seed);
        let what = format!(
            "rms_norm 1027x256 {} {variant} seed={seed}",
            gpu.caps.backend
        );
        eprintln!(
            "{what}: relative error {:e}",
            testing::relative_error(&got, &want)
        );
        testing::assert_close(&got, &want, 2e-6, &what);
    }
}

#[test]
fn rms_norm_reference_normalises_to_unit_rms() {
    let cols = 896;
    let x: Vec<f32> = testing::random_f32(cols, testing::fresh_seed())
        .into_iter()
        .map(|v| v * 40.0)
        .collect();
    let out = norm::rms_norm_reference(&x, &vec![1.0; cols], 0.0);
    let rms = (out.iter().map(|v| f64::from(*v).powi(2)).sum::<f64>() / cols as f64).sqrt();
    assert!((rms - 1.0).abs() < 1e-5, "rms {rms}");
    let ratio = f64::from(out[3]) / f64::from(x[3]);
    assert!(out
        .iter()
        .zip(&x)
        .all(|(o, v)| (f64::from(*o) - ratio * f64::from(*v)).abs() < 1e-5));
}

#[test]
fn rms_norm_add_accumulates_into_the_residual() {
    let seed = testing::fresh_seed();
    for (gpu, variant) in each_variant() {
        for (rows, cols) in [(1usize, 640usize), (7, 576), (3, 1152)] {
            let case_seed = seed + (rows * 10_000 + cols) as u64;
            let x = testing::random_f32(rows * cols, case_seed);
            let weight = testing::random_f32(cols, case_seed ^ 1);
            let residual = testing::random_f32(rows * cols, case_seed ^ 2);
            let out = gpu::upload_f32(&gpu, "residual", &residual);
            let (x_buf, w_buf) = (
                gpu::upload_f32(&gpu, "x", &x),
                gpu::upload_f32(&gpu, "w", &weight),
            );
            let mut rec = Recorder::with_variant(&gpu, variant);
            norm::rms_norm_add(
                &mut rec,
                &x_buf,
                &w_buf,
                &out,
                rows as u32,
                cols as u32,
                1e-6,
            );
            rec.submit();
            let got = pollster::block_on(gpu::read_f32(&gpu, &out, 0, (rows * cols) as u64))
                .expect("read");
            let want: Vec<f32> = norm::rms_norm_reference(&x, &weight, 1e-6)
                .iter()
                .zip(&residual)
                .map(|(n, r)| r + n)
                .collect();
            let what = format!(
                "rms_norm_add {rows}x{cols} {} {variant} seed={case_seed}",
                gpu.caps.backend
            );
            testing::assert_close(&got, &want, 4e-6, &what);
        }
    }
}

/// Runs layer_norm on fresh inputs with a large common offset (hidden states before BERT's
/// norms have one); returns (gpu result, reference).
fn run_layer_norm(
    gpu: &Gpu,
    variant: Variant,
    rows: usize,
    cols: usize,
    seed: u64,
) -> (Vec<f32>, Vec<f32>, f32) {
    let x: Vec<f32> = testing::random_f32(rows * cols, seed)
        .into_iter()
        .enumerate()
        .map(|(i, v)| v * (1.0 + (i % 5) as f32 * 2.0) + 12.0)
        .collect();
    let weight = testing::random_f32(cols, seed ^ 0x5eed);
    let bias = testing::random_f32(cols, seed ^ 0xb1a5);
    let guard = 5;
    let out = gpu::storage_buffer(gpu, "out", ((rows * cols + guard) * 4) as u64);
    gpu::poison_f32(gpu, &out);
    let mut rec = Recorder::with_variant(gpu, variant);
    let x_buf = gpu::upload_f32(gpu, "x", &x);
    let w_buf = gpu::upload_f32(gpu, "w", &weight);
    let b_buf = gpu::upload_f32(gpu, "b", &bias);
    norm::layer_norm(
        &mut rec,
        &x_buf,
        &w_buf,
        &b_buf,
        &out,
        rows as u32,
        cols as u32,
        1e-12,
    );
    rec.submit();
    let all =
        pollster::block_on(gpu::read_f32(gpu, &out, 0, (rows * cols + guard) as u64)).unwrap();
    assert!(
        all[rows * cols..]
            .iter()
            .all(|v| v.to_bits() == gpu::POISON),
        "layer_norm wrote past rows * cols"
    );
    (
        all[..rows * cols].to_vec(),
        norm::layer_norm_reference(&x, &weight, &bias, 1e-12),
        centring_error(&x, cols),
    )
}

/// The relative error an f32 kernel may add when centring: `v - mean` loses about an ulp of the
/// mean, which normalising scales by 1 / std, so a row whose values sit close together far from
/// zero (3 columns around 12) is ill-conditioned however the kernel sums.
fn centring_error(x: &[f32], cols: usize) -> f32 {
    let worst = x
        .chunks(cols)
        .map(|row| {
            let mean = row.iter().map(|&v| f64::from(v)).sum::<f64>() / cols as f64;
            let var = row
                .iter()
                .map(|&v| (f64::from(v) - mean).powi(2))
                .sum::<f64>()
                / cols as f64;
            mean.abs() / var.sqrt().max(f64::MIN_POSITIVE)
        })
        .fold(0.0, f64::max);
    (8.0 * f64::from(f32::EPSILON) * worst) as f32
}

#[test]
fn layer_norm_matches_reference() {
    let seed = testing::fresh_seed();
    for (gpu, variant) in each_variant() {
        for rows in [1usize, 7, 130] {
            for cols in [3usize, 384, 768, 1000] {
                let case_seed = seed + (rows * 10_000 + cols) as u64;
                let (got, want, centring) = run_layer_norm(&gpu, variant, rows, cols, case_seed);
                let what = format!(
                    "layer_norm {rows}x{cols} {} ({}) {variant} seed={case_seed}",
                    gpu.caps.adapter, gpu.caps.backend
                );
                eprintln!(
                    "{what}: relative error {:e}",
                    testing::relative_error(&got, &want)
                );
                testing::assert_close(&got, &want, 1e-5 + centring, &what);
            }
        }
    }
}

#[test]
fn layer_norm_reference_centres_and_scales() {
    let x = testing::random_f32(384, testing::fresh_seed());
    let shifted: Vec<f32> = x.iter().map(|v| v * 3.0 + 100.0).collect();
    let ones = vec![1.0; 384];
    let zeros = vec![0.0; 384];
    let y = norm::layer_norm_reference(&shifted, &ones, &zeros, 0.0);
    let mean: f64 = y.iter().map(|&v| f64::from(v)).sum::<f64>() / 384.0;
    let var: f64 = y
        .iter()
        .map(|&v| (f64::from(v) - mean).powi(2))
        .sum::<f64>()
        / 384.0;
    assert!(mean.abs() < 1e-5, "mean {mean}");
    assert!((var - 1.0).abs() < 1e-4, "variance {var}");
    let biased = norm::layer_norm_reference(&shifted, &ones, &ones, 0.0);
    for (a, b) in y.iter().zip(&biased) {
        assert!((a + 1.0 - b).abs() < 1e-6);
    }
}
