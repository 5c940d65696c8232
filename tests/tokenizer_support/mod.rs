//! Shared helpers for tests against the real models and llama.cpp's goldens.
#![allow(dead_code)]

use std::path::PathBuf;

use serde_json::Value;
use webshard::gguf::{read_header, FileSource, Metadata};
use webshard::tokenizer::Tokenizer;

/// A real model file and the stem of its golden files.
pub struct GoldenModel {
    pub file: &'static str,
    pub golden: &'static str,
}

pub fn golden_models() -> Vec<GoldenModel> {
    vec![
        GoldenModel {
            file: "SmolLM2-135M-Instruct.Q4_1.gguf",
            golden: "smollm2-135m-instruct-q4_1",
        },
        GoldenModel {
            file: "qwen2.5-coder-0.5b-instruct-awq.Q4_K_M.gguf",
            golden: "qwen2.5-coder-0.5b-instruct-q4_k_m",
        },
        GoldenModel {
            file: "gemma-3-270m-q4_k_m.gguf",
            golden: "gemma-3-270m-q4_k_m",
        },
    ]
}

fn dir_from_env(var: &str, default: PathBuf) -> PathBuf {
    std::env::var_os(var).map(PathBuf::from).unwrap_or(default)
}

pub fn model_path(model: &GoldenModel) -> PathBuf {
    let dir = dir_from_env(
        "WEBSHARD_MODELS",
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models"),
    );
    let path = dir.join(model.file);
    assert!(
        path.is_file(),
        "model {} is missing (set WEBSHARD_MODELS or link <repo>/models)",
        path.display()
    );
    path
}

pub fn goldens_dir() -> PathBuf {
    let dir = dir_from_env(
        "WEBSHARD_GOLDENS",
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/goldens"),
    );
    assert!(
        dir.is_dir(),
        "goldens folder {} is missing (set WEBSHARD_GOLDENS)",
        dir.display()
    );
    dir
}

pub fn read_metadata(model: &GoldenModel) -> Metadata {
    let source = FileSource::open(model_path(model)).expect("open model");
    pollster::block_on(read_header(&source))
        .expect("parse header")
        .metadata
}

pub fn load_tokenizer(model: &GoldenModel) -> Tokenizer {
    Tokenizer::from_metadata(&read_metadata(model))
        .unwrap_or_else(|e| panic!("{}: tokenizer: {e}", model.golden))
}

fn read_golden(model: &GoldenModel, suffix: &str) -> String {
    let path = goldens_dir().join(format!("{}.{suffix}", model.golden));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

pub fn read_tokenize_lines(model: &GoldenModel) -> Vec<Value> {
    read_golden(model, "tokenize.jsonl")
        .lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| serde_json::from_str(line).expect("tokenize line is JSON"))
        .collect()
}

pub fn read_generate(model: &GoldenModel) -> Vec<Value> {
    let doc: Value =
        serde_json::from_str(&read_golden(model, "generate.json")).expect("generate.json");
    doc["records"].as_array().expect("records").clone()
}

pub fn ids_of(value: &Value) -> Vec<u32> {
    value
        .as_array()
        .expect("id array")
        .iter()
        .map(|id| id.as_u64().expect("id") as u32)
        .collect()
}
