//! The crate's native integration tests, one binary with a module per capability.
//!
//! One binary, not one per file: each test binary links the whole crate and its dependencies,
//! and some 60 of them made linking most of a CI build (docs/ci.md, session 19). `.ci/run_tests.py`
//! still runs each module in a process of its own, so modules keep their own process state.
//! One module alone: `cargo test --release --test suite -- fidelity::`.

// Helpers shared by several test modules.
mod constraint_support;
mod gguf_writer;
mod roles_support;
mod shard_support;
mod support;
mod tokenizer_support;

// One module per tested capability (each was its own binary before).
mod batch_step;
mod big_model;
mod chat_template;
mod constraint;
mod embed_fidelity;
mod embed_packed;
mod engine_constrained;
mod fidelity;
mod fidelity_breadth;
mod gguf_http;
mod gguf_malformed;
mod gguf_models;
mod gguf_reader;
mod gguf_split;
mod gguf_truncation;
mod gpu_core;
mod model_fit;
mod model_split;
mod ops_attention;
mod ops_attention_coop;
mod ops_attention_paged;
mod ops_attention_rows;
mod ops_attention_segments;
mod ops_elementwise;
mod ops_kv_cache;
mod ops_matmul_coop;
mod ops_matvec;
mod ops_matvec_int8;
mod ops_matvec_residual;
mod ops_norm;
mod ops_quant;
mod ops_rope;
mod ops_rope_attention;
mod ops_rope_attention_rows;
mod ops_rope_scaled;
mod ops_row_views;
mod ops_select;
mod ops_short_conv;
mod quant_reference;
mod sampler;
mod shard_chunk;
mod shard_frame;
mod shard_plan;
mod shard_roles;
mod shard_transport;
mod shard_validate;
mod shard_vocab;
mod spec_decode;
mod tokenizer_goldens;
