//! The matrix-matrix products (prefill): the tiled one on the FP32 cores, `wgsl/matmul.wgsl`,
//! and the tile it runs with; and, where the device has them, the one on cooperative matrices
//! (tensor cores), `wgsl/matmul_coop.wgsl`.

use super::{fold_groups, product_params, ProductParams, QuantMatrix, MATMUL, MATMUL_COOP};
use crate::gpu::{Caps, Recorder, Variant};
use crate::ops::elementwise;

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

/// Grids of fewer cooperative-matrix workgroups than this split K: a GPU of ~130 SMs leaves
/// most of them idle. On an H100 (docs/perf.md, session 30) Qwen2.5's k and v products at 512
/// tokens (2 x 8 workgroups) went 39.7 -> 16.6 µs split 7 ways, but its 14 x 8 grids (q, o and
/// down) went 93 -> 100 µs split 3 ways: a grid of a workgroup an SM is no longer limited by
/// each one walking all of K alone.
const COOP_SMALL_GRID: u32 = 64;
/// The grid a split aims for.
const COOP_GRID_TARGET: u32 = 128;
/// Most workgroups along K: each split costs its slice of outputs written and read again.
const COOP_MOST_K_SPLITS: u32 = 8;

/// Workgroups along K for a cooperative-matrix product of `tokens` tokens with a matrix of
/// `[rows, cols]`: for a grid under `COOP_SMALL_GRID`, enough to bring it to
/// `COOP_GRID_TARGET`, at most one per K step and `COOP_MOST_K_SPLITS` (or the configured
/// most), and no more than one binding's worth of slices.
pub fn coop_k_splits(caps: &Caps, [rows, cols]: [u32; 2], tokens: u32) -> u32 {
    let grid = (rows.div_ceil(COOP_TILE) * tokens.div_ceil(COOP_TILE)).max(1);
    if grid >= COOP_SMALL_GRID {
        return 1;
    }
    let most = caps.coop_k_splits.unwrap_or(COOP_MOST_K_SPLITS);
    let slice_bytes = u64::from(tokens) * u64::from(rows) * 4;
    let fitting = (caps.max_binding / slice_bytes.max(1)).min(u64::from(u32::MAX)) as u32;
    COOP_GRID_TARGET
        .div_ceil(grid)
        .min(cols.div_ceil(STEP_COLS))
        .min(most)
        .min(fitting)
        .max(1)
}

fn matmul_coop(
    rec: &mut Recorder,
    w: &QuantMatrix,
    x: &wgpu::Buffer,
    out: &wgpu::Buffer,
    tokens: u32,
) {
    let pipeline = rec.pipeline(&MATMUL_COOP, &w.quant_consts());
    let splits = coop_k_splits(&rec.gpu().caps, [w.rows, w.cols], tokens);
    let outputs = tokens * w.rows;
    // Split products write their slices into scratch, which is then summed into `out`.
    let target = match splits {
        1 => out.clone(),
        _ => {
            let bytes = u64::from(splits) * u64::from(outputs) * 4;
            rec.gpu().kept_storage("product K slices", bytes)
        }
    };
    let tile = [COOP_TILE, COOP_TILE, splits];
    dispatch_parts(rec, &pipeline, w, [x, &target], tile, tokens);
    if splits > 1 {
        elementwise::sum_slices(rec, &target, splits, out, outputs);
    }
}

/// One dispatch per weight part over a grid of `tile` = `[rows, tokens, k_splits]` tiles.
fn dispatch_parts(
    rec: &mut Recorder,
    pipeline: &wgpu::ComputePipeline,
    w: &QuantMatrix,
    [x, out]: [&wgpu::Buffer; 2],
    [tile_rows, tile_tokens, k_splits]: [u32; 3],
    tokens: u32,
) {
    let max_per_dim = rec.gpu().caps.max_workgroups_per_dim;
    let token_groups = tokens.div_ceil(tile_tokens) * k_splits;
    assert!(
        token_groups <= max_per_dim,
        "{tokens} tokens exceed one prefill dispatch"
    );
    for part in w.parts() {
        let [groups_x, groups_y] = fold_groups(part.rows.div_ceil(tile_rows), max_per_dim);
        let params = ProductParams {
            k_splits,
            ..product_params(w, &part, groups_x, tokens)
        };
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
        [tile.rows, tile.tokens, 1],
        tokens,
    );
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests {
    use super::super::QuantType;
    use super::*;
    use crate::gpu::specialised_source;
    use wgpu::naga;

    /// No CI adapter has cooperative matrices, so naga's validation is what checks there that
    /// the kernel compiles for every type (its products are checked on a device that has
    /// them: `ops_matmul_coop`).
    #[test]
    fn the_cooperative_kernel_validates_for_every_type() {
        let variant = Variant {
            f16: true,
            subgroups: true,
            coop_matrix: true,
        };
        let validator_flags = naga::valid::ValidationFlags::all();
        for quant in QuantType::ALL {
            let text = specialised_source(&MATMUL_COOP, variant, &quant.kernel_consts(), false);
            let what = format!("matmul_coop {quant:?}");
            let module = naga::front::wgsl::parse_str(&text)
                .unwrap_or_else(|e| panic!("{what}: {}", e.emit_to_string(&text)));
            naga::valid::Validator::new(validator_flags, naga::valid::Capabilities::all())
                .validate(&module)
                .unwrap_or_else(|e| panic!("{what}: {}", e.emit_to_string(&text)));
        }
    }
}
