//! Shared by the integration tests that run real models: where models and goldens are, and how
//! to load an engine on a given backend.
#![allow(dead_code)]

pub mod breadth;
pub mod goldens;

use std::path::PathBuf;
use std::sync::Arc;

use webshard::engine::{Engine, EngineOptions};
use webshard::gguf::open_source;
use webshard::gpu::{BackendChoice, Gpu, GpuOptions};

/// The real models, by their `models.toml` names.
pub const SMOLLM2: (&str, &str) = (
    "smollm2-135m-instruct-q4_1",
    "SmolLM2-135M-Instruct.Q4_1.gguf",
);
pub const QWEN25: (&str, &str) = (
    "qwen2.5-coder-0.5b-instruct-q4_k_m",
    "qwen2.5-coder-0.5b-instruct-awq.Q4_K_M.gguf",
);
pub const GEMMA3: (&str, &str) = ("gemma-3-270m-q4_k_m", "gemma-3-270m-q4_k_m.gguf");
/// Small seeded-random models of real families (`.ci/build_tiny_model.sh`); their goldens are
/// in this repository's `tests/goldens/`.
pub const TINY_QWEN3: (&str, &str) = ("tiny-qwen3-f16", "tiny-qwen3.F16.gguf");
pub const TINY_LFM2: (&str, &str) = ("tiny-lfm2-f16", "tiny-lfm2.F16.gguf");

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A real model file; missing models fail the test (run `.ci/fetch_models.py`).
pub fn model_path(file: &str) -> PathBuf {
    let dir = std::env::var("WEBSHARD_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|_| repo_root().join("models"));
    let path = dir.join(file);
    assert!(
        path.is_file(),
        "model {} is missing: run `python3 .ci/fetch_models.py`",
        path.display()
    );
    path
}

/// The llama.cpp goldens (`../shared/goldens` beside the checkout unless overridden).
pub fn goldens_dir() -> PathBuf {
    let dir = std::env::var("WEBSHARD_GOLDENS")
        .map(PathBuf::from)
        .unwrap_or_else(|_| repo_root().join("../shared/goldens"));
    assert!(dir.is_dir(), "goldens missing at {}", dir.display());
    dir
}

/// A model's generation goldens: the repository's own (`tests/goldens/`, for the models it
/// builds) or the shared ones.
pub fn read_goldens(model: &str) -> serde_json::Value {
    let name = format!("{model}.generate.json");
    let local = repo_root().join("tests/goldens").join(&name);
    let path = match local.is_file() {
        true => local,
        false => goldens_dir().join(&name),
    };
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).expect("goldens are JSON")
}

/// Backends the fidelity tests cover (`WEBSHARD_TEST_BACKENDS`, default Vulkan and GL).
pub fn backends() -> Vec<BackendChoice> {
    std::env::var("WEBSHARD_TEST_BACKENDS")
        .unwrap_or_else(|_| "vulkan,gl".into())
        .split(',')
        .map(|name| BackendChoice::parse(name.trim()).expect("known backend name"))
        .collect()
}

/// Whether item `item` (a record, a pooling) is checked on backend `backend` of `backends`
/// this run: each item on one backend, in turn from a start the seed chooses, so that every
/// item is checked every run and, across runs, on every backend (the seed, printed, replays it).
pub fn on_backend(item: usize, backend: usize, backends: usize, seed: u64) -> bool {
    let start = (seed % backends as u64) as usize;
    (item + start) % backends == backend
}

pub async fn load_engine(file: &str, options: GpuOptions) -> Engine {
    load_engine_on(Gpu::new(&options).await.expect("gpu"), file).await
}

/// `file` on `gpu`, whose pipelines may already be compiled.
pub async fn load_engine_on(gpu: Arc<Gpu>, file: &str) -> Engine {
    let path = model_path(file);
    let source = open_source(path.to_str().expect("utf-8 path"))
        .await
        .expect("open model");
    let engine_options = EngineOptions {
        max_context: 1024,
        ..Default::default()
    };
    Engine::load(gpu, source.as_ref(), &engine_options, &mut |_| {})
        .await
        .expect("load model")
}
