//! The matrix-matrix products (prefill): the tiled one on the FP32 cores, `wgsl/matmul.wgsl`,
//! and the tile it runs with; and, where the device has them, the one on cooperative matrices
//! (tensor cores), `wgsl/matmul_coop.wgsl`.

use super::{fold_groups, product_params, QuantMatrix, MATMUL, MATMUL_COOP};
use crate::gpu::{Caps, Recorder, Variant};

/// A prefill tile: `rows` × `tokens` outputs per workgroup, `lane` × `lane` per lane (4 or 8,
/// so `rows` × `tokens` / `lane`² lanes); activations are staged `staged_cols` columns at a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MatmulTile {
    pub rows: u32,
    pub tokens: u32,
    pub staged_cols: u32,
    pub lane: u32,
}

/// Columns of weights dequantized per step (`BK` in the kernel).
const STEP_COLS: u32 = 128;

impl MatmulTile {
    /// CPU adapters: few fat lanes, 8 × 8 outputs each, since each workgroup-memory load costs
    /// a loop over the SIMD lanes there (llvmpipe): 8 × 8 halves the loads per product, SmolLM2's
    /// prompt and 16 tokens on lavapipe 21.4 -> 14.7 s with its compiles (docs/ci.md, session 14).
    pub const CPU: MatmulTile = MatmulTile::new([32, 32, 32, 8]);
    /// GPUs: the best of seven tiles on the H200 (docs/perf.md), 43 KiB of workgroup memory.
    pub const GPU: MatmulTile = MatmulTile::new([64, 64, 32, 4]);
    /// GPUs with 32 KiB of workgroup memory (lavapipe, most browsers): the next best.
    pub const GPU_32K: MatmulTile = MatmulTile::new([32, 64, 32, 4]);
    /// Fits WebGPU's minimum 16 KiB of workgroup memory, for devices with no more.
    pub const SMALL: MatmulTile = MatmulTile::new([16, 16, 32, 4]);

    /// From `[rows, tokens, staged_cols, lane]`.
    pub const fn new(numbers: [u32; 4]) -> MatmulTile {
        let [rows, tokens, staged_cols, lane] = numbers;
        MatmulTile {
            rows,
            tokens,
            staged_cols,
            lane,
        }
    }

    pub fn lanes(&self) -> u32 {
        (self.rows / self.lane) * (self.tokens / self.lane)
    }

    /// Why the kernel cannot run this tile, if it cannot.
    pub fn check(&self) -> Result<(), String> {
        if ![4, 8].contains(&self.lane) {
            return Err("outputs per lane must be 4 or 8 each way".into());
        }
        let lane = self.lane;
        if self.rows == 0
            || self.tokens == 0
            || !self.rows.is_multiple_of(lane)
            || !self.tokens.is_multiple_of(lane)
        {
            return Err(format!(
                "rows and tokens must be non-zero multiples of {lane}"
            ));
        }
        if self.lanes() > 256 {
            return Err(format!(
                "{} lanes (rows × tokens / {}); at most 256",
                self.lanes(),
                lane * lane
            ));
        }
        if ![32, 64, 128].contains(&self.staged_cols) {
            return Err("staged columns must be 32, 64 or 128".into());
        }
        Ok(())
    }

    /// Workgroup memory the kernel declares: both tiles, rows padded by a vec4.
    pub fn workgroup_bytes(&self) -> u32 {
        let vec4s = self.rows * (STEP_COLS / 4 + 1) + self.tokens * (self.staged_cols / 4 + 1);
        vec4s * 16
    }

    /// The tile for `caps`: the configured one, else the work split's largest that fits, else
    /// `SMALL`.
    pub fn for_device(caps: &Caps) -> MatmulTile {
        let split: &[MatmulTile] = match caps.cpu_work_split {
            true => &[MatmulTile::CPU],
            false => &[MatmulTile::GPU, MatmulTile::GPU_32K],
        };
        let configured = caps.matmul_tile.map(MatmulTile::new);
        configured
            .iter()
            .chain(split)
            .copied()
            .find(|tile| {
                tile.check().is_ok() && tile.workgroup_bytes() <= caps.max_workgroup_storage
            })
            .unwrap_or(MatmulTile::SMALL)
    }

    fn consts(&self) -> [(&'static str, u32); 5] {
        [
            ("TR", self.rows),
            ("TT", self.tokens),
            ("WG", self.lanes()),
            ("XK", self.staged_cols),
            ("LANE", self.lane),
        ]
    }
}

/// Rows and tokens of the cooperative-matrix kernel's tile (`TR`, `TT` there).
const COOP_TILE: u32 = 64;

/// Whether prefill products in `variant` on this device run on cooperative matrices. A
/// configured tile (`runner bench --matmul-tile`) measures the tiled kernel, so it keeps that.
pub fn uses_coop_matrix(caps: &Caps, variant: Variant) -> bool {
    variant.coop_matrix && caps.coop_matrix && caps.matmul_tile.is_none()
}

/// `out = x W^T` for `tokens` tokens: cooperative matrices where `uses_coop_matrix`, else tiles.
pub fn matmul_product(
    rec: &mut Recorder,
    w: &QuantMatrix,
    x: &wgpu::Buffer,
    out: &wgpu::Buffer,
    tokens: u32,
) {
    if uses_coop_matrix(&rec.gpu().caps, rec.variant()) {
        matmul_coop(rec, w, x, out, tokens);
    } else {
        matmul_tiled(rec, w, x, out, tokens);
    }
}

fn matmul_coop(
    rec: &mut Recorder,
    w: &QuantMatrix,
    x: &wgpu::Buffer,
    out: &wgpu::Buffer,
    tokens: u32,
) {
    let pipeline = rec.pipeline(&MATMUL_COOP, &w.quant_consts());
    dispatch_parts(rec, &pipeline, w, [x, out], [COOP_TILE, COOP_TILE], tokens);
}

/// One dispatch per weight part over a grid of `tile` = `[rows, tokens]` tiles.
fn dispatch_parts(
    rec: &mut Recorder,
    pipeline: &wgpu::ComputePipeline,
    w: &QuantMatrix,
    [x, out]: [&wgpu::Buffer; 2],
    [tile_rows, tile_tokens]: [u32; 2],
    tokens: u32,
) {
    let max_per_dim = rec.gpu().caps.max_workgroups_per_dim;
    let token_groups = tokens.div_ceil(tile_tokens);
    assert!(
        token_groups <= max_per_dim,
        "{tokens} tokens exceed one prefill dispatch"
    );
    for part in w.parts() {
        let [groups_x, groups_y] = fold_groups(part.rows.div_ceil(tile_rows), max_per_dim);
        let params = product_params(w, &part, groups_x, tokens);
        rec.dispatch(
            pipeline,
            &params,
            &[
                part.buffer.as_entire_binding(),
                x.as_entire_binding(),
                out.as_entire_binding(),
                part.buffer.as_entire_binding(),
            ],
            [groups_x, groups_y, token_groups],
        );
    }
}

fn matmul_tiled(
    rec: &mut Recorder,
    w: &QuantMatrix,
    x: &wgpu::Buffer,
    out: &wgpu::Buffer,
    tokens: u32,
) {
    let tile = MatmulTile::for_device(&rec.gpu().caps);
    let mut consts = tile.consts().to_vec();
    consts.extend(w.quant_consts());
    let pipeline = rec.pipeline(&MATMUL, &consts);
    dispatch_parts(
        rec,
        &pipeline,
        w,
        [x, out],
        [tile.rows, tile.tokens],
        tokens,
    );
}
