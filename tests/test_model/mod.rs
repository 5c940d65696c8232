//! Writes llama-shaped GGUF test models of any size, byte for byte the same anywhere: the real
//! SmolLM2 tokenizer and chat template (copied from a SmolLM2 GGUF's metadata), random finite
//! weights in real quant types from a fixed seed, one file or the `gguf-split` form.
//!
//! Shared by `examples/test_model.rs` (the command line), `tests/big_model.rs` and
//! `native-runner/tests/fleet.rs` (CI).
//! Each tensor's bytes come from its own generator seeded by (seed, tensor name), so the split
//! form holds exactly the single file's tensors. The generator is SplitMix64, written out here
//! because its stream is fixed by its definition (a crate's could change between versions).

#![allow(dead_code)]

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use webshard::gguf::{GgmlType, Metadata, Value};

/// The model's shape and types.
#[derive(Debug, Clone)]
pub struct Shape {
    pub hidden: u64,
    pub ffn: u64,
    pub heads: u64,
    pub kv_heads: u64,
    pub layers: u64,
    pub embedding: GgmlType,
    /// One type for every layer matrix instead of the mix (`None`: the mix).
    pub matrices: Option<GgmlType>,
    pub seed: u64,
}

impl Shape {
    /// A TinyLlama-like shape (hidden 2048, ffn 5632, 32 heads, 4 KV heads) with as many layers
    /// as make the file at least `mib` MiB.
    pub fn llama_of_size(mib: u64, seed: u64) -> Shape {
        let mut shape = Shape {
            hidden: 2048,
            ffn: 5632,
            heads: 32,
            kv_heads: 4,
            layers: 1,
            embedding: GgmlType::Q8_0,
            matrices: None,
            seed,
        };
        shape.layers = shape.layers_for(mib << 20);
        shape
    }

    /// Layers needed for the tensors to reach `bytes`.
    pub fn layers_for(&self, bytes: u64) -> u64 {
        let fixed = self.tensor_bytes(&self.fixed_tensors());
        let layer = self.tensor_bytes(&self.layer_tensors(0));
        bytes.saturating_sub(fixed).div_ceil(layer).max(1)
    }

    fn kv_dim(&self) -> u64 {
        self.hidden / self.heads * self.kv_heads
    }

    fn fixed_tensors(&self) -> Vec<TensorSpec> {
        let d = self.hidden;
        vec![
            spec("token_embd.weight", &[d, VOCAB], self.embedding),
            spec("output_norm.weight", &[d], GgmlType::F32),
            spec("output.weight", &[d, VOCAB], GgmlType::Q6_K),
        ]
    }

    /// The real quant types, several per layer, as llama.cpp's mixes use them.
    fn layer_tensors(&self, layer: u64) -> Vec<TensorSpec> {
        let (d, ff, kv) = (self.hidden, self.ffn, self.kv_dim());
        let name = |t: &str| format!("blk.{layer}.{t}.weight");
        let matrix = |mixed: GgmlType| self.matrices.unwrap_or(mixed);
        vec![
            spec(&name("attn_norm"), &[d], GgmlType::F32),
            spec(&name("attn_q"), &[d, d], matrix(GgmlType::Q4_K)),
            spec(&name("attn_k"), &[d, kv], matrix(GgmlType::Q4_1)),
            spec(&name("attn_v"), &[d, kv], matrix(GgmlType::Q8_0)),
            spec(&name("attn_output"), &[d, d], matrix(GgmlType::Q4_K)),
            spec(&name("ffn_norm"), &[d], GgmlType::F32),
            spec(&name("ffn_gate"), &[d, ff], matrix(GgmlType::Q4_K)),
            spec(&name("ffn_up"), &[d, ff], matrix(GgmlType::Q4_1)),
            spec(&name("ffn_down"), &[ff, d], matrix(GgmlType::Q6_K)),
        ]
    }

    /// Every tensor in file order.
    pub fn tensors(&self) -> Vec<TensorSpec> {
        let mut all = self.fixed_tensors();
        for layer in 0..self.layers {
            all.extend(self.layer_tensors(layer));
        }
        all
    }

    fn tensor_bytes(&self, tensors: &[TensorSpec]) -> u64 {
        tensors
            .iter()
            .map(|t| t.bytes().next_multiple_of(ALIGNMENT))
            .sum()
    }

    /// The model's own keys (the tokenizer's come from SmolLM2).
    fn model_keys(&self) -> Vec<(String, Value)> {
        let key = |k: &str| format!("llama.{k}");
        let size_mib = self.tensor_bytes(&self.tensors()) >> 20;
        vec![
            ("general.architecture".into(), Value::String("llama".into())),
            (
                "general.name".into(),
                Value::String(format!(
                    "webshard test model {size_mib} MiB seed {}",
                    self.seed
                )),
            ),
            (key("context_length"), Value::U32(8192)),
            (key("embedding_length"), Value::U32(self.hidden as u32)),
            (key("block_count"), Value::U32(self.layers as u32)),
            (key("feed_forward_length"), Value::U32(self.ffn as u32)),
            (key("attention.head_count"), Value::U32(self.heads as u32)),
            (
                key("attention.head_count_kv"),
                Value::U32(self.kv_heads as u32),
            ),
            (
                key("rope.dimension_count"),
                Value::U32((self.hidden / self.heads) as u32),
            ),
            (key("rope.freq_base"), Value::F32(10_000.0)),
            (key("attention.layer_norm_rms_epsilon"), Value::F32(1e-5)),
            (key("vocab_size"), Value::U32(VOCAB as u32)),
        ]
    }
}

/// The types `set_scales` can write for a layer matrix (`Shape::matrices`).
pub const MATRIX_TYPES: [GgmlType; 6] = [
    GgmlType::F32,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q8_0,
    GgmlType::Q4_K,
    GgmlType::Q6_K,
];

/// SmolLM2's vocabulary size.
pub const VOCAB: u64 = 49_152;
const ALIGNMENT: u64 = 32;

#[derive(Debug, Clone)]
pub struct TensorSpec {
    pub name: String,
    pub dims: Vec<u64>,
    pub ggml_type: GgmlType,
}

fn spec(name: &str, dims: &[u64], ggml_type: GgmlType) -> TensorSpec {
    TensorSpec {
        name: name.into(),
        dims: dims.to_vec(),
        ggml_type,
    }
}

impl TensorSpec {
    pub fn bytes(&self) -> u64 {
        let n: u64 = self.dims.iter().product();
        n / self.ggml_type.block_size() * self.ggml_type.type_size()
    }
}

/// The tokenizer and chat template keys of a SmolLM2 GGUF, in file order.
pub fn tokenizer_keys(smollm2: &Metadata) -> Vec<(String, Value)> {
    smollm2
        .iter()
        .filter(|(k, _)| k.starts_with("tokenizer."))
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect()
}

/// Writes the model as one file at `path`; returns its size.
pub fn write_single(
    shape: &Shape,
    tokenizer: &[(String, Value)],
    path: &Path,
) -> std::io::Result<u64> {
    let mut keys = shape.model_keys();
    keys.extend_from_slice(tokenizer);
    write_part(shape, &keys, &shape.tensors(), path)
}

/// Writes the model as `parts` files named as `gguf-split` names them (`STEM-00001-of-0000N.gguf`
/// next to `stem`), with its keys: all metadata and `split.*` in the first part, only `split.*`
/// in the others, tensors in file order, about as many per part. Returns the paths.
pub fn write_split(
    shape: &Shape,
    tokenizer: &[(String, Value)],
    stem: &Path,
    parts: u16,
) -> std::io::Result<Vec<PathBuf>> {
    let tensors = shape.tensors();
    let groups = group_by_count(&tensors, parts);
    let count = groups.len() as u16;
    let mut paths = Vec::new();
    for (index, group) in groups.iter().enumerate() {
        let mut keys = match index {
            0 => {
                let mut keys = shape.model_keys();
                keys.extend_from_slice(tokenizer);
                keys
            }
            _ => Vec::new(),
        };
        keys.push(("split.no".into(), Value::U16(index as u16)));
        keys.push(("split.count".into(), Value::U16(count)));
        keys.push((
            "split.tensors.count".into(),
            Value::I32(tensors.len() as i32),
        ));
        let name = format!(
            "{}-{:05}-of-{count:05}.gguf",
            stem.file_name().unwrap_or_default().to_string_lossy(),
            index + 1
        );
        let path = stem.with_file_name(name);
        write_part(shape, &keys, group, &path)?;
        paths.push(path);
    }
    Ok(paths)
}

/// `parts` consecutive groups of about the same number of tensors, as `gguf-split
/// --split-max-tensors` makes them.
fn group_by_count(tensors: &[TensorSpec], parts: u16) -> Vec<Vec<TensorSpec>> {
    let per_part = tensors.len().div_ceil(usize::from(parts.max(1)));
    tensors
        .chunks(per_part.max(1))
        .map(<[TensorSpec]>::to_vec)
        .collect()
}

fn write_part(
    shape: &Shape,
    keys: &[(String, Value)],
    tensors: &[TensorSpec],
    path: &Path,
) -> std::io::Result<u64> {
    let mut out = BufWriter::with_capacity(8 << 20, File::create(path)?);
    let mut header = Vec::new();
    header.extend_from_slice(b"GGUF");
    header.extend_from_slice(&3u32.to_le_bytes());
    header.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    header.extend_from_slice(&(keys.len() as u64).to_le_bytes());
    for (key, value) in keys {
        put_string(&mut header, key);
        header.extend_from_slice(&type_id(value).to_le_bytes());
        put_value(&mut header, value);
    }
    let mut offset = 0u64;
    for tensor in tensors {
        put_string(&mut header, &tensor.name);
        header.extend_from_slice(&(tensor.dims.len() as u32).to_le_bytes());
        for d in &tensor.dims {
            header.extend_from_slice(&d.to_le_bytes());
        }
        header.extend_from_slice(&tensor.ggml_type.id().to_le_bytes());
        header.extend_from_slice(&offset.to_le_bytes());
        offset += tensor.bytes().next_multiple_of(ALIGNMENT);
    }
    header.resize(
        (header.len() as u64).next_multiple_of(ALIGNMENT) as usize,
        0,
    );
    out.write_all(&header)?;
    for tensor in tensors {
        write_weights(&mut out, tensor, shape.seed)?;
        let pad = tensor.bytes().next_multiple_of(ALIGNMENT) - tensor.bytes();
        out.write_all(&vec![0; pad as usize])?;
    }
    out.flush()?;
    Ok(header.len() as u64 + offset)
}

fn put_string(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn type_id(value: &Value) -> u32 {
    match value {
        Value::U8(_) => 0,
        Value::I8(_) => 1,
        Value::U16(_) => 2,
        Value::I16(_) => 3,
        Value::U32(_) => 4,
        Value::I32(_) => 5,
        Value::F32(_) => 6,
        Value::Bool(_) => 7,
        Value::String(_) => 8,
        Value::Array(_) => 9,
        Value::U64(_) => 10,
        Value::I64(_) => 11,
        Value::F64(_) => 12,
    }
}

fn put_value(out: &mut Vec<u8>, value: &Value) {
    match value {
        Value::U8(v) => out.push(*v),
        Value::I8(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::U16(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::I16(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::U32(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::I32(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::U64(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::I64(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::F32(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::F64(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::Bool(v) => out.push(u8::from(*v)),
        Value::String(s) => put_string(out, s),
        Value::Array(items) => {
            // An empty array's element type is lost on parsing; u8 reads back the same.
            let element = items.first().map_or(0, type_id);
            out.extend_from_slice(&element.to_le_bytes());
            out.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for item in items {
                put_value(out, item);
            }
        }
    }
}

/// SplitMix64 (Steele, Lea, Flood 2014).
struct SplitMix64(u64);

impl SplitMix64 {
    fn new(seed: u64, name: &str) -> SplitMix64 {
        // FNV-1a of the name, so each tensor has its own stream.
        let hash = name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
        });
        SplitMix64(seed ^ hash)
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32
    }

    fn fill(&mut self, out: &mut [u8]) {
        for chunk in out.chunks_mut(8) {
            let word = self.next().to_le_bytes();
            chunk.copy_from_slice(&word[..chunk.len()]);
        }
    }
}

fn f16_bytes(v: f32) -> [u8; 2] {
    half::f16::from_f32(v).to_le_bytes()
}

/// Random blocks of `tensor`'s type with finite scales sized so a row's dot product with a
/// normalised input stays near 1 (so activations stay finite through any number of layers).
fn write_weights(out: &mut impl Write, tensor: &TensorSpec, seed: u64) -> std::io::Result<()> {
    let mut rng = SplitMix64::new(seed, &tensor.name);
    let cols = tensor.dims[0] as f32;
    let unit = 1.0 / cols.sqrt();
    let ty = tensor.ggml_type;
    let block_bytes = ty.type_size() as usize;
    let blocks_per_write = (1 << 20) / block_bytes;
    let mut blocks = tensor.bytes() / ty.type_size();
    let mut buf = vec![0u8; blocks_per_write * block_bytes];
    while blocks > 0 {
        let n = blocks.min(blocks_per_write as u64) as usize;
        let buf = &mut buf[..n * block_bytes];
        rng.fill(buf);
        for block in buf.chunks_exact_mut(block_bytes) {
            set_scales(ty, block, unit, tensor.dims.len() == 1, &mut rng);
        }
        out.write_all(buf)?;
        blocks -= n as u64;
    }
    Ok(())
}

/// Overwrites the random bytes that hold a block's scales (or an f32 value) with finite ones.
fn set_scales(ty: GgmlType, block: &mut [u8], unit: f32, norm: bool, rng: &mut SplitMix64) {
    let scale = |rng: &mut SplitMix64, of: f32| unit * (0.5 + rng.unit()) / of;
    match ty {
        // Norm weights near 1, matrices (embeddings) around 0.
        GgmlType::F32 if norm => block.copy_from_slice(&(0.8 + 0.4 * rng.unit()).to_le_bytes()),
        GgmlType::F32 => block.copy_from_slice(&(unit * (2.0 * rng.unit() - 1.0)).to_le_bytes()),
        GgmlType::Q8_0 => block[..2].copy_from_slice(&f16_bytes(scale(rng, 64.0))),
        GgmlType::Q4_0 => block[..2].copy_from_slice(&f16_bytes(scale(rng, 8.0))),
        GgmlType::Q4_1 => {
            let d = scale(rng, 8.0);
            block[..2].copy_from_slice(&f16_bytes(d));
            block[2..4].copy_from_slice(&f16_bytes(-7.5 * d));
        }
        GgmlType::Q4_K => {
            block[..2].copy_from_slice(&f16_bytes(scale(rng, 8.0 * 32.0)));
            block[2..4].copy_from_slice(&f16_bytes(scale(rng, 16.0 * 32.0)));
        }
        GgmlType::Q6_K => block[208..210].copy_from_slice(&f16_bytes(scale(rng, 32.0 * 64.0))),
        other => unreachable!("no generator for {other}"),
    }
}
