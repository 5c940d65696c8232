//! `runner info`: what a GGUF file holds, read through the same ranged sources the engine uses,
//! so inspecting a model behind a URL costs only its header.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;
use webshard::gguf::{
    open_source, read_header, GgufError, Header, Metadata, SourceStats, TensorInfo,
};
use webshard::ops::quant::ENGINE_SUPPORTED;

/// Everything `runner info` reports; `--json` prints it as is.
#[derive(Debug, Serialize)]
pub struct ModelInfo {
    pub source: String,
    pub file_bytes: Option<u64>,
    pub gguf_version: u32,
    pub architecture: String,
    pub name: Option<String>,
    #[serde(flatten)]
    pub hyper: HyperParams,
    pub tokenizer: Option<String>,
    pub vocab_size: Option<u64>,
    pub chat_template: bool,
    pub metadata_count: usize,
    pub alignment: u64,
    /// Bytes before the tensor data (= `data_offset`).
    pub header_bytes: u64,
    pub tensor_count: usize,
    pub weight_bytes: u64,
    /// Weights counted one per element, as llama-bench's `params`.
    pub parameters: u64,
    /// `general.file_type` named as llama.cpp names it, else the type most bytes are in.
    pub quantization: String,
    /// Whether the engine computes this `general.architecture` (`webshard::model::ARCHITECTURES`).
    pub architecture_supported: bool,
    pub unsupported_tensor_count: usize,
    pub type_histogram: BTreeMap<String, TypeTotal>,
    pub tensors: Vec<TensorRow>,
    pub bytes_fetched: u64,
    pub requests: u64,
}

/// The `<arch>.*` hyperparameters; `None` where the file does not say.
#[derive(Debug, Serialize)]
pub struct HyperParams {
    pub block_count: Option<u64>,
    pub embedding_length: Option<u64>,
    pub feed_forward_length: Option<u64>,
    pub head_count: Option<u64>,
    pub head_count_kv: Option<u64>,
    pub context_length: Option<u64>,
    pub rope_freq_base: Option<f32>,
    pub rms_eps: Option<f32>,
}

#[derive(Debug, Default, Serialize)]
pub struct TypeTotal {
    pub count: usize,
    pub bytes: u64,
}

#[derive(Debug, Serialize)]
pub struct TensorRow {
    pub name: String,
    #[serde(rename = "type")]
    pub ggml_type: String,
    pub shape: Vec<u64>,
    pub offset: u64,
    pub bytes: u64,
    /// Whether the engine has kernels for this type.
    pub supported: bool,
}

/// Opens `path_or_url`, reads only the header, and summarises it.
pub async fn inspect(path_or_url: &str) -> Result<ModelInfo, GgufError> {
    let source = open_source(path_or_url).await?;
    let header = read_header(source.as_ref()).await?;
    summarise(path_or_url, source.size(), source.stats(), &header)
}

fn summarise(
    location: &str,
    file_bytes: Option<u64>,
    stats: SourceStats,
    header: &Header,
) -> Result<ModelInfo, GgufError> {
    let meta = &header.metadata;
    let architecture = header.architecture()?.to_string();
    let architecture_supported = webshard::model::architecture(&architecture).is_some();
    let tensors: Vec<TensorRow> = header.tensors.iter().map(tensor_row).collect();
    Ok(ModelInfo {
        source: location.to_string(),
        file_bytes,
        gguf_version: header.version,
        name: meta.opt_str("general.name")?.map(str::to_string),
        hyper: hyper_params(meta, &architecture)?,
        architecture,
        tokenizer: meta.opt_str("tokenizer.ggml.model")?.map(str::to_string),
        vocab_size: vocab_size(meta),
        chat_template: meta.get("tokenizer.chat_template").is_some(),
        metadata_count: meta.len(),
        alignment: header.alignment,
        header_bytes: header.data_offset,
        tensor_count: tensors.len(),
        weight_bytes: tensors.iter().map(|t| t.bytes).sum(),
        parameters: parameter_count(header),
        quantization: quantization(header)?,
        architecture_supported,
        unsupported_tensor_count: tensors.iter().filter(|t| !t.supported).count(),
        type_histogram: type_histogram(&tensors),
        tensors,
        bytes_fetched: stats.bytes_fetched,
        requests: stats.requests,
    })
}

fn hyper_params(meta: &Metadata, arch: &str) -> Result<HyperParams, GgufError> {
    let int = |key: &str| meta.opt_u64(&format!("{arch}.{key}"));
    let float = |key: &str| meta.opt_f32(&format!("{arch}.{key}"));
    Ok(HyperParams {
        block_count: int("block_count")?,
        embedding_length: int("embedding_length")?,
        feed_forward_length: int("feed_forward_length")?,
        head_count: int("attention.head_count")?,
        head_count_kv: kv_heads(meta, &format!("{arch}.attention.head_count_kv"))?,
        context_length: int("context_length")?,
        rope_freq_base: float("rope.freq_base")?,
        rms_eps: float("attention.layer_norm_rms_epsilon")?,
    })
}

/// KV heads: one count, or the largest of a per-layer list (LFM2 gives 0 for its
/// convolution blocks).
fn kv_heads(meta: &Metadata, key: &str) -> Result<Option<u64>, GgufError> {
    match meta.get(key).and_then(|value| value.as_array()) {
        Some(_) => Ok(meta.get_u32_array(key)?.into_iter().max().map(u64::from)),
        None => meta.opt_u64(key),
    }
}

/// The token list's length: what the embedding rows are indexed by.
fn vocab_size(meta: &Metadata) -> Option<u64> {
    let tokens = meta.get("tokenizer.ggml.tokens")?.as_array()?;
    Some(tokens.len() as u64)
}

/// Elements of every tensor.
pub fn parameter_count(header: &Header) -> u64 {
    header
        .tensors
        .iter()
        .map(|t| t.shape.iter().product::<u64>())
        .sum()
}

/// llama.cpp's name of `general.file_type` (its `llama_ftype`), else the tensor type that
/// holds the most bytes (files without the key, or a type llama.cpp added later).
pub fn quantization(header: &Header) -> Result<String, GgufError> {
    let named = header
        .metadata
        .opt_u64("general.file_type")?
        .and_then(file_type_name);
    Ok(named.map_or_else(|| dominant_type(header), str::to_string))
}

fn file_type_name(file_type: u64) -> Option<&'static str> {
    Some(match file_type {
        0 => "F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        7 => "Q8_0",
        8 => "Q5_0",
        9 => "Q5_1",
        10 => "Q2_K",
        11 => "Q3_K_S",
        12 => "Q3_K_M",
        13 => "Q3_K_L",
        14 => "Q4_K_S",
        15 => "Q4_K_M",
        16 => "Q5_K_S",
        17 => "Q5_K_M",
        18 => "Q6_K",
        32 => "BF16",
        _ => return None,
    })
}

fn dominant_type(header: &Header) -> String {
    let mut bytes = BTreeMap::<&str, u64>::new();
    for tensor in &header.tensors {
        *bytes.entry(tensor.ggml_type.name()).or_default() += tensor.bytes;
    }
    let top = bytes.into_iter().max_by_key(|(_, total)| *total);
    top.map_or_else(|| "-".to_string(), |(name, _)| name.to_string())
}

/// What llama-bench's model column says: `llama 135M Q4_1`.
pub fn model_label(architecture: &str, parameters: u64, quantization: &str) -> String {
    let size = match parameters {
        p if p >= 1_000_000_000 => format!("{:.1}B", p as f64 / 1e9),
        p => format!("{:.0}M", p as f64 / 1e6),
    };
    format!("{architecture} {size} {quantization}")
}

fn tensor_row(tensor: &TensorInfo) -> TensorRow {
    TensorRow {
        name: tensor.name.clone(),
        ggml_type: tensor.ggml_type.name().to_string(),
        shape: tensor.shape.clone(),
        offset: tensor.offset,
        bytes: tensor.bytes,
        supported: ENGINE_SUPPORTED.contains(&tensor.ggml_type),
    }
}

fn type_histogram(tensors: &[TensorRow]) -> BTreeMap<String, TypeTotal> {
    let mut histogram = BTreeMap::<String, TypeTotal>::new();
    for tensor in tensors {
        let total = histogram.entry(tensor.ggml_type.clone()).or_default();
        total.count += 1;
        total.bytes += tensor.bytes;
    }
    histogram
}

/// The human-readable report: summary and type histogram, and the tensor table when asked
/// for (it is hundreds of lines).
pub fn render_text(info: &ModelInfo, with_tensors: bool) -> String {
    let mut out = String::new();
    render_summary(&mut out, info);
    render_histogram(&mut out, info);
    if with_tensors {
        render_tensors(&mut out, info);
    } else {
        let _ = writeln!(out, "\n(--tensors lists the {} tensors)", info.tensor_count);
    }
    out
}

fn or_dash<T: ToString>(value: Option<T>) -> String {
    value.map_or_else(|| "-".to_string(), |v| v.to_string())
}

fn render_summary(out: &mut String, info: &ModelInfo) {
    let h = &info.hyper;
    let rows = [
        ("source", info.source.clone()),
        ("name", or_dash(info.name.as_deref())),
        (
            "model",
            model_label(&info.architecture, info.parameters, &info.quantization),
        ),
        ("architecture", info.architecture.clone()),
        (
            "arch supported",
            yes_no(info.architecture_supported).to_string(),
        ),
        ("parameters", info.parameters.to_string()),
        ("quantization", info.quantization.clone()),
        ("gguf version", info.gguf_version.to_string()),
        ("file bytes", or_dash(info.file_bytes)),
        ("block_count", or_dash(h.block_count)),
        ("embedding_length", or_dash(h.embedding_length)),
        ("feed_forward_length", or_dash(h.feed_forward_length)),
        ("head_count", or_dash(h.head_count)),
        ("head_count_kv", or_dash(h.head_count_kv)),
        ("context_length", or_dash(h.context_length)),
        ("rope freq base", or_dash(h.rope_freq_base)),
        ("rms eps", or_dash(h.rms_eps)),
        ("tokenizer", or_dash(info.tokenizer.as_deref())),
        ("vocab size", or_dash(info.vocab_size)),
        ("chat template", yes_no(info.chat_template).to_string()),
        ("metadata keys", info.metadata_count.to_string()),
        ("header bytes", info.header_bytes.to_string()),
        ("tensors", info.tensor_count.to_string()),
        ("weight bytes", info.weight_bytes.to_string()),
        ("unsupported", info.unsupported_tensor_count.to_string()),
        (
            "fetched",
            format!("{} bytes in {} requests", info.bytes_fetched, info.requests),
        ),
    ];
    for (label, value) in rows {
        let _ = writeln!(out, "{label:<20} {value}");
    }
}

fn render_histogram(out: &mut String, info: &ModelInfo) {
    let _ = writeln!(out, "\n{:<8} {:>7} {:>14}", "type", "tensors", "bytes");
    for (name, total) in &info.type_histogram {
        let _ = writeln!(out, "{name:<8} {:>7} {:>14}", total.count, total.bytes);
    }
}

fn render_tensors(out: &mut String, info: &ModelInfo) {
    let width = info.tensors.iter().map(|t| t.name.len()).max().unwrap_or(4);
    let _ = writeln!(
        out,
        "\n{:<width$} {:<6} {:<22} {:>12} {:>12} supported",
        "name", "type", "shape", "offset", "bytes"
    );
    for t in &info.tensors {
        let shape = format!("{:?}", t.shape);
        let _ = writeln!(
            out,
            "{:<width$} {:<6} {:<22} {:>12} {:>12} {}",
            t.name,
            t.ggml_type,
            shape,
            t.offset,
            t.bytes,
            yes_no(t.supported)
        );
    }
}

fn yes_no(flag: bool) -> &'static str {
    if flag {
        "yes"
    } else {
        "no"
    }
}
