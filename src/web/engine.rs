//! The `Engine` class JavaScript sees: load a GGUF URL into WebGPU, then generate and chat
//! with streamed text. Meant to run inside a Web Worker (see `web/worker.js`); nothing here
//! blocks, so the worker stays responsive to `abort()` between tokens.

use std::cell::{Cell, RefCell};
use std::ops::ControlFlow;
use std::rc::Rc;
use std::sync::Arc;

use js_sys::{Function, Reflect};
use wasm_bindgen::prelude::*;
use web_sys::AbortSignal;

use super::error::WebError;
use super::options::{self, GenerateSettings, LoadSettings};
use super::source::{open_model_source, Abortable, ModelSource};
use crate::engine::{Engine, EngineOptions};
use crate::front::{
    FinishReason, GenerateRequest, Generated, Generator, Prompt, TokenEvent, Usage,
};
use crate::gpu::{BackendChoice, Gpu, GpuError, GpuOptions};
use crate::model::LoadProgress;
use crate::tokenizer::{ChatMessage, ToolSupport};

/// What a page shows about a loaded model and the device it runs on.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct EngineInfo {
    url: String,
    adapter: String,
    backend: String,
    /// Kernel variant in use, e.g. `f32+subgroups`.
    variant: String,
    f16: bool,
    subgroups: bool,
    arch: String,
    n_layers: u32,
    vocab: u32,
    max_context: u32,
    bytes_total: u64,
    load_seconds: f64,
    /// Range requests and bytes that went over the network.
    network_requests: u64,
    network_bytes: u64,
    cache: Option<super::cache::CacheStats>,
    /// Loaded from the cache with the server unreachable.
    offline: bool,
    wasm_memory_bytes: f64,
    /// How the chat template shows tools: `hermes` (calls in `<tool_call>` tags, which the
    /// page can constrain and read), `none` or `other`.
    tool_support: &'static str,
    /// Seconds the load spent compiling the generation's kernels (`WebEngine::warm_up`), or
    /// null where it did not.
    warm_up_seconds: Option<f64>,
}

/// The throwaway generation of `WebEngine::warm_up`: a prompt of several tokens (a batched
/// prefill) and two decoded tokens (the decode step and its sampling).
const WARM_UP_PROMPT: &str = "The quick brown fox jumps over the lazy dog.";
const WARM_UP_TOKENS: u32 = 2;

/// A loaded model on a WebGPU device.
#[wasm_bindgen(js_name = Engine)]
pub struct WebEngine {
    engine: Rc<RefCell<Engine>>,
    gpu: Arc<Gpu>,
    stop: Rc<Cell<bool>>,
    disposed: Rc<Cell<bool>>,
    gpu_errors: GpuErrors,
    info: EngineInfo,
}

/// The first WebGPU error nobody caught (a kernel the browser rejects, an out-of-memory...).
/// Browsers only log these, and the work they spoil reads back as zeros, so every load and
/// generation checks here and fails with the browser's message instead of producing garbage.
#[derive(Clone, Default)]
pub(super) struct GpuErrors(Arc<std::sync::Mutex<Option<String>>>);

impl GpuErrors {
    pub(super) fn watch(gpu: &Gpu) -> GpuErrors {
        let errors = GpuErrors::default();
        let slot = errors.0.clone();
        gpu.device
            .on_uncaptured_error(Arc::new(move |err: wgpu::Error| {
                if let Ok(mut first) = slot.lock() {
                    first.get_or_insert_with(|| err.to_string());
                }
            }));
        errors
    }

    pub(super) fn check(&self) -> Result<(), WebError> {
        match self.0.lock().ok().and_then(|first| first.clone()) {
            Some(message) => Err(WebError::Validation(message)),
            None => Ok(()),
        }
    }
}

/// The callback and signal members of `Engine.load`'s options.
pub(super) struct LoadHooks {
    pub(super) on_progress: Option<Function>,
    pub(super) on_device_lost: Option<Function>,
    pub(super) signal: Option<AbortSignal>,
}

pub(super) fn member<T: JsCast>(options: &JsValue, name: &str) -> Option<T> {
    if !options.is_object() {
        return None;
    }
    Reflect::get(options, &name.into())
        .ok()?
        .dyn_into::<T>()
        .ok()
}

impl LoadHooks {
    pub(super) fn read(options: &JsValue) -> LoadHooks {
        LoadHooks {
            on_progress: member(options, "onProgress"),
            on_device_lost: member(options, "onDeviceLost"),
            signal: member(options, "signal"),
        }
    }
}

/// `{ bytesDone, bytesTotal, mbPerSec, tensor }` for `onProgress`.
pub(super) fn progress_event(p: &LoadProgress<'_>, seconds: f64) -> JsValue {
    let event = js_sys::Object::new();
    let mb_per_sec = if seconds > 0.0 {
        p.bytes_done as f64 / 1e6 / seconds
    } else {
        0.0
    };
    for (key, value) in [
        ("bytesDone", JsValue::from_f64(p.bytes_done as f64)),
        ("bytesTotal", JsValue::from_f64(p.bytes_total as f64)),
        ("mbPerSec", JsValue::from_f64(mb_per_sec)),
        ("tensor", JsValue::from_str(p.tensor)),
    ] {
        let _ = Reflect::set(&event, &key.into(), &value);
    }
    event.into()
}

/// Bytes of this module's linear memory (it only grows, so after a load it is the peak).
#[wasm_bindgen(js_name = wasmMemoryBytes)]
pub fn wasm_memory_bytes() -> f64 {
    wasm_bindgen::memory()
        .dyn_into::<js_sys::WebAssembly::Memory>()
        .ok()
        .and_then(|m| m.buffer().dyn_into::<js_sys::ArrayBuffer>().ok())
        .map_or(0.0, |b| f64::from(b.byte_length()))
}

/// A WebGPU device, with f16 or subgroup kernels turned off on request.
pub(super) async fn open_gpu(
    disable_f16: bool,
    disable_subgroups: bool,
) -> Result<Arc<Gpu>, WebError> {
    let navigator = Reflect::get(&js_sys::global(), &"navigator".into()).unwrap_or_default();
    let has_gpu = Reflect::get(&navigator, &"gpu".into()).is_ok_and(|g| g.is_object());
    if !has_gpu {
        return Err(WebError::NoWebGpu("navigator.gpu is missing".into()));
    }
    let options = GpuOptions {
        backend: BackendChoice::BrowserWebGpu,
        disable_f16,
        disable_subgroups,
        max_binding_override: None,
        gpu_work_split: false,
        matvec_split: None,
        matvec_batch_split: None,
        matmul_tile: None,
        streamed_products: None,
        coop_k_splits: None,
        per_token_products: None,
        int8_products: None,
        int8_split: None,
        storage_bindings_limit: None,
    };
    Gpu::new(&options).await.map_err(|err| match err {
        GpuError::NoAdapter { .. } => {
            WebError::NoWebGpu("navigator.gpu.requestAdapter() found no adapter".into())
        }
        other => other.into(),
    })
}

/// Reports a lost device to `on_lost(reason, message)` unless the engine was freed on purpose.
/// wgpu wants a `Send` callback, so it only sends the news to a local task that holds the
/// JS function.
pub(super) fn watch_device(gpu: &Gpu, on_lost: Option<Function>, disposed: Rc<Cell<bool>>) {
    let Some(on_lost) = on_lost else { return };
    let (sender, receiver) = futures::channel::oneshot::channel::<(String, String)>();
    let sender = std::sync::Mutex::new(Some(sender));
    gpu.device.set_device_lost_callback(move |reason, message| {
        if let Some(sender) = sender.lock().ok().and_then(|mut s| s.take()) {
            let _ = sender.send((format!("{reason:?}"), message));
        }
    });
    wasm_bindgen_futures::spawn_local(async move {
        if let Ok((reason, message)) = receiver.await {
            if !disposed.get() {
                let _ = on_lost.call2(&JsValue::NULL, &reason.into(), &message.into());
            }
        }
    });
}

#[wasm_bindgen(js_class = Engine)]
impl WebEngine {
    /// `Engine.load(url, { onProgress, onDeviceLost, signal, cache, maxContext, chunkBytes,
    /// inFlight, disableF16, disableSubgroups, gpuMemMib, warmUp, decodeDepth })`.
    pub async fn load(url: String, options: JsValue) -> Result<WebEngine, JsValue> {
        let (mut engine, warm_up) = Self::load_inner(url, options).await?;
        if warm_up {
            engine.warm_up().await?;
        }
        Ok(engine)
    }

    /// Compiles the kernels a generation uses before the first request asks: WebGPU compiles a
    /// pipeline on its first use, so otherwise the first reply pays for them (on the H200 its
    /// decode ran at 0.17x the native runner's, a warm page's at 0.85x: docs/perf.md, session
    /// 19). A throwaway greedy generation, then the cache is forgotten.
    async fn warm_up(&mut self) -> Result<(), JsValue> {
        let started = web_time::Instant::now();
        let options = to_js(&serde_json::json!({ "n": WARM_UP_TOKENS, "temp": 0 }))?;
        let run = self.runner(options, None, None);
        run.generate(Prompt::Text(WARM_UP_PROMPT.to_string()))
            .await?;
        self.reset()?;
        self.info.warm_up_seconds = Some(started.elapsed().as_secs_f64());
        Ok(())
    }

    /// The engine, and whether to warm it up (`LoadSettings::warm_up`).
    async fn load_inner(url: String, options: JsValue) -> Result<(WebEngine, bool), WebError> {
        let settings: LoadSettings = options::parse(&options, "load options")?;
        let hooks = LoadHooks::read(&options);
        let engine_options = EngineOptions {
            max_context: settings.max_context,
            load: settings.load_options()?,
            gpu_budget_bytes: settings.gpu_mem_mib.map(|mib| mib.saturating_mul(1 << 20)),
        };
        let decode_depth = settings.checked_decode_depth()?;
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
        let mut engine = Engine::load(gpu.clone(), &abortable, &engine_options, &mut on_progress)
            .await
            .map_err(|e| abortable.explain(e.into()))?;
        engine.set_prefill_progress(Box::new(report_prefill));
        engine.set_decode_depth(decode_depth);
        gpu_errors.check()?;
        let info = engine_info(
            &url,
            &engine,
            &gpu,
            &source,
            started.elapsed().as_secs_f64(),
        );
        let warm_up = settings.warm_up.unwrap_or(!gpu.caps.cpu_work_split);
        let engine = WebEngine {
            engine: Rc::new(RefCell::new(engine)),
            gpu,
            stop: Rc::new(Cell::new(false)),
            disposed,
            gpu_errors,
            info,
        };
        Ok((engine, warm_up))
    }

    /// The model, device and load statistics (see `EngineInfo`).
    pub fn info(&self) -> Result<JsValue, JsValue> {
        let mut info = self.info.clone();
        info.wasm_memory_bytes = wasm_memory_bytes();
        to_js(&info)
    }

    /// Token ids of `text` as `runner generate` tokenizes a prompt.
    pub fn tokenize(&self, text: &str) -> Result<Vec<u32>, JsValue> {
        let engine = self.engine.try_borrow().map_err(|_| WebError::Busy)?;
        Ok(engine.tokenize_prompt(text))
    }

    /// Generates after `prompt`; `onToken(text)` gets each printable piece and
    /// `onPrefill(done, total)` the prompt tokens processed so far. Resolves to
    /// `{ promptIds, ids, text, prefillTokens, prefillSeconds, decodeSeconds, decodeTokS,
    /// aborted, finishReason, usage }`.
    pub fn generate(
        &self,
        prompt: String,
        options: JsValue,
        on_token: Option<Function>,
        on_prefill: Option<Function>,
    ) -> js_sys::Promise {
        let run = self.runner(options, on_token, on_prefill);
        wasm_bindgen_futures::future_to_promise(run.generate(Prompt::Text(prompt)))
    }

    /// Renders `messages` (`[{ role, content, tool_calls?, tool_call_id? }]`) with the
    /// model's chat template (with `options.tools` where given), then generates as
    /// `generate` does.
    pub fn chat(
        &self,
        messages: JsValue,
        options: JsValue,
        on_token: Option<Function>,
        on_prefill: Option<Function>,
    ) -> js_sys::Promise {
        let run = self.runner(options, on_token, on_prefill);
        wasm_bindgen_futures::future_to_promise(async move {
            let messages: Vec<ChatMessage> = serde_wasm_bindgen::from_value(messages)
                .map_err(|e| WebError::Options(format!("messages: {e}")))?;
            run.generate(Prompt::Chat(messages)).await
        })
    }

    /// Teacher-forced logits of `ids`, as `runner score` gives them: the rows of positions
    /// `from..ids.length`, flattened into one `Float32Array` of `(ids.length - from) * vocab`
    /// floats (the fidelity checks of e2e/tests/fidelity.spec.js). Forgets the conversation.
    pub fn score(&self, ids: Vec<u32>, from: u32) -> js_sys::Promise {
        let engine = self.engine.clone();
        let gpu_errors = self.gpu_errors.clone();
        wasm_bindgen_futures::future_to_promise(async move {
            let mut engine = engine.try_borrow_mut().map_err(|_| WebError::Busy)?;
            if from as usize > ids.len() {
                let what = format!("score: from {from} is past the {} ids", ids.len());
                return Err(WebError::Options(what).into());
            }
            let rows = engine.score(&ids).await.map_err(WebError::from)?;
            gpu_errors.check()?;
            let kept: Vec<f32> = rows.into_iter().skip(from as usize).flatten().collect();
            Ok(js_sys::Float32Array::from(kept.as_slice()).into())
        })
    }

    /// Stops the running generation after the current token.
    pub fn abort(&self) {
        self.stop.set(true);
    }

    /// Forgets the conversation held in the KV cache.
    pub fn reset(&self) -> Result<(), JsValue> {
        self.engine
            .try_borrow_mut()
            .map_err(|_| WebError::Busy)?
            .reset();
        Ok(())
    }

    /// Destroys the GPU device, as a driver reset would: for testing device-loss recovery.
    #[wasm_bindgen(js_name = loseDevice)]
    pub fn lose_device(&self) {
        self.gpu.device.destroy();
    }

    fn runner(
        &self,
        options: JsValue,
        on_token: Option<Function>,
        on_prefill: Option<Function>,
    ) -> Run {
        self.stop.set(false);
        Run {
            engine: self.engine.clone(),
            stop: self.stop.clone(),
            gpu_errors: self.gpu_errors.clone(),
            options,
            on_token,
            on_prefill,
        }
    }
}

impl Drop for WebEngine {
    fn drop(&mut self) {
        self.disposed.set(true);
    }
}

/// One `generate`/`chat` call, owning what its promise needs.
struct Run {
    engine: Rc<RefCell<Engine>>,
    stop: Rc<Cell<bool>>,
    gpu_errors: GpuErrors,
    options: JsValue,
    on_token: Option<Function>,
    on_prefill: Option<Function>,
}

thread_local! {
    /// The running call's `onPrefill`. The engine's prefill callback must be `Send`, which a
    /// JS function is not, so the callback reaches it through here (a worker has one thread,
    /// and the engine runs one call at a time).
    static ON_PREFILL: RefCell<Option<Function>> = const { RefCell::new(None) };
}

/// The engine's prefill progress, handed to the running call's `onPrefill`.
fn report_prefill(done: usize, total: usize) {
    ON_PREFILL.with(|hook| {
        if let Some(callback) = hook.borrow().as_ref() {
            let (done, total) = (JsValue::from(done as f64), JsValue::from(total as f64));
            let _ = callback.call2(&JsValue::NULL, &done, &total);
        }
    });
}

/// Makes a call's `onPrefill` the one `report_prefill` calls, until dropped.
struct PrefillHook;

impl PrefillHook {
    fn install(callback: Option<Function>) -> PrefillHook {
        ON_PREFILL.with(|hook| *hook.borrow_mut() = callback);
        PrefillHook
    }
}

impl Drop for PrefillHook {
    fn drop(&mut self) {
        ON_PREFILL.with(|hook| *hook.borrow_mut() = None);
    }
}

impl Run {
    async fn generate(self, prompt: Prompt) -> Result<JsValue, JsValue> {
        let settings: GenerateSettings = options::parse(&self.options, "generate options")?;
        let mut options = settings.options()?;
        let mut engine = self.engine.try_borrow_mut().map_err(|_| WebError::Busy)?;
        let prompt = with_tools(prompt, &settings, engine.text.template.tool_support())?;
        let prompt_ids = engine
            .prompt_ids(&prompt)
            .map_err(|e| WebError::Engine(e.into()))?;
        options.max_tokens = settings.max_tokens(prompt_ids.len(), engine.context_length());
        engine
            .check_fits(prompt_ids.len(), options.max_tokens)
            .map_err(WebError::from)?;
        let request = GenerateRequest::new(Prompt::Ids(prompt_ids), options);
        let stop = self.stop.clone();
        let on_token = self.on_token.clone();
        let errors = self.gpu_errors.clone();
        let mut on_event = |event: TokenEvent<'_>| {
            if let Some(callback) = &on_token {
                let _ = callback.call1(&JsValue::NULL, &JsValue::from_str(event.text));
            }
            match stop.get() || errors.check().is_err() {
                true => ControlFlow::Break(()),
                false => ControlFlow::Continue(()),
            }
        };
        let _prefill = PrefillHook::install(self.on_prefill.clone());
        let out = engine
            .generate_one(&request, &mut on_event)
            .await
            .map_err(WebError::from)?;
        self.gpu_errors.check()?;
        to_js(&GenerateResult::new(out, self.stop.get()))
    }
}

/// A chat with `tools` as a `Prompt::ToolChat`, on a template that shows them.
fn with_tools(
    prompt: Prompt,
    settings: &GenerateSettings,
    support: ToolSupport,
) -> Result<Prompt, WebError> {
    if settings.tools.is_empty() {
        return Ok(prompt);
    }
    let Prompt::Chat(messages) = prompt else {
        return Err(WebError::Options("tools: only a chat takes tools".into()));
    };
    if support != ToolSupport::Hermes {
        return Err(WebError::Options(
            "tools: this model's chat template has no tools in Hermes' <tool_call> format".into(),
        ));
    }
    Ok(Prompt::ToolChat {
        messages,
        tools: settings.tools.clone(),
    })
}

#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct GenerateResult {
    prompt_ids: Vec<u32>,
    ids: Vec<u32>,
    text: String,
    prefill_tokens: u32,
    prefill_seconds: f64,
    decode_seconds: f64,
    decode_tok_s: f64,
    aborted: bool,
    /// `stop`, `length` or `cancelled` (see `FinishReason`).
    finish_reason: FinishReason,
    /// `{ prompt_tokens, completion_tokens, cached_tokens }`, as OpenAI's `usage` counts.
    usage: Usage,
    /// Speculative decoding (`spec`): draft tokens verified, and how many were kept.
    drafted: u32,
    accepted: u32,
}

impl GenerateResult {
    fn new(out: Generated, aborted: bool) -> GenerateResult {
        let decode_tok_s = if out.timings.decode_seconds > 0.0 {
            out.ids.len() as f64 / out.timings.decode_seconds
        } else {
            0.0
        };
        GenerateResult {
            finish_reason: out.finish_reason,
            usage: out.usage(),
            prefill_tokens: out.prefill_tokens(),
            prefill_seconds: out.timings.prefill_seconds,
            decode_seconds: out.timings.decode_seconds,
            drafted: out.timings.drafted,
            accepted: out.timings.accepted,
            prompt_ids: out.prompt_ids,
            ids: out.ids,
            text: out.text,
            decode_tok_s,
            aborted,
        }
    }
}

pub(super) fn to_js<T: serde::Serialize>(value: &T) -> Result<JsValue, JsValue> {
    let serializer = serde_wasm_bindgen::Serializer::json_compatible();
    value
        .serialize(&serializer)
        .map_err(|e| JsValue::from(js_sys::Error::new(&e.to_string())))
}

fn engine_info(
    url: &str,
    engine: &Engine,
    gpu: &Gpu,
    source: &ModelSource,
    seconds: f64,
) -> EngineInfo {
    let network = source.network_stats();
    EngineInfo {
        url: url.to_string(),
        adapter: gpu.caps.adapter.clone(),
        backend: gpu.caps.backend.clone(),
        variant: gpu.variant().to_string(),
        f16: gpu.caps.f16,
        subgroups: gpu.caps.subgroups,
        arch: engine.model.cfg.arch.name().to_string(),
        n_layers: engine.model.cfg.n_layers,
        vocab: engine.model.cfg.vocab,
        max_context: engine.stage.spec.max_context,
        bytes_total: engine.model.header.tensors.iter().map(|t| t.bytes).sum(),
        load_seconds: seconds,
        network_requests: network.requests,
        network_bytes: network.bytes_fetched,
        cache: source.cache_stats(),
        offline: source.offline(),
        wasm_memory_bytes: wasm_memory_bytes(),
        warm_up_seconds: None,
        tool_support: match engine.text.template.tool_support() {
            ToolSupport::Hermes => "hermes",
            ToolSupport::None => "none",
            ToolSupport::Other => "other",
        },
    }
}
