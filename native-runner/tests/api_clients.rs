//! The OpenAI-compatible API through the official clients: the `openai` Python package and
//! the `openai` npm package (both pinned; `.ci/setup.sh` installs them) against
//! `runner serve -m` on SmolLM2. Greedy answers must equal `runner generate --chat --temp 0`.

use crate::api_support;
use crate::common;

use std::path::Path;
use std::process::Command;

use api_support::{greedy_reference, ApiServer, KEY};

const PROMPT: &str = "What is the capital of France?";
/// The scripts' MAX_TOKENS.
const MAX_TOKENS: u32 = 8;
const CTX: u32 = 256;

/// Runs a client script and fails the test with its output unless it exits 0.
fn run_client(program: &str, script: &Path, server: &ApiServer, reference: &str) {
    let output = Command::new(program)
        .arg(script)
        .args([&server.base, KEY, &server.model, reference])
        .output()
        .unwrap_or_else(|err| panic!("run {program}: {err}"));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "{} failed:\n{stdout}\n{stderr}",
        script.display()
    );
    assert!(stdout.contains("all checks passed"), "{stdout}");
}

#[tokio::test(flavor = "multi_thread")]
async fn official_clients_get_the_greedy_answers_and_each_error() {
    let model = common::model_path(common::SMOLLM2);
    let model = model.to_str().unwrap();
    let reference = greedy_reference(model, PROMPT, MAX_TOKENS, CTX).to_string();
    let server = ApiServer::start(model, "smollm2", &["--ctx", &CTX.to_string()]).await;

    let root = common::repo_root();
    let python = root.join("native-runner/tests/openai_client.py");
    run_client("python3", &python, &server, &reference);

    let node_script = root.join("e2e/openai-client.mjs");
    assert!(
        root.join("e2e/node_modules/openai/package.json").is_file(),
        "the openai npm package is missing: run .ci/setup.sh (npm ci in e2e/)"
    );
    run_client("node", &node_script, &server, &reference);
}
