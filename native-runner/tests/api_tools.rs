//! Tool calls through the official `openai` Python client against `runner serve -m` on the
//! Qwen3 twin (Qwen's chat template, which shows tools; SmolLM2's does not; the claim is the
//! API, and the twin costs a fraction of Qwen2.5's time per token on lavapipe): the model calls a
//! function with arguments valid under its schema, the streamed deltas reassemble to the same
//! call, and the client's `tool` message brings back an answer in plain content.

use crate::api_support;
use crate::common;

use std::process::Command;

use api_support::{ApiServer, KEY};

/// Prompt (tools included) and answers fit well within this.
const CTX: &str = "512";

#[tokio::test(flavor = "multi_thread")]
async fn a_tool_call_round_trip_through_the_openai_client() {
    let model = common::model_path(common::TINY_QWEN3);
    let server = ApiServer::start(model.to_str().unwrap(), "tiny-qwen3", &["--ctx", CTX]).await;
    let script = common::repo_root().join("native-runner/tests/openai_tools.py");
    let output = Command::new("python3")
        .arg(&script)
        .args([&server.base, KEY, &server.model])
        .output()
        .expect("run python3");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "{} failed:\n{stdout}\n{stderr}",
        script.display()
    );
    assert!(stdout.contains("all checks passed"), "{stdout}");
}
