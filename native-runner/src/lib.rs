//! The native side of webshard: the pieces behind the `runner` commands, kept in a library so
//! integration tests and later commands (shard donors, `/signal`) can reuse them.

pub mod api;
pub mod bench;
pub mod bench_batch;
pub mod bench_embed;
pub mod bench_mask;
pub mod bench_spec;
pub mod bench_stage;
pub mod catalog;
pub mod chat;
pub mod constraint_args;
pub mod embed;
pub mod fleet;
pub mod generate;
pub mod info;
pub mod memory;
pub mod model_args;
pub mod profile;
pub mod progress;
pub mod runtime_dir;
pub mod sampling_args;
pub mod score;
pub mod serve;
pub mod signal;
pub mod spec_args;
