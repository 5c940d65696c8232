//! Products with GGUF-quantized weights, read straight from the file's bytes: the
//! matrix-vector product (decode), the matrix-matrix products (prefill: tiled, or on cooperative
//! matrices) and the embedding gather. Kernels: `wgsl/matvec.wgsl`, `wgsl/matmul.wgsl`,
//! `wgsl/matmul_coop.wgsl`, `wgsl/embed.wgsl`, all built on the
//! per-type block decoding of `wgsl/dequant.wgsl`.

mod dequant;
mod int8;
mod matmul;
mod matvec;
mod table;
pub mod testing;

use dequant::IQ4_NL_CODEBOOK_CONSTS;
pub use dequant::{dequant_row_reference, matmul_reference, IQ4_NL_CODEBOOK};
pub use int8::{
    int8_products, int8_products_reference, integer_type, quantize_int8, quantize_int8_reference,
    quantize_quarter_reference, valid_split as valid_int8_split, INT8_MOST_TOKENS,
};
pub use matmul::matmul_product;
pub use matmul::{coop_k_splits, uses_coop_matrix, MatmulTile};
pub use matvec::{
    matvec, matvec_reference, matvec_sections, matvec_tokens, matvec_tokens_each,
    residual_fold_supported, sections_supported, shares_part, Epilogue, Fusion, ReferenceEpilogue,
    Residual,
};
use table::KERNEL_CODES;
pub use table::{QuantType, ENGINE_SUPPORTED};

use crate::gguf::GgmlType;
use crate::gpu::{Kernel, Lib, Recorder, WeightTensor};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantError {
    #[error("tensor {tensor}: {cols} columns are not a multiple of {multiple}, which {quant:?} kernels need")]
    Columns {
        tensor: String,
        quant: QuantType,
        cols: u32,
        multiple: u32,
    },
    #[error("tensor {tensor}: has {actual} bytes per row and {actual_rows} rows, but {rows} rows of {cols} {quant:?} columns take {expected} bytes each")]
    Shape {
        tensor: String,
        quant: QuantType,
        rows: u32,
        cols: u32,
        actual_rows: u64,
        actual: u64,
        expected: u64,
    },
}

impl QuantType {
    /// Elements per GGUF block.
    pub fn block_size(self) -> u32 {
        self.ggml().block_size() as u32
    }

    /// Bytes per GGUF block.
    pub fn block_bytes(self) -> u32 {
        self.ggml().type_size() as u32
    }

    /// The engine's type for a GGUF type, if the kernels compute it.
    pub fn from_ggml(ggml: GgmlType) -> Option<QuantType> {
        Self::ALL.into_iter().find(|quant| quant.ggml() == ggml)
    }

    /// Parses ggml's type name (`q4_K`, `Q4_K`, `f16`, `BF16`, ...), case-insensitively.
    pub fn from_ggml_name(name: &str) -> Option<QuantType> {
        Self::ALL
            .into_iter()
            .find(|quant| quant.ggml_name().eq_ignore_ascii_case(name))
    }

    /// ggml's name of the type.
    pub fn ggml_name(self) -> &'static str {
        self.ggml().name()
    }

    /// Bytes of one row of `cols` elements.
    pub fn row_bytes(self, cols: u64) -> u64 {
        cols / u64::from(self.block_size()) * u64::from(self.block_bytes())
    }

    /// Columns must be a multiple of this: the block size, and at least the 32 values of a
    /// kernel unit (float rows are read in units of 32 too).
    pub fn cols_multiple(self) -> u32 {
        self.block_size().max(32)
    }

    /// The type's code in the kernels (`const QUANT`): its ggml id, which `KERNEL_CODES`
    /// names `QUANT_<NAME>`.
    fn code(self) -> u32 {
        self.ggml().id()
    }

    /// The block as the kernels see it: (elements, bytes); float types in blocks of 32.
    fn kernel_block(self) -> (u32, u32) {
        let elements = self.cols_multiple();
        (elements, elements / self.block_size() * self.block_bytes())
    }

    /// The constants every product kernel is specialised with for this type.
    fn kernel_consts(self) -> [(&'static str, u32); 4] {
        let (block, block_bytes) = self.kernel_block();
        [
            ("QUANT", self.code()),
            ("BLOCK", block),
            ("BLOCK_BYTES", block_bytes),
            ("UNITS", block / 32),
        ]
    }
}

/// A weight matrix of `rows` x `cols` (GGUF shape `[cols, rows]`), stored as raw GGUF bytes.
#[derive(Debug, Clone, Copy)]
pub struct QuantMatrix<'a> {
    pub weights: &'a WeightTensor,
    pub quant: QuantType,
    /// K: elements per row (GGUF shape[0]).
    pub cols: u32,
    /// N: rows (GGUF shape[1]).
    pub rows: u32,
    /// The tensor row holding the matrix's first row: a tensor may hold several matrices'
    /// rows one after another (q, k and v; gate and up), each a view of its own rows.
    pub row_offset: u32,
}

/// Rows `first_row .. first_row + rows` of a matrix, which lie in one weight part from its
/// row `buffer_row`: what one dispatch reads.
pub(super) struct ViewPart<'a> {
    pub buffer: &'a wgpu::Buffer,
    pub first_row: u32,
    pub rows: u32,
    pub buffer_row: u32,
}

impl<'a> QuantMatrix<'a> {
    /// Checks that the shape fits the kernels and matches the tensor's bytes.
    pub fn new(
        weights: &'a WeightTensor,
        quant: QuantType,
        cols: u32,
        rows: u32,
    ) -> Result<Self, QuantError> {
        let multiple = quant.cols_multiple();
        if cols == 0 || !cols.is_multiple_of(multiple) {
            return Err(QuantError::Columns {
                tensor: weights.name.clone(),
                quant,
                cols,
                multiple,
            });
        }
        let expected = quant.row_bytes(u64::from(cols));
        if weights.row_bytes != expected || weights.rows != u64::from(rows) {
            return Err(QuantError::Shape {
                tensor: weights.name.clone(),
                quant,
                rows,
                cols,
                actual_rows: weights.rows,
                actual: weights.row_bytes,
                expected,
            });
        }
        Ok(QuantMatrix {
            weights,
            quant,
            cols,
            rows,
            row_offset: 0,
        })
    }

    /// The matrix of rows `rows` of this one.
    pub fn rows(&self, rows: std::ops::Range<u32>) -> QuantMatrix<'a> {
        assert!(
            rows.start <= rows.end && rows.end <= self.rows,
            "rows {rows:?} of a matrix of {}",
            self.rows
        );
        QuantMatrix {
            rows: rows.end - rows.start,
            row_offset: self.row_offset + rows.start,
            ..*self
        }
    }

    /// The matrix's rows part by part, one dispatch each.
    pub(super) fn parts(&self) -> impl Iterator<Item = ViewPart<'a>> {
        let start = u64::from(self.row_offset);
        let end = start + u64::from(self.rows);
        self.weights.parts.iter().filter_map(move |part| {
            let first = start.max(part.first_row);
            let last = end.min(part.first_row + part.rows);
            (first < last).then(|| ViewPart {
                buffer: &part.buffer,
                first_row: (first - start) as u32,
                rows: (last - first) as u32,
                buffer_row: (first - part.first_row) as u32,
            })
        })
    }

    pub(super) fn blocks_per_row(&self) -> u32 {
        self.cols / self.quant.kernel_block().0
    }

    /// A row's 32-value units as the kernels cut it (`UNITS` per kernel block; float types
    /// are 32-element blocks there though single elements in GGUF).
    pub(super) fn units_per_row(&self) -> u32 {
        self.blocks_per_row() * (self.quant.kernel_block().0 / 32)
    }

    /// The constants every kernel of this family is specialised with.
    pub(super) fn quant_consts(&self) -> [(&'static str, u32); 4] {
        self.quant.kernel_consts()
    }
}

/// Parameters of `matmul.wgsl` (one dispatch per weight part).
#[repr(C)]
#[derive(Debug, Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct ProductParams {
    rows: u32,
    first_row: u32,
    row_bytes: u32,
    blocks_per_row: u32,
    groups_x: u32,
    cols: u32,
    tokens: u32,
    out_stride: u32,
    buffer_row: u32,
    /// Workgroups along K (the cooperative-matrix product's split; 1 for the tiled one).
    k_splits: u32,
    pad: [u32; 2],
}

#[repr(C)]
#[derive(Debug, Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct EmbedParams {
    rows: u32,
    first_row: u32,
    row_bytes: u32,
    blocks_per_row: u32,
    cols: u32,
    scale: f32,
    first_token: u32,
    buffer_row: u32,
}

const MATMUL: Kernel = Kernel {
    name: "matmul",
    source: include_str!("../../wgsl/matmul.wgsl"),
    entry: "matmul",
    libs: &[
        Lib::Constants(KERNEL_CODES),
        Lib::Constants(IQ4_NL_CODEBOOK_CONSTS),
        Lib::Dequant,
    ],
};

const MATMUL_COOP: Kernel = Kernel {
    name: "matmul_coop",
    source: include_str!("../../wgsl/matmul_coop.wgsl"),
    entry: "matmul",
    libs: &[
        Lib::CooperativeMatrix,
        Lib::IndicesInRange,
        Lib::Constants(KERNEL_CODES),
        Lib::Constants(IQ4_NL_CODEBOOK_CONSTS),
        Lib::Dequant,
    ],
};

const EMBED: Kernel = Kernel {
    name: "embed",
    source: include_str!("../../wgsl/embed.wgsl"),
    entry: "embed",
    libs: &[
        Lib::Constants(KERNEL_CODES),
        Lib::Constants(IQ4_NL_CODEBOOK_CONSTS),
        Lib::Dequant,
    ],
};

const EMBED_WG: u32 = 64;

/// Most tokens a GPU multiplies with the matrix-vector kernel (one workgroup row per token)
/// rather than the tiled product: a batched decode step's few rows leave the tiled kernel a
/// handful of workgroups (9 for a 576-row matrix at 64 rows a tile). On the H200 (SmolLM2 /
/// Qwen2.5 steps, tiled then matrix-vector): 4 rows 10.7 / 15.6 ms then 4.9 / 6.0, 16 rows 16.5
/// / 18.7 then 11.4 / 15.9, but 64 rows 38.7 / 36.9 then 35.9 / 53.5, where reading Qwen's
/// weights once per token costs more than the tiled kernel's idle lanes.
pub const MATVEC_TOKENS_ON_GPU: u32 = 16;

/// The same on a CPU adapter, where the tiled kernel costs a whole tile of tokens however few
/// there are: on lavapipe a batched step of 2 SmolLM2 rows took 5.7 s, 14 single steps' time.
/// The matrix-vector kernel there takes 4 tokens per workgroup and decodes each weight once
/// for them: 2 / 4 / 16 rows give 3.3 / 4.3 / 4.6 tok/s in all, one row 2.5 (docs/perf.md,
/// session 17).
pub const MATVEC_TOKENS_ON_CPU: u32 = 16;

/// Whether `matmul` multiplies `tokens` tokens with the matrix-vector kernel, one product per
/// token (so the fusions of `matvec_tokens` apply to them too).
pub fn per_token_products(gpu: &crate::gpu::Gpu, tokens: u32) -> bool {
    let most = match gpu.caps.cpu_work_split {
        true => MATVEC_TOKENS_ON_CPU,
        false => gpu.caps.per_token_products.unwrap_or(MATVEC_TOKENS_ON_GPU),
    };
    tokens <= most
}

/// Bytes from which a GPU multiplies `STREAMED_TOKENS` tokens or more with the tiled (or
/// cooperative-matrix) product even where `per_token_products` says otherwise. The
/// matrix-vector kernel reads and decodes the weights once per token, and a matrix larger than
/// the cache (the heads: Qwen2.5's 111 MB, Gemma 3's 178 MB, SmolLM2's 30 MB) comes from memory
/// each time: 16 rows of Qwen2.5's head took 1.1 ms against 87 µs for one. The tiled product
/// reads it once but costs ~0.8 ms whatever the tokens, so on the H200 (docs/perf.md, session
/// 22) batched steps of 16 rows gain (Gemma 3 3,980 -> 4,936 tok/s, Qwen2.5 3,283 -> 3,500)
/// and of 8 lose (3,045 -> 2,995, 2,684 -> 2,520).
pub const STREAMED_MATRIX_BYTES: u64 = 16 << 20;
pub const STREAMED_TOKENS: u32 = 12;

/// Whether a GPU's product of `tokens` tokens with `w` had better read the weights once.
fn reads_weights_once(gpu: &crate::gpu::Gpu, w: &QuantMatrix, tokens: u32) -> bool {
    let bytes = u64::from(w.rows) * w.weights.row_bytes;
    let default = [u64::from(STREAMED_TOKENS), STREAMED_MATRIX_BYTES];
    let [most_tokens, most_bytes] = gpu.caps.streamed_products.unwrap_or(default);
    !gpu.caps.cpu_work_split && u64::from(tokens) >= most_tokens && bytes >= most_bytes
}

/// `out[t, n] = sum_k x[t, k] * W[n, k]` for `t < tokens`; `x` is `[tokens, cols]` and `out`
/// `[tokens, rows]`, both f32. Up to `MATVEC_TOKENS_ON_GPU` tokens on a GPU use the
/// matrix-vector kernel (`MATVEC_TOKENS_ON_CPU` on a CPU adapter), but for `reads_weights_once`
/// unless the integer products take them (they decode the weights once for 16 tokens); the rest use the cooperative-matrix one where `uses_coop_matrix`, else the tiled one.
pub fn matmul(
    rec: &mut Recorder,
    w: &QuantMatrix,
    x: &wgpu::Buffer,
    out: &wgpu::Buffer,
    tokens: u32,
) {
    let gpu = rec.gpu();
    let per_token = per_token_products(gpu, tokens)
        && (int8::int8_applies(gpu, w, &Fusion::default(), tokens)
            || !reads_weights_once(gpu, w, tokens));
    if per_token {
        matvec::matvec_tokens(rec, w, x, out, &Fusion::default(), tokens);
    } else {
        matmul_product(rec, w, x, out, tokens);
    }
}

/// Workgroups along x and y for `groups` workgroups, within the per-dimension limit.
pub(super) fn fold_groups(groups: u32, max_per_dim: u32) -> [u32; 2] {
    let x = groups.clamp(1, max_per_dim);
    [x, groups.div_ceil(x)]
}

fn product_params(w: &QuantMatrix, part: &ViewPart, groups_x: u32, tokens: u32) -> ProductParams {
    ProductParams {
        rows: part.rows,
        first_row: part.first_row,
        row_bytes: w.weights.row_bytes as u32,
        blocks_per_row: w.blocks_per_row(),
        groups_x,
        cols: w.cols,
        tokens,
        out_stride: w.rows,
        buffer_row: part.buffer_row,
        k_splits: 1,
        pad: [0; 2],
    }
}

/// `out[t, :] = dequant(table row ids[t]) * scale` for `t < tokens`; `ids` is a u32 buffer
/// (so sampled ids can stay on the GPU), `out` is `[tokens, cols]` f32. An id outside the
/// table leaves its output row unwritten.
pub fn embed(
    rec: &mut Recorder,
    table: &QuantMatrix,
    ids: &wgpu::Buffer,
    out: &wgpu::Buffer,
    tokens: u32,
    scale: f32,
) {
    let max_per_dim = rec.gpu().caps.max_workgroups_per_dim;
    let mut consts = vec![("WG", EMBED_WG)];
    consts.extend(table.quant_consts());
    let pipeline = rec.pipeline(&EMBED, &consts);
    let groups_x = table.units_per_row().div_ceil(EMBED_WG);
    for part in table.parts() {
        let mut first_token = 0;
        while first_token < tokens {
            let chunk = (tokens - first_token).min(max_per_dim);
            let params = EmbedParams {
                rows: part.rows,
                first_row: part.first_row,
                row_bytes: table.weights.row_bytes as u32,
                blocks_per_row: table.blocks_per_row(),
                cols: table.cols,
                scale,
                first_token,
                buffer_row: part.buffer_row,
            };
            rec.dispatch(
                &pipeline,
                &params,
                &[
                    part.buffer.as_entire_binding(),
                    ids.as_entire_binding(),
                    out.as_entire_binding(),
                    part.buffer.as_entire_binding(),
                ],
                [groups_x, chunk, 1],
            );
            first_token += chunk;
        }
    }
}
