// Gate activations, shared by gated_activation (elementwise.wgsl) and the fused matvec.

fn silu(x: f32) -> f32 {
    return x / (1.0 + exp(-x));
}

// tanh is clamped because some drivers evaluate it as a ratio of exponentials, which gives
// inf/inf = NaN for large arguments; tanh(10) is already 1 in f32.
fn gelu_tanh(x: f32) -> f32 {
    let sqrt_2_over_pi = 0.7978845608028654;
    let inner = sqrt_2_over_pi * x * (1.0 + 0.044715 * x * x);
    return 0.5 * x * (1.0 + tanh(clamp(inner, -10.0, 10.0)));
}
