//! Element-wise operators: residual adds, bias broadcast, activations alone (BERT's GELU) and
//! gated (SwiGLU, GeGLU).
//!
//! All stay f32 in every variant (each element is touched once; f16 would only lose accuracy).

use crate::gpu::{Gpu, Kernel, Lib, Recorder};

const SOURCE: &str = include_str!("../../wgsl/elementwise.wgsl");
const WG: u32 = 256;

const ADD: Kernel = Kernel {
    name: "add",
    source: SOURCE,
    entry: "add",
    libs: &[Lib::Activation],
};
const ADD_IN_PLACE: Kernel = Kernel {
    name: "add_in_place",
    source: SOURCE,
    entry: "add_in_place",
    libs: &[Lib::Activation],
};
const ADD_BIAS: Kernel = Kernel {
    name: "add_bias",
    source: SOURCE,
    entry: "add_bias",
    libs: &[Lib::Activation],
};
const ACTIVATE: Kernel = Kernel {
    name: "activate",
    source: SOURCE,
    entry: "activate",
    libs: &[Lib::Activation],
};
const GATED_ACTIVATION: Kernel = Kernel {
    name: "gated_activation",
    source: SOURCE,
    entry: "gated_activation",
    libs: &[Lib::Activation],
};
const SUM_SLICES: Kernel = Kernel {
    name: "sum_slices",
    source: SOURCE,
    entry: "sum_slices",
    libs: &[Lib::Activation],
};

/// The activation applied to the gate of a gated feed-forward block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// x * sigmoid(x) (llama, qwen2: SwiGLU).
    Silu,
    /// ggml's `gelu`: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) (gemma3: GeGLU; bert).
    GeluTanh,
}

impl Activation {
    fn code(self) -> u32 {
        match self {
            Activation::Silu => 0,
            Activation::GeluTanh => 1,
        }
    }
}

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct ElementwiseParams {
    n: u32,
    cols: u32,
    groups_x: u32,
    act: u32,
}

/// A dispatch of `workgroups` workgroups folded into a 2-D grid, because one dimension is
/// limited (65535 on most devices). Kernels recover the flat workgroup index as
/// `group.y * grid[0] + group.x` and skip indices past the end.
pub fn workgroup_grid(gpu: &Gpu, workgroups: u32) -> [u32; 3] {
    let max_x = gpu.caps.max_workgroups_per_dim.max(1);
    if workgroups <= max_x {
        return [workgroups, 1, 1];
    }
    let rows = workgroups.div_ceil(max_x);
    [workgroups.div_ceil(rows), rows, 1]
}

fn dispatch_flat(
    rec: &mut Recorder,
    kernel: &Kernel,
    n: u32,
    cols: u32,
    act: u32,
    buffers: &[&wgpu::Buffer],
) {
    if n == 0 {
        return;
    }
    let pipeline = rec.pipeline(kernel, &[("WG", WG)]);
    let grid = workgroup_grid(rec.gpu(), n.div_ceil(WG));
    let params = ElementwiseParams {
        n,
        cols,
        groups_x: grid[0],
        act,
    };
    let bindings: Vec<_> = buffers.iter().map(|b| b.as_entire_binding()).collect();
    rec.dispatch(&pipeline, &params, &bindings, grid);
}

/// out[i] = a[i] + b[i] for i < n. `out` must be a different buffer from `a` and `b`.
pub fn add(rec: &mut Recorder, a: &wgpu::Buffer, b: &wgpu::Buffer, out: &wgpu::Buffer, n: u32) {
    dispatch_flat(rec, &ADD, n, 1, 0, &[a, b, out]);
}

/// out[i] = the sum of `slices[s * n + i]` over s < `count`, in order of s, for i < n: the
/// slices of a product split along K (`quant::matmul`'s cooperative-matrix product).
pub fn sum_slices(
    rec: &mut Recorder,
    slices: &wgpu::Buffer,
    count: u32,
    out: &wgpu::Buffer,
    n: u32,
) {
    dispatch_flat(rec, &SUM_SLICES, n, count, 0, &[slices, out]);
}

/// acc[i] += b[i] for i < n (the residual connection).
pub fn add_in_place(rec: &mut Recorder, acc: &wgpu::Buffer, b: &wgpu::Buffer, n: u32) {
    dispatch_flat(rec, &ADD_IN_PLACE, n, 1, 0, &[acc, b]);
}

/// x[r, c] += bias[c] for every row r < rows of `cols` values, in place.
pub fn add_bias(rec: &mut Recorder, x: &wgpu::Buffer, bias: &wgpu::Buffer, rows: u32, cols: u32) {
    assert!(cols > 0, "add_bias needs at least one column");
    let n = rows
        .checked_mul(cols)
        .expect("add_bias: rows * cols overflows u32");
    dispatch_flat(rec, &ADD_BIAS, n, cols, 0, &[x, bias]);
}

/// x[i] = act(x[i]) for i < n, in place.
pub fn activate(rec: &mut Recorder, x: &wgpu::Buffer, n: u32, act: Activation) {
    dispatch_flat(rec, &ACTIVATE, n, 1, act.code(), &[x]);
}

/// out[i] = act(gate[i]) * up[i] for i < n. `out` must differ from `gate` and `up`.
pub fn gated_activation(
    rec: &mut Recorder,
    gate: &wgpu::Buffer,
    up: &wgpu::Buffer,
    out: &wgpu::Buffer,
    n: u32,
    act: Activation,
) {
    dispatch_flat(rec, &GATED_ACTIVATION, n, 1, act.code(), &[gate, up, out]);
}

pub fn sum_slices_reference(slices: &[f32], count: usize) -> Vec<f32> {
    let n = slices.len() / count;
    (0..n)
        .map(|i| (1..count).fold(slices[i], |total, s| total + slices[s * n + i]))
        .collect()
}

pub fn add_reference(a: &[f32], b: &[f32]) -> Vec<f32> {
    a.iter().zip(b).map(|(x, y)| x + y).collect()
}

pub fn add_bias_reference(x: &[f32], bias: &[f32]) -> Vec<f32> {
    x.chunks(bias.len())
        .flat_map(|row| row.iter().zip(bias).map(|(v, b)| v + b))
        .collect()
}

/// The activation alone, in f32 as ggml computes it (without ggml's f16 GELU table).
pub fn activation_reference(x: f32, act: Activation) -> f32 {
    match act {
        Activation::Silu => x / (1.0 + (-x).exp()),
        Activation::GeluTanh => {
            let sqrt_2_over_pi = 0.797_884_6_f32;
            0.5 * x * (1.0 + (sqrt_2_over_pi * x * (1.0 + 0.044_715 * x * x)).tanh())
        }
    }
}

pub fn gated_activation_reference(gate: &[f32], up: &[f32], act: Activation) -> Vec<f32> {
    gate.iter()
        .zip(up)
        .map(|(&g, &u)| activation_reference(g, act) * u)
        .collect()
}
