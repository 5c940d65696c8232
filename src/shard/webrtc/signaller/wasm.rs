//! The page's websocket half: ws_stream_wasm, as matchbox's own wasm signaller uses.

use async_trait::async_trait;
use futures::{SinkExt, StreamExt};
use matchbox_socket::{
    PeerEvent, PeerRequest, PeerSignal, SignalingError, Signaller, SignallerBuilder,
};
use ws_stream_wasm::{WsMessage, WsMeta, WsStream};

use super::SignalGate;

#[derive(Debug, Default)]
pub(in super::super) struct CheckedSignallerBuilder;

#[async_trait(?Send)]
impl SignallerBuilder for CheckedSignallerBuilder {
    /// One attempt: a refused or unreachable server is an answer (see `connect_with`).
    async fn new_signaller(
        &self,
        _attempts: Option<u16>,
        room_url: String,
    ) -> Result<Box<dyn Signaller>, SignalingError> {
        let (_, stream) = WsMeta::connect(&room_url, None)
            .await
            .map_err(|error| SignalingError::NegotiationFailed(Box::new(error.into())))?;
        Ok(Box::new(CheckedSignaller {
            stream,
            gate: SignalGate::default(),
        }))
    }
}

struct CheckedSignaller {
    stream: WsStream,
    gate: SignalGate,
}

#[async_trait(?Send)]
impl Signaller for CheckedSignaller {
    async fn send(&mut self, request: PeerRequest) -> Result<(), SignalingError> {
        let text = serde_json::to_string(&request)
            .map_err(|error| SignalingError::UserImplementationError(error.to_string()))?;
        self.stream
            .send(WsMessage::Text(text))
            .await
            .map_err(SignalingError::from)
    }

    /// The next event from the server, skipping peers' signals that fail their checks.
    async fn next_message(&mut self) -> Result<PeerEvent, SignalingError> {
        loop {
            let text = match self.stream.next().await {
                Some(WsMessage::Text(text)) => text,
                Some(WsMessage::Binary(_)) => return Err(SignalingError::UnknownFormat),
                None => return Err(SignalingError::StreamExhausted),
            };
            if let Some(event) = self.gate.admit(&text)? {
                return Ok(event);
            }
        }
    }
}

/// In a page the browser's own parser reads the description after these checks, and nothing
/// but them can run before it: nothing more to check here.
pub(super) fn stack_parses(_signal: &PeerSignal) -> Result<(), String> {
    Ok(())
}

/// To the console: a page has no tracing subscriber, and this is for whoever reads devtools.
pub(super) fn warn(text: &str) {
    web_sys::console::warn_1(&text.into());
}
