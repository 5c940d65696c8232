//! The `EmbeddingModel` class JavaScript sees: load an embedding GGUF (an encoder such as
//! `bert`/`nomic-bert`, or a causal decoder whose hidden states are pooled) into WebGPU, then
//! embed texts or token ids. It runs `embed::Embedder`, the code `runner embed` and
//! `/v1/embeddings` run natively; `web/openai.js` gives it OpenAI's `embeddings.create` shape.

use std::cell::Cell;
use std::rc::Rc;

use wasm_bindgen::prelude::*;

use super::engine::{open_gpu, progress_event, to_js, watch_device, GpuErrors, LoadHooks};
use super::error::WebError;
use super::options::{self, LoadSettings};
use super::source::{open_model_source, Abortable};
use crate::embed::{EmbedOptions, Embedder};
use crate::model::LoadProgress;

/// Most inputs one `embed` call takes (OpenAI's own limit per request).
const MAX_INPUTS: usize = 2048;

/// What a page shows about a loaded embedding model.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct EmbedderInfo {
    url: String,
    adapter: String,
    backend: String,
    variant: String,
    f16: bool,
    subgroups: bool,
    arch: String,
    /// Length of every embedding.
    dimensions: usize,
    vocab: u32,
    /// Most tokens one input may have, special tokens included.
    max_context: u32,
    /// `mean`, `cls` or `last`: how token states become one vector.
    pooling: &'static str,
    load_seconds: f64,
    network_requests: u64,
    network_bytes: u64,
}

/// A loaded embedding model on a WebGPU device.
#[wasm_bindgen(js_name = EmbeddingModel)]
pub struct WebEmbedder {
    embedder: Rc<Embedder>,
    disposed: Rc<Cell<bool>>,
    busy: Rc<Cell<bool>>,
    gpu_errors: GpuErrors,
    info: EmbedderInfo,
}

/// One input: a text (tokenized with the model's special tokens) or token ids.
#[derive(serde::Deserialize)]
#[serde(untagged)]
enum EmbedInput {
    Text(String),
    Ids(Vec<u32>),
}

/// What `embed` resolves to: one L2-normalised vector per input, and the tokens counted.
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct EmbedResult {
    embeddings: Vec<Vec<f32>>,
    prompt_tokens: usize,
}

#[wasm_bindgen(js_class = EmbeddingModel)]
impl WebEmbedder {
    /// `EmbeddingModel.load(url, options)`, with `Engine.load`'s options (`maxContext` bounds
    /// a pooled decoder's inputs).
    pub async fn load(url: String, options: JsValue) -> Result<WebEmbedder, JsValue> {
        Ok(Self::load_inner(url, options).await?)
    }

    async fn load_inner(url: String, options: JsValue) -> Result<WebEmbedder, WebError> {
        let settings: LoadSettings = options::parse(&options, "load options")?;
        let hooks = LoadHooks::read(&options);
        let gpu = open_gpu(settings.disable_f16, settings.disable_subgroups).await?;
        let disposed = Rc::new(Cell::new(false));
        watch_device(&gpu, hooks.on_device_lost.clone(), disposed.clone());
        let gpu_errors = GpuErrors::watch(&gpu);
        let started = web_time::Instant::now();
        let source = open_model_source(&url, settings.cache, hooks.signal.clone()).await?;
        let abortable = Abortable::new(source.as_range_source(), hooks.signal.clone());
        let mut on_progress = |p: LoadProgress<'_>| {
            if let Some(callback) = &hooks.on_progress {
                let event = progress_event(&p, started.elapsed().as_secs_f64());
                let _ = callback.call1(&JsValue::NULL, &event);
            }
        };
        let embedder = Embedder::load(
            gpu.clone(),
            &abortable,
            settings.max_context,
            &mut on_progress,
        )
        .await
        .map_err(|e| abortable.explain(e.into()))?;
        gpu_errors.check()?;
        let network = source.network_stats();
        let info = EmbedderInfo {
            url,
            adapter: gpu.caps.adapter.clone(),
            backend: gpu.caps.backend.clone(),
            variant: gpu.variant().to_string(),
            f16: gpu.caps.f16,
            subgroups: gpu.caps.subgroups,
            arch: embedder.architecture().to_string(),
            dimensions: embedder.dimensions(),
            vocab: embedder.vocab(),
            max_context: embedder.context_length(),
            pooling: embedder.default_pooling()?.name(),
            load_seconds: started.elapsed().as_secs_f64(),
            network_requests: network.requests,
            network_bytes: network.bytes_fetched,
        };
        Ok(WebEmbedder {
            embedder: Rc::new(embedder),
            disposed,
            busy: Rc::new(Cell::new(false)),
            gpu_errors,
            info,
        })
    }

    /// The model, device and load statistics (see `EmbedderInfo`).
    pub fn info(&self) -> Result<JsValue, JsValue> {
        to_js(&self.info)
    }

    /// Token ids of `text` as they are embedded (the model's special tokens added).
    pub fn tokenize(&self, text: &str) -> Vec<u32> {
        self.embedder.tokenize(text)
    }

    /// Embeds `inputs` (a list of strings or of token-id lists) with the model's pooling,
    /// L2-normalised as OpenAI's and `/v1/embeddings`' vectors are. Resolves to
    /// `{ embeddings, promptTokens }`; an input that cannot fit rejects naming its index.
    pub fn embed(&self, inputs: JsValue) -> js_sys::Promise {
        let embedder = self.embedder.clone();
        let busy = self.busy.clone();
        let gpu_errors = self.gpu_errors.clone();
        wasm_bindgen_futures::future_to_promise(async move {
            let inputs = token_inputs(&embedder, inputs)?;
            if busy.replace(true) {
                return Err(WebError::Busy.into());
            }
            let options = EmbedOptions {
                pooling: None,
                normalize: true,
            };
            let embedded = embedder.embed_ids(&inputs, options).await;
            busy.set(false);
            let embeddings = embedded.map_err(WebError::from)?;
            gpu_errors.check()?;
            let prompt_tokens = inputs.iter().map(Vec::len).sum();
            to_js(&EmbedResult {
                embeddings,
                prompt_tokens,
            })
        })
    }
}

impl Drop for WebEmbedder {
    fn drop(&mut self) {
        self.disposed.set(true);
    }
}

/// Token ids of every input, texts tokenized; a bad list is an `options` error.
fn token_inputs(embedder: &Embedder, inputs: JsValue) -> Result<Vec<Vec<u32>>, WebError> {
    let inputs: Vec<EmbedInput> = serde_wasm_bindgen::from_value(inputs).map_err(|e| {
        WebError::Options(format!(
            "input: must be a list of strings or of token-id lists ({e})"
        ))
    })?;
    if inputs.is_empty() || inputs.len() > MAX_INPUTS {
        return Err(WebError::Options(format!(
            "input: has {} items; it must have 1 to {MAX_INPUTS}",
            inputs.len()
        )));
    }
    Ok(inputs
        .into_iter()
        .map(|input| match input {
            EmbedInput::Text(text) => embedder.tokenize(&text),
            EmbedInput::Ids(ids) => ids,
        })
        .collect())
}
