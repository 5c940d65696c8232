//! Helpers shared by the integration tests: where the real models are, and a running server.

#![allow(dead_code)] // each test binary uses a different subset

use std::path::PathBuf;

use native_runner::serve::{ServeOptions, Server};

pub const SMOLLM2: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
pub const QWEN: &str = "qwen2.5-coder-0.5b-instruct-awq.Q4_K_M.gguf";
pub const GEMMA: &str = "gemma-3-270m-q4_k_m.gguf";
/// Issue 13's Qwen3 twin (`.ci/build_tiny_model.sh`): seeded random weights, Qwen's tokenizer
/// and chat template, a few times cheaper per token than SmolLM2 on lavapipe.
pub const TINY_QWEN3: &str = "tiny-qwen3.F16.gguf";

/// The repository root (the root crate's manifest directory).
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("native-runner lives inside the repository")
        .to_path_buf()
}

/// `WEBSHARD_MODELS`, else `<repo>/models`.
pub fn models_dir() -> PathBuf {
    std::env::var_os("WEBSHARD_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("models"))
}

/// The path of a real model; panics (the test fails) when it is missing.
pub fn model_path(file: &str) -> PathBuf {
    let path = models_dir().join(file);
    assert!(
        path.is_file(),
        "model {} is missing: run `python3 .ci/fetch_models.py`",
        path.display()
    );
    path
}

/// Starts an in-process server on a free port and returns its base URL (`http://.../`).
pub async fn start_server(opts: ServeOptions) -> String {
    let server = Server::bind(&opts).await.expect("bind a free port");
    let base = server.base_url();
    tokio::spawn(server.run());
    base
}
