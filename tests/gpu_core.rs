//! The GPU core itself: device probing, specialisation headers, every reduction variant, the
//! recorder's uniform blocks, read-back, and weight splitting under a forced binding limit.

use webshard::gpu::{self, DispatchGraph, Gpu, GpuOptions, Kernel, Lib, Recorder, WeightTensor};

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

/// One `ROW_SUM` dispatch: each of `rows` rows of `input` summed (times a scale) and its
/// maximum, into `output`.
struct RowSums<'a> {
    input: &'a wgpu::Buffer,
    output: &'a wgpu::Buffer,
    rows: usize,
    cols: usize,
}

impl RowSums<'_> {
    fn dispatch(&self, recorder: &mut Recorder, pipeline: &wgpu::ComputePipeline, scale: f32) {
        let params = Params {
            cols: self.cols as u32,
            scale,
            pad: [0; 2],
        };
        recorder.dispatch(
            pipeline,
            &params,
            &[
                self.input.as_entire_binding(),
                self.output.as_entire_binding(),
            ],
            [self.rows as u32, 1, 1],
        );
    }
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
            let sums = RowSums {
                input: &input_buf,
                output: &output,
                rows,
                cols,
            };
            sums.dispatch(&mut recorder, &pipeline, 0.5);
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

/// A recording under a `DispatchGraph` makes its bind groups once: the second recording of the
/// same dispatches makes none (each dispatch's new parameters still reach it: the scale
/// changes), and one whose output moves remakes that dispatch's alone.
#[test]
fn a_graph_finds_its_bind_groups_from_its_second_recording() {
    let devices = pollster::block_on(gpu::testing::devices_under_test()).expect("gpu");
    let (rows, cols, dispatches) = (3usize, 64usize, 3usize);
    let seed = gpu::testing::fresh_seed();
    for gpu in &devices {
        let variant = gpu.caps.all_variants()[0];
        let pipeline = gpu.pipeline(&ROW_SUM, variant, &[("WG", 32)]);
        let input = gpu::testing::random_f32(rows * cols, seed);
        let input_buf = gpu::upload_f32(gpu, "input", &input);
        let outputs: Vec<wgpu::Buffer> = (0..=dispatches)
            .map(|_| gpu::storage_buffer(gpu, "output", (rows * 2 * 4) as u64))
            .collect();
        let mut graph = DispatchGraph::default();
        let mut record = |scale: f32, last_output: usize| {
            for output in &outputs {
                gpu::poison_f32(gpu, output);
            }
            let before = gpu.counters.snapshot();
            let mut recorder = Recorder::with_graph(gpu, &mut graph);
            for d in 0..dispatches {
                let output = &outputs[if d + 1 == dispatches { last_output } else { d }];
                let sums = RowSums {
                    input: &input_buf,
                    output,
                    rows,
                    cols,
                };
                sums.dispatch(&mut recorder, &pipeline, scale * (d + 1) as f32);
            }
            recorder.submit();
            let made = (gpu.counters.snapshot() - before).bind_groups;
            let got = pollster::block_on(gpu::read_f32(gpu, &outputs[last_output], 0, 2)).unwrap();
            let want: f32 = input[..cols].iter().sum::<f32>() * scale * dispatches as f32;
            assert!(
                (got[0] - want).abs() < 1e-3 * want.abs().max(1.0),
                "{} seed={seed} scale {scale}: {} vs {want}",
                gpu.caps.adapter,
                got[0]
            );
            made
        };
        let last = dispatches - 1;
        assert_eq!(
            record(0.5, last),
            dispatches as u64,
            "{}: the first recording",
            gpu.caps.adapter
        );
        assert_eq!(
            record(2.0, last),
            0,
            "{}: the second recording",
            gpu.caps.adapter
        );
        assert_eq!(
            record(3.0, dispatches),
            1,
            "{}: the last output moved",
            gpu.caps.adapter
        );
    }
}

const AFFINE: Kernel = Kernel {
    name: "test_affine",
    source: r#"
struct Params { scale: f32, add: f32, pad0: u32, pad1: u32 }
@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    if (id.x < arrayLength(&x)) {
        x[id.x] = x[id.x] * params.scale + params.add;
    }
}
"#,
    entry: "main",
    libs: &[],
};

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct AffineParams {
    scale: f32,
    add: f32,
    pad: [u32; 2],
}

/// A recording submitted in parts (`Recorder::submit_in_parts`) runs its dispatches in order
/// with their own parameters, as one submit does: a chain of in-place `x * s + a` steps whose
/// signs flip (so any reordering or misplaced parameter shows), integers throughout (exact in
/// f32 on every device), uncached and under a graph recorded twice.
#[test]
fn a_recording_submitted_in_parts_runs_as_one_submit() {
    let devices = pollster::block_on(gpu::testing::devices_under_test()).expect("gpu");
    let (len, dispatches) = (100usize, 200usize);
    let seed = gpu::testing::fresh_seed();
    for gpu in &devices {
        let pipeline = gpu.pipeline(&AFFINE, gpu.caps.all_variants()[0], &[("WG", 64)]);
        let start: Vec<f32> = gpu::testing::random_f32(len, seed)
            .iter()
            .map(|v| (v * 1000.0).round())
            .collect();
        let mut graph = DispatchGraph::default();
        // Each recording its own parameters: a part that ran with the last recording's (or
        // none) would show.
        for (recording, use_graph) in [false, true, true].into_iter().enumerate() {
            let steps: Vec<(f32, f32)> = (0..dispatches)
                .map(|d| {
                    let scale = if d % 3 == 0 { -1.0 } else { 1.0 };
                    (scale, ((d + 5 * recording) % 17) as f32 - 8.0)
                })
                .collect();
            let want: Vec<f32> = start
                .iter()
                .map(|&v| steps.iter().fold(v, |x, &(s, a)| x * s + a))
                .collect();
            let x = gpu::upload_f32(gpu, "x", &start);
            let before = gpu.counters.snapshot();
            let mut recorder = match use_graph {
                true => Recorder::with_graph(gpu, &mut graph),
                false => Recorder::new(gpu),
            };
            recorder.submit_in_parts();
            for &(scale, add) in &steps {
                let params = AffineParams {
                    scale,
                    add,
                    pad: [0; 2],
                };
                let groups = (len as u32).div_ceil(64);
                recorder.dispatch(&pipeline, &params, &[x.as_entire_binding()], [groups, 1, 1]);
            }
            recorder.submit();
            let submits = (gpu.counters.snapshot() - before).submits;
            let got = pollster::block_on(gpu::read_f32(gpu, &x, 0, len as u64)).unwrap();
            assert_eq!(
                got, want,
                "{} seed={seed} graph {use_graph}",
                gpu.caps.adapter
            );
            assert!(submits >= 4, "{}: {submits} submits", gpu.caps.adapter);
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
