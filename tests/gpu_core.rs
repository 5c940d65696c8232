//! The GPU core itself: device probing, specialisation headers, every reduction variant, the
//! recorder's uniform blocks, read-back, and weight splitting under a forced binding limit.

use webshard::gpu::{self, Gpu, GpuOptions, Kernel, Lib, Recorder, WeightTensor};

const ROW_SUM: Kernel = Kernel {
    name: "test_row_sum",
    source: r#"
struct Params { cols: u32, scale: f32, pad0: u32, pad1: u32 }
@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> input: array<f32>;
@group(0) @binding(2) var<storage, read_write> output: array<f32>;
@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) group: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    var sum = 0.0;
    var best = -3.4028235e38;
    for (var c = lane; c < params.cols; c = c + WG) {
        let value = input[group.x * params.cols + c];
        sum = sum + f32(half_t(value));
        best = max(best, value);
    }
    let total = reduce_sum(sum, lane);
    let top = reduce_max(best, lane);
    if (lane == 0u) {
        output[group.x * 2u] = total * params.scale;
        output[group.x * 2u + 1u] = top;
    }
}
"#,
    entry: "main",
    libs: &[Lib::Reduce],
};

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Params {
    cols: u32,
    scale: f32,
    pad: [u32; 2],
}

#[test]
fn reductions_match_cpu_in_every_variant() {
    let devices = pollster::block_on(gpu::testing::devices_under_test()).expect("gpu");
    let (rows, cols) = (37usize, 1003usize);
    let seed = gpu::testing::fresh_seed();
    for (gpu, variant) in devices
        .iter()
        .flat_map(|g| g.caps.all_variants().into_iter().map(move |v| (g, v)))
    {
        for wg in [32u32, 64, 256] {
            let input = gpu::testing::random_f32(rows * cols, seed + u64::from(wg));
            let input_buf = gpu::upload_f32(gpu, "input", &input);
            let output = gpu::storage_buffer(gpu, "output", (rows * 2 * 4) as u64);
            gpu::poison_f32(gpu, &output);
            let pipeline = gpu.pipeline(&ROW_SUM, variant, &[("WG", wg)]);
            let mut recorder = Recorder::new(gpu);
            let params = Params {
                cols: cols as u32,
                scale: 0.5,
                pad: [0; 2],
            };
            recorder.dispatch(
                &pipeline,
                &params,
                &[input_buf.as_entire_binding(), output.as_entire_binding()],
                [rows as u32, 1, 1],
            );
            recorder.submit();
            let got =
                pollster::block_on(gpu::read_f32(gpu, &output, 0, (rows * 2) as u64)).unwrap();
            for r in 0..rows {
                let row = &input[r * cols..(r + 1) * cols];
                let rounded: f32 = row
                    .iter()
                    .map(|&v| {
                        if variant.f16 {
                            half::f16::from_f32(v).to_f32()
                        } else {
                            v
                        }
                    })
                    .sum();
                let want_max = row.iter().cloned().fold(f32::MIN, f32::max);
                let tolerance = 1e-3 * (cols as f32).sqrt();
                assert!(
                    (got[r * 2] - rounded * 0.5).abs() < tolerance,
                    "{} {variant} wg={wg} seed={seed} row {r}: sum {} vs {}",
                    gpu.caps.adapter,
                    got[r * 2],
                    rounded * 0.5
                );
                assert_eq!(got[r * 2 + 1], want_max, "{variant} wg={wg} row {r}: max");
            }
        }
    }
}

#[test]
fn weights_split_at_row_boundaries_under_a_small_binding_limit() {
    let options = GpuOptions {
        max_binding_override: Some(1 << 16),
        ..Default::default()
    };
    let gpu = pollster::block_on(Gpu::new(&options)).expect("gpu");
    let (rows, row_bytes) = (1000u64, 146u64);
    let tensor = WeightTensor::allocate(&gpu, "w", rows, row_bytes).unwrap();
    assert!(tensor.parts.len() > 1, "64 KiB limit must split 146 KB");
    let mut next_row = 0;
    for part in &tensor.parts {
        assert_eq!(part.first_row, next_row);
        assert!(part.rows * row_bytes <= 1 << 16);
        next_row += part.rows;
    }
    assert_eq!(next_row, rows);
    let bytes: Vec<u8> = (0..rows * row_bytes).map(|i| (i * 7 % 251) as u8).collect();
    for piece in tensor.upload_pieces(10_000) {
        let start = piece.tensor_offset as usize;
        tensor.write_piece(&gpu, &piece, &bytes[start..start + piece.bytes as usize]);
    }
    for part in &tensor.parts {
        let got = pollster::block_on(gpu::read_back(&gpu, &part.buffer, 0, part.rows * row_bytes))
            .unwrap();
        let start = (part.first_row * row_bytes) as usize;
        assert_eq!(got, &bytes[start..start + got.len()]);
    }
}

#[test]
fn one_byte_row_too_large_for_the_binding_is_an_error() {
    let options = GpuOptions {
        max_binding_override: Some(1024),
        ..Default::default()
    };
    let gpu = pollster::block_on(Gpu::new(&options)).expect("gpu");
    let error = WeightTensor::allocate(&gpu, "huge_row", 4, 4096).unwrap_err();
    assert!(error.to_string().contains("huge_row"), "{error}");
}

/// The pipelines' runtime checks: loop bounding off for every kernel (every loop in wgsl/ ends),
/// division checks on, and bounds checks on but for a kernel marked `IndicesInRange` on Vulkan,
/// where the driver bounds storage accesses; GL, Metal, DX12 and browsers keep them.
#[test]
fn runtime_checks_drop_bounds_only_for_kernels_in_range_on_vulkan() {
    const IN_RANGE: Kernel = Kernel {
        libs: &[Lib::IndicesInRange],
        ..ROW_SUM
    };
    for (kernel, backend, bounds) in [
        (&ROW_SUM, "Vulkan", true),
        (&IN_RANGE, "Vulkan", false),
        (&IN_RANGE, "Gl", true),
        (&IN_RANGE, "Metal", true),
        (&IN_RANGE, "BrowserWebGpu", true),
    ] {
        let checks = gpu::runtime_checks(kernel, backend);
        assert_eq!(checks.bounds_checks, bounds, "{} on {backend}", kernel.name);
        assert!(!checks.force_loop_bounding, "{} on {backend}", kernel.name);
        assert!(checks.int_div_checks, "{} on {backend}", kernel.name);
    }
}
