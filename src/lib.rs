//! webshard: a GPU runtime for large language models.
//!
//! One data path, native and in the browser:
//! `RangeSource` → `gguf::Header` → tensor plan → `gpu` buffers → `model::Stage`s →
//! logits → `sample` → ids → `tokenizer` → text. See `docs/ARCHITECTURE.md`.

pub mod embed;
pub mod engine;
pub mod front;
pub mod gguf;
pub mod gpu;
pub mod model;
pub mod ops;
pub mod sample;
pub mod shard;
pub mod tokenizer;

#[cfg(target_arch = "wasm32")]
pub mod web;
