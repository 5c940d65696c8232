//! The OpenAI-compatible API on a fleet: `runner serve -m SmolLM2 --fleet TOKEN --donors 2`
//! with two `runner donor` processes over WebRTC on loopback, driven by the official `openai`
//! Python client. Greedy answers, whole and streamed and two at once, must equal single-device
//! `runner generate --chat --temp 0`, also when log-probabilities are asked for.

use crate::api_support::greedy_reference;
use crate::common;
use crate::fleet_support::*;

use std::process::Command;

const PROMPT: &str = "What is the capital of France?";
/// The script's MAX_TOKENS.
const MAX_TOKENS: u32 = 8;
const CTX: u32 = 256;

#[test]
fn serve_with_donors_answers_the_openai_client_with_single_device_text() {
    let _turn = serial();
    let model = common::model_path(common::SMOLLM2);
    let reference = greedy_reference(model.to_str().unwrap(), PROMPT, MAX_TOKENS, CTX);
    let ctx = CTX.to_string();
    let api = [
        "-m",
        model.to_str().unwrap(),
        "--donors",
        "2",
        "--ctx",
        &ctx,
        "--alias",
        "smollm2",
    ];
    let server = Server::start_serving(&common::models_dir(), &api);
    // Each donor offers too little for the whole model, so both take a stage.
    let donors: Vec<Donor> = (0..2)
        .map(|i| server.donor(&format!("donor {i}"), &["--gpu-mem-mib", "300"]))
        .collect();
    let script = common::repo_root().join("native-runner/tests/openai_fleet.py");
    let output = Command::new("python3")
        .arg(&script)
        .args([&server.base, "smollm2", &reference.to_string()])
        .arg(RUN_LIMIT.as_secs().to_string())
        .output()
        .expect("run python3");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let donor_logs: Vec<String> = donors.iter().map(|d| d.0.stderr()).collect();
    assert!(
        output.status.success() && stdout.contains("all checks passed"),
        "{} failed:\n{stdout}\n{}\nserver:\n{}\ndonors:\n{}",
        script.display(),
        String::from_utf8_lossy(&output.stderr),
        server._proc.stderr(),
        donor_logs.join("\n---\n")
    );
}
