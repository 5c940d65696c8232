//! Support for kernel tests, natively and in the browser: the devices to test on, fresh random
//! inputs, and a comparison that reports relative error.

use std::sync::Arc;

use super::device::{BackendChoice, Gpu, GpuError, GpuOptions, Variant};

/// Backends kernel tests must cover, from `WEBSHARD_TEST_BACKENDS` (comma-separated, default
/// `vulkan,gl` natively: lavapipe and llvmpipe's GL in CI). A listed backend without an
/// adapter is an error, never a silent skip.
pub async fn devices_under_test() -> Result<Vec<Arc<Gpu>>, GpuError> {
    let names = std::env::var("WEBSHARD_TEST_BACKENDS").unwrap_or_else(|_| default_backends());
    let mut devices = Vec::new();
    for name in names.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        let backend = BackendChoice::parse(name).ok_or(GpuError::NoAdapter {
            backend: BackendChoice::Auto,
        })?;
        let options = GpuOptions {
            backend,
            ..Default::default()
        };
        devices.push(Gpu::new(&options).await?);
    }
    Ok(devices)
}

/// Every device under test paired with every variant it supports: the loop each kernel test
/// runs. Fails (never skips) when a listed backend has no adapter.
pub async fn device_variants() -> Result<Vec<(Arc<Gpu>, Variant)>, GpuError> {
    Ok(with_every_variant(devices_under_test().await?))
}

/// `device_variants`, plus each CPU adapter again with the GPU work split, for kernels whose
/// work split depends on the adapter's kind.
pub async fn device_variants_both_splits() -> Result<Vec<(Arc<Gpu>, Variant)>, GpuError> {
    Ok(with_every_variant(devices_both_splits().await?))
}

fn with_every_variant(devices: Vec<Arc<Gpu>>) -> Vec<(Arc<Gpu>, Variant)> {
    devices
        .into_iter()
        .flat_map(|gpu| {
            let variants = gpu.caps.all_variants();
            variants.into_iter().map(move |v| (gpu.clone(), v))
        })
        .collect()
}

/// `variants` plus, once for each device with cooperative matrices among them, its best
/// variant: the one that runs prefill attention and products on them (`all_variants` leaves
/// it out for its own tolerance).
pub fn with_coop_variants(mut variants: Vec<(Arc<Gpu>, Variant)>) -> Vec<(Arc<Gpu>, Variant)> {
    let mut seen = std::collections::HashSet::new();
    let coop: Vec<_> = variants
        .iter()
        .filter(|(gpu, _)| gpu.caps.coop_matrix && seen.insert(Arc::as_ptr(gpu)))
        .map(|(gpu, _)| (gpu.clone(), gpu.caps.best_variant()))
        .collect();
    variants.extend(coop);
    variants
}

/// Every device under test, CPU adapters once more with the GPU work split: the devices of
/// `device_variants_both_splits`, for tests that choose a variant per case.
pub async fn devices_both_splits() -> Result<Vec<Arc<Gpu>>, GpuError> {
    let mut devices = devices_under_test().await?;
    let cpu_backends: Vec<BackendChoice> = devices
        .iter()
        .filter(|gpu| gpu.caps.cpu_work_split)
        .map(|gpu| BackendChoice::parse(&gpu.caps.backend).unwrap_or_default())
        .collect();
    for backend in cpu_backends {
        let options = GpuOptions {
            backend,
            gpu_work_split: true,
            ..Default::default()
        };
        devices.push(Gpu::new(&options).await?);
    }
    Ok(devices)
}

/// The variant case number `case` of a test runs in: the device's variants in turn, from a
/// start the seed chooses. A test with at least as many cases as the device has variants
/// checks every variant, and each run pairs variants with other cases (the seed, printed on
/// failure, replays the pairing). Why not every case in every variant: the cases vary what the
/// kernels' shapes and bounds decide, the variants only how a sum is stored or reduced, and
/// the full product was four times the CPU adapters' time in the slowest tests of CI.
pub fn variant_for_case(variants: &[Variant], case: usize, seed: u64) -> Variant {
    assert!(
        !variants.is_empty(),
        "a device has at least the f32 variant"
    );
    variants[(case + (seed % variants.len() as u64) as usize) % variants.len()]
}

fn default_backends() -> String {
    if cfg!(target_arch = "wasm32") {
        "webgpu".into()
    } else {
        "vulkan,gl".into()
    }
}

/// Deterministic pseudo-random values in [-1, 1), different for every seed.
pub fn random_f32(count: usize, seed: u64) -> Vec<f32> {
    let mut state = seed ^ 0x9e37_79b9_7f4a_7c15;
    (0..count)
        .map(|_| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// Deterministic pseudo-random bytes.
pub fn random_bytes(count: usize, seed: u64) -> Vec<u8> {
    let mut state = seed ^ 0x2545_f491_4f6c_dd1d;
    (0..count)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 24) as u8
        })
        .collect()
}

/// A seed that differs per run unless `WEBSHARD_TEST_SEED` fixes it (printed on failure).
pub fn fresh_seed() -> u64 {
    if let Some(seed) = std::env::var("WEBSHARD_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        return seed;
    }
    let nanos = web_time_nanos();
    nanos ^ (nanos >> 17)
}

#[cfg(not(target_arch = "wasm32"))]
fn web_time_nanos() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64)
}

#[cfg(target_arch = "wasm32")]
fn web_time_nanos() -> u64 {
    (js_sys::Math::random() * 1e15) as u64
}

/// Largest error relative to the largest reference magnitude; NaN in `got` counts as infinite.
pub fn relative_error(got: &[f32], want: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len(), "result length");
    let scale = want.iter().fold(1e-6f32, |m, v| m.max(v.abs()));
    got.iter().zip(want).fold(0.0f32, |worst, (g, w)| {
        let error = if g.is_finite() {
            (g - w).abs() / scale
        } else {
            f32::INFINITY
        };
        worst.max(error)
    })
}

/// Panics with a useful message when `relative_error(got, want) > tolerance`.
pub fn assert_close(got: &[f32], want: &[f32], tolerance: f32, what: &str) {
    let error = relative_error(got, want);
    let worst = got
        .iter()
        .zip(want)
        .enumerate()
        .max_by(|a, b| {
            let da = (a.1 .0 - a.1 .1).abs();
            let db = (b.1 .0 - b.1 .1).abs();
            da.partial_cmp(&db).unwrap_or(std::cmp::Ordering::Greater)
        })
        .map(|(i, (g, w))| format!("index {i}: got {g}, want {w}"))
        .unwrap_or_default();
    assert!(
        error <= tolerance,
        "{what}: relative error {error:e} > {tolerance:e} ({worst})"
    );
}
