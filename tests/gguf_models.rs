//! The reader against the three real models: layout facts derivable from each file, the
//! hyper-parameters listed in shared/models.toml, and the header-fetch byte budget.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use webshard::gguf::{read_header, FileSource, GgmlType, Header, RangeSource};
use webshard::ops::quant::ENGINE_SUPPORTED;

/// Facts copied from shared/models.toml (file sizes and the comment on each entry).
struct Expected {
    file: &'static str,
    bytes: u64,
    architecture: &'static str,
    layers: u64,
    d_model: u64,
    heads: u64,
    kv_heads: u64,
    vocab: u64,
    types: &'static [GgmlType],
}

const SMOLLM2: Expected = Expected {
    file: "SmolLM2-135M-Instruct.Q4_1.gguf",
    bytes: 98362432,
    architecture: "llama",
    layers: 30,
    d_model: 576,
    heads: 9,
    kv_heads: 3,
    vocab: 49152,
    types: &[GgmlType::F32, GgmlType::Q8_0, GgmlType::Q4_1],
};

const QWEN: Expected = Expected {
    file: "qwen2.5-coder-0.5b-instruct-awq.Q4_K_M.gguf",
    bytes: 491400064,
    architecture: "qwen2",
    layers: 24,
    d_model: 896,
    heads: 14,
    kv_heads: 2,
    vocab: 151936,
    types: &[
        GgmlType::F32,
        GgmlType::Q5_0,
        GgmlType::Q8_0,
        GgmlType::Q4_K,
        GgmlType::Q6_K,
    ],
};

const GEMMA: Expected = Expected {
    file: "gemma-3-270m-q4_k_m.gguf",
    bytes: 253113024,
    architecture: "gemma3",
    layers: 18,
    d_model: 640,
    heads: 4,
    kv_heads: 1,
    vocab: 262144,
    types: &[
        GgmlType::F32,
        GgmlType::Q8_0,
        GgmlType::Q5_0,
        GgmlType::Q4_K,
        GgmlType::Q6_K,
    ],
};

fn model_path(file: &str) -> PathBuf {
    let dir = std::env::var_os("WEBSHARD_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models"));
    let path = dir.join(file);
    assert!(
        path.is_file(),
        "model {} is missing (set WEBSHARD_MODELS or link <repo>/models)",
        path.display()
    );
    path
}

async fn open_and_read(expected: &Expected) -> (Header, FileSource) {
    let source = FileSource::open(model_path(expected.file)).expect("open model");
    assert_eq!(
        source.size(),
        Some(expected.bytes),
        "file size vs models.toml"
    );
    let header = read_header(&source).await.expect("parse header");
    (header, source)
}

fn check_hyper_parameters(header: &Header, expected: &Expected) {
    let arch = header.architecture().unwrap();
    assert_eq!(arch, expected.architecture);
    let meta = &header.metadata;
    assert_eq!(
        meta.get_u64(&format!("{arch}.block_count")).unwrap(),
        expected.layers
    );
    assert_eq!(
        meta.get_u64(&format!("{arch}.embedding_length")).unwrap(),
        expected.d_model
    );
    assert_eq!(
        meta.get_u64(&format!("{arch}.attention.head_count"))
            .unwrap(),
        expected.heads
    );
    assert_eq!(
        meta.get_u64(&format!("{arch}.attention.head_count_kv"))
            .unwrap(),
        expected.kv_heads
    );
    let tokens = meta.get_str_array("tokenizer.ggml.tokens").unwrap();
    assert_eq!(tokens.len() as u64, expected.vocab);
    let embedding = header
        .tensor("token_embd.weight")
        .expect("token_embd.weight");
    assert_eq!(embedding.shape, [expected.d_model, expected.vocab]);
    assert_eq!(embedding.rows(), expected.vocab);
    assert_eq!(
        embedding.row_bytes() * embedding.rows(),
        embedding.bytes,
        "row geometry"
    );
}

/// Tensor data must tile the data section: in offset order each tensor starts at the aligned end
/// of the previous one, the first at `data_offset`, and the last ends at the file's end
/// (up to alignment padding).
fn check_layout(header: &Header, file_size: u64) {
    let align = |x: u64| x.div_ceil(header.alignment) * header.alignment;
    assert_eq!(header.data_offset % header.alignment, 0);
    let mut sorted: Vec<_> = header.tensors.iter().collect();
    sorted.sort_by_key(|t| t.offset);
    let mut expected_start = header.data_offset;
    for t in &sorted {
        assert_eq!(t.offset, expected_start, "tensor {} start", t.name);
        assert_eq!(t.bytes, t.ggml_type.bytes_for(t.n_elements()).unwrap());
        expected_start = align(t.offset + t.bytes);
    }
    let last_end = sorted.last().map(|t| t.offset + t.bytes).unwrap();
    assert!(
        last_end <= file_size && align(last_end) >= file_size,
        "last end {last_end}"
    );
}

/// Every `blk.N.` tensor belongs to a layer below block_count and all layers hold the same set.
fn check_layers(header: &Header, layers: u64) {
    let mut per_layer: BTreeMap<u64, BTreeSet<&str>> = BTreeMap::new();
    for t in &header.tensors {
        if let Some(rest) = t.name.strip_prefix("blk.") {
            let (index, suffix) = rest.split_once('.').expect("blk.N.suffix");
            per_layer
                .entry(index.parse().unwrap())
                .or_default()
                .insert(suffix);
        }
    }
    assert_eq!(
        per_layer.keys().copied().collect::<Vec<_>>(),
        (0..layers).collect::<Vec<_>>()
    );
    let first = per_layer[&0].clone();
    assert!(per_layer.values().all(|s| *s == first), "layers differ");
    let globals = header.tensors.len() as u64 - layers * first.len() as u64;
    assert!((1..=4).contains(&globals), "{globals} global tensors");
}

fn check_types(header: &Header, expected: &[GgmlType]) {
    let found: BTreeSet<u32> = header.tensors.iter().map(|t| t.ggml_type.id()).collect();
    let want: BTreeSet<u32> = expected.iter().map(|t| t.id()).collect();
    assert_eq!(found, want);
    assert!(header
        .tensors
        .iter()
        .all(|t| ENGINE_SUPPORTED.contains(&t.ggml_type)));
}

/// The reader must fetch little more than the header itself, in few requests.
fn check_fetch_budget(header: &Header, source: &FileSource) {
    let stats = source.stats();
    let budget = header.data_offset + header.data_offset / 4 + 256 * 1024;
    assert!(
        stats.bytes_fetched <= budget,
        "fetched {} bytes for a {}-byte header (budget {budget})",
        stats.bytes_fetched,
        header.data_offset
    );
    assert!(stats.requests <= 10, "{} requests", stats.requests);
    eprintln!(
        "{}: data_offset {} fetched {} in {} requests",
        source.location(),
        header.data_offset,
        stats.bytes_fetched,
        stats.requests
    );
}

async fn check_model(expected: &Expected) -> Header {
    let (header, source) = open_and_read(expected).await;
    assert_eq!(header.version, 3);
    check_hyper_parameters(&header, expected);
    check_layout(&header, expected.bytes);
    check_layers(&header, expected.layers);
    check_types(&header, expected.types);
    check_fetch_budget(&header, &source);
    header
}

#[tokio::test]
async fn smollm2_header() {
    let header = check_model(&SMOLLM2).await;
    // Embeddings are tied: no separate output matrix.
    assert!(header.tensor("output.weight").is_none());
}

#[tokio::test]
async fn qwen2_header() {
    let header = check_model(&QWEN).await;
    assert!(header.tensor("output.weight").is_some(), "untied output");
    assert!(header.tensor("blk.0.attn_q.bias").is_some(), "q/k/v biases");
}

#[tokio::test]
async fn gemma3_header() {
    let header = check_model(&GEMMA).await;
    let embedding = header.tensor("token_embd.weight").unwrap();
    // models.toml: "Q8_0 embedding = 178 MB".
    assert_eq!(embedding.ggml_type, GgmlType::Q8_0);
    assert_eq!(embedding.bytes / 1_000_000, 178);
}
