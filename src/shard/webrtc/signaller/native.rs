//! The native websocket half: async-tungstenite, as matchbox's own native signaller uses.

use std::io::Cursor;

use async_trait::async_trait;
use async_tungstenite::smol::{connect_async, ConnectStream};
use async_tungstenite::tungstenite::Message;
use async_tungstenite::WebSocketStream;
use futures::StreamExt;
use matchbox_socket::{
    PeerEvent, PeerRequest, PeerSignal, SignalingError, Signaller, SignallerBuilder,
};

use super::SignalGate;

#[derive(Debug, Default)]
pub(in super::super) struct CheckedSignallerBuilder;

#[async_trait]
impl SignallerBuilder for CheckedSignallerBuilder {
    /// One attempt: a refused or unreachable server is an answer (see `connect_with`).
    async fn new_signaller(
        &self,
        _attempts: Option<u16>,
        room_url: String,
    ) -> Result<Box<dyn Signaller>, SignalingError> {
        let (stream, _) = connect_async(&room_url)
            .await
            .map_err(|error| SignalingError::NegotiationFailed(Box::new(error.into())))?;
        Ok(Box::new(CheckedSignaller {
            stream,
            gate: SignalGate::default(),
        }))
    }
}

struct CheckedSignaller {
    stream: WebSocketStream<ConnectStream>,
    gate: SignalGate,
}

#[async_trait]
impl Signaller for CheckedSignaller {
    async fn send(&mut self, request: PeerRequest) -> Result<(), SignalingError> {
        let text = serde_json::to_string(&request)
            .map_err(|error| SignalingError::UserImplementationError(error.to_string()))?;
        self.stream.send(Message::Text(text.into())).await?;
        Ok(())
    }

    /// The next event from the server, skipping peers' signals that fail their checks.
    async fn next_message(&mut self) -> Result<PeerEvent, SignalingError> {
        loop {
            let text = match self.stream.next().await {
                Some(Ok(Message::Text(text))) => text,
                Some(Ok(Message::Ping(_) | Message::Pong(_))) => continue,
                Some(Ok(_)) => return Err(SignalingError::UnknownFormat),
                Some(Err(error)) => return Err(error.into()),
                None => return Err(SignalingError::StreamExhausted),
            };
            if let Some(event) = self.gate.admit(&text)? {
                return Ok(event);
            }
        }
    }
}

/// webrtc-rs parses a description with rtc-sdp, and matchbox unwraps the result: it must
/// parse there too (its line order is stricter than browsers').
pub(super) fn stack_parses(signal: &PeerSignal) -> Result<(), String> {
    let (PeerSignal::Offer(sdp) | PeerSignal::Answer(sdp)) = signal else {
        return Ok(());
    };
    rtc_sdp::description::session::SessionDescription::unmarshal(&mut Cursor::new(sdp))
        .map(|_| ())
        .map_err(|error| format!("not SDP to webrtc-rs: {error}"))
}

pub(super) fn warn(text: &str) {
    tracing::warn!("{text}");
}
