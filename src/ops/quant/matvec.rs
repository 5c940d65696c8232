//! The matrix-vector product of decode (`wgsl/matvec.wgsl`), with the fusions that spare a
//! decode step whole dispatches: the RMS norm of its input, and an epilogue that adds a bias,
//! accumulates into the residual stream, gates by the activated gate projection, or computes
//! the up projection alongside (GLU: both products and the gating in one dispatch).

use crate::gpu::{Kernel, Lib, Recorder};
use crate::ops::elementwise::{activation_reference, Activation};
use crate::ops::norm::rms_norm_reference;

use super::{fold_groups, matmul_reference, QuantMatrix};

const LIBS: &[Lib] = &[
    Lib::Activation,
    Lib::Constants(super::KERNEL_CODES),
    Lib::Constants(super::IQ4_NL_CODEBOOK_CONSTS),
    Lib::Dequant,
];

/// The residual fold's kernels also reduce the post-norm's squares over the workgroup.
const RESIDUAL_LIBS: &[Lib] = &[
    Lib::Activation,
    Lib::Constants(super::KERNEL_CODES),
    Lib::Constants(super::IQ4_NL_CODEBOOK_CONSTS),
    Lib::Dequant,
    Lib::Reduce,
];

const MATVEC: Kernel = Kernel {
    name: "matvec",
    source: concat!(
        include_str!("../../../wgsl/matvec.wgsl"),
        include_str!("../../../wgsl/matvec_input.wgsl")
    ),
    entry: "matvec",
    libs: LIBS,
};

const MATVEC_SUBGROUP: Kernel = Kernel {
    name: "matvec_subgroup",
    source: concat!(
        include_str!("../../../wgsl/matvec.wgsl"),
        include_str!("../../../wgsl/matvec_input.wgsl"),
        include_str!("../../../wgsl/matvec_subgroup.wgsl")
    ),
    entry: "matvec_subgroup",
    libs: LIBS,
};

/// The residual fold has three bindings more, so it is a kernel of its own: WebGPU's default
/// limit of 8 storage bindings holds the others.
const MATVEC_RESIDUAL: Kernel = Kernel {
    name: "matvec_residual",
    source: concat!(
        include_str!("../../../wgsl/matvec.wgsl"),
        include_str!("../../../wgsl/matvec_residual.wgsl")
    ),
    entry: "matvec",
    libs: RESIDUAL_LIBS,
};

const MATVEC_RESIDUAL_SUBGROUP: Kernel = Kernel {
    name: "matvec_residual_subgroup",
    source: concat!(
        include_str!("../../../wgsl/matvec.wgsl"),
        include_str!("../../../wgsl/matvec_residual.wgsl"),
        include_str!("../../../wgsl/matvec_subgroup.wgsl")
    ),
    entry: "matvec_subgroup",
    libs: RESIDUAL_LIBS,
};

/// Storage bindings of the residual fold's kernels.
const RESIDUAL_STORAGE_BINDINGS: u32 = 9;

/// Work split of one matvec: threads per workgroup, threads sharing a row group along K, and
/// rows per thread.
struct Shape {
    wg: u32,
    threads_per_row: u32,
    rows_per_thread: u32,
}

/// CPU adapters run each lane as a loop iteration: few threads, each reusing every activation
/// it loads for 8 rows. On lavapipe an activation load costs about what decoding a weight unit
/// does (each a loop over the SIMD lanes): 8 rows a thread rather than 4 (4 threads a row
/// rather than 8) decode a token 2.20 -> 2.96 tok/s on SmolLM2, 0.59 -> 0.73 on Qwen2.5, 0.87
/// -> 1.09 on Gemma 3, and 16 batched rows 3.6 -> 5.5 tok/s on SmolLM2 (docs/perf.md, session 18).
const CPU_SHAPE: Shape = Shape {
    wg: 64,
    threads_per_row: 4,
    rows_per_thread: 8,
};

/// Tokens per workgroup of several tokens' products on a CPU adapter: each decoded weight
/// serves them all (on lavapipe a 64-token Qwen2.5 prompt through them took 0.54 s a token,
/// 8 a group no better, against 1.15 s for a lone decode step).
const CPU_TOKENS_PER_GROUP: u32 = 4;

/// GPUs need many workgroups in flight for rows of a few hundred values: a subgroup (up to 32
/// lanes) per row, so a row's units are read by neighbouring lanes at once.
const GPU_SHAPE: Shape = Shape {
    wg: 128,
    threads_per_row: 32,
    rows_per_thread: 1,
};

/// From this many rows on (output heads of 49k-262k rows), GPUs are limited by how fast they
/// start workgroups (about one per 4 ns on an H200, whatever each reads), so each lane takes 4
/// rows: a quarter of the workgroups, each with four loads in flight per lane. Measured on the
/// H200 (docs/perf.md): the 262k-row Gemma 3 head 434 -> 183 µs, Qwen2.5's 176 -> 121 µs;
/// the layers' matrices are fastest with GPU_SHAPE.
const GPU_WIDE_SHAPE: Shape = Shape {
    wg: 128,
    threads_per_row: 32,
    rows_per_thread: 4,
};
const WIDE_ROWS: u32 = 16384;

/// GLU matvecs of this many gate rows or more (Qwen2.5's 4864) would need more lanes than an
/// H200 holds at once with GPU_SHAPE (9728 rows of 32 lanes), so they run in two waves; two
/// rows per lane make it one (measured 22.5 -> 18.5 µs per call).
const GPU_GLU_SHAPE: Shape = Shape {
    wg: 128,
    threads_per_row: 32,
    rows_per_thread: 2,
};
const WIDE_GLU_ROWS: u32 = 4096;

/// A batched step's layer products (several tokens, each its own workgroups) on GPUs: two rows
/// per lane, so each activation a lane loads serves two rows. On the H200 16 rows of SmolLM2
/// decode 4,147 -> 5,432 tok/s and Qwen2.5 1,757 -> 2,594 with every product so split
/// (docs/perf.md, session 21); one token stays fastest at one row per lane. 256 lanes a
/// workgroup gained 3% on Gemma 3's 16 rows and lost as much on SmolLM2's 4 streams and
/// Qwen2.5's 8 rows on an H100 (session 38).
const GPU_BATCH_SHAPE: Shape = Shape {
    wg: 128,
    threads_per_row: 32,
    rows_per_thread: 2,
};

/// What happens to the dot products.
#[derive(Clone, Copy, Default)]
pub enum Epilogue<'a> {
    #[default]
    Store,
    /// `out[r] = dot + bias[r]`.
    Bias(&'a wgpu::Buffer),
    /// `out[r] += dot`.
    Accumulate,
    /// `out[r] = act(gate[r]) * dot`.
    Gated(&'a wgpu::Buffer, Activation),
    /// `out[r] = act(dot) * up_dot[r]`: the matrix is the gate projection and this one, the up
    /// projection, rows of the same single-part tensor (see `shares_part`).
    Glu(QuantMatrix<'a>, Activation),
}

impl Epilogue<'_> {
    pub(super) fn code(&self) -> u32 {
        match self {
            Epilogue::Store => 0,
            Epilogue::Bias(_) => 1,
            Epilogue::Accumulate => 2,
            Epilogue::Gated(_, Activation::Silu) => 3,
            Epilogue::Gated(_, Activation::GeluTanh) => 4,
            Epilogue::Glu(_, Activation::Silu) => 5,
            Epilogue::Glu(_, Activation::GeluTanh) => 6,
        }
    }

    pub(super) fn aux(&self) -> Option<&wgpu::Buffer> {
        match *self {
            Epilogue::Bias(buffer) | Epilogue::Gated(buffer, _) => Some(buffer),
            Epilogue::Store | Epilogue::Accumulate | Epilogue::Glu(..) => None,
        }
    }
}

/// A post-norm joining the residual stream inside the product that reads the stream next: the
/// product's input is `x + rms_norm(delta) * weight` (x is the stream before), which its first
/// workgroup also writes into `out` (a buffer other than x) for the dispatches after it.
#[derive(Clone, Copy)]
pub struct Residual<'a> {
    pub delta: &'a wgpu::Buffer,
    pub weight: &'a wgpu::Buffer,
    pub eps: f32,
    pub out: &'a wgpu::Buffer,
}

/// Operations fused into one matvec.
#[derive(Clone, Copy, Default)]
pub struct Fusion<'a> {
    /// Fold a post-norm into the input first (one token, see `residual_fold_supported`).
    pub residual: Option<Residual<'a>>,
    /// RMS-normalise x (after the residual fold, if any), with this weight and epsilon.
    pub norm: Option<(&'a wgpu::Buffer, f32)>,
    pub epilogue: Epilogue<'a>,
    /// Where in `out` row 0 goes: row r is `out[out_offset + r]` (and reads `aux` there too).
    pub out_offset: u32,
}

/// Whether `a` and `b` lie in the same one-part tensor, so that one dispatch reads both (the
/// GLU epilogue's condition on gate and up).
pub fn shares_part(a: &QuantMatrix, b: &QuantMatrix) -> bool {
    std::ptr::eq(a.weights, b.weights)
        && a.weights.parts.len() == 1
        && (a.quant, a.cols, a.rows) == (b.quant, b.cols, b.rows)
}

/// The GLU epilogue's up rows, as a row offset from the gate rows `w` in the same buffer.
pub(super) fn glu_up_rows(w: &QuantMatrix, epilogue: &Epilogue) -> Option<u32> {
    match epilogue {
        Epilogue::Glu(up, _) => {
            assert!(shares_part(w, up), "GLU: gate and up in different parts");
            Some(up.row_offset.wrapping_sub(w.row_offset))
        }
        _ => None,
    }
}

#[repr(C)]
#[derive(Debug, Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct MatvecParams {
    rows: u32,
    first_row: u32,
    row_bytes: u32,
    blocks_per_row: u32,
    groups_x: u32,
    cols: u32,
    eps: f32,
    buffer_row: u32,
    up_buffer_row: u32,
    out_offset: u32,
    x_stride: u32,
    out_stride: u32,
    tokens: u32,
    post_eps: f32,
    section_ends: [u32; 3],
}

/// The work split of one product: `shape`, and tokens per workgroup (`TPW` in the kernel).
fn work_split(
    caps: &crate::gpu::Caps,
    w: &QuantMatrix,
    fusion: &Fusion,
    tokens: u32,
) -> (Shape, u32) {
    if let (Some([wg, threads_per_row, rows_per_thread, per_group]), true) =
        (caps.matvec_batch_split, tokens > 1)
    {
        let shape = Shape {
            wg,
            threads_per_row,
            rows_per_thread,
        };
        return (shape, tokens_per_group(per_group, tokens));
    }
    let shape = match caps.matvec_split {
        Some([wg, threads_per_row, rows_per_thread]) => Shape {
            wg,
            threads_per_row,
            rows_per_thread,
        },
        None if caps.cpu_work_split => CPU_SHAPE,
        None if w.rows >= WIDE_ROWS => GPU_WIDE_SHAPE,
        None if w.rows >= WIDE_GLU_ROWS && matches!(fusion.epilogue, Epilogue::Glu(..)) => {
            GPU_GLU_SHAPE
        }
        None if tokens > 1 => GPU_BATCH_SHAPE,
        None => GPU_SHAPE,
    };
    let per_group = match caps.cpu_work_split && caps.matvec_split.is_none() {
        true => CPU_TOKENS_PER_GROUP,
        false => 1,
    };
    (shape, tokens_per_group(per_group, tokens))
}

/// The largest power of two no larger than `most` and `tokens`: each count is its own
/// pipeline.
fn tokens_per_group(most: u32, tokens: u32) -> u32 {
    let most = most.min(tokens).max(1);
    1 << (31 - most.leading_zeros())
}

/// Whether one token's product of `w` can take `Fusion::residual` here: a GPU work split that
/// stages its rows (one unit per thread) in the one-token loop, and room for its bindings.
pub fn residual_fold_supported(rec: &Recorder, w: &QuantMatrix, epilogue: &Epilogue) -> bool {
    let caps = &rec.gpu().caps;
    let fusion = Fusion {
        epilogue: *epilogue,
        ..Fusion::default()
    };
    let (shape, _) = work_split(caps, w, &fusion, 1);
    let halves = if matches!(epilogue, Epilogue::Glu(..)) {
        2
    } else {
        1
    };
    caps.max_storage_bindings >= RESIDUAL_STORAGE_BINDINGS
        && caps.int8_products != crate::gpu::Int8Products::Decode
        && stages_x(rec, w, &shape)
        && shape.rows_per_thread * halves <= 4
}

/// Whether the one-token loop stages x in workgroup memory: on GPUs, where a row is one unit
/// per thread (each workgroup reads x once, coalesced, instead of once per row group). Longer
/// rows would stage in chunks, a barrier pair each: Qwen2.5's 4,864-column down projection
/// went 10.8 -> 11.4 µs so on the H200 (docs/perf.md, session 21). On CPU adapters a barrier
/// costs more than it saves.
fn stages_x(rec: &Recorder, w: &QuantMatrix, shape: &Shape) -> bool {
    !rec.gpu().caps.cpu_work_split && w.units_per_row() <= row_threads(rec, shape)
}

/// Threads sharing a row group: the shuffle reduction needs all of them in one subgroup.
fn row_threads(rec: &Recorder, shape: &Shape) -> u32 {
    let caps = &rec.gpu().caps;
    if subgroup_kernel(rec) {
        let fitting = shape.threads_per_row.min(caps.subgroup_min);
        1 << (31 - fitting.leading_zeros())
    } else {
        shape.threads_per_row.min(shape.wg)
    }
}

fn subgroup_kernel(rec: &Recorder) -> bool {
    rec.variant().subgroups && rec.gpu().caps.subgroup_min >= 1
}

/// `out = epilogue(W · fused_norm(x))` for one token; `x` holds `cols` f32 values.
pub fn matvec(
    rec: &mut Recorder,
    w: &QuantMatrix,
    x: &wgpu::Buffer,
    out: &wgpu::Buffer,
    fusion: &Fusion,
) {
    matvec_tokens(rec, w, x, out, fusion, 1);
}

/// `matvec` for each of `tokens` rows of `x` (`[tokens, cols]`) into the same row of `out`
/// (`[tokens, w.rows]`, and `aux` likewise), in one dispatch: a GPU's batched decode step runs
/// its products this way (`quant::matmul`), as wide as one token's times the rows.
pub fn matvec_tokens(
    rec: &mut Recorder,
    w: &QuantMatrix,
    x: &wgpu::Buffer,
    out: &wgpu::Buffer,
    fusion: &Fusion,
    tokens: u32,
) {
    let gpu = rec.gpu();
    if super::int8::int8_applies(gpu, w, fusion, tokens) {
        let xq = super::int8::quantize_int8(rec, x, fusion.norm, tokens, w.cols);
        return super::int8::int8_products(rec, w, &xq, out, fusion, tokens);
    }
    record_matvec(rec, w, x, out, fusion, tokens, None);
}

/// Whether `tokens` tokens' product of `w` can go into sections (`matvec_sections`): not where
/// integer products take it.
pub fn sections_supported(gpu: &crate::gpu::Gpu, w: &QuantMatrix, tokens: u32) -> bool {
    !super::int8::int8_applies(gpu, w, &Fusion::default(), tokens)
}

/// `matvec_tokens` into sections of `out`: the output rows, numbered from `fusion.out_offset`,
/// fall in three sections ending at rows `section_ends`, and each section is a `[tokens,
/// length]` block of its own, the blocks one after another. A batched step's q, k and v (one
/// tensor's rows, see `Matrix::followed_by`) so take one product instead of three, and lie where
/// the attention kernels read them. Where `sections_supported` says so; a store
/// or bias epilogue only (the bias indexed by output row).
pub fn matvec_sections(
    rec: &mut Recorder,
    w: &QuantMatrix,
    x: &wgpu::Buffer,
    out: &wgpu::Buffer,
    fusion: &Fusion,
    tokens: u32,
    section_ends: [u32; 3],
) {
    assert!(
        sections_supported(rec.gpu(), w, tokens),
        "matvec_sections: integer products write rows of tokens only"
    );
    assert!(
        matches!(fusion.epilogue, Epilogue::Store | Epilogue::Bias(_)) && fusion.residual.is_none(),
        "matvec_sections: a store or bias epilogue, no residual fold"
    );
    let ends_rise = section_ends[0] <= section_ends[1] && section_ends[1] <= section_ends[2];
    assert!(
        ends_rise && fusion.out_offset + w.rows <= section_ends[2],
        "matvec_sections: rows {}..{} outside sections ending at {section_ends:?}",
        fusion.out_offset,
        fusion.out_offset + w.rows
    );
    record_matvec(rec, w, x, out, fusion, tokens, Some(section_ends));
}

/// The matrix-vector kernel's dispatch: `sections` as `matvec_sections` says, `None` rows of
/// tokens.
fn record_matvec(
    rec: &mut Recorder,
    w: &QuantMatrix,
    x: &wgpu::Buffer,
    out: &wgpu::Buffer,
    fusion: &Fusion,
    tokens: u32,
    sections: Option<[u32; 3]>,
) {
    let gpu = rec.gpu();
    let (shape, per_group) = work_split(&gpu.caps, w, fusion, tokens);
    let residual = fusion.residual.is_some();
    let kernel = match (subgroup_kernel(rec), residual) {
        (true, false) => &MATVEC_SUBGROUP,
        (true, true) => &MATVEC_RESIDUAL_SUBGROUP,
        (false, false) => &MATVEC,
        (false, true) => &MATVEC_RESIDUAL,
    };
    let threads_per_row = row_threads(rec, &shape);
    let up_rows = glu_up_rows(w, &fusion.epilogue);
    let stage = stages_x(rec, w, &shape);
    assert!(
        !residual || (stage && tokens == 1 && per_group == 1),
        "the residual fold needs one token and staged rows (see residual_fold_supported)"
    );
    let rows_per_group = shape.wg / threads_per_row * shape.rows_per_thread;
    let mut consts = vec![
        ("WG", shape.wg),
        ("TPR", threads_per_row),
        ("RPT", shape.rows_per_thread),
        ("HALVES", if up_rows.is_some() { 2 } else { 1 }),
        ("NORM", u32::from(fusion.norm.is_some())),
        ("EPILOGUE", fusion.epilogue.code()),
        ("TPW", per_group),
        ("STAGE", u32::from(stage)),
        ("STAGED", if stage { 8 * (threads_per_row + 1) } else { 1 }),
        ("SECTIONS", u32::from(sections.is_some())),
    ];
    consts.extend(w.quant_consts());
    let pipeline = rec.pipeline(kernel, &consts);
    let placeholder = gpu.placeholder();
    let aux = fusion.epilogue.aux().unwrap_or(placeholder);
    let (norm_weight, eps) = fusion.norm.unwrap_or((placeholder, 0.0));
    let max_per_dim = gpu.caps.max_workgroups_per_dim;
    for part in w.parts() {
        let [groups_x, groups_y] = fold_groups(part.rows.div_ceil(rows_per_group), max_per_dim);
        let params = MatvecParams {
            rows: part.rows,
            first_row: part.first_row,
            row_bytes: w.weights.row_bytes as u32,
            blocks_per_row: w.blocks_per_row(),
            groups_x,
            cols: w.cols,
            eps,
            buffer_row: part.buffer_row,
            up_buffer_row: part.buffer_row.wrapping_add(up_rows.unwrap_or(0)),
            out_offset: fusion.out_offset,
            x_stride: w.cols / 4,
            out_stride: w.rows,
            tokens,
            post_eps: fusion.residual.map_or(0.0, |r| r.eps),
            section_ends: sections.unwrap_or_default(),
        };
        let mut bindings = vec![
            part.buffer.as_entire_binding(),
            x.as_entire_binding(),
            out.as_entire_binding(),
            part.buffer.as_entire_binding(),
            aux.as_entire_binding(),
            norm_weight.as_entire_binding(),
        ];
        if let Some(r) = fusion.residual {
            bindings.extend([
                r.delta.as_entire_binding(),
                r.weight.as_entire_binding(),
                r.out.as_entire_binding(),
            ]);
        }
        rec.dispatch(
            &pipeline,
            &params,
            &bindings,
            [tokens.div_ceil(per_group), groups_x, groups_y],
        );
    }
}

/// `matvec_tokens` of one input `x`, normalised with `norm`, by each of `products` (matrix,
/// output, epilogue) in order. Where the integer products take them all, x is quantized once
/// for all of them rather than once a product (a batched step's q, k and v: two dispatches
/// fewer a layer).
pub fn matvec_tokens_each(
    rec: &mut Recorder,
    x: &wgpu::Buffer,
    norm: Option<(&wgpu::Buffer, f32)>,
    tokens: u32,
    products: &[(QuantMatrix, &wgpu::Buffer, Epilogue)],
) {
    let fusion = |epilogue| Fusion {
        residual: None,
        norm,
        epilogue,
        out_offset: 0,
    };
    let gpu = rec.gpu();
    let integer = products
        .iter()
        .all(|(w, _, epilogue)| super::int8::int8_applies(gpu, w, &fusion(*epilogue), tokens));
    match (integer, products.first()) {
        (true, Some((first, ..))) => {
            let xq = super::int8::quantize_int8(rec, x, norm, tokens, first.cols);
            for (w, out, epilogue) in products {
                super::int8::int8_products(rec, w, &xq, out, &fusion(*epilogue), tokens);
            }
        }
        _ => {
            for (w, out, epilogue) in products {
                matvec_tokens(rec, w, x, out, &fusion(*epilogue), tokens);
            }
        }
    }
}

/// What `matvec` computes, on the CPU: `out` holds the output's previous contents (read by
/// `Accumulate`), `aux` the bias or gate values.
#[allow(clippy::too_many_arguments)]
pub fn matvec_reference(
    quant: super::QuantType,
    weights: &[u8],
    rows: usize,
    x: &[f32],
    norm: Option<(&[f32], f32)>,
    epilogue: ReferenceEpilogue,
    aux: &[f32],
    out: &mut [f32],
) {
    let input = match norm {
        Some((weight, eps)) => rms_norm_reference(x, weight, eps),
        None => x.to_vec(),
    };
    let dots = matmul_reference(quant, weights, rows, x.len(), &input, 1);
    for ((r, slot), dot) in out.iter_mut().enumerate().zip(dots) {
        *slot = match epilogue {
            ReferenceEpilogue::Store => dot,
            ReferenceEpilogue::Bias => dot + aux[r],
            ReferenceEpilogue::Accumulate => *slot + dot,
            ReferenceEpilogue::Gated(act) => activation_reference(aux[r], act) * dot,
        };
    }
}

/// `Epilogue` without its buffers, for the reference.
#[derive(Clone, Copy, Debug)]
pub enum ReferenceEpilogue {
    Store,
    Bias,
    Accumulate,
    Gated(Activation),
}
