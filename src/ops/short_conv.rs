//! LFM2's gated short convolution (`shortconv` blocks) and its per-sequence state.
//!
//! After `in_proj` splits each token into B, C and x (one row of 3·d), the block computes
//! `y = C ⊙ conv(B ⊙ x)`, a causal depthwise convolution over the last `L` positions
//! (llama.cpp's `ggml_ssm_conv` over the state prepended to the chunk). The state is `B ⊙ x`
//! of every earlier position of the sequence, one buffer per convolution layer, indexed by
//! position like the KV cache: any prefix can be taken up again (prefix reuse, a chain's
//! replay from position 0) without a rolling state to rewind. It costs d floats per position
//! and layer, the size of one attention layer's keys and values at LFM2's shapes.
//!
//! f32 in every variant: each output is a few products of values read once.

use crate::gpu::{storage_buffer, Gpu, GpuError, Kernel, Recorder};
use crate::ops::elementwise::workgroup_grid;

const SHORT_CONV: Kernel = Kernel {
    name: "short_conv",
    source: include_str!("../../wgsl/short_conv.wgsl"),
    entry: "main",
    libs: &[],
};
const WG: u32 = 256;

/// Longest kernel accepted from a file (LFM2 uses 3).
pub const MAX_KERNEL_LEN: u32 = 16;

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct ShortConvParams {
    tokens: u32,
    channels: u32,
    kernel_len: u32,
    start_pos: u32,
    groups_x: u32,
    _pad: [u32; 3],
}

/// `B ⊙ x` of every position of one sequence, for each convolution layer of a stage.
#[derive(Debug)]
pub struct ShortConvState {
    /// One `[max_ctx][channels]` f32 buffer per convolution layer, in layer order.
    pub layers: Vec<wgpu::Buffer>,
    pub max_ctx: u32,
    pub channels: u32,
}

impl ShortConvState {
    /// Zeroed state for `layers` convolution layers of `channels` over `max_ctx` positions.
    pub fn new(gpu: &Gpu, layers: u32, max_ctx: u32, channels: u32) -> Result<Self, GpuError> {
        let bytes = u64::from(max_ctx) * u64::from(channels) * 4;
        let limit = gpu.caps.max_binding.min(gpu.caps.max_buffer);
        if bytes > limit {
            return Err(GpuError::BindingTooSmall {
                name: "short_conv state layer".into(),
                needed: bytes,
                limit,
            });
        }
        let layers = (0..layers)
            .map(|i| storage_buffer(gpu, &format!("short_conv.state[{i}]"), bytes.max(4)))
            .collect();
        Ok(ShortConvState {
            layers,
            max_ctx,
            channels,
        })
    }

    /// Bytes of the whole state.
    pub fn bytes(&self) -> u64 {
        self.layers.len() as u64 * u64::from(self.max_ctx) * u64::from(self.channels) * 4
    }
}

/// The convolution's operands for one layer and call.
pub struct ShortConvCall<'a> {
    /// `[tokens][3 · channels]`: B, C and x of each token.
    pub bcx: &'a wgpu::Buffer,
    /// `[channels][kernel_len]` (GGUF `shortconv.conv.weight`, f32).
    pub weight: &'a wgpu::Buffer,
    /// This layer's state buffer (`ShortConvState::layers[i]`).
    pub history: &'a wgpu::Buffer,
    pub tokens: u32,
    pub channels: u32,
    pub kernel_len: u32,
    /// Position of the first token; the history must hold every position before it.
    pub start_pos: u32,
}

/// out[t, c] = C[t, c] · Σ_j w[c, j] · (B ⊙ x)[start_pos + t − (L − 1) + j, c], storing
/// `B ⊙ x` of the call's positions into the history.
pub fn short_conv(rec: &mut Recorder, call: &ShortConvCall, out: &wgpu::Buffer) {
    let n = call
        .tokens
        .checked_mul(call.channels)
        .expect("short_conv: tokens * channels overflows u32");
    assert!(
        (1..=MAX_KERNEL_LEN).contains(&call.kernel_len),
        "short_conv: kernel length {} outside 1..={MAX_KERNEL_LEN}",
        call.kernel_len
    );
    if n == 0 {
        return;
    }
    let pipeline = rec.pipeline(&SHORT_CONV, &[("WG", WG)]);
    let grid = workgroup_grid(rec.gpu(), n.div_ceil(WG));
    let params = ShortConvParams {
        tokens: call.tokens,
        channels: call.channels,
        kernel_len: call.kernel_len,
        start_pos: call.start_pos,
        groups_x: grid[0],
        _pad: [0; 3],
    };
    let bindings = [
        call.bcx.as_entire_binding(),
        call.weight.as_entire_binding(),
        call.history.as_entire_binding(),
        out.as_entire_binding(),
    ];
    rec.dispatch(&pipeline, &params, &bindings, grid);
}

/// CPU reference of `short_conv` over a whole sequence from position 0, in f64:
/// `bcx` is `[tokens][3 · channels]`, `weight` `[channels][kernel_len]`; returns
/// `[tokens][channels]`.
pub fn short_conv_reference(
    bcx: &[f32],
    weight: &[f32],
    channels: usize,
    kernel_len: usize,
) -> Vec<f32> {
    let tokens = bcx.len() / (3 * channels);
    let gated = |t: usize, c: usize| {
        let row = &bcx[t * 3 * channels..(t + 1) * 3 * channels];
        f64::from(row[c]) * f64::from(row[2 * channels + c])
    };
    let mut out = vec![0.0; tokens * channels];
    for t in 0..tokens {
        for c in 0..channels {
            let mut acc = 0.0f64;
            for j in 0..kernel_len {
                // Position t - (kernel_len - 1) + j; earlier than 0 contributes nothing.
                if let Some(source) = (t + j + 1).checked_sub(kernel_len) {
                    acc += f64::from(weight[c * kernel_len + j]) * gated(source, c);
                }
            }
            let gate = f64::from(bcx[t * 3 * channels + channels + c]);
            out[t * channels + c] = (gate * acc) as f32;
        }
    }
    out
}
