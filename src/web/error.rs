//! Errors of the browser glue, and how every error reaches JavaScript: an `Error` whose
//! `kind` property lets a page pick its message (404, CORS, not a GGUF, unsupported...).

use wasm_bindgen::{JsCast, JsValue};

use crate::embed::EmbedError;
use crate::engine::EngineError;
use crate::front::RequestError;
use crate::gguf::{GgufError, SourceError};
use crate::gpu::GpuError;
use crate::model::bert::ENCODER_ARCHITECTURES;
use crate::model::{ConfigError, ModelError};
use crate::sample::ConstraintError;
use crate::shard::roles::RoleError;

#[derive(Debug, thiserror::Error)]
pub enum WebError {
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error(transparent)]
    Embed(#[from] EmbedError),
    #[error(transparent)]
    Source(#[from] SourceError),
    #[error(transparent)]
    Gpu(#[from] GpuError),
    #[error("WebGPU is not available here: {0}. It works in Chrome and Edge 113+ on Windows, macOS and ChromeOS, Chrome 121+ on Android, Safari 26+, Firefox 141+ on Windows; on Linux start Chromium with --enable-unsafe-webgpu (and --enable-features=Vulkan where a GPU is present)")]
    NoWebGpu(String),
    #[error("{url}: {message}")]
    Network { url: String, message: String },
    #[error("{url}: the file changed on the server during the download (ETag {before} became {after}); load it again")]
    Changed {
        url: String,
        before: String,
        after: String,
    },
    #[error("stopped: the load was aborted")]
    Aborted,
    #[error("the engine is busy with another request")]
    Busy,
    #[error("the GPU device was lost ({0}); the engine is being re-initialised")]
    DeviceLost(String),
    #[error("WebGPU reported an error, so results would be wrong: {0}")]
    Validation(String),
    #[error("fleet: {0}")]
    Fleet(#[from] RoleError),
    /// A fleet error with what to check or do about it.
    #[error("fleet: {error}{}", if hint.is_empty() { String::new() } else { format!(" ({hint})") })]
    FleetHint {
        error: RoleError,
        hint: &'static str,
    },
    #[error("the fleet is closed ({0}): connect again")]
    FleetClosed(String),
    #[error("bad options: {0}")]
    Options(String),
    #[error("cache (OPFS) {operation} `{name}`: {message}")]
    Cache {
        operation: &'static str,
        name: String,
        message: String,
    },
}

impl WebError {
    /// A short machine-readable class for pages: `not-found`, `http`, `network`, `not-gguf`,
    /// `unsupported`, `no-webgpu`, `aborted`, `busy`, `device-lost`, `options`, `cache`, `fleet`,
    /// `embedding-model` (an encoder given to `Engine`: load it as an `EmbeddingModel`), `other`.
    pub fn kind(&self) -> &'static str {
        match self {
            WebError::Engine(e) => engine_kind(e),
            WebError::Embed(e) => embed_kind(e),
            WebError::Source(e) => source_kind(e),
            WebError::Gpu(_) | WebError::Validation(_) => "gpu",
            WebError::NoWebGpu(_) => "no-webgpu",
            WebError::Network { .. } => "network",
            WebError::Changed { .. } => "changed",
            WebError::Aborted => "aborted",
            WebError::Busy => "busy",
            WebError::DeviceLost(_) => "device-lost",
            WebError::Options(_) => "options",
            WebError::Fleet(_) | WebError::FleetHint { .. } | WebError::FleetClosed(_) => "fleet",
            WebError::Cache { .. } => "cache",
        }
    }

    /// Text of a JS exception (`Error.message` or the value itself).
    pub(crate) fn from_js(url: &str, value: &JsValue) -> WebError {
        if is_abort(value) {
            return WebError::Aborted;
        }
        WebError::Network {
            url: url.to_string(),
            message: format!(
                "{} (a network failure, or the server does not allow this origin: cross-origin model URLs need CORS headers Access-Control-Allow-Origin and Access-Control-Expose-Headers: Content-Range, ETag)",
                js_message(value)
            ),
        }
    }
}

/// `Error.message`, or the value as a string.
pub(crate) fn js_message(value: &JsValue) -> String {
    value
        .dyn_ref::<js_sys::Error>()
        .map(|e| String::from(e.message()))
        .or_else(|| value.as_string())
        .unwrap_or_else(|| format!("{value:?}"))
}

/// Whether a rejected fetch was cancelled by its `AbortSignal`.
pub(crate) fn is_abort(value: &JsValue) -> bool {
    value
        .dyn_ref::<js_sys::Error>()
        .is_some_and(|e| e.name() == "AbortError")
}

fn engine_kind(e: &EngineError) -> &'static str {
    match e {
        EngineError::Model(m) => model_kind(m),
        EngineError::Gguf(g) => gguf_kind(g),
        EngineError::Tokenizer(_) => "unsupported",
        EngineError::Request(RequestError::Template(_)) => "unsupported",
        EngineError::Request(_) | EngineError::ContextTooSmall { .. } => "options",
        EngineError::DoesNotFit(_) => "does-not-fit",
        EngineError::Constraint(ConstraintError::Compile(_)) => "options",
        EngineError::Constraint(_) => "other",
    }
}

fn embed_kind(e: &EmbedError) -> &'static str {
    match e {
        EmbedError::Gguf(g) => gguf_kind(g),
        EmbedError::Source(s) => source_kind(s),
        EmbedError::Model(m) => model_kind(m),
        EmbedError::Tokenizer(_) | EmbedError::UnsupportedPooling(_) => "unsupported",
        EmbedError::TooLong { .. }
        | EmbedError::Empty { .. }
        | EmbedError::OutOfVocabulary { .. } => "options",
    }
}

fn model_kind(e: &ModelError) -> &'static str {
    match e {
        ModelError::Config(ConfigError::UnsupportedArch(arch))
            if ENCODER_ARCHITECTURES.contains(&arch.as_str()) =>
        {
            "embedding-model"
        }
        ModelError::Config(ConfigError::Gguf(g)) | ModelError::Gguf(g) => gguf_kind(g),
        ModelError::Config(_) => "unsupported",
        ModelError::Source(s) => source_kind(s),
        ModelError::Gpu(_) => "gpu",
        ModelError::Tensor { .. } => "unsupported",
        ModelError::ContextFull { .. } | ModelError::Plan(_) => "other",
    }
}

fn gguf_kind(e: &GgufError) -> &'static str {
    match e {
        GgufError::Source(s) => source_kind(s),
        GgufError::BadMagic { .. } => "not-gguf",
        GgufError::UnsupportedVersion { .. } => "unsupported",
        _ => "bad-gguf",
    }
}

fn source_kind(e: &SourceError) -> &'static str {
    match e {
        SourceError::MissingPart { source, .. } => source_kind(source),
        SourceError::HttpStatus { status: 404, .. } => "not-found",
        SourceError::HttpStatus { .. } => "http",
        SourceError::Request { message, .. } if message.starts_with(ABORTED) => "aborted",
        SourceError::Request { .. } | SourceError::Interrupted { .. } => "network",
        _ => "http",
    }
}

/// Prefix of the `SourceError::Request` message a cancelled read carries, so the kind
/// survives the trip through the engine's error types.
pub(crate) const ABORTED: &str = "aborted";

impl From<WebError> for JsValue {
    fn from(err: WebError) -> JsValue {
        let js = js_sys::Error::new(&err.to_string());
        let _ = js_sys::Reflect::set(&js, &"kind".into(), &err.kind().into());
        js.into()
    }
}

/// A cache or network failure inside a `RangeSource` read, which can only return a
/// `SourceError`.
pub(crate) fn as_source_error(url: &str, err: WebError) -> SourceError {
    match err {
        WebError::Source(s) => s,
        WebError::Aborted => SourceError::Request {
            url: url.to_string(),
            message: ABORTED.to_string(),
        },
        other => SourceError::Request {
            url: url.to_string(),
            message: other.to_string(),
        },
    }
}
