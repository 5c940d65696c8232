// The residual fold of matvec.wgsl (one token, staged rows only): the product's input is the
// residual stream after a sub-block's output `delta` has joined it through its own RMS norm,
// x + rms_norm(delta) * post_w, as rms_norm_add would leave it in x. Gemma 3 normalises every
// attention and feed-forward output before it joins the stream; on a GPU that norm was a
// dispatch of its own, two a layer, each ~7.7 µs of a ~50 µs decode layer on the H200
// (docs/perf.md, session 24). Every workgroup computes the norm's factor itself (the rows are
// short: the staged ones, at most TPR units); the first also writes the sum to `residual`, a
// buffer other than x, for the dispatches after this one.

@group(0) @binding(7) var<storage, read> delta: array<vec4<f32>>;
@group(0) @binding(8) var<storage, read> post_w: array<vec4<f32>>;
@group(0) @binding(9) var<storage, read_write> residual: array<vec4<f32>>;

// 1 / rms(delta), reduced over the workgroup. Every lane calls it (uniform control flow).
fn staging_scale(lane: u32) -> f32 {
    var squares = 0.0;
    for (var i = lane; i < params.cols / 4u; i = i + WG) {
        let d = delta[i];
        squares = squares + dot(d, d);
    }
    let total = reduce_sum(squares, lane);
    return 1.0 / sqrt(total / f32(params.cols) + params.post_eps);
}

// Vec4 `at` of x + rms_norm(delta) * post_w, in rms_norm_add's order of operations.
fn staged_input(at: u32, scale: f32) -> vec4<f32> {
    let value = x[x_base(0u) + at] + (delta[at] * scale) * post_w[at];
    if (first_group) {
        residual[at] = value;
    }
    return value;
}
