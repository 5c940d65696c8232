//! Embedding fidelity against llama.cpp (`tests/goldens/embed/README.md`): on every backend
//! under test (lavapipe and llvmpipe's GL in CI), webshard's token ids equal llama.cpp's and
//! every input's embedding has cosine similarity >= 0.999 to llama.cpp's, with and without
//! normalisation; an input beyond the context is refused with its index. A causal decoder
//! (SmolLM2) pooled mean and last is held to llama.cpp's goldens made with that pooling, and
//! nomic-bert (rotary, SwiGLU, fused qkv) to its own.

use crate::support;

use std::path::PathBuf;

use serde_json::Value;
use webshard::embed::{cosine_similarity, EmbedError, EmbedOptions, Embedder, Pooling};
use webshard::gguf::open_source;
use webshard::gpu::{Gpu, GpuOptions};

const MINILM: (&str, &str) = ("all-minilm-l6-v2-f16", "all-MiniLM-L6-v2.f16.gguf");
const NOMIC: (&str, &str) = ("nomic-bert-tiny-f16", "nomic-bert-tiny.f16.gguf");
const MIN_COSINE: f64 = 0.999;
/// SmolLM2's goldens, made with `make_goldens.py ... mean` and `... last`.
const SMOLLM2_MEAN: &str = "smollm2-135m-instruct-q4_1-mean";
const SMOLLM2_LAST: &str = "smollm2-135m-instruct-q4_1-last";
const SMOLLM2_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

fn golden(name: &str) -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/goldens/embed")
        .join(format!("{name}.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).expect("golden is JSON")
}

fn numbers<T>(value: &Value, convert: impl Fn(&Value) -> Option<T>) -> Vec<T> {
    value
        .as_array()
        .expect("array")
        .iter()
        .map(|v| convert(v).expect("number"))
        .collect()
}

async fn load(file: &str, options: GpuOptions) -> Embedder {
    let gpu = Gpu::new(&options).await.expect("gpu");
    let path = support::model_path(file);
    let source = open_source(path.to_str().expect("utf-8 path"))
        .await
        .expect("open model");
    Embedder::load(gpu, source.as_ref(), 512, &mut |_| {})
        .await
        .expect("load embedding model")
}

fn check_model((name, file): (&str, &str)) {
    let golden = golden(name);
    assert_eq!(golden["model_file"], file, "golden made from another file");
    let inputs = golden["inputs"].as_array().expect("inputs");
    let texts: Vec<&str> = inputs
        .iter()
        .map(|r| r["text"].as_str().expect("text"))
        .collect();
    for backend in support::backends() {
        let options = GpuOptions {
            backend,
            ..Default::default()
        };
        let embedder = pollster::block_on(load(file, options));
        assert_eq!(
            Some(embedder.default_pooling().expect("pooling").name()),
            golden["pooling"].as_str()
        );
        for (record, text) in inputs.iter().zip(&texts) {
            let want: Vec<u32> = numbers(&record["ids"], |v| v.as_u64().map(|x| x as u32));
            assert_eq!(embedder.tokenize(text), want, "{backend:?} ids of {text:?}");
        }
        for normalize in [false, true] {
            let options = EmbedOptions {
                pooling: None,
                normalize,
            };
            let got = pollster::block_on(embedder.embed(&texts, options)).expect("embed");
            let mut worst = 1.0f64;
            for ((record, text), vector) in inputs.iter().zip(&texts).zip(&got) {
                let want: Vec<f32> =
                    numbers(&record["embedding"], |v| v.as_f64().map(|x| x as f32));
                let cosine = cosine_similarity(vector, &want);
                assert!(
                    cosine >= MIN_COSINE,
                    "{backend:?} normalize={normalize}: cosine {cosine:.6} < {MIN_COSINE} for {text:?}"
                );
                if normalize {
                    let norm: f64 = vector.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>();
                    assert!((norm.sqrt() - 1.0).abs() < 1e-5, "normalised length {norm}");
                }
                worst = worst.min(cosine);
            }
            println!(
                "{name} {backend:?} normalize={normalize}: worst cosine {worst:.7} over {} inputs",
                got.len()
            );
        }
    }
}

/// The worst cosine over `inputs` (some of `golden`'s) of `embedder`'s vectors pooled as the
/// golden says; fails on any id that differs or any cosine under MIN_COSINE.
fn check_pooled(
    embedder: &Embedder,
    golden: &Value,
    inputs: &[&Value],
    normalize: bool,
    label: &str,
) -> f64 {
    let texts: Vec<&str> = inputs
        .iter()
        .map(|r| r["text"].as_str().expect("text"))
        .collect();
    for (record, text) in inputs.iter().zip(&texts) {
        let want: Vec<u32> = numbers(&record["ids"], |v| v.as_u64().map(|x| x as u32));
        assert_eq!(embedder.tokenize(text), want, "{label} ids of {text:?}");
    }
    let pooling = Pooling::parse(golden["pooling"].as_str().expect("pooling"));
    let options = EmbedOptions { pooling, normalize };
    let got = pollster::block_on(embedder.embed(&texts, options)).expect("embed");
    let mut worst = 1.0f64;
    for ((record, text), vector) in inputs.iter().zip(&texts).zip(&got) {
        let want: Vec<f32> = numbers(&record["embedding"], |v| v.as_f64().map(|x| x as f32));
        let cosine = cosine_similarity(vector, &want);
        assert!(
            cosine >= MIN_COSINE,
            "{label}: cosine {cosine:.6} < {MIN_COSINE} for {text:?}"
        );
        worst = worst.min(cosine);
    }
    println!("{label}: worst cosine {worst:.7} over {} inputs", got.len());
    worst
}

/// Mean pooling and last-token pooling (normalized), each on one backend and half the inputs,
/// in turn from a start the seed chooses: a pooled decoder embeds its inputs one prefill each
/// (twelve take minutes on a CPU adapter), and the pooling is a host-side choice over the same
/// hidden states. Across runs every input meets every pooling on every backend.
#[test]
fn pooled_decoder_matches_llama_cpp_mean_and_last_across_backends() {
    let (mean, last) = (golden(SMOLLM2_MEAN), golden(SMOLLM2_LAST));
    for golden in [&mean, &last] {
        assert_eq!(
            golden["model_file"], SMOLLM2_FILE,
            "golden made from another file"
        );
    }
    let seed = webshard::gpu::testing::fresh_seed();
    let poolings = [(&mean, false, SMOLLM2_MEAN), (&last, true, SMOLLM2_LAST)];
    let backends = support::backends();
    let turns = backends.len().max(poolings.len());
    for turn in 0..turns {
        let backend = backends[turn % backends.len()];
        let (golden, normalize, name) = poolings[(turn + seed as usize) % poolings.len()];
        let options = GpuOptions {
            backend,
            ..Default::default()
        };
        let embedder = pollster::block_on(load(SMOLLM2_FILE, options));
        assert_eq!(embedder.dimensions(), 576);
        let label = format!("{name} {backend:?} normalize={normalize} seed {seed}");
        let all = golden["inputs"].as_array().expect("inputs");
        let half: Vec<&Value> = all
            .iter()
            .enumerate()
            .filter(|(index, _)| (index + turn + (seed / 2) as usize).is_multiple_of(2))
            .map(|(_, input)| input)
            .collect();
        check_pooled(&embedder, golden, &half, normalize, &label);
    }
}

#[test]
fn minilm_matches_llama_cpp_on_every_backend() {
    check_model(MINILM);
}

#[test]
fn nomic_bert_matches_llama_cpp_on_every_backend() {
    check_model(NOMIC);
}

#[test]
fn pooling_choices_differ_and_oversized_input_names_its_index() {
    let embedder = pollster::block_on(load(MINILM.1, GpuOptions::default()));
    let texts = ["a short text", "another one"];
    let run = |pooling| {
        let options = EmbedOptions {
            pooling: Some(pooling),
            normalize: true,
        };
        pollster::block_on(embedder.embed(&texts, options)).expect("embed")
    };
    let (mean, cls, last) = (run(Pooling::Mean), run(Pooling::Cls), run(Pooling::Last));
    assert!(
        cosine_similarity(&mean[0], &cls[0]) < 0.999,
        "mean and CLS pooling agree"
    );
    assert!(
        cosine_similarity(&cls[0], &last[0]) < 0.999,
        "CLS and last pooling agree"
    );
    let long = "word ".repeat(600);
    let err = pollster::block_on(embedder.embed(&["fine", long.as_str()], EmbedOptions::default()))
        .expect_err("longer than the context");
    assert!(matches!(err, EmbedError::TooLong { index: 1, .. }), "{err}");
    assert!(err.to_string().contains("input 1"), "{err}");
}
