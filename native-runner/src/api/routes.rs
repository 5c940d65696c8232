//! The HTTP face: routes, the API key check, response counting, and the handlers that turn a
//! request into a queued job and its events into an answer.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::header::{AUTHORIZATION, CONTENT_TYPE};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use subtle::ConstantTimeEq;
use tokio::sync::mpsc::unbounded_channel;
use tower_http::catch_panic::CatchPanicLayer;

use super::embeddings::{self, EmbedHandle};
use super::errors::{parse_body, ApiError};
use super::metrics::{render, Responses};
use super::reply::{Endpoint, Reply};
use super::types::{ChatRequest, CompletionRequest, ModelCard, ModelList};
use super::validate::{chat_plan, completion_plan, Plan};
use super::worker::{Job, ModelHandle};
use super::{sse, MAX_BODY_BYTES};

/// What the handlers share.
pub struct ApiState {
    pub models: Vec<ModelHandle>,
    /// Models answering `/v1/embeddings` (encoders, and chat models under `--embeddings`).
    pub embedders: Vec<EmbedHandle>,
    pub api_key: Option<String>,
    pub responses: Responses,
    pub started: u64,
}

type Shared = Arc<ApiState>;

impl ApiState {
    fn model(&self, name: &str) -> Result<&ModelHandle, ApiError> {
        self.models
            .iter()
            .find(|model| model.name == name)
            .ok_or_else(|| ApiError::unknown_model(name))
    }
}

/// `/v1/*` behind the key (when one is set) and the body limit; `/health` and `/metrics` open.
pub fn router(state: Shared) -> Router {
    let v1 = Router::new()
        .route("/v1/models", get(list_models))
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/embeddings", post(embeddings::create))
        .route_layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .route_layer(middleware::from_fn_with_state(
            Arc::clone(&state),
            require_key,
        ));
    Router::new()
        .merge(v1)
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route_layer(middleware::from_fn_with_state(
            Arc::clone(&state),
            count_responses,
        ))
        .route_layer(CatchPanicLayer::custom(|_| {
            ApiError::internal("Internal error while handling the request").into_response()
        }))
        .with_state(state)
}

/// Compares the bearer token in constant time, so its bytes cannot be guessed by timing.
async fn require_key(State(state): State<Shared>, req: Request, next: Next) -> Response {
    if let Some(key) = &state.api_key {
        let given = req
            .headers()
            .get(AUTHORIZATION)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.strip_prefix("Bearer "))
            .unwrap_or("");
        if !bool::from(given.as_bytes().ct_eq(key.as_bytes())) {
            return ApiError::unauthorized().into_response();
        }
    }
    next.run(req).await
}

async fn count_responses(State(state): State<Shared>, req: Request, next: Next) -> Response {
    let response = next.run(req).await;
    state.responses.count(response.status().as_u16());
    response
}

async fn list_models(State(state): State<Shared>) -> Json<ModelList> {
    let mut names: Vec<&String> = state.models.iter().map(|model| &model.name).collect();
    // A chat model that also embeds (`--embeddings`) is listed once.
    let embedding_only: Vec<&String> = (state.embedders.iter())
        .map(|model| &model.name)
        .filter(|name| !names.contains(name))
        .collect();
    names.extend(embedding_only);
    let data = names
        .into_iter()
        .map(|name| ModelCard {
            id: name.clone(),
            object: "model",
            created: state.started,
            owned_by: "webshard",
        })
        .collect();
    Json(ModelList {
        object: "list",
        data,
    })
}

/// 200 once every model is loaded, 503 while any still loads.
async fn health(State(state): State<Shared>) -> Response {
    for model in &state.models {
        if let Err(loading) = model.front() {
            return loading.into_response();
        }
    }
    for model in &state.embedders {
        if let Err(loading) = model.ready() {
            return loading.into_response();
        }
    }
    Json(serde_json::json!({ "status": "ok" })).into_response()
}

async fn metrics(State(state): State<Shared>) -> Response {
    let text = render(&state.models, &state.responses);
    let content_type = "text/plain; version=0.0.4; charset=utf-8";
    ([(CONTENT_TYPE, content_type)], text).into_response()
}

async fn chat(State(state): State<Shared>, body: Result<Bytes, BytesRejection>) -> Response {
    let answer = async {
        let req: ChatRequest = parse_body(body, MAX_BODY_BYTES)?;
        let model = state.model(&req.model)?;
        let plan = chat_plan(&req, model.front()?)?;
        run(model, Endpoint::Chat, plan).await
    };
    answer.await.unwrap_or_else(IntoResponse::into_response)
}

async fn completions(State(state): State<Shared>, body: Result<Bytes, BytesRejection>) -> Response {
    let answer = async {
        let req: CompletionRequest = parse_body(body, MAX_BODY_BYTES)?;
        let model = state.model(&req.model)?;
        let plan = completion_plan(&req, model.front()?)?;
        run(model, Endpoint::Completion, plan).await
    };
    answer.await.unwrap_or_else(IntoResponse::into_response)
}

/// Queues the job and answers with its stream or, once it is done, the whole response.
async fn run(model: &ModelHandle, endpoint: Endpoint, plan: Plan) -> Result<Response, ApiError> {
    let (events, received) = unbounded_channel();
    let reply = Reply::new(endpoint, &model.name, plan.include_usage, plan.tool_calls);
    model.submit(Job {
        request: plan.request,
        events,
    })?;
    model
        .metrics
        .requests
        .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    if plan.stream {
        return Ok(sse::stream(reply, received).into_response());
    }
    let done = sse::collect(received).await?;
    Ok(Json(reply.whole(&done)).into_response())
}
