//! `GET /models/index.json`: what `runner serve`'s models folder holds, read from each GGUF
//! header (architecture, size, quant, context, parameters, memory needed), so the chat page
//! lists the served models without a hard-coded list and says whether one fits before
//! downloading it.
//!
//! Only headers are read (`info::inspect`, bounded by the crate's reader), each file once per
//! (size, modification time): the index is cheap to ask for again.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use axum::extract::State;
use axum::routing::get;
use axum::{Json, Router};
use serde::Serialize;

use crate::info::{inspect, ModelInfo};

/// The served path of the index.
pub const INDEX_PATH: &str = "/models/index.json";
/// More files than this are left out (and `truncated` says so): the folder is untrusted input.
const MAX_ENTRIES: usize = 256;
/// The context the memory estimate assumes when the model's own is longer (the page's default).
const ESTIMATE_CONTEXT: u64 = 4096;
/// The engine keeps K and V in f32.
const KV_BYTES_PER_VALUE: u64 = 4;

/// One model of the index; `error` instead of the header fields when the file is not a
/// readable GGUF.
#[derive(Debug, Clone, Serialize)]
pub struct CatalogEntry {
    pub file: String,
    pub url: String,
    pub size_bytes: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub architecture: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quant: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub context_length: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parameters: Option<u64>,
    /// The largest tensor: it must fit one storage buffer binding.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub largest_tensor_bytes: Option<u64>,
    /// Weights plus the KV cache at `estimate_context` tokens.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub estimate_context: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct CatalogIndex {
    pub models: Vec<CatalogEntry>,
    pub truncated: bool,
}

type Stamp = (u64, Option<SystemTime>);

/// Entries by path, valid while the file's size and modification time are unchanged.
#[derive(Clone, Default)]
struct Cache(Arc<Mutex<HashMap<PathBuf, (Stamp, CatalogEntry)>>>);

#[derive(Clone)]
struct CatalogState {
    dir: PathBuf,
    cache: Cache,
}

/// The index route for the models folder `dir`.
pub fn catalog_routes(dir: &Path) -> Router {
    let state = CatalogState {
        dir: dir.to_path_buf(),
        cache: Cache::default(),
    };
    Router::new()
        .route(INDEX_PATH, get(index))
        .with_state(state)
}

async fn index(State(state): State<CatalogState>) -> Json<CatalogIndex> {
    Json(build_index(&state.dir, &state.cache).await)
}

async fn build_index(dir: &Path, cache: &Cache) -> CatalogIndex {
    let (files, truncated) = gguf_files(dir);
    let mut models = Vec::with_capacity(files.len());
    for (path, stamp) in files {
        models.push(cached_entry(&path, stamp, cache).await);
    }
    CatalogIndex { models, truncated }
}

/// `*.gguf` files directly in `dir`, by name, at most MAX_ENTRIES.
fn gguf_files(dir: &Path) -> (Vec<(PathBuf, Stamp)>, bool) {
    let Ok(read) = std::fs::read_dir(dir) else {
        return (Vec::new(), false);
    };
    let mut files: Vec<(PathBuf, Stamp)> = read
        .filter_map(Result::ok)
        .filter(|e| e.path().extension().is_some_and(|x| x == "gguf"))
        .filter_map(|e| {
            let meta = e.metadata().ok().filter(|m| m.is_file())?;
            Some((e.path(), (meta.len(), meta.modified().ok())))
        })
        .collect();
    files.sort_by(|a, b| a.0.cmp(&b.0));
    let truncated = files.len() > MAX_ENTRIES;
    files.truncate(MAX_ENTRIES);
    (files, truncated)
}

async fn cached_entry(path: &Path, stamp: Stamp, cache: &Cache) -> CatalogEntry {
    if let Some((seen, entry)) = cache.0.lock().ok().and_then(|c| c.get(path).cloned()) {
        if seen == stamp {
            return entry;
        }
    }
    let entry = read_entry(path, stamp.0).await;
    if let Ok(mut map) = cache.0.lock() {
        map.insert(path.to_path_buf(), (stamp, entry.clone()));
    }
    entry
}

async fn read_entry(path: &Path, size_bytes: u64) -> CatalogEntry {
    let file = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut entry = CatalogEntry {
        url: format!("/models/{file}"),
        file,
        size_bytes,
        name: None,
        architecture: None,
        quant: None,
        context_length: None,
        parameters: None,
        largest_tensor_bytes: None,
        memory_bytes: None,
        estimate_context: None,
        error: None,
    };
    match inspect(&path.to_string_lossy()).await {
        Ok(info) => fill_entry(&mut entry, &info),
        Err(err) => entry.error = Some(err.to_string()),
    }
    entry
}

fn fill_entry(entry: &mut CatalogEntry, info: &ModelInfo) {
    let context = info.hyper.context_length.map(|c| c.min(ESTIMATE_CONTEXT));
    entry.name = info.name.clone();
    entry.architecture = Some(info.architecture.clone());
    entry.quant = Some(info.quantization.clone());
    entry.context_length = info.hyper.context_length;
    entry.parameters = Some(info.parameters);
    entry.largest_tensor_bytes = info.tensors.iter().map(|t| t.bytes).max();
    entry.memory_bytes = Some(info.weight_bytes + context.map_or(0, |c| kv_cache_bytes(info, c)));
    entry.estimate_context = context;
}

/// K and V for every layer: `2 * layers * context * kv_heads * head_dim` values.
fn kv_cache_bytes(info: &ModelInfo, context: u64) -> u64 {
    let hyper = &info.hyper;
    let (Some(layers), Some(embd), Some(heads)) =
        (hyper.block_count, hyper.embedding_length, hyper.head_count)
    else {
        return 0;
    };
    let kv_heads = hyper.head_count_kv.unwrap_or(heads);
    let head_dim = embd / heads.max(1);
    2 * layers * context * kv_heads * head_dim * KV_BYTES_PER_VALUE
}
