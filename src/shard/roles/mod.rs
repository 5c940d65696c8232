//! The roles of the shard chain: donors run a contiguous range of layers on their GPU, the
//! coordinator plans, feeds requests through the chain, samples, and recovers when a donor
//! leaves. Both are generic over `Transport` and run under any executor (native and wasm).
//!
//! Data flow of one step: coordinator → `Forward` (token ids, and the allowed tokens under a
//! constraint) → stage 0 → `Forward` (activations) → … → last stage → `Result` (greedy id or
//! top-k, among the allowed tokens) → coordinator, which samples and sends the next step.
//! Details in `docs/protocol.md`.

mod constrain;
pub mod coordinator;
pub mod donor;
mod feed;
mod host;
mod lanes;
mod link;
mod offload;
pub mod probe;
mod recovery;
pub mod replicas;
mod session;
pub mod stage_bench;
mod step;
pub mod timer;
pub mod verify;

pub use coordinator::{Coordinator, CoordinatorConfig, HopReport};
pub use donor::{Donor, DonorConfig, DonorExit, DonorPhase, DonorStatus};
pub use feed::Feed;
pub use probe::probe_ms_per_layer;
pub use replicas::{ChainCount, ReplicaReport, Replicas};
pub use stage_bench::{time_stage_steps, StageBench, StageStepTimes};
pub use verify::{VerifyConfig, VerifyFlag};

use super::frame::{ErrorCode, FrameError};
use super::plan::PlanError;
use super::transport::{PeerId, TransportError};
use crate::front::RequestError;
use crate::model::ModelError;
use crate::sample::ConstraintError;

#[derive(Debug, thiserror::Error)]
pub enum RoleError {
    #[error(transparent)]
    Transport(#[from] TransportError),
    #[error(transparent)]
    Frame(#[from] FrameError),
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error(transparent)]
    Request(#[from] RequestError),
    #[error(transparent)]
    Constraint(#[from] ConstraintError),
    #[error("model source: {0}")]
    Source(String),
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("peer {peer} reported {code:?}: {message}")]
    Peer {
        peer: PeerId,
        code: ErrorCode,
        message: String,
    },
    #[error("timed out after {seconds:.1} s waiting for {what}")]
    Timeout { what: String, seconds: f64 },
    /// The coordinator's join timeout passed before enough donors were admitted.
    #[error("{joined} of {wanted} donors joined within {seconds} s")]
    TooFewDonors {
        joined: usize,
        wanted: usize,
        seconds: f64,
    },
    #[error("{0}")]
    Invalid(String),
}
