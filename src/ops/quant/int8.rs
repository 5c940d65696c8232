//! Integer products of a few tokens (a batched decode step's rows): x quantized to 8 bits per
//! 8 values, its RMS norm folded in (`wgsl/quantize_int8.wgsl`), then each weight unit
//! decoded once to 8-bit integers for up to 16 tokens and multiplied with `dot4I8Packed`
//! (`wgsl/matvec_int8.wgsl`, the per-type decoding in `wgsl/dequant_int8.wgsl`), with the
//! epilogues of `matvec`. The f32 products decode each weight once per token, which bounds a
//! batched step (docs/perf.md, sessions 16-31). CPU references: `quantize_int8_reference` and
//! `int8_products_reference`.

use crate::gpu::{Gpu, Int8Products, Kernel, Lib, Recorder};
use crate::ops::norm::rms_norm_reference;

use super::matvec::{glu_up_rows, matvec_reference, Fusion, ReferenceEpilogue};
use super::{fold_groups, QuantMatrix, QuantType, IQ4_NL_CODEBOOK_CONSTS, KERNEL_CODES};

const QUANTIZE: Kernel = Kernel {
    name: "quantize_int8",
    source: include_str!("../../../wgsl/quantize_int8.wgsl"),
    entry: "quantize_int8",
    libs: &[Lib::Reduce],
};

const MATVEC_INT8: Kernel = Kernel {
    name: "matvec_int8",
    source: concat!(
        include_str!("../../../wgsl/matvec_int8.wgsl"),
        include_str!("../../../wgsl/dequant_int8.wgsl")
    ),
    entry: "matvec_int8",
    libs: &[
        Lib::Activation,
        Lib::Constants(KERNEL_CODES),
        Lib::Constants(IQ4_NL_CODEBOOK_CONSTS),
        Lib::Dequant,
    ],
};

const QUANTIZE_WG: u32 = 64;

/// Values per scale of quantized x (a quarter of a weight unit).
const QUARTER: usize = 8;

/// Most tokens one workgroup multiplies (four vec4s of sums a row).
pub const INT8_MOST_TOKENS: u32 = 16;

/// The built-in work split `[lanes, lanes per row, most tokens per workgroup]`: of eight
/// measured on the H200 (docs/perf.md, session 34), the one faster than `[64, 8, 16]` at one,
/// 4 and 16 rows on all three models (four times the workgroups: 16 rows of Qwen2.5 2,208 ->
/// 3,918 tok/s). Integer products stay off by default all the same: f32 products are faster.
const DEFAULT_SPLIT: [u32; 3] = [64, 16, 8];

/// Whether `quant` has an integer decoding (`wgsl/dequant_int8.wgsl`): every type but floats.
pub fn integer_type(quant: QuantType) -> bool {
    !matches!(quant, QuantType::F32 | QuantType::F16 | QuantType::BF16)
}

/// Whether this GPU multiplies `tokens` tokens with `w` on integers: the device's choice
/// (`Caps::int8_products`: several tokens, or every step), an integer type, and no residual
/// fold (one token's fusion, which `residual_fold_supported` turns down where one token's
/// products are on integers).
pub fn int8_applies(gpu: &Gpu, w: &QuantMatrix, fusion: &Fusion, tokens: u32) -> bool {
    let steps = match gpu.caps.int8_products {
        Int8Products::Off => false,
        Int8Products::Batched => tokens > 1,
        Int8Products::Decode => true,
    };
    steps && fusion.residual.is_none() && integer_type(w.quant)
}

/// Whether a work split `[lanes, lanes per row, most tokens]` is one the kernel takes.
pub fn valid_split([wg, threads_per_row, most]: [u32; 3]) -> bool {
    let vecs = most / 4;
    wg.is_power_of_two()
        && wg <= 256
        && threads_per_row.is_power_of_two()
        && threads_per_row <= wg
        && most % 4 == 0
        && (1..=4).contains(&vecs)
        && threads_per_row >= vecs
}

#[repr(C)]
#[derive(Debug, Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct QuantizeParams {
    cols: u32,
    eps: f32,
    tokens: u32,
    groups_x: u32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct ProductParams {
    rows: u32,
    first_row: u32,
    row_bytes: u32,
    blocks_per_row: u32,
    groups_x: u32,
    cols: u32,
    buffer_row: u32,
    up_buffer_row: u32,
    out_offset: u32,
    out_stride: u32,
    tokens: u32,
    pad: u32,
}

/// `x` (`[tokens, cols]` f32, `cols` a multiple of 32), RMS-normalised with `norm` if given,
/// as 8-bit activations (2 bytes a value) in a buffer the device keeps for them: valid until
/// the next call records over it.
pub fn quantize_int8(
    rec: &mut Recorder,
    x: &wgpu::Buffer,
    norm: Option<(&wgpu::Buffer, f32)>,
    tokens: u32,
    cols: u32,
) -> wgpu::Buffer {
    assert!(cols.is_multiple_of(32), "int8 activations: {cols} columns");
    let gpu = rec.gpu();
    let xq = gpu.kept_storage("int8 activations", u64::from(tokens) * u64::from(cols) * 2);
    let consts = [("WG", QUANTIZE_WG), ("NORM", u32::from(norm.is_some()))];
    let pipeline = rec.pipeline(&QUANTIZE, &consts);
    let (norm_weight, eps) = norm.unwrap_or((gpu.placeholder(), 0.0));
    let [groups_x, groups_y] = fold_groups(tokens, gpu.caps.max_workgroups_per_dim);
    let params = QuantizeParams {
        cols,
        eps,
        tokens,
        groups_x,
    };
    let bindings = [
        x.as_entire_binding(),
        norm_weight.as_entire_binding(),
        xq.as_entire_binding(),
    ];
    rec.dispatch(&pipeline, &params, &bindings, [groups_x, groups_y, 1]);
    xq
}

/// `out[t, :] = epilogue(W · x_t)` for `t < tokens`, x from `quantize_int8` (which took the
/// fusion's norm; `fusion.residual` must be `None`), `out` and `aux` as `matvec_tokens` has them.
pub fn int8_products(
    rec: &mut Recorder,
    w: &QuantMatrix,
    xq: &wgpu::Buffer,
    out: &wgpu::Buffer,
    fusion: &Fusion,
    tokens: u32,
) {
    assert!(
        integer_type(w.quant),
        "{:?} has no integer decoding",
        w.quant
    );
    assert!(
        fusion.residual.is_none(),
        "the residual fold is one token's"
    );
    let gpu = rec.gpu();
    let [wg, threads_per_row, most] = gpu.caps.int8_split.unwrap_or(DEFAULT_SPLIT);
    // One token (a lone decode step) is a workgroup of its own; more, in fours.
    let per_group = match tokens {
        1 => 1,
        _ => tokens.next_multiple_of(4).min(most),
    };
    let up_rows = glu_up_rows(w, &fusion.epilogue);
    let mut consts = vec![
        ("WG", wg),
        ("TPR", threads_per_row),
        ("TPW", per_group),
        ("HALVES", if up_rows.is_some() { 2 } else { 1 }),
        ("EPILOGUE", fusion.epilogue.code()),
    ];
    consts.extend(w.quant_consts());
    let pipeline = rec.pipeline(&MATVEC_INT8, &consts);
    let aux = fusion.epilogue.aux().unwrap_or(gpu.placeholder());
    let rows_per_group = wg / threads_per_row;
    for part in w.parts() {
        let [groups_x, groups_y] = fold_groups(
            part.rows.div_ceil(rows_per_group),
            gpu.caps.max_workgroups_per_dim,
        );
        let params = ProductParams {
            rows: part.rows,
            first_row: part.first_row,
            row_bytes: w.weights.row_bytes as u32,
            blocks_per_row: w.blocks_per_row(),
            groups_x,
            cols: w.cols,
            buffer_row: part.buffer_row,
            up_buffer_row: part.buffer_row.wrapping_add(up_rows.unwrap_or(0)),
            out_offset: fusion.out_offset,
            out_stride: w.rows,
            tokens,
            pad: 0,
        };
        let bindings = [
            part.buffer.as_entire_binding(),
            xq.as_entire_binding(),
            out.as_entire_binding(),
            part.buffer.as_entire_binding(),
            aux.as_entire_binding(),
        ];
        let grid = [tokens.div_ceil(per_group), groups_x, groups_y];
        rec.dispatch(&pipeline, &params, &bindings, grid);
    }
}

/// One quarter of 8 values as the kernel quantizes it: (q, d) with value ≈ d * q.
pub fn quantize_quarter_reference(values: &[f32]) -> ([i8; QUARTER], f32) {
    let largest = values.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let inverse = if largest > 0.0 { 127.0 / largest } else { 0.0 };
    let mut q = [0i8; QUARTER];
    for (slot, v) in q.iter_mut().zip(values) {
        *slot = (v * inverse).round_ties_even() as i8;
    }
    (q, largest / 127.0)
}

/// x (`[tokens, cols]`) as the integer products multiply it: RMS-normalised with `norm` if
/// given, then each quarter of 8 values d * q.
pub fn quantize_int8_reference(x: &[f32], norm: Option<(&[f32], f32)>) -> Vec<f32> {
    let input = match norm {
        Some((weight, eps)) => rms_norm_reference(x, weight, eps),
        None => x.to_vec(),
    };
    input
        .chunks(QUARTER)
        .flat_map(|quarter| {
            let (q, d) = quantize_quarter_reference(quarter);
            q.map(|v| d * f32::from(v))
        })
        .collect()
}

/// What `int8_products` computes for `tokens` rows of `xq` (from `quantize_int8_reference`):
/// `matvec_reference` on each, `aux` per token for gated epilogues (the bias is every token's).
#[allow(clippy::too_many_arguments)]
pub fn int8_products_reference(
    quant: QuantType,
    weights: &[u8],
    rows: usize,
    xq: &[f32],
    tokens: usize,
    epilogue: ReferenceEpilogue,
    aux: &[f32],
    out: &mut [f32],
) {
    let cols = xq.len() / tokens;
    for t in 0..tokens {
        let aux = match epilogue {
            ReferenceEpilogue::Gated(_) => &aux[t * rows..][..rows],
            _ => aux,
        };
        let (x, out) = (&xq[t * cols..][..cols], &mut out[t * rows..][..rows]);
        matvec_reference(quant, weights, rows, x, None, epilogue, aux, out);
    }
}
