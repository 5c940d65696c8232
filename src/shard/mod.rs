//! The shard chain: plan, protocol frames, transport, roles.
//!
//! Transport-agnostic foundations: `vocab` (ByteVocab, so donors show text without the
//! tokenizer), `frame`/`activations`/`allowed`/`validate` (the protocol, `docs/protocol.md`), `chunk`
//! (16 KiB wire chunks and reassembly), `plan` (layer ranges per donor) and `transport`.
//! `webrtc` implements the transport over WebRTC data channels, with `flow` (credit windows)
//! and `fleet` (the fleet token and its signaling room). `fault` makes a donor wrong on
//! purpose, for tests.

pub mod activations;
pub mod allowed;
pub mod chunk;
pub mod fault;
pub mod fleet;
pub mod flow;
pub mod frame;
pub mod plan;
pub mod replica;
pub mod roles;
pub mod transport;
pub mod validate;
pub mod vocab;
pub mod webrtc;

pub use activations::{f16_round_trip_error, Activations, Encoding, RoundTripError};
pub use allowed::AllowedTokens;
pub use chunk::{slice_frame, ChunkError, Reassembler, ReassemblyLimits};
pub use fleet::{fleet_room, token_matches};
pub use frame::{decode_frame, encode_frame, FrameError, Kind, Message};
pub use plan::{plan, replan, DonorCapacity, FleetChange, ModelSizes, Plan, PlanError, StagePlan};
pub use replica::{chain_rate, plan_chains, plan_replicas, FleetPlan};
pub use transport::{
    InProcessConfig, InProcessNetwork, InProcessTransport, MaybeSync, PeerId, Transport,
    TransportError, TransportEvent,
};
pub use validate::{FrameLimits, FrameValidator, InputKind, ModelShape};
pub use vocab::{ByteVocab, StreamDecoder, VocabError};
pub use webrtc::{WebRtcConfig, WebRtcTransport};
