//! The OpenAI-compatible API on a fleet: `runner serve -m SmolLM2 --fleet TOKEN --donors 2`
//! with two `runner donor` processes over WebRTC on loopback, driven by the official `openai`
//! Python client. Greedy answers, whole and streamed and two at once, must equal single-device
//! `runner generate --chat --temp 0`, also when log-probabilities are asked for; on one chain,
//! and on two chains (`--replicas 2`) serving one queue.

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
    // Each donor offers too little for the whole model, so both take a stage of one chain.
    let planned = run_script(&[], &["--gpu-mem-mib", "300"]);
    assert!(planned.is_empty(), "one chain by default: {planned:?}");
}

/// `--replicas 2`: each donor holds the whole model, one chain each, and with one request a
/// chain (`--parallel 1`) the script's two requests at once, and its short request during a
/// long one, can only be answered by both chains serving the same queue.
#[test]
fn serve_with_two_chains_answers_from_both() {
    let planned = run_script(&["--replicas", "2", "--parallel", "1"], &[]);
    assert!(
        planned.len() == 1 && planned[0].contains("chains=2"),
        "two chains planned: {planned:?}"
    );
}

/// Serves SmolLM2 on two donor processes with `api` arguments added, runs `openai_fleet.py`
/// against it, and returns the server's lines that say how many chains it planned (several
/// chains only: one chain plans without them).
fn run_script(api: &[&str], donor: &[&str]) -> Vec<String> {
    let _turn = serial();
    let model = common::model_path(common::SMOLLM2);
    let reference = greedy_reference(model.to_str().unwrap(), PROMPT, MAX_TOKENS, CTX);
    let ctx = CTX.to_string();
    let mut args = vec![
        "-m",
        model.to_str().unwrap(),
        "--donors",
        "2",
        "--ctx",
        &ctx,
        "--alias",
        "smollm2",
    ];
    args.extend_from_slice(api);
    let server = Server::start_serving(&common::models_dir(), &args);
    let donors: Vec<Donor> = (0..2)
        .map(|i| server.donor(&format!("donor {i}"), donor))
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
    let log = server._proc.stderr();
    assert!(
        output.status.success() && stdout.contains("all checks passed"),
        "{} failed:\n{stdout}\n{}\nserver:\n{log}\ndonors:\n{}",
        script.display(),
        String::from_utf8_lossy(&output.stderr),
        donor_logs.join("\n---\n")
    );
    let lines = server._proc.stderr.lock().unwrap();
    let planned = lines
        .iter()
        .filter(|(_, line)| line.contains("planned the fleet"));
    planned.map(|(_, line)| line.clone()).collect()
}
