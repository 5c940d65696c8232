//! Row-wise softmax in place, as a small op of its own (attention fuses its own softmax).

use crate::gpu::{Kernel, Lib, Recorder};

use super::kv_cache::grid_2d;

const SOFTMAX: Kernel = Kernel {
    name: "softmax",
    source: include_str!("../../../wgsl/softmax.wgsl"),
    entry: "main",
    libs: &[Lib::Reduce],
};

const SOFTMAX_WG: u32 = 64;

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct SoftmaxParams {
    rows: u32,
    cols: u32,
    groups_x: u32,
    pad0: u32,
}

/// x[r, :] = softmax(x[r, :]) for each of `rows` rows of `cols` f32 values, in place.
pub fn softmax(rec: &mut Recorder, x: &wgpu::Buffer, rows: u32, cols: u32) {
    if rows == 0 || cols == 0 {
        return;
    }
    let needed = u64::from(rows) * u64::from(cols) * 4;
    assert!(
        x.size() >= needed,
        "softmax of {rows}x{cols} needs {needed} bytes, the buffer has {}",
        x.size()
    );
    let [groups_x, groups_y] = grid_2d(rows, rec.gpu().caps.max_workgroups_per_dim);
    let params = SoftmaxParams {
        rows,
        cols,
        groups_x,
        pad0: 0,
    };
    let pipeline = rec.pipeline(&SOFTMAX, &[("WG", SOFTMAX_WG)]);
    rec.dispatch(
        &pipeline,
        &params,
        &[x.as_entire_binding()],
        [groups_x, groups_y, 1],
    );
}

/// CPU reference for `softmax`: each row of `cols` values of `x` normalised.
pub fn softmax_reference(x: &[f32], cols: usize) -> Vec<f32> {
    let mut out = x.to_vec();
    for row in out.chunks_mut(cols.max(1)) {
        softmax_in_place(row);
    }
    out
}

pub(super) fn softmax_in_place(row: &mut [f32]) {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0;
    for value in row.iter_mut() {
        *value = (*value - max).exp();
        sum += *value;
    }
    for value in row.iter_mut() {
        *value /= sum;
    }
}
