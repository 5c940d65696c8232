//! The model commands end to end, through the built `runner` binary on the real models:
//! generate (plain and chat), tokenize, score, bench, chat, and their errors.

use crate::common;

use std::io::Write;
use std::process::{Command, Output, Stdio};

use serde_json::Value;

const RUNNER: &str = env!("CARGO_BIN_EXE_runner");

fn runner(args: &[&str]) -> Output {
    Command::new(RUNNER)
        .args(args)
        .env("XDG_RUNTIME_DIR", std::env::temp_dir())
        .output()
        .expect("run the runner")
}

fn json_stdout(output: &Output) -> Value {
    assert!(
        output.status.success(),
        "runner failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

fn goldens(model: &str) -> Value {
    let dir = std::env::var_os("WEBSHARD_GOLDENS")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| common::repo_root().join("../shared/goldens"));
    let path = dir.join(format!("{model}.generate.json"));
    serde_json::from_str(&std::fs::read_to_string(&path).expect("goldens")).expect("json")
}

fn ids(value: &Value) -> Vec<u64> {
    value
        .as_array()
        .expect("array")
        .iter()
        .map(|v| v.as_u64().expect("id"))
        .collect()
}

/// The golden step ids up to (not including) the first step whose margin is 0.5 or less.
fn trusted_ids(record: &Value, limit: usize) -> Vec<u64> {
    record["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .take(limit)
        .take_while(|s| s["top5"][0][1].as_f64().unwrap() - s["top5"][1][1].as_f64().unwrap() > 0.5)
        .map(|s| s["id"].as_u64().unwrap())
        .collect()
}

fn model(file: &str) -> String {
    common::model_path(file).display().to_string()
}

#[test]
fn generate_greedy_matches_the_goldens() {
    let record = &goldens("smollm2-135m-instruct-q4_1")["records"][0];
    let prompt = record["prompt"].as_str().unwrap();
    let out = json_stdout(&runner(&[
        "generate",
        "-m",
        &model(common::SMOLLM2),
        "-p",
        prompt,
        "-n",
        "8",
        "--temp",
        "0",
        "--json",
        "--quiet",
    ]));
    assert_eq!(ids(&out["prompt_ids"]), ids(&record["prompt_ids"]));
    let trusted = trusted_ids(record, 8);
    assert!(!trusted.is_empty());
    assert_eq!(&ids(&out["ids"])[..trusted.len()], &trusted[..]);
    assert!(!out["text"].as_str().unwrap().is_empty());
}

#[test]
fn generate_chat_applies_the_template_on_gemma() {
    let record = &goldens("gemma-3-270m-q4_k_m")["records"][3];
    let user = record["messages"][0]["content"].as_str().unwrap();
    let out = json_stdout(&runner(&[
        "generate",
        "-m",
        &model(common::GEMMA),
        "--chat",
        "-p",
        user,
        "-n",
        "6",
        "--temp",
        "0",
        "--json",
        "--quiet",
    ]));
    assert_eq!(ids(&out["prompt_ids"]), ids(&record["prompt_ids"]));
    let trusted = trusted_ids(record, 6);
    assert_eq!(&ids(&out["ids"])[..trusted.len()], &trusted[..]);
}

#[test]
fn streaming_text_goes_to_stdout_and_timings_to_stderr() {
    let output = runner(&[
        "generate",
        "-m",
        &model(common::SMOLLM2),
        "-p",
        "The capital of France is",
        "-n",
        "6",
        "--temp",
        "0",
        "--quiet",
    ]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stdout.contains("Paris"), "stdout: {stdout}");
    assert!(
        stderr.contains("decode") && stderr.contains("tok/s"),
        "stderr: {stderr}"
    );
}

#[test]
fn sampling_is_reproducible_by_seed() {
    let run = |seed: &str| {
        json_stdout(&runner(&[
            "generate",
            "-m",
            &model(common::SMOLLM2),
            "-p",
            "Once upon a time",
            "-n",
            "12",
            "--temp",
            "1.0",
            "--seed",
            seed,
            "--json",
            "--quiet",
        ]))["ids"]
            .clone()
    };
    assert_eq!(run("7"), run("7"));
}

#[test]
fn tokenize_follows_both_conventions() {
    let model = model(common::SMOLLM2);
    let plain = json_stdout(&runner(&[
        "tokenize",
        "-m",
        &model,
        "--json",
        "Hello world",
    ]));
    assert_eq!(ids(&plain["ids"]), vec![19556, 905]);
    let record = &goldens("smollm2-135m-instruct-q4_1")["records"][3];
    let prompt = record["prompt"].as_str().unwrap();
    let special = json_stdout(&runner(&[
        "tokenize",
        "-m",
        &model,
        "--parse-special",
        "--json",
        prompt,
    ]));
    assert_eq!(ids(&special["ids"]), ids(&record["prompt_ids"]));
    let literal = json_stdout(&runner(&["tokenize", "-m", &model, "--json", prompt]));
    assert!(ids(&literal["ids"]).len() > ids(&record["prompt_ids"]).len());
}

#[test]
fn score_gives_teacher_forced_top_k_per_position() {
    let record = &goldens("qwen2.5-coder-0.5b-instruct-q4_k_m")["records"][1];
    let mut sequence = ids(&record["prompt_ids"]);
    let steps = record["steps"].as_array().unwrap();
    sequence.extend(steps.iter().take(4).map(|s| s["id"].as_u64().unwrap()));
    let list: Vec<String> = sequence.iter().map(u64::to_string).collect();
    let out = json_stdout(&runner(&[
        "score",
        "-m",
        &model(common::QWEN),
        "--ids",
        &list.join(","),
        "--top",
        "3",
        "--json",
        "--quiet",
    ]));
    let positions = out["positions"].as_array().unwrap();
    assert_eq!(positions.len(), sequence.len());
    let prompt_len = ids(&record["prompt_ids"]).len();
    for (i, step) in steps.iter().take(4).enumerate() {
        let top = &positions[prompt_len - 1 + i]["top"];
        assert_eq!(top.as_array().unwrap().len(), 3);
        let margin = step["top5"][0][1].as_f64().unwrap() - step["top5"][1][1].as_f64().unwrap();
        if margin > 0.5 {
            assert_eq!(top[0][0], step["top5"][0][0], "position {i}");
        }
        let ours = top[0][1].as_f64().unwrap();
        let golden = step["top5"][0][1].as_f64().unwrap();
        assert!(
            (ours - golden).abs() < 2.0 || margin <= 0.5,
            "logit {ours} vs {golden}"
        );
    }
}

#[test]
fn bench_reports_rates_load_and_memory() {
    let out = json_stdout(&runner(&[
        "bench",
        "-m",
        &model(common::SMOLLM2),
        "-p",
        "16",
        "-n",
        "4",
        "-r",
        "2",
        "--json",
        "--quiet",
    ]));
    let tests = out["tests"].as_array().unwrap();
    let names: Vec<&str> = tests.iter().map(|t| t["test"].as_str().unwrap()).collect();
    assert_eq!(names, ["pp16", "tg4"]);
    assert!(tests.iter().all(|t| t["tok_s"].as_f64().unwrap() > 0.0));
    assert!(out["load_bytes"].as_u64().unwrap() > 90_000_000);
    // Streaming keeps the host heap far below the 98 MB model.
    let heap = out["peak_heap_bytes_during_load"].as_u64().unwrap();
    assert!(heap < 64 << 20, "peak heap during load {heap}");
}

#[test]
fn bench_profile_accounts_for_a_decode_token() {
    let out = json_stdout(&runner(&[
        "bench",
        "-m",
        &model(common::SMOLLM2),
        "-p",
        "0",
        "-n",
        "4",
        "-r",
        "1",
        "--profile",
        "--json",
        "--quiet",
    ]));
    let profile = &out["profile"];
    let per_token = |key: &str| profile[key].as_f64().unwrap();
    // 30 layers of fused decode: at least one dispatch per layer, far fewer than 20.
    let dispatches = per_token("dispatches_per_token");
    assert!(
        (30.0..600.0).contains(&dispatches),
        "{dispatches} dispatches"
    );
    // One submit per token (the decoder's steps) but for the first, which finds the GPU idle
    // and goes in parts of 64 dispatches; and one host sync per token read back.
    let first_step_parts = (dispatches / 64.0).ceil();
    let submits = (3.0 + first_step_parts) / 4.0;
    assert!(
        (per_token("submits_per_token") - submits).abs() < 0.3,
        "{profile}"
    );
    assert!(
        (per_token("syncs_per_token") - 1.0).abs() < 0.3,
        "{profile}"
    );
    assert!(per_token("host_us_per_token") > 0.0);
    let floor = &profile["dispatch_floor_us"];
    assert!(floor["dependent"].as_f64().unwrap() > 0.0);
    // lavapipe has timestamp queries: every kernel family of a decode step is timed, and the
    // timed dispatches add up to the counted ones.
    let kernels = profile["kernels"].as_array().unwrap();
    let families: Vec<&str> = kernels
        .iter()
        .map(|k| k["kernel"].as_str().unwrap())
        .collect();
    for family in ["embed", "rope_store", "argmax_final"] {
        assert!(
            families.contains(&family),
            "{family} missing from {families:?}"
        );
    }
    let timed: f64 = kernels
        .iter()
        .map(|k| k["dispatches_per_token"].as_f64().unwrap())
        .sum();
    assert!(
        (timed - dispatches).abs() < 1.0,
        "timed {timed} vs counted {dispatches}"
    );
}

#[test]
fn chat_answers_each_turn() {
    let mut child = Command::new(RUNNER)
        .args([
            "chat",
            "-m",
            &model(common::SMOLLM2),
            "-n",
            "8",
            "--temp",
            "0",
            "--quiet",
        ])
        .env("XDG_RUNTIME_DIR", std::env::temp_dir())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn chat");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"What is 12 times 7?\nAnd times 8?\n\n")
        .unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(
        stdout.lines().filter(|l| !l.trim().is_empty()).count(),
        2,
        "two replies: {stdout}"
    );
}

#[test]
fn bad_inputs_fail_with_one_line() {
    let missing = runner(&["generate", "-m", "/nonexistent/model.gguf", "-p", "hi"]);
    let not_gguf = runner(&["score", "-m", file!(), "--ids", "1,2"]);
    let bad_id = runner(&[
        "score",
        "-m",
        &model(common::SMOLLM2),
        "--ids",
        "1,99999999",
        "--quiet",
    ]);
    for output in [missing, not_gguf, bad_id] {
        assert!(!output.status.success());
        let stderr = String::from_utf8_lossy(&output.stderr);
        let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error:")).collect();
        assert_eq!(errors.len(), 1, "stderr: {stderr}");
    }
}
