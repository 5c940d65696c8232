//! RMSNorm over rows, with the weight as stored in the GGUF (multiplied as is: the converters
//! already folded Gemma's `1 + w` into the stored tensor); LayerNorm with weight and bias
//! (BERT).

use crate::gpu::{Kernel, Lib, Recorder};
use crate::ops::elementwise::workgroup_grid;

const RMS_NORM: Kernel = Kernel {
    name: "rms_norm",
    source: include_str!("../../wgsl/norm.wgsl"),
    entry: "rms_norm",
    libs: &[Lib::Reduce],
};

const LAYER_NORM: Kernel = Kernel {
    name: "layer_norm",
    source: include_str!("../../wgsl/norm.wgsl"),
    entry: "layer_norm",
    libs: &[Lib::Reduce],
};

/// Rows are short (576..2048 here, 64..256 for per-head q/k norms) and barriers are costly on
/// CPU adapters, so a small workgroup with several elements per lane there.
const CPU_WG: u32 = 64;
/// On GPUs each lane's loads of a row are a chain of memory latencies: 256 lanes read 640
/// values in three steps rather than ten (Gemma 3's post-norms, 37 per token, 12 µs each on
/// the H200 with 64 lanes).
const GPU_WG: u32 = 256;

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct NormParams {
    rows: u32,
    cols: u32,
    eps: f32,
    groups_x: u32,
}

/// out[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * weight[:] for r < rows.
/// `out` must be a different buffer from `x`.
pub fn rms_norm(
    rec: &mut Recorder,
    x: &wgpu::Buffer,
    weight: &wgpu::Buffer,
    out: &wgpu::Buffer,
    rows: u32,
    cols: u32,
    eps: f32,
) {
    dispatch_norm(rec, x, weight, out, [rows, cols], eps, false);
}

/// out[r, :] += rms_norm(x[r, :]) * weight[:]: a post-norm joining the residual stream in one
/// dispatch. `out` must be a different buffer from `x`.
pub fn rms_norm_add(
    rec: &mut Recorder,
    x: &wgpu::Buffer,
    weight: &wgpu::Buffer,
    out: &wgpu::Buffer,
    rows: u32,
    cols: u32,
    eps: f32,
) {
    dispatch_norm(rec, x, weight, out, [rows, cols], eps, true);
}

/// out[r, :] = (x[r, :] - mean) / sqrt(var + eps) * weight[:] + bias[:] for r < rows, with the
/// mean and (biased) variance of row r. `out` must be a different buffer from `x`.
#[allow(clippy::too_many_arguments)]
pub fn layer_norm(
    rec: &mut Recorder,
    x: &wgpu::Buffer,
    weight: &wgpu::Buffer,
    bias: &wgpu::Buffer,
    out: &wgpu::Buffer,
    rows: u32,
    cols: u32,
    eps: f32,
) {
    dispatch_rows(
        rec,
        &LAYER_NORM,
        false,
        [x, weight, bias, out],
        [rows, cols],
        eps,
    );
}

fn workgroup_size(rec: &Recorder) -> u32 {
    if rec.gpu().caps.cpu_work_split {
        CPU_WG
    } else {
        GPU_WG
    }
}

fn dispatch_norm(
    rec: &mut Recorder,
    x: &wgpu::Buffer,
    weight: &wgpu::Buffer,
    out: &wgpu::Buffer,
    shape: [u32; 2],
    eps: f32,
    add: bool,
) {
    dispatch_rows(rec, &RMS_NORM, add, [x, weight, out], shape, eps);
}

/// One workgroup per row of a norm kernel; `buffers` are its bindings in order.
fn dispatch_rows<const N: usize>(
    rec: &mut Recorder,
    kernel: &Kernel,
    add: bool,
    buffers: [&wgpu::Buffer; N],
    [rows, cols]: [u32; 2],
    eps: f32,
) {
    assert!(cols > 0, "{} needs at least one column", kernel.name);
    if rows == 0 {
        return;
    }
    let pipeline = rec.pipeline(
        kernel,
        &[("WG", workgroup_size(rec)), ("ADD", u32::from(add))],
    );
    let grid = workgroup_grid(rec.gpu(), rows);
    let params = NormParams {
        rows,
        cols,
        eps,
        groups_x: grid[0],
    };
    rec.dispatch(
        &pipeline,
        &params,
        &buffers.map(|b| b.as_entire_binding()),
        grid,
    );
}

/// ggml's rms_norm followed by mul: the sum of squares in f64, the rest in f32.
pub fn rms_norm_reference(x: &[f32], weight: &[f32], eps: f32) -> Vec<f32> {
    let cols = weight.len();
    x.chunks(cols)
        .flat_map(|row| {
            let squares: f64 = row.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
            let mean = (squares / cols as f64) as f32;
            let scale = 1.0 / (mean + eps).sqrt();
            row.iter().zip(weight).map(move |(&v, &w)| (v * scale) * w)
        })
        .collect()
}

/// ggml's norm followed by mul and add: sums in f64, the rest in f32.
pub fn layer_norm_reference(x: &[f32], weight: &[f32], bias: &[f32], eps: f32) -> Vec<f32> {
    let cols = weight.len();
    x.chunks(cols)
        .flat_map(|row| {
            let sum: f64 = row.iter().map(|&v| f64::from(v)).sum();
            let mean = (sum / cols as f64) as f32;
            let squares: f64 = row
                .iter()
                .map(|&v| f64::from(v - mean) * f64::from(v - mean))
                .sum();
            let scale = 1.0 / ((squares / cols as f64) as f32 + eps).sqrt();
            row.iter()
                .zip(weight.iter().zip(bias))
                .map(move |(&v, (&w, &b))| ((v - mean) * scale) * w + b)
        })
        .collect()
}
