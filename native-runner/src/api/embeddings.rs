//! `POST /v1/embeddings` in OpenAI's shape: `input` as a string, a list of strings, a list of
//! token ids or a list of such lists; `encoding_format` `float` (default) or `base64`
//! (little-endian f32); `usage`. Vectors are pooled the way the model says and L2-normalised,
//! as OpenAI's and llama-server's are, so they equal `runner embed --normalize`.
//!
//! Each embedding model gets a thread that owns its `Embedder`. Handlers tokenize and check
//! every input against the context before queueing (a 400 names the input's index); the
//! thread takes every request waiting when it gets to run and embeds their inputs in one
//! `embed_ids` call, so concurrent requests are batched: an encoder packs them into as few GPU
//! passes as its pass holds (`Embedder::embed_ids`).

use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, OnceLock};

use anyhow::Context;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::Engine as _;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::oneshot;
use webshard::embed::{EmbedOptions, Embedder};
use webshard::gguf::open_source;
use webshard::gpu::Gpu;

use super::errors::{parse_body, ApiError};
use super::routes::ApiState;
use super::worker::guarded;
use super::MAX_BODY_BYTES;
use crate::model_args::ModelArgs;

/// Most inputs in one request (OpenAI's own limit).
const MAX_INPUTS: usize = 2048;
/// Most inputs the worker embeds in one call, gathered from the waiting requests.
const MAX_BATCH_INPUTS: usize = 256;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct EmbeddingsRequest {
    model: String,
    input: Value,
    #[serde(default)]
    encoding_format: Option<String>,
    /// Only the model's own length is possible (no Matryoshka truncation).
    #[serde(default)]
    dimensions: Option<u64>,
    #[serde(default)]
    #[allow(dead_code)] // accepted as OpenAI documents it; identifies nothing here
    user: Option<String>,
}

#[derive(Serialize)]
struct EmbeddingsResponse {
    object: &'static str,
    data: Vec<EmbeddingData>,
    model: String,
    usage: EmbeddingsUsage,
}

#[derive(Serialize)]
struct EmbeddingData {
    object: &'static str,
    index: usize,
    embedding: Value,
}

#[derive(Serialize)]
struct EmbeddingsUsage {
    prompt_tokens: usize,
    total_tokens: usize,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Format {
    Float,
    Base64,
}

/// One request's inputs and where their vectors go.
struct EmbedJob {
    inputs: Vec<Vec<u32>>,
    reply: oneshot::Sender<Result<Vec<Vec<f32>>, ApiError>>,
}

/// A served embedding model as the handlers see it.
pub struct EmbedHandle {
    pub name: String,
    embedder: Arc<OnceLock<Arc<Embedder>>>,
    jobs: SyncSender<EmbedJob>,
}

impl EmbedHandle {
    /// Starts the thread that loads the model and then serves at most `queue` waiting
    /// requests; a load failure is sent on `failed`.
    pub fn start(
        name: String,
        load: ModelArgs,
        queue: usize,
        failed: tokio::sync::mpsc::UnboundedSender<String>,
    ) -> std::io::Result<EmbedHandle> {
        let (jobs, queued) = sync_channel(queue);
        let embedder = Arc::new(OnceLock::new());
        let ready = Arc::clone(&embedder);
        let label = name.clone();
        std::thread::Builder::new()
            .name(format!("embed {name}"))
            .spawn(move || {
                if let Err(err) = serve_jobs(&load, &ready, queued) {
                    let _ = failed.send(format!("embedding model {label}: {err:#}"));
                }
            })?;
        Ok(EmbedHandle {
            name,
            embedder,
            jobs,
        })
    }

    /// The loaded model; 503 while it loads.
    pub fn ready(&self) -> Result<&Arc<Embedder>, ApiError> {
        self.embedder.get().ok_or_else(|| {
            ApiError::unavailable(
                "model_loading",
                format!("The model `{}` is still loading", self.name),
            )
        })
    }

    async fn embed(&self, inputs: Vec<Vec<u32>>) -> Result<Vec<Vec<f32>>, ApiError> {
        let (reply, answer) = oneshot::channel();
        match self.jobs.try_send(EmbedJob { inputs, reply }) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => {
                return Err(ApiError::unavailable(
                    "queue_full",
                    format!("The queue of `{}` is full; retry later", self.name),
                ))
            }
            Err(TrySendError::Disconnected(_)) => {
                return Err(ApiError::unavailable(
                    "worker_stopped",
                    format!("The worker of `{}` has stopped", self.name),
                ))
            }
        }
        answer
            .await
            .unwrap_or_else(|_| Err(ApiError::internal("The embedding worker went away")))
    }
}

/// The worker thread: load, then embed the waiting requests together, round after round.
fn serve_jobs(
    load: &ModelArgs,
    ready: &OnceLock<Arc<Embedder>>,
    queued: Receiver<EmbedJob>,
) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let embedder = runtime.block_on(load_embedder(load))?;
    let _ = ready.set(Arc::clone(&embedder));
    while let Ok(first) = queued.recv() {
        let mut batch = vec![first];
        let mut count = batch[0].inputs.len();
        while count < MAX_BATCH_INPUTS {
            let Ok(next) = queued.try_recv() else { break };
            count += next.inputs.len();
            batch.push(next);
        }
        batch.retain(|job| !job.reply.is_closed());
        let all: Vec<Vec<u32>> = batch.iter().flat_map(|j| j.inputs.clone()).collect();
        let options = EmbedOptions {
            pooling: None,
            normalize: true,
        };
        let result = guarded(|| runtime.block_on(embedder.embed_ids(&all, options)))
            .and_then(|r| r.map_err(|err| ApiError::internal(format!("Embedding failed: {err}"))));
        answer_jobs(batch, result);
    }
    Ok(())
}

/// Hands each job its share of the batch's vectors, in order, or the batch's error.
fn answer_jobs(batch: Vec<EmbedJob>, result: Result<Vec<Vec<f32>>, ApiError>) {
    match result {
        Ok(vectors) => {
            let mut vectors = vectors.into_iter();
            for job in batch {
                let mine: Vec<Vec<f32>> = vectors.by_ref().take(job.inputs.len()).collect();
                let _ = job.reply.send(Ok(mine));
            }
        }
        Err(err) => {
            for job in batch {
                let _ = job.reply.send(Err(err.clone()));
            }
        }
    }
}

async fn load_embedder(load: &ModelArgs) -> anyhow::Result<Arc<Embedder>> {
    let gpu = Gpu::new(&load.gpu_options()?).await?;
    let source = open_source(&load.model)
        .await
        .with_context(|| format!("opening {}", load.model))?;
    let embedder = Embedder::load(gpu, source.as_ref(), load.ctx, &mut |_| {})
        .await
        .with_context(|| format!("loading {}", load.model))?;
    Ok(Arc::new(embedder))
}

/// `POST /v1/embeddings`.
pub async fn create(
    State(state): State<Arc<ApiState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    answer(&state, body)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

async fn answer(
    state: &ApiState,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req: EmbeddingsRequest = parse_body(body, MAX_BODY_BYTES)?;
    let model = find_model(state, &req.model)?;
    let embedder = model.ready()?;
    let format = match req.encoding_format.as_deref() {
        None | Some("float") => Format::Float,
        Some("base64") => Format::Base64,
        Some(other) => {
            return Err(ApiError::bad_field(
                "encoding_format",
                format!("`encoding_format` is `{other}`; it must be `float` or `base64`"),
            ))
        }
    };
    if let Some(dims) = req.dimensions {
        if dims != embedder.dimensions() as u64 {
            return Err(ApiError::bad_field(
                "dimensions",
                format!(
                    "`dimensions` is {dims}, but `{}` makes vectors of {} only",
                    model.name,
                    embedder.dimensions()
                ),
            ));
        }
    }
    let inputs = token_inputs(embedder, &req.input)?;
    let tokens: usize = inputs.iter().map(Vec::len).sum();
    let vectors = model.embed(inputs).await?;
    let data = vectors
        .into_iter()
        .enumerate()
        .map(|(index, vector)| EmbeddingData {
            object: "embedding",
            index,
            embedding: encode(&vector, format),
        })
        .collect();
    Ok(Json(EmbeddingsResponse {
        object: "list",
        data,
        model: model.name.clone(),
        usage: EmbeddingsUsage {
            prompt_tokens: tokens,
            total_tokens: tokens,
        },
    })
    .into_response())
}

/// The embedding model named `name`; a chat model served without `--embeddings` is told so.
fn find_model<'a>(state: &'a ApiState, name: &str) -> Result<&'a EmbedHandle, ApiError> {
    if let Some(model) = state.embedders.iter().find(|m| m.name == name) {
        return Ok(model);
    }
    if state.models.iter().any(|m| m.name == name) {
        return Err(ApiError::bad_field(
            "model",
            format!(
                "`{name}` is served for chat only; start `runner serve` with --embeddings to embed with it too"
            ),
        ));
    }
    Err(ApiError::unknown_model(name))
}

fn encode(vector: &[f32], format: Format) -> Value {
    match format {
        Format::Float => Value::from(vector.iter().map(|&x| f64::from(x)).collect::<Vec<_>>()),
        Format::Base64 => {
            let bytes: Vec<u8> = vector.iter().flat_map(|x| x.to_le_bytes()).collect();
            Value::String(base64::engine::general_purpose::STANDARD.encode(bytes))
        }
    }
}

/// `input` as token sequences: a string, a list of strings, a list of token ids (one input)
/// or a list of such lists; each checked against the vocabulary and the context.
fn token_inputs(embedder: &Embedder, input: &Value) -> Result<Vec<Vec<u32>>, ApiError> {
    let inputs = match input {
        Value::String(text) => vec![embedder.tokenize(text)],
        Value::Array(items) if items.is_empty() => {
            return Err(ApiError::bad_field("input", "`input` is an empty list"))
        }
        Value::Array(items) if items.len() > MAX_INPUTS => {
            return Err(ApiError::bad_field(
                "input",
                format!("`input` has {} items, more than {MAX_INPUTS}", items.len()),
            ))
        }
        Value::Array(items) if items[0].is_number() => vec![token_ids(input, "input")?],
        Value::Array(items) => {
            let texts = items[0].is_string();
            items
                .iter()
                .enumerate()
                .map(|(index, item)| match item {
                    Value::String(text) if texts => Ok(embedder.tokenize(text)),
                    Value::Array(_) if !texts => token_ids(item, &format!("input[{index}]")),
                    _ => Err(mixed(index)),
                })
                .collect::<Result<_, _>>()?
        }
        _ => {
            return Err(ApiError::bad_field(
                "input",
                "`input` must be a string, a list of strings, a list of token ids or a list of token-id lists",
            ))
        }
    };
    for (index, ids) in inputs.iter().enumerate() {
        check_input(embedder, index, ids)?;
    }
    Ok(inputs)
}

fn mixed(index: usize) -> ApiError {
    ApiError::bad_field(
        &format!("input[{index}]"),
        format!("`input[{index}]` is not of the kind of `input[0]`: the list must hold only strings or only token-id lists"),
    )
}

/// A JSON list of token ids (integers from 0 to 2^32 - 1).
fn token_ids(value: &Value, param: &str) -> Result<Vec<u32>, ApiError> {
    let items = value.as_array().map(Vec::as_slice).unwrap_or_default();
    items
        .iter()
        .enumerate()
        .map(|(index, item)| {
            item.as_u64()
                .and_then(|id| u32::try_from(id).ok())
                .ok_or_else(|| {
                    ApiError::bad_field(
                        &format!("{param}[{index}]"),
                        format!("`{param}[{index}]` is {item}, not a token id"),
                    )
                })
        })
        .collect()
}

fn check_input(embedder: &Embedder, index: usize, ids: &[u32]) -> Result<(), ApiError> {
    let param = format!("input[{index}]");
    if ids.is_empty() {
        return Err(ApiError::bad_field(
            &param,
            format!("input {index} has no tokens"),
        ));
    }
    let max = embedder.context_length() as usize;
    if ids.len() > max {
        return Err(ApiError {
            code: Some("context_length_exceeded"),
            ..ApiError::bad_field(
                &param,
                format!(
                    "input {index} has {} tokens, more than the model's context of {max}",
                    ids.len()
                ),
            )
        });
    }
    let vocab = embedder.vocab();
    if let Some(bad) = ids.iter().find(|&&id| id >= vocab) {
        return Err(ApiError::bad_field(
            &param,
            format!("input {index} has token id {bad}, outside the vocabulary of {vocab}"),
        ));
    }
    Ok(())
}
