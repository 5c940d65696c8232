//! Constrained generation end to end on the real models: generated JSON Schemas (greedy and
//! sampled, through `runner serve -m`), regexes and a Lark grammar (through `runner generate`),
//! every output checked by an independent validator; constrained greedy against free greedy; errors before loading; and
//! `runner bench`'s mask cost.

use crate::api_support;
use crate::common;
#[path = "../../tests/constraint_support/mod.rs"]
mod constraint_support;

use std::path::Path;
use std::process::{Command, Output};

use api_support::ApiServer;
use constraint_support::{generated_schema, is_arithmetic, ARITHMETIC_LARK, REGEXES};
use reqwest::{Client, StatusCode};
use serde_json::{json, Value};
use webshard::gguf::{read_header, FileSource};
use webshard::sample::{Constraint, ConstraintSpec, TokenView};
use webshard::tokenizer::Tokenizer;

/// The runner this test was built with; the same variable at run time names a copy (the
/// build directory can be shared by several checkouts).
fn runner_path() -> std::ffi::OsString {
    std::env::var_os("CARGO_BIN_EXE_runner").unwrap_or_else(|| env!("CARGO_BIN_EXE_runner").into())
}

fn runner(args: &[&str]) -> Output {
    Command::new(runner_path())
        .args(args)
        .env("XDG_RUNTIME_DIR", std::env::temp_dir())
        .output()
        .expect("run the runner")
}

/// `runner generate --chat --json` with `extra` arguments; the parsed stdout.
fn generate(model: &str, prompt: &str, n: u32, extra: &[&str]) -> Value {
    let path = common::model_path(model).display().to_string();
    let n = n.to_string();
    let mut args = vec![
        "generate", "-m", &path, "-p", prompt, "-n", &n, "--chat", "--json", "--quiet",
    ];
    args.extend_from_slice(extra);
    let output = runner(&args);
    assert!(
        output.status.success(),
        "runner {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

/// `runner generate`'s text, checked against its finish reason (`finished_text`).
fn generated_text(out: &Value, n: u32) -> Option<String> {
    let count = out["ids"].as_array().expect("ids").len() as u32;
    let text = out["text"].as_str().expect("text").to_owned();
    finished_text(out["finish_reason"].as_str(), count, text, n)
}

/// The text of an answer of `count` tokens, checked against its finish reason: `stop` before
/// `n` tokens, or `length` at exactly `n`. `None` when cut at the length.
fn finished_text(reason: Option<&str>, count: u32, text: String, n: u32) -> Option<String> {
    match reason {
        Some("stop") => {
            assert!(count <= n, "{count} tokens for at most {n}: {text}");
            Some(text)
        }
        Some("length") => {
            assert_eq!(count, n, "length only at max tokens: {text}");
            None
        }
        other => panic!("finish reason {other:?}: {text}"),
    }
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write a temporary file");
    path.display().to_string()
}

/// `schemas` generated schemas, each asked for greedily and then sampled through one `runner
/// serve -m`, every answer checked by an independent validator. The server's KV pool keeps the
/// last request's pages: the sampled request after its greedy twin computes none of the prompt
/// but its last token (the schema is most of the work on a CPU adapter), and the model loads
/// once.
async fn schemas_validate_on(model: &str, schemas: u64, n: u32) {
    let path = common::model_path(model).display().to_string();
    let server = ApiServer::start(&path, model, &["--ctx", "1024"]).await;
    let (client, url) = (Client::new(), server.url("v1/chat/completions"));
    let mut finished = 0;
    for seed in 0..schemas {
        let schema = generated_schema(1000 + seed, 0);
        let validator = jsonschema::validator_for(&schema).expect("valid schema");
        let prompt = format!("Give a JSON object for this schema: {schema}");
        let greedy = json!({"temperature": 0});
        let sampled = json!({"temperature": 1.0, "top_k": 0, "top_p": 1, "min_p": 0});
        for (turn, sampler) in [greedy, sampled].into_iter().enumerate() {
            let mut body = json!({
                "model": model, "messages": [{"role": "user", "content": prompt}],
                "max_tokens": n, "seed": 3,
                "response_format": {"type": "json_schema",
                                    "json_schema": {"name": "generated", "schema": schema}},
            });
            let fields = body.as_object_mut().expect("an object");
            fields.extend(sampler.as_object().expect("an object").clone());
            let answer = post(&client, &url, &body).await;
            let cached = &answer["usage"]["prompt_tokens_details"]["cached_tokens"];
            let prompt_tokens = answer["usage"]["prompt_tokens"].as_u64().expect("usage");
            if turn == 1 {
                // All but the prompt's last token, which yields the first logits.
                assert_eq!(cached.as_u64(), Some(prompt_tokens - 1), "{answer}");
            }
            let choice = &answer["choices"][0];
            let count = answer["usage"]["completion_tokens"]
                .as_u64()
                .expect("usage") as u32;
            let text = choice["message"]["content"]
                .as_str()
                .expect("content")
                .to_owned();
            let Some(text) = finished_text(choice["finish_reason"].as_str(), count, text, n) else {
                continue;
            };
            let value: Value =
                serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text} ({schema})"));
            assert!(validator.is_valid(&value), "{text} against {schema}");
            finished += 1;
        }
    }
    assert!(finished > 0, "no output finished within {n} tokens");
}

async fn post(client: &Client, url: &str, body: &Value) -> Value {
    let response = client
        .post(url)
        .bearer_auth(api_support::KEY)
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .expect("the server answers");
    let status = response.status();
    let text = response.text().await.expect("a body");
    assert_eq!(status, StatusCode::OK, "{text} for {body}");
    serde_json::from_str(&text).expect("JSON")
}

#[tokio::test(flavor = "multi_thread")]
async fn generated_schemas_validate_on_smollm2() {
    schemas_validate_on(common::SMOLLM2, 5, 40).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn generated_schemas_validate_on_qwen() {
    schemas_validate_on(common::QWEN, 2, 32).await;
}

#[test]
fn regexes_and_a_grammar_hold_on_smollm2() {
    let dir = tempfile::tempdir().expect("temp dir");
    for pattern in REGEXES {
        let full = regex::Regex::new(&format!("^(?:{pattern})$")).expect("test regex");
        let out = generate(
            common::SMOLLM2,
            "Write one.",
            16,
            &["--regex", pattern, "--temp", "0"],
        );
        if let Some(text) = generated_text(&out, 16) {
            assert!(full.is_match(&text), "{pattern}: {text:?}");
        }
    }
    let grammar = write(dir.path(), "arithmetic.lark", ARITHMETIC_LARK);
    let out = generate(
        common::SMOLLM2,
        "Write an arithmetic expression.",
        16,
        &["--grammar", &grammar, "--temp", "0"],
    );
    if let Some(text) = generated_text(&out, 16) {
        assert!(is_arithmetic(&text), "{text:?}");
    }
}

fn smollm2_view() -> (Tokenizer, TokenView) {
    let source = FileSource::open(common::model_path(common::SMOLLM2)).expect("open model");
    let header = pollster::block_on(read_header(&source)).expect("header");
    let tokenizer = Tokenizer::from_metadata(&header.metadata).expect("tokenizer");
    let view = TokenView::new(&tokenizer).expect("token view");
    (tokenizer, view)
}

/// How many of `ids` the constraint accepts in order.
fn allowed_prefix(view: &TokenView, spec: &ConstraintSpec, ids: &[u32]) -> usize {
    let mut constraint = Constraint::new(view, spec).expect("compile");
    for (index, &id) in ids.iter().enumerate() {
        if constraint.is_complete() || !constraint.allowed().expect("mask").is_allowed(id) {
            return index;
        }
        constraint.commit(id).expect("commit");
    }
    ids.len()
}

fn ids(out: &Value) -> Vec<u32> {
    out["ids"]
        .as_array()
        .expect("ids")
        .iter()
        .map(|id| id.as_u64().expect("id") as u32)
        .collect()
}

#[test]
fn constrained_greedy_follows_free_greedy_while_it_is_allowed() {
    let (_, view) = smollm2_view();
    let prompt = "Reply with a JSON object with keys name and age.";
    let free = ids(&generate(common::SMOLLM2, prompt, 12, &["--temp", "0"]));
    let cases = [
        (
            ConstraintSpec::Regex {
                pattern: "(?s).*".into(),
            },
            "--regex",
            "(?s).*",
        ),
        (ConstraintSpec::Json, "--json-mode", ""),
    ];
    for (spec, flag, value) in cases {
        let extra: Vec<&str> = [flag, value, "--temp", "0"]
            .into_iter()
            .filter(|a| !a.is_empty())
            .collect();
        let constrained = ids(&generate(common::SMOLLM2, prompt, 12, &extra));
        let same = allowed_prefix(&view, &spec, &free);
        assert_eq!(
            constrained[..same.min(constrained.len())],
            free[..same.min(constrained.len())],
            "{spec:?}"
        );
        if let (Some(c), Some(f)) = (constrained.get(same), free.get(same)) {
            assert_ne!(
                c, f,
                "{spec:?}: diverged only where the free token was disallowed"
            );
        }
    }
}

#[test]
fn bad_constraints_fail_before_loading_the_model() {
    let dir = tempfile::tempdir().expect("temp dir");
    let bad_schema = write(dir.path(), "bad.json", r#"{"type": "wat"}"#);
    let not_json = write(dir.path(), "broken.json", "{ nope");
    let bad_grammar = write(dir.path(), "bad.lark", "start: undefined_rule");
    let cases: [(&[&str], &str); 5] = [
        (&["--json-schema", &bad_schema], "bad.json"),
        (&["--json-schema", &not_json], "broken.json"),
        (
            &["--json-schema", "/nonexistent/schema.json"],
            "/nonexistent/schema.json",
        ),
        (&["--grammar", &bad_grammar], "bad.lark"),
        (&["--regex", "([0-9]"], "--regex"),
    ];
    for (extra, names) in cases {
        // The model does not exist: the error must be the constraint's, found first.
        let mut args = vec!["generate", "-m", "/nonexistent/model.gguf", "-p", "hi"];
        args.extend_from_slice(extra);
        let output = runner(&args);
        assert!(!output.status.success());
        let stderr = String::from_utf8_lossy(&output.stderr);
        let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error:")).collect();
        assert_eq!(errors.len(), 1, "{stderr}");
        assert!(
            errors[0].contains(names) && !stderr.contains("model.gguf"),
            "{stderr}"
        );
    }
}

#[test]
fn bench_measures_the_mask_per_token() {
    let dir = tempfile::tempdir().expect("temp dir");
    let schema = write(
        dir.path(),
        "schema.json",
        &generated_schema(7, 1).to_string(),
    );
    let path = common::model_path(common::SMOLLM2).display().to_string();
    let output = runner(&[
        "bench",
        "-m",
        &path,
        "-p",
        "0",
        "-n",
        "6",
        "-r",
        "1",
        "--json",
        "--quiet",
        "--json-schema",
        &schema,
    ]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: Value = serde_json::from_slice(&output.stdout).expect("bench JSON");
    let mask = &report["mask"];
    assert!(mask["tokens"].as_u64().expect("tokens") > 0, "{mask}");
    assert!(
        mask["mask_us_per_token"].as_f64().expect("us") > 0.0,
        "{mask}"
    );
    let fraction = mask["fraction_of_step"].as_f64().expect("fraction");
    assert!(fraction > 0.0 && fraction.is_finite(), "{mask}");
}
