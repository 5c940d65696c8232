// The parameters of the attention kernels that take `ops::attention::KernelParams` (decode,
// decode_gpu, decode_rows, combine and both prefill kernels), at binding 0.

struct Params {
    kv_heads: u32,
    heads: u32,
    start_pos: u32,
    // Query tokens of the call (the rows of a batched step).
    tokens: u32,
    // Keys j with pos - j < window are visible; u32 max when there is no sliding window.
    window: u32,
    splits: u32,
    scale: f32,
    // tanh logit soft-capping when > 0.
    softcap: f32,
}

@group(0) @binding(0) var<uniform> params: Params;
