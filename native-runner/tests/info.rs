//! `runner info` end to end: the built binary on the three real models, by path and through
//! `runner serve`, checked against the facts in .ci/models.toml and the GGUF reader itself.

use crate::common;
#[path = "../../tests/gguf_writer/mod.rs"]
mod gguf_writer;

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};

use serde_json::Value;

const RUNNER: &str = env!("CARGO_BIN_EXE_runner");

/// What .ci/models.toml states about each model.
struct Facts {
    file: &'static str,
    architecture: &'static str,
    block_count: u64,
    embedding_length: u64,
    head_count: u64,
    head_count_kv: u64,
    vocab_size: u64,
    tensor_types: &'static [&'static str],
}

const MODELS: [Facts; 3] = [
    Facts {
        file: common::SMOLLM2,
        architecture: "llama",
        block_count: 30,
        embedding_length: 576,
        head_count: 9,
        head_count_kv: 3,
        vocab_size: 49152,
        tensor_types: &["F32", "Q4_1", "Q8_0"],
    },
    Facts {
        file: common::QWEN,
        architecture: "qwen2",
        block_count: 24,
        embedding_length: 896,
        head_count: 14,
        head_count_kv: 2,
        vocab_size: 151936,
        tensor_types: &["F32", "Q4_K", "Q5_0", "Q6_K", "Q8_0"],
    },
    Facts {
        file: common::GEMMA,
        architecture: "gemma3",
        block_count: 18,
        embedding_length: 640,
        head_count: 4,
        head_count_kv: 1,
        vocab_size: 262144,
        tensor_types: &["F32", "Q4_K", "Q5_0", "Q6_K", "Q8_0"],
    },
];

/// A `runner serve` child process, killed when dropped.
struct ServeProcess {
    child: Child,
    base: String,
}

impl ServeProcess {
    fn start(models_dir: &Path) -> ServeProcess {
        let mut child = Command::new(RUNNER)
            .args(["serve", "--port", "0", "--models"])
            .arg(models_dir)
            .arg("--root")
            .arg(common::repo_root())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn runner serve");
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut first_line = String::new();
        stdout.read_line(&mut first_line).unwrap();
        // Keep the pipe open and drained for as long as the server runs.
        std::thread::spawn(move || std::io::copy(&mut stdout, &mut std::io::sink()));
        let base = first_line
            .strip_prefix("serving ")
            .unwrap_or_else(|| panic!("unexpected first line {first_line:?}"))
            .trim()
            .to_string();
        ServeProcess { child, base }
    }
}

impl Drop for ServeProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn run_info(args: &[&str]) -> Output {
    Command::new(RUNNER)
        .arg("info")
        .args(args)
        .output()
        .expect("run runner info")
}

fn info_json(source: &str) -> Value {
    let out = run_info(&[source, "--json"]);
    assert!(
        out.status.success(),
        "runner info {source} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("runner info --json prints JSON")
}

fn u64_of(json: &Value, key: &str) -> u64 {
    json[key]
        .as_u64()
        .unwrap_or_else(|| panic!("{key} is not a number in {}", json[key]))
}

fn check_facts(json: &Value, facts: &Facts) {
    assert_eq!(json["architecture"], facts.architecture, "{}", facts.file);
    assert_eq!(json["architecture_supported"], true, "{}", facts.file);
    assert_eq!(u64_of(json, "block_count"), facts.block_count);
    assert_eq!(u64_of(json, "embedding_length"), facts.embedding_length);
    assert_eq!(u64_of(json, "head_count"), facts.head_count);
    assert_eq!(u64_of(json, "head_count_kv"), facts.head_count_kv);
    assert_eq!(u64_of(json, "vocab_size"), facts.vocab_size);
    let types: Vec<&str> = json["type_histogram"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(types, facts.tensor_types, "{}", facts.file);
}

/// The tensor table must be exactly what the GGUF reader parses from the file.
fn check_tensors_match_reader(json: &Value, path: &Path) {
    let header = read_header_from(path.to_str().unwrap());
    let tensors = json["tensors"].as_array().unwrap();
    assert_eq!(u64_of(json, "tensor_count"), tensors.len() as u64);
    assert_eq!(tensors.len(), header.tensors.len());
    assert_eq!(u64_of(json, "header_bytes"), header.data_offset);
    for (row, tensor) in tensors.iter().zip(&header.tensors) {
        assert_eq!(row["name"], tensor.name.as_str());
        assert_eq!(row["type"], tensor.ggml_type.name());
        assert_eq!(row["shape"], serde_json::json!(tensor.shape));
        assert_eq!(u64_of(row, "offset"), tensor.offset);
        assert_eq!(u64_of(row, "bytes"), tensor.bytes);
        let supported = webshard::ops::quant::ENGINE_SUPPORTED.contains(&tensor.ggml_type);
        assert_eq!(row["supported"], supported);
    }
    let weight_bytes: u64 = header.tensors.iter().map(|t| t.bytes).sum();
    assert_eq!(u64_of(json, "weight_bytes"), weight_bytes);
}

fn read_header_from(source: &str) -> webshard::gguf::Header {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let src = webshard::gguf::open_source(source).await.unwrap();
        webshard::gguf::read_header(src.as_ref()).await.unwrap()
    })
}

/// Everything but where the bytes came from and how many were fetched.
fn without_transport(mut json: Value) -> Value {
    for key in ["source", "bytes_fetched", "requests"] {
        json.as_object_mut().unwrap().remove(key);
    }
    json
}

#[test]
fn info_by_path_matches_models_toml_and_the_reader() {
    for facts in &MODELS {
        let path = common::model_path(facts.file);
        let json = info_json(path.to_str().unwrap());
        check_facts(&json, facts);
        check_tensors_match_reader(&json, &path);
        assert_eq!(u64_of(&json, "file_bytes"), path.metadata().unwrap().len());
    }
}

#[test]
fn info_by_url_fetches_little_more_than_the_header() {
    let server = ServeProcess::start(&common::models_dir());
    for facts in &MODELS {
        let path = common::model_path(facts.file);
        let url = format!("{}models/{}", server.base, facts.file);
        let json = info_json(&url);
        check_facts(&json, facts);
        let header_bytes = u64_of(&json, "header_bytes");
        let fetched = u64_of(&json, "bytes_fetched");
        assert!(
            fetched as f64 <= 1.25 * header_bytes as f64 + 256.0 * 1024.0,
            "{}: fetched {fetched} bytes for a {header_bytes}-byte header",
            facts.file
        );
        assert!(u64_of(&json, "requests") >= 1);
        let by_path = info_json(path.to_str().unwrap());
        assert_eq!(without_transport(json), without_transport(by_path));
    }
}

#[test]
fn text_output_names_the_essentials() {
    let path = common::model_path(common::SMOLLM2);
    // The tensor table comes with --tensors (the default is the summary alone).
    let out = run_info(&[path.to_str().unwrap(), "--tensors"]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let line = |label: &str| {
        text.lines()
            .find(|l| l.starts_with(label))
            .unwrap_or_else(|| panic!("no {label} line in:\n{text}"))
            .split_whitespace()
            .last()
            .unwrap()
            .to_string()
    };
    assert_eq!(line("architecture"), "llama");
    assert_eq!(line("block_count"), "30");
    assert_eq!(line("vocab size"), "49152");
    assert_eq!(line("chat template"), "yes");
    assert!(text.contains("token_embd.weight"), "tensor table missing");
}

#[test]
fn verbose_flag_logs_debug_to_stderr_only() {
    let path = common::model_path(common::SMOLLM2);
    let quiet = run_info(&[path.to_str().unwrap(), "--json"]);
    assert!(quiet.stderr.is_empty());
    let verbose = run_info(&["-v", path.to_str().unwrap(), "--json"]);
    assert!(verbose.status.success());
    let stderr = String::from_utf8(verbose.stderr).unwrap();
    assert!(stderr.contains("DEBUG"), "{stderr}");
    serde_json::from_slice::<Value>(&verbose.stdout).expect("stdout stays pure JSON");
}

fn assert_one_line_error(args: &[&str], expected: &str) {
    let out = run_info(args);
    assert!(!out.status.success(), "runner info {args:?} succeeded");
    assert!(out.stdout.is_empty());
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert_eq!(stderr.lines().count(), 1, "not one line: {stderr:?}");
    assert!(stderr.starts_with("error: "), "{stderr:?}");
    assert!(stderr.contains(expected), "{stderr:?} lacks {expected:?}");
}

#[test]
fn bad_inputs_fail_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("absent.gguf");
    assert_one_line_error(&[missing.to_str().unwrap()], "absent.gguf");

    let not_gguf = dir.path().join("notes.gguf");
    std::fs::write(&not_gguf, b"this is not a model, just some text\n").unwrap();
    assert_one_line_error(&[not_gguf.to_str().unwrap()], "notes.gguf");

    let truncated = dir.path().join("cut.gguf");
    let mut prefix = Vec::new();
    let model = std::fs::File::open(common::model_path(common::SMOLLM2)).unwrap();
    model.take(100_000).read_to_end(&mut prefix).unwrap();
    std::fs::write(&truncated, &prefix).unwrap();
    assert_one_line_error(&[truncated.to_str().unwrap()], "cut.gguf");

    let server = ServeProcess::start(dir.path());
    let url = format!("{}models/nothing-here.gguf", server.base);
    assert_one_line_error(&[&url], "404");
}

/// A file with a tensor of each of Q2_K, Q3_K, IQ4_NL and IQ4_XS, and one of a type without
/// kernels (IQ2_XXS): the four are listed as supported, the last not.
#[test]
fn info_lists_q2_k_q3_k_iq4_nl_and_iq4_xs_as_supported() {
    use webshard::gguf::GgmlType;
    let types = [
        (GgmlType::Q2_K, true),
        (GgmlType::Q3_K, true),
        (GgmlType::IQ4_NL, true),
        (GgmlType::IQ4_XS, true),
        (GgmlType::IQ2_XXS, false),
    ];
    let mut builder = gguf_writer::GgufBuilder::empty()
        .kv("general.architecture", gguf_writer::v_str("llama"))
        .kv("llama.block_count", gguf_writer::v_u32(1));
    let mut offset = 0;
    for (index, (ggml_type, _)) in types.iter().enumerate() {
        builder = builder.tensor(&format!("t{index}"), &[256, 2], ggml_type.id(), offset);
        offset += ggml_type.bytes_for(512).unwrap().next_multiple_of(32);
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("types.gguf");
    std::fs::write(&path, builder.bytes()).unwrap();
    let json = info_json(path.to_str().unwrap());
    let rows = json["tensors"].as_array().unwrap();
    assert_eq!(rows.len(), types.len());
    for (row, (ggml_type, supported)) in rows.iter().zip(types) {
        assert_eq!(row["type"], ggml_type.name());
        assert_eq!(row["supported"], supported, "{ggml_type}");
    }
    assert_eq!(u64_of(&json, "unsupported_tensor_count"), 1);
}

/// The small qwen3 and lfm2 models (`.ci/build_tiny_model.sh`): architectures the engine
/// computes, with LFM2's per-layer KV head list (0 for convolution blocks) read as its
/// attention blocks' count.
#[test]
fn info_lists_qwen3_and_lfm2_as_supported() {
    for (file, architecture, blocks) in [
        ("tiny-qwen3.F16.gguf", "qwen3", 4),
        ("tiny-lfm2.F16.gguf", "lfm2", 6),
    ] {
        let path = common::model_path(file);
        let json = info_json(path.to_str().expect("utf-8 path"));
        assert_eq!(json["architecture"], architecture, "{file}");
        assert_eq!(json["architecture_supported"], true, "{file}");
        assert_eq!(u64_of(&json, "block_count"), blocks, "{file}");
        assert_eq!(u64_of(&json, "head_count_kv"), 2, "{file}");
        assert_eq!(u64_of(&json, "unsupported_tensor_count"), 0, "{file}");
    }
}
