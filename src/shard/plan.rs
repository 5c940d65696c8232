//! Splitting a model's layers over the fleet: contiguous ranges in donor order, every layer
//! exactly once, within each donor's memory, minimizing the slowest stage.
//!
//! Decode is bound by reading weights, so a stage's time is estimated as the donor's
//! measured ms-per-layer scaled by the bytes it reads (its layers, plus the output head on
//! the last stage) over the mean layer's bytes. The slowest stage sets the pipeline's
//! throughput once requests are micro-batched through it; among equally fast plans the one
//! with fewer stages (fewer hops) wins.

use std::ops::Range;

use crate::gguf::Header;

use super::transport::PeerId;

pub const MAX_LAYERS: usize = 1024;
pub const MAX_DONORS: usize = 256;

/// What a model needs in memory, per part.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelSizes {
    /// Weight bytes of each layer (`blk.N.*`).
    pub layer_bytes: Vec<u64>,
    /// `token_embd.weight`.
    pub embedding_bytes: u64,
    /// `output_norm.weight` plus the output matrix (the embedding matrix when tied).
    pub head_bytes: u64,
    /// Bytes counted in both `embedding_bytes` and `head_bytes` (a tied embedding matrix):
    /// a stage holding both keeps them once.
    pub shared_edge_bytes: u64,
    /// Memory each layer needs beyond its weights (KV cache at the planned context, scratch).
    pub runtime_bytes_per_layer: u64,
}

/// A donor as the planner sees it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DonorCapacity {
    pub id: PeerId,
    pub usable_bytes: u64,
    pub ms_per_layer: f32,
}

/// One donor's part of a plan.
#[derive(Clone, Debug, PartialEq)]
pub struct StagePlan {
    pub stage_id: u16,
    pub donor: PeerId,
    pub layers: Range<u32>,
    pub embedding: bool,
    pub head: bool,
    /// Memory the stage needs (weights and runtime).
    pub bytes: u64,
    /// Estimated milliseconds per decode token.
    pub est_ms: f64,
}

/// Stages in chain order. Donors that got no layers are not in `stages` but stay in
/// `donors`, the order later re-plans keep.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    pub stages: Vec<StagePlan>,
    pub donors: Vec<DonorCapacity>,
}

impl Plan {
    /// The slowest stage's estimate: the chain's time per token at full micro-batching.
    pub fn max_stage_ms(&self) -> f64 {
        self.stages.iter().map(|s| s.est_ms).fold(0.0, f64::max)
    }
}

/// A change in the fleet.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum FleetChange {
    /// A donor joins at the end of the order.
    Join(DonorCapacity),
    Leave(PeerId),
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PlanError {
    #[error("model has no layers")]
    NoLayers,
    #[error("model has {count} layers, more than the planner's limit of {MAX_LAYERS}")]
    TooManyLayers { count: usize },
    #[error("no donors")]
    NoDonors,
    #[error("{count} donors, more than the planner's limit of {MAX_DONORS}")]
    TooManyDonors { count: usize },
    #[error("donor {donor} appears twice")]
    DuplicateDonor { donor: PeerId },
    #[error("donor {donor} is not in the plan")]
    UnknownDonor { donor: PeerId },
    #[error("donor {donor} reports ms_per_layer {value}; it must be finite and positive")]
    BadProbe { donor: PeerId, value: f32 },
    #[error("layer {layer} needs {bytes} bytes but the largest donor offers {largest}")]
    LayerTooLarge {
        layer: u32,
        bytes: u64,
        largest: u64,
    },
    #[error("the fleet cannot hold the model: it needs {needed} bytes in contiguous stages, the donors offer {available} in all")]
    CannotHold { needed: u64, available: u64 },
    #[error("cannot make {chains} chain(s) of {donors} donor(s): each chain needs a donor")]
    ChainCount { chains: usize, donors: usize },
    #[error("model header: {0}")]
    Header(String),
}

impl PlanError {
    /// The donors cannot hold the model, though more donors could.
    pub fn is_shortage(&self) -> bool {
        matches!(
            self,
            PlanError::CannotHold { .. } | PlanError::LayerTooLarge { .. } | PlanError::NoDonors
        )
    }
}

impl ModelSizes {
    /// Sizes from a GGUF header: `{arch}.block_count` layers, tensors grouped by name.
    /// Tensors that belong to no stage part (such as `rope_freqs.weight`) are not counted.
    pub fn from_header(header: &Header) -> Result<ModelSizes, PlanError> {
        let header_error = |e: crate::gguf::GgufError| PlanError::Header(e.to_string());
        let arch = header.architecture().map_err(header_error)?;
        let key = format!("{arch}.block_count");
        let n_layers = header.metadata.get_u32(&key).map_err(header_error)? as usize;
        if n_layers > MAX_LAYERS {
            return Err(PlanError::TooManyLayers { count: n_layers });
        }
        let mut sizes = ModelSizes {
            layer_bytes: vec![0; n_layers],
            embedding_bytes: 0,
            head_bytes: 0,
            shared_edge_bytes: 0,
            runtime_bytes_per_layer: 0,
        };
        for tensor in &header.tensors {
            sizes.add_tensor(&tensor.name, tensor.bytes)?;
        }
        if header.tensor("output.weight").is_none() {
            sizes.head_bytes += sizes.embedding_bytes;
            sizes.shared_edge_bytes = sizes.embedding_bytes;
        }
        if let Some(layer) = sizes.layer_bytes.iter().position(|&b| b == 0) {
            return Err(PlanError::Header(format!("layer {layer} has no tensors")));
        }
        Ok(sizes)
    }

    fn add_tensor(&mut self, name: &str, bytes: u64) -> Result<(), PlanError> {
        if let Some(rest) = name.strip_prefix("blk.") {
            let layer = rest
                .split('.')
                .next()
                .and_then(|n| n.parse::<usize>().ok())
                .filter(|&n| n < self.layer_bytes.len())
                .ok_or_else(|| {
                    let n_layers = self.layer_bytes.len();
                    PlanError::Header(format!("tensor {name} is not in layers 0..{n_layers}"))
                })?;
            self.layer_bytes[layer] += bytes;
        }
        match name {
            "token_embd.weight" => self.embedding_bytes += bytes,
            "output_norm.weight" | "output.weight" => self.head_bytes += bytes,
            _ => {}
        }
        Ok(())
    }

    fn mean_layer_bytes(&self) -> f64 {
        let total: u64 = self.layer_bytes.iter().sum();
        (total as f64 / self.layer_bytes.len().max(1) as f64).max(1.0)
    }
}

/// Prefix sums so a range's bytes cost O(1).
struct Costs<'a> {
    model: &'a ModelSizes,
    prefix: Vec<u64>,
    mean_layer: f64,
}

impl Costs<'_> {
    fn new(model: &ModelSizes) -> Costs<'_> {
        let mut prefix = Vec::with_capacity(model.layer_bytes.len() + 1);
        prefix.push(0u64);
        for &bytes in &model.layer_bytes {
            prefix.push(prefix.last().copied().unwrap_or(0).saturating_add(bytes));
        }
        Costs {
            model,
            prefix,
            mean_layer: model.mean_layer_bytes(),
        }
    }

    fn n_layers(&self) -> usize {
        self.model.layer_bytes.len()
    }

    fn weight_bytes(&self, layers: Range<usize>) -> u64 {
        self.prefix[layers.end] - self.prefix[layers.start]
    }

    /// Memory a stage over `layers` needs, with the edge tensors its position implies.
    fn memory(&self, layers: Range<usize>) -> u64 {
        let (embedding, head) = (layers.start == 0, layers.end == self.n_layers());
        let runtime = self.model.runtime_bytes_per_layer * layers.len() as u64;
        let mut bytes = self.weight_bytes(layers).saturating_add(runtime);
        if embedding {
            bytes = bytes.saturating_add(self.model.embedding_bytes);
        }
        if head {
            bytes = bytes.saturating_add(self.model.head_bytes);
        }
        if embedding && head {
            bytes = bytes.saturating_sub(self.model.shared_edge_bytes);
        }
        bytes
    }

    fn time_ms(&self, donor: &DonorCapacity, layers: Range<usize>) -> f64 {
        let head = layers.end == self.n_layers();
        let mut read = self.weight_bytes(layers) as f64;
        if head {
            read += self.model.head_bytes as f64;
        }
        donor.ms_per_layer as f64 * read / self.mean_layer
    }
}

/// The best value found for covering the first `j` layers with the first `i` donors.
#[derive(Clone, Copy)]
struct Cell {
    value: f64,
    /// Layers covered before donor `i - 1`'s stage; equal to `j` when that donor was skipped.
    from: usize,
}

type Table = Vec<Vec<Option<Cell>>>;

/// Dynamic programme over (donors used, layers covered). `extend(value, stage_ms)` is the
/// value after adding a stage, or `None` when the stage is not allowed; lower is better.
fn solve(
    costs: &Costs<'_>,
    donors: &[DonorCapacity],
    extend: impl Fn(f64, f64) -> Option<f64>,
) -> Table {
    let n = costs.n_layers();
    let mut table: Table = vec![vec![None; n + 1]; donors.len() + 1];
    table[0][0] = Some(Cell {
        value: 0.0,
        from: 0,
    });
    for (i, donor) in donors.iter().enumerate() {
        for j in 0..=n {
            let Some(here) = table[i][j] else { continue };
            let next = &mut table[i + 1];
            relax(&mut next[j], here.value, j);
            for (k, cell) in next.iter_mut().enumerate().skip(j + 1) {
                // Weights only grow with k; the edge tensors are checked exactly below.
                if costs.weight_bytes(j..k) > donor.usable_bytes {
                    break;
                }
                if costs.memory(j..k) > donor.usable_bytes {
                    continue;
                }
                if let Some(value) = extend(here.value, costs.time_ms(donor, j..k)) {
                    relax(cell, value, j);
                }
            }
        }
    }
    table
}

fn relax(cell: &mut Option<Cell>, value: f64, from: usize) {
    if cell.is_none_or(|current| value < current.value) {
        *cell = Some(Cell { value, from });
    }
}

/// Plans `model` over `donors`, in that order: first the smallest possible slowest stage,
/// then, among plans that achieve it, the fewest stages.
pub fn plan(model: &ModelSizes, donors: &[DonorCapacity]) -> Result<Plan, PlanError> {
    check_inputs(model, donors)?;
    let costs = Costs::new(model);
    let n = costs.n_layers();
    let fastest = solve(&costs, donors, |max_ms, ms| Some(max_ms.max(ms)));
    let Some(best) = fastest[donors.len()][n] else {
        return Err(infeasible(&costs, donors));
    };
    // Stage times are computed the same way in both passes, so the optimum passes `<=`.
    let fewest = solve(&costs, donors, |stages, ms| {
        (ms <= best.value).then_some(stages + 1.0)
    });
    Ok(Plan {
        stages: stages_from_table(&fewest, &costs, donors),
        donors: donors.to_vec(),
    })
}

fn check_inputs(model: &ModelSizes, donors: &[DonorCapacity]) -> Result<(), PlanError> {
    match model.layer_bytes.len() {
        0 => return Err(PlanError::NoLayers),
        count if count > MAX_LAYERS => return Err(PlanError::TooManyLayers { count }),
        _ => {}
    }
    match donors.len() {
        0 => return Err(PlanError::NoDonors),
        count if count > MAX_DONORS => return Err(PlanError::TooManyDonors { count }),
        _ => {}
    }
    for (index, donor) in donors.iter().enumerate() {
        if !(donor.ms_per_layer.is_finite() && donor.ms_per_layer > 0.0) {
            return Err(PlanError::BadProbe {
                donor: donor.id,
                value: donor.ms_per_layer,
            });
        }
        if donors[..index].iter().any(|d| d.id == donor.id) {
            return Err(PlanError::DuplicateDonor { donor: donor.id });
        }
    }
    Ok(())
}

fn stages_from_table(table: &Table, costs: &Costs<'_>, donors: &[DonorCapacity]) -> Vec<StagePlan> {
    let mut ranges = Vec::new();
    let mut j = costs.n_layers();
    for i in (0..donors.len()).rev() {
        // Every cell on the path back from a filled final cell is filled.
        let Some(cell) = table[i + 1][j] else { break };
        if cell.from < j {
            ranges.push((i, cell.from..j));
        }
        j = cell.from;
    }
    ranges.reverse();
    ranges
        .into_iter()
        .enumerate()
        .map(|(stage_id, (i, layers))| StagePlan {
            stage_id: stage_id as u16,
            donor: donors[i].id,
            embedding: layers.start == 0,
            head: layers.end == costs.n_layers(),
            bytes: costs.memory(layers.clone()),
            est_ms: costs.time_ms(&donors[i], layers.clone()),
            layers: layers.start as u32..layers.end as u32,
        })
        .collect()
}

/// Explains why no plan exists: a layer no donor can hold, or too little memory overall.
fn infeasible(costs: &Costs<'_>, donors: &[DonorCapacity]) -> PlanError {
    let largest = donors.iter().map(|d| d.usable_bytes).max().unwrap_or(0);
    let n = costs.n_layers();
    for layer in 0..n {
        let bytes = costs.memory(layer..layer + 1);
        if bytes > largest {
            return PlanError::LayerTooLarge {
                layer: layer as u32,
                bytes,
                largest,
            };
        }
    }
    PlanError::CannotHold {
        needed: costs.memory(0..n),
        available: donors
            .iter()
            .fold(0u64, |sum, d| sum.saturating_add(d.usable_bytes)),
    }
}

/// Plans again after a donor joins (at the end of the order) or leaves.
pub fn replan(model: &ModelSizes, previous: &Plan, change: FleetChange) -> Result<Plan, PlanError> {
    let mut donors = previous.donors.clone();
    match change {
        FleetChange::Join(donor) => donors.push(donor),
        FleetChange::Leave(id) => {
            let before = donors.len();
            donors.retain(|d| d.id != id);
            if donors.len() == before {
                return Err(PlanError::UnknownDonor { donor: id });
            }
        }
    }
    plan(model, &donors)
}
