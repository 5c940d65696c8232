//! `runner serve -m` as a child process on a free port, for the API tests.

#![allow(dead_code)] // each test binary uses a different subset

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub const RUNNER: &str = env!("CARGO_BIN_EXE_runner");
pub const KEY: &str = "test-key-0123456789";
/// How long loading SmolLM2 on a software adapter may take.
const READY_WITHIN: Duration = Duration::from_secs(300);

/// A running `runner serve -m`; killed when dropped.
pub struct ApiServer {
    child: Child,
    /// `http://127.0.0.1:PORT/`.
    pub base: String,
    pub model: String,
}

impl ApiServer {
    /// Serves `model_path` (named `model`) with a small context and `extra` flags; returns once
    /// `/health` answers 200.
    pub async fn start(model_path: &str, model: &str, extra: &[&str]) -> ApiServer {
        let root = crate::common::repo_root();
        let mut child = Command::new(RUNNER)
            .args(["serve", "--port", "0", "--root"])
            .arg(&root)
            .args(["-m", model_path, "--alias", model, "--api-key", KEY])
            .args(extra)
            .env("XDG_RUNTIME_DIR", std::env::temp_dir())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn runner serve");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let base = line
            .trim()
            .strip_prefix("serving ")
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
            .to_string();
        let server = ApiServer {
            child,
            base,
            model: model.to_string(),
        };
        server.wait_ready().await;
        server
    }

    async fn wait_ready(&self) {
        let started = Instant::now();
        let client = reqwest::Client::new();
        let mut saw_loading = false;
        loop {
            let status = client
                .get(format!("{}health", self.base))
                .send()
                .await
                .map(|r| r.status().as_u16());
            match status {
                Ok(200) => break,
                Ok(503) => saw_loading = true,
                other => panic!("/health answered {other:?}"),
            }
            assert!(started.elapsed() < READY_WITHIN, "the model never loaded");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        // Loading a real model takes far longer than the first poll.
        assert!(saw_loading, "/health never answered 503 while loading");
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path.trim_start_matches('/'))
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `runner generate --chat --temp 0 --json`: the greedy reference of a chat prompt.
pub fn greedy_reference(model_path: &str, prompt: &str, n: u32, ctx: u32) -> serde_json::Value {
    let output: Output = Command::new(RUNNER)
        .args([
            "generate", "-m", model_path, "--chat", "--temp", "0", "--json", "--quiet",
        ])
        .args([
            "-n",
            &n.to_string(),
            "--ctx",
            &ctx.to_string(),
            "-p",
            prompt,
        ])
        .env("XDG_RUNTIME_DIR", std::env::temp_dir())
        .output()
        .expect("run runner generate");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("generate --json prints JSON")
}
