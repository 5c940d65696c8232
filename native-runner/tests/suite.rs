//! The runner's native integration tests, one binary with a module per capability.
//!
//! One binary, not one per file: each test binary links the whole crate and its dependencies,
//! and some 60 of them made linking most of a CI build (docs/ci.md, session 19). `.ci/run_tests.py`
//! still runs each module in a process of its own, so modules keep their own process state.
//! One module alone: `cargo test --release -p native-runner --test suite -- fleet::`.

// Helpers shared by several test modules.
mod api_support;
mod big_model;
mod common;
mod fleet_support;

// One module per tested capability (each was its own binary before).
mod api_abuse;
mod api_batch;
mod api_clients;
mod api_embeddings;
mod api_fleet;
mod api_tools;
mod cli;
mod commands;
mod constrained;
mod fleet;
mod hostile_signal;
mod info;
mod serve;
mod shard_webrtc;
mod signal_rooms;
mod terminal;
