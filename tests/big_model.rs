//! A model over 2 GiB, generated (`tests/test_model/mod.rs`), gives the same greedy ids from one file
//! as from its `gguf-split` parts: offsets past 2^31 in the reader, the sources and the uploads,
//! and split models read by Range from the part that holds each tensor.
//!
//! The shape is wide and shallow (hidden 9216, one layer, an F32 token embedding of 1.8 GB of
//! which a step reads one row) so that the file passes 2 GiB while a step reads under 0.5 GB:
//! the output matrix, which starts below 2 GiB and ends above, and the layer, all above.
//! Weights are random, so correctness here is the same ids from both. The files are deleted
//! at the end, also when the test fails.

#[path = "test_model/mod.rs"]
mod test_model;

use std::path::{Path, PathBuf};
use std::time::Instant;

use test_model::{tokenizer_keys, write_single, write_split, Shape};
use webshard::engine::{Engine, EngineOptions};
use webshard::front::{GenerateOptions, GenerateRequest, Generator, Prompt};
use webshard::gguf::{open_source, read_header, FileSource, GgmlType};
use webshard::gpu::{Gpu, GpuOptions};
use webshard::sample::SamplerConfig;

const TWO_GIB: u64 = 2 << 30;

fn wide_shallow_shape() -> Shape {
    Shape {
        hidden: 9216,
        ffn: 256,
        heads: 72,
        kv_heads: 8,
        layers: 1,
        embedding: GgmlType::F32,
        matrices: None,
        seed: 16,
    }
}

/// Removes the directory when dropped, so a failing test leaves no gigabytes behind.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn smollm2_tokenizer() -> Vec<(String, webshard::gguf::Value)> {
    let models = std::env::var("WEBSHARD_MODELS").unwrap_or_else(|_| "models".into());
    let path = Path::new(&models).join("SmolLM2-135M-Instruct.Q4_1.gguf");
    let source = FileSource::open(&path).expect("SmolLM2 for its tokenizer");
    tokenizer_keys(
        &pollster::block_on(read_header(&source))
            .expect("SmolLM2 header")
            .metadata,
    )
}

async fn greedy_ids(location: &str) -> Vec<u32> {
    let started = Instant::now();
    let gpu = Gpu::new(&GpuOptions::default()).await.expect("gpu");
    let source = open_source(location).await.expect("open model");
    let options = EngineOptions {
        max_context: 64,
        ..Default::default()
    };
    let mut engine = Engine::load(gpu, source.as_ref(), &options, &mut |_| {})
        .await
        .expect("load model");
    let loaded = started.elapsed();
    let prompt = engine.tokenize_prompt("The big model says");
    let generate = GenerateOptions {
        max_tokens: 4,
        sampler: SamplerConfig::greedy(),
        stop: Vec::new(),
        constraint: None,
        ..GenerateOptions::default()
    };
    let request = GenerateRequest::new(Prompt::Ids(prompt), generate);
    let out = engine
        .generate_one(&request, &mut |_| std::ops::ControlFlow::Continue(()))
        .await
        .expect("generate");
    eprintln!(
        "{location}: loaded in {loaded:.1?}, {} ids in {:.1?}: {:?}",
        out.ids.len(),
        started.elapsed() - loaded,
        out.ids
    );
    assert!(!out.ids.is_empty(), "{location}: no ids");
    out.ids
}

#[tokio::test]
async fn a_model_over_2_gib_gives_the_same_ids_from_one_file_and_from_its_parts() {
    let dir = std::env::temp_dir().join(format!("webshard-big-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let scratch = Scratch(dir.clone());
    let shape = wide_shallow_shape();
    let tokenizer = smollm2_tokenizer();

    let started = Instant::now();
    let single = dir.join("big.gguf");
    let size = write_single(&shape, &tokenizer, &single).unwrap();
    assert!(size > TWO_GIB, "{size} bytes");
    let ids = greedy_ids(single.to_str().unwrap()).await;
    std::fs::remove_file(&single).unwrap();
    eprintln!("single file of {size} bytes: {:.1?}", started.elapsed());

    let started = Instant::now();
    let parts = write_split(&shape, &tokenizer, &dir.join("big"), 3).unwrap();
    assert_eq!(parts.len(), 3);
    let sizes: Vec<u64> = parts.iter().map(|p| p.metadata().unwrap().len()).collect();
    assert!(sizes.iter().all(|&s| s < size), "{sizes:?}");
    let split_ids = greedy_ids(parts[0].to_str().unwrap()).await;
    eprintln!("3 parts of {sizes:?} bytes: {:.1?}", started.elapsed());
    assert_eq!(split_ids, ids);
    drop(scratch);
}
