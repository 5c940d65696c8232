//! Sampling: greedy, temperature, top-k, top-p, min-p, repetition penalty, seeded draws;
//! stopping on end-of-generation tokens and stop strings; constrained decoding (JSON, JSON
//! Schema, regex, Lark) through llguidance.

pub mod constraint;
pub mod lookup;
#[cfg(not(target_arch = "wasm32"))]
#[path = "mask_thread.rs"]
mod mask_ahead;
#[cfg(target_arch = "wasm32")]
#[path = "mask_inline.rs"]
mod mask_ahead;
pub mod rng;
pub mod sampler;
pub mod stop;
pub mod token_view;

pub use constraint::{Constraint, ConstraintError, ConstraintSpec, TokenMask};
pub use lookup::{DraftLength, SpecConfig};
pub use mask_ahead::{MaskAhead, Masked};
pub use rng::Rng;
pub use sampler::{log_sum_exp, Sampler, SamplerConfig};
pub use stop::{StopChecker, StopReason, StopStep};
pub use token_view::TokenView;
