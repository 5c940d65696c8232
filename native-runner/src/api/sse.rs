//! A job's events as a server-sent event stream in OpenAI's shape: `data: {chunk}` lines,
//! then `data: [DONE]`. Dropping the stream (the client disconnected) drops the job's
//! receiver, which stops the job at its next token.

use std::convert::Infallible;

use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use futures_util::stream::{self, Stream, StreamExt};
use serde_json::Value;
use tokio::sync::mpsc::UnboundedReceiver;

use super::errors::ApiError;
use super::reply::Reply;
use super::tool_calls::CallReader;
use super::worker::{Event, Finished};

/// Where a stream is.
struct Progress {
    reply: Reply,
    events: UnboundedReceiver<Event>,
    opened: bool,
    /// Reads the text as content or a tool call when the answer may be one.
    calls: Option<CallReader>,
}

pub fn stream(
    reply: Reply,
    events: UnboundedReceiver<Event>,
) -> Sse<impl Stream<Item = Result<SseEvent, Infallible>>> {
    let start = Progress {
        calls: reply.tool_calls.then(CallReader::default),
        reply,
        events,
        opened: false,
    };
    let chunks = stream::unfold(Some(start), |progress| async move {
        let mut progress = progress?;
        if !progress.opened {
            progress.opened = true;
            let opening = progress.reply.opening().into_iter().map(data).collect();
            return Some((opening, Some(progress)));
        }
        match progress.events.recv().await {
            Some(Event::Text(text)) => {
                let chunks = match &mut progress.calls {
                    Some(reader) => reader
                        .push(&text)
                        .iter()
                        .map(|piece| data(progress.reply.piece(piece)))
                        .collect(),
                    None => vec![data(progress.reply.text(&text))],
                };
                Some((chunks, Some(progress)))
            }
            Some(Event::Done(done)) => {
                let called = progress.calls.as_ref().is_some_and(|r| r.call().is_some());
                Some((closing(&progress.reply, &done, called), None))
            }
            Some(Event::Failed(err)) => Some((failure(&err), None)),
            None => Some((
                failure(&ApiError::internal("The model worker stopped")),
                None,
            )),
        }
    })
    .flat_map(|events: Vec<SseEvent>| stream::iter(events.into_iter().map(Ok)));
    Sse::new(chunks).keep_alive(KeepAlive::default())
}

/// Waits for the whole answer, for a non-streamed request.
pub async fn collect(mut events: UnboundedReceiver<Event>) -> Result<Finished, ApiError> {
    while let Some(event) = events.recv().await {
        match event {
            Event::Text(_) => {}
            Event::Done(done) => return Ok(done),
            Event::Failed(err) => return Err(err),
        }
    }
    Err(ApiError::internal("The model worker stopped"))
}

fn data(value: Value) -> SseEvent {
    SseEvent::default().data(value.to_string())
}

fn done_marker() -> SseEvent {
    SseEvent::default().data("[DONE]")
}

fn closing(reply: &Reply, done: &Finished, called: bool) -> Vec<SseEvent> {
    let mut events = Vec::new();
    if let Some(choices) = &done.logprobs {
        events.push(data(reply.logprobs(choices)));
    }
    events.push(data(reply.finish(reply.finish_reason(done, called))));
    if reply.include_usage {
        events.push(data(reply.usage(done)));
    }
    events.push(done_marker());
    events
}

/// An error after the stream began: OpenAI's clients raise on a chunk holding `error`.
fn failure(err: &ApiError) -> Vec<SseEvent> {
    vec![data(err.body()), done_marker()]
}
