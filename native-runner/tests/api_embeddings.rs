//! `POST /v1/embeddings` through the official `openai` Python client (pinned; `.ci/setup.sh`
//! installs it) against `runner serve -m` on all-MiniLM-L6-v2: every vector equals
//! `runner embed --normalize` of the same texts, and bad inputs get 400s naming the field.

use crate::api_support;
use crate::common;

use std::process::Command;

use api_support::{ApiServer, KEY, RUNNER};

const MINILM: &str = "all-MiniLM-L6-v2.f16.gguf";
/// openai_embeddings.py's TEXTS.
const TEXTS: [&str; 3] = [
    "A man is playing a guitar.",
    "Someone is playing an instrument.",
    "x",
];

/// `runner embed --normalize --json` of TEXTS, each text's token ids included.
fn reference(model: &str) -> serde_json::Value {
    let output = Command::new(RUNNER)
        .args(["embed", "-m", model, "--normalize", "--json"])
        .args(TEXTS)
        .env("XDG_RUNTIME_DIR", std::env::temp_dir())
        .output()
        .expect("run runner embed");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("embed --json prints JSON")
}

#[tokio::test(flavor = "multi_thread")]
async fn openai_client_embeddings_equal_runner_embed() {
    let model = common::model_path(MINILM);
    let model = model.to_str().unwrap();
    let reference = reference(model).to_string();
    let server = ApiServer::start(model, "minilm", &[]).await;
    let script = common::repo_root().join("native-runner/tests/openai_embeddings.py");
    let output = Command::new("python3")
        .arg(&script)
        .args([&server.base, KEY, &server.model, &reference])
        .output()
        .expect("run python3");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("all checks passed"), "{stdout}");
}
