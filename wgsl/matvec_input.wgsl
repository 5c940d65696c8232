// The product's input as matvec.wgsl stages it: x itself (see matvec_residual.wgsl for the
// other input).

fn staging_scale(lane: u32) -> f32 {
    return 1.0;
}

// Vec4 `at` of the first token's input.
fn staged_input(at: u32, scale: f32) -> vec4<f32> {
    return x[x_base(0u) + at];
}
