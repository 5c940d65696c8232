//! The CLI as a new user meets it, end to end through the built `runner`: argument checks,
//! the context check, seeds, quiet adapter probing, and the shape of each command's output.

use crate::common;

use std::net::TcpListener;
use std::process::{Command, Output};

use serde_json::Value;

const RUNNER: &str = env!("CARGO_BIN_EXE_runner");

fn runner(args: &[&str]) -> Output {
    Command::new(RUNNER)
        .args(args)
        .env("XDG_RUNTIME_DIR", std::env::temp_dir())
        .output()
        .expect("run the runner")
}

fn smollm2() -> String {
    common::model_path(common::SMOLLM2).display().to_string()
}

fn stderr_of(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn stdout_of(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The run failed with a message on stderr that contains every one of `expected`.
fn assert_refused(output: &Output, expected: &[&str]) {
    let stderr = stderr_of(output);
    assert!(!output.status.success(), "accepted; stderr: {stderr}");
    for text in expected {
        assert!(stderr.contains(text), "{stderr:?} lacks {text:?}");
    }
}

/// A generate run on SmolLM2 with `extra` flags after the model and a short prompt.
fn generate(extra: &[&str]) -> Output {
    let model = smollm2();
    let mut args = vec![
        "generate",
        "-m",
        &model,
        "-p",
        "Once upon a time",
        "--quiet",
    ];
    args.extend_from_slice(extra);
    runner(&args)
}

#[test]
fn a_prompt_longer_than_the_context_is_refused_before_prefill() {
    let prompt = "the quick brown fox jumps over the lazy dog ".repeat(40);
    let model = smollm2();
    let started = std::time::Instant::now();
    let output = runner(&[
        "generate", "-m", &model, "-p", &prompt, "--ctx", "128", "-n", "8", "--quiet",
    ]);
    assert_refused(
        &output,
        &["the context holds 128", "raise --ctx or lower -n"],
    );
    let stderr = stderr_of(&output);
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    // The message gives the prompt's length in tokens, counted as generate counts them.
    let tokens: usize = stderr
        .split("the prompt is ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no prompt length in {stderr}"));
    assert!(tokens > 128, "{tokens} tokens");
    // No prefill happened: prefilling 400 tokens on a CPU adapter takes far longer.
    assert!(started.elapsed().as_secs() < 60, "{:?}", started.elapsed());
    // The prompt alone fits, but not with -n more tokens.
    let fits = runner(&[
        "generate", "-m", &model, "-p", "Hi", "--ctx", "64", "-n", "100", "--quiet",
    ]);
    assert_refused(
        &fits,
        &["100 more are to be generated", "the context holds 64"],
    );
}

#[test]
fn sampler_settings_out_of_range_are_refused_with_the_range() {
    for (flag, value, want) in [
        ("--temp", "-1", "0 or more"),
        ("--temp", "nan", "not a number"),
        ("--temp", "inf", "not a number"),
        ("--top-p", "2", "from 0 to 1"),
        ("--min-p", "-0.5", "from 0 to 1"),
        ("--repeat-penalty", "0", "more than 0"),
        ("--top-k", "-3", "0 or more"),
        ("--repeat-last-n", "-2", "-1 for the whole context"),
        ("--frequency-penalty", "3", "from -2 to 2"),
        ("--presence-penalty", "-2.5", "from -2 to 2"),
        ("--seed", "-7", "-1 for a random seed"),
        ("-n", "-1", "1 or more"),
        ("-n", "0", "1 or more"),
    ] {
        let output = generate(&[flag, value]);
        assert_refused(&output, &[value, want]);
        assert!(
            !stderr_of(&output).contains("unexpected argument"),
            "{flag} {value}: {}",
            stderr_of(&output)
        );
    }
}

#[test]
fn the_seed_is_random_by_default_printed_and_reproducible() {
    let seed_of = |output: &Output| -> String {
        let stderr = stderr_of(output);
        assert!(output.status.success(), "{stderr}");
        let line = stderr
            .lines()
            .find(|l| l.contains("| seed "))
            .unwrap_or_else(|| panic!("no seed in {stderr}"));
        line.rsplit("seed ").next().unwrap().trim().to_string()
    };
    let sampled = ["-n", "12", "--temp", "1.0", "--json"];
    let first = generate(&sampled);
    let second = generate(&sampled);
    assert_ne!(
        seed_of(&first),
        seed_of(&second),
        "two runs drew the same seed"
    );
    // The printed seed repeats the run it came from.
    let seed = seed_of(&first);
    let again = generate(&["-n", "12", "--temp", "1.0", "--json", "--seed", &seed]);
    assert_eq!(seed_of(&again), seed);
    let ids =
        |output: &Output| serde_json::from_slice::<Value>(&output.stdout).unwrap()["ids"].clone();
    assert_eq!(ids(&again), ids(&first));
    // `--seed -1` is the default, random; a greedy run prints no seed.
    assert_ne!(seed_of(&generate(&["-n", "2", "--seed", "-1"])), seed);
    let greedy = generate(&["-n", "2", "--temp", "0"]);
    assert!(
        !stderr_of(&greedy).contains("seed"),
        "{}",
        stderr_of(&greedy)
    );
}

#[test]
fn model_commands_print_no_error_without_a_runtime_dir() {
    let model = smollm2();
    let output = Command::new(RUNNER)
        .args([
            "generate", "-m", &model, "-p", "Hi", "-n", "2", "--temp", "0", "--quiet",
        ])
        .env_remove("XDG_RUNTIME_DIR")
        .output()
        .expect("run the runner");
    let stderr = stderr_of(&output);
    assert!(output.status.success(), "{stderr}");
    assert!(!stderr.to_lowercase().contains("error"), "{stderr}");
    assert!(!stderr.contains("XDG_RUNTIME_DIR"), "{stderr}");
}

#[test]
fn a_prompt_is_not_drawn_as_progress_when_stderr_is_not_a_terminal() {
    let prompt = "the quick brown fox jumps over the lazy dog ".repeat(20);
    let model = smollm2();
    let output = runner(&[
        "generate", "-m", &model, "-p", &prompt, "-n", "1", "--temp", "0",
    ]);
    let stderr = stderr_of(&output);
    assert!(output.status.success(), "{stderr}");
    assert!(
        !stderr.contains("prompt ") && !stderr.contains('\r'),
        "{stderr:?}"
    );
    assert_eq!(stderr.lines().count(), 1, "only the timings: {stderr:?}");
}

#[test]
fn json_output_ends_with_a_newline() {
    let model = smollm2();
    for args in [
        vec!["info", model.as_str(), "--json"],
        vec!["tokenize", "-m", &model, "--json", "Hello"],
        vec![
            "generate", "-m", &model, "-p", "Hi", "-n", "2", "--temp", "0", "--json", "--quiet",
        ],
    ] {
        let output = runner(&args);
        assert!(output.status.success(), "{args:?}: {}", stderr_of(&output));
        let stdout = stdout_of(&output);
        assert!(stdout.ends_with('\n'), "{args:?}: {stdout:?}");
        serde_json::from_str::<Value>(&stdout).expect("one JSON value");
    }
}

#[test]
fn tokenize_shows_the_text_of_special_tokens() {
    let model = smollm2();
    let output = runner(&[
        "tokenize",
        "-m",
        &model,
        "--parse-special",
        "<|im_start|>user",
    ]);
    let stdout = stdout_of(&output);
    assert!(output.status.success(), "{}", stderr_of(&output));
    let first = stdout.lines().next().unwrap_or_default();
    assert!(first.contains("\"<|im_start|>\""), "{stdout}");
    assert!(!stdout.contains("\"\""), "{stdout}");
}

#[test]
fn info_is_a_summary_unless_tensors_are_asked_for() {
    let model = smollm2();
    let summary = stdout_of(&runner(&["info", &model]));
    assert!(summary.lines().count() < 50, "{summary}");
    assert!(!summary.contains("blk.0.attn_q.weight"), "{summary}");
    assert!(summary.contains("--tensors"), "{summary}");
    let model_line = summary
        .lines()
        .find(|l| l.starts_with("model "))
        .unwrap_or_default();
    assert!(model_line.ends_with("llama 135M Q4_1"), "{summary}");
    let table = stdout_of(&runner(&["info", &model, "--tensors"]));
    assert!(table.contains("blk.0.attn_q.weight"), "{table}");
    assert!(
        table.lines().count() > 250,
        "{} lines",
        table.lines().count()
    );
}

#[test]
fn bench_names_the_model_as_llama_bench_does() {
    let model = smollm2();
    let output = runner(&[
        "bench", "-m", &model, "-p", "4", "-n", "2", "-r", "1", "--quiet",
    ]);
    let stdout = stdout_of(&output);
    assert!(output.status.success(), "{}", stderr_of(&output));
    assert!(stdout.starts_with("| model | size | params |"), "{stdout}");
    let row = stdout
        .lines()
        .find(|l| l.contains("pp4"))
        .unwrap_or_else(|| panic!("{stdout}"));
    assert!(row.starts_with("| llama 135M Q4_1 | "), "{row}");
    assert!(row.contains(" MiB | ") && row.contains(" M | "), "{row}");
}

#[test]
fn chat_without_a_template_says_which_format_is_used() {
    let model = common::model_path(common::GEMMA).display().to_string();
    let output = runner(&[
        "generate", "-m", &model, "--chat", "-p", "Hi", "-n", "1", "--temp", "0", "--quiet",
    ]);
    let stderr = stderr_of(&output);
    assert!(output.status.success(), "{stderr}");
    assert!(
        stderr.contains("has no chat template: using the built-in Gemma turn format"),
        "{stderr}"
    );
    let smol = runner(&[
        "generate",
        "-m",
        &smollm2(),
        "--chat",
        "-p",
        "Hi",
        "-n",
        "1",
        "--temp",
        "0",
        "--quiet",
    ]);
    assert!(
        !stderr_of(&smol).contains("built-in"),
        "{}",
        stderr_of(&smol)
    );
}

#[test]
fn serve_refuses_a_missing_root_and_names_a_taken_port() {
    let missing = std::env::temp_dir().join("webshard-no-such-root");
    let output = runner(&["serve", "--root", missing.to_str().unwrap(), "--port", "0"]);
    assert_refused(
        &output,
        &["--root", "webshard-no-such-root", "not a folder"],
    );
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    let root = common::repo_root();
    let output = runner(&["serve", "--root", root.to_str().unwrap(), "--port", &port]);
    assert_refused(
        &output,
        &[&format!("port {port}"), "already in use", "--port"],
    );
}
