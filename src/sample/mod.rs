//! Sampling: greedy, temperature, top-k, top-p, min-p, repetition penalty, seeded draws;
//! stopping on end-of-generation tokens and stop strings.

pub mod rng;
pub mod sampler;
pub mod stop;

pub use rng::Rng;
pub use sampler::{Sampler, SamplerConfig};
pub use stop::{StopChecker, StopReason, StopStep};
