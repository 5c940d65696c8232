//! The signaling half of the native WebRTC socket: matchbox's websocket signaller, with
//! every peer's offer, answer and ICE candidate checked before matchbox sees it.
//!
//! Matchbox unwraps what webrtc-rs parses from a peer's SDP inside its message loop, so one
//! malformed offer or answer from a hostile or broken peer would end the socket and every
//! link on it. Here such a signal is dropped with one warning; that peer's handshake never
//! completes, and the others go on. (Hand-written: matchbox keeps its own signaller private.)

use std::io::Cursor;

use async_trait::async_trait;
use async_tungstenite::smol::{connect_async, ConnectStream};
use async_tungstenite::tungstenite::Message;
use async_tungstenite::WebSocketStream;
use futures::StreamExt;
use matchbox_socket::{
    PeerEvent, PeerRequest, PeerSignal, SignalingError, Signaller, SignallerBuilder,
};

/// Longest offer or answer accepted (a data-channel-only SDP is about 1 KiB).
const MAX_SDP_BYTES: usize = 64 << 10;
/// Longest ICE candidate accepted, as its JSON.
const MAX_CANDIDATE_BYTES: usize = 4 << 10;

#[derive(Debug, Default)]
pub(super) struct CheckedSignallerBuilder;

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
        Ok(Box::new(CheckedSignaller { stream }))
    }
}

struct CheckedSignaller {
    stream: WebSocketStream<ConnectStream>,
}

#[async_trait]
impl Signaller for CheckedSignaller {
    async fn send(&mut self, request: PeerRequest) -> Result<(), SignalingError> {
        let text = serde_json::to_string(&request)
            .map_err(|error| SignalingError::UserImplementationError(error.to_string()))?;
        self.stream.send(Message::Text(text.into())).await?;
        Ok(())
    }

    /// The next event from the server, skipping peers' signals that fail `check_signal`.
    async fn next_message(&mut self) -> Result<PeerEvent, SignalingError> {
        loop {
            let text = match self.stream.next().await {
                Some(Ok(Message::Text(text))) => text,
                Some(Ok(Message::Ping(_) | Message::Pong(_))) => continue,
                Some(Ok(_)) => return Err(SignalingError::UnknownFormat),
                Some(Err(error)) => return Err(error.into()),
                None => return Err(SignalingError::StreamExhausted),
            };
            let event: PeerEvent =
                serde_json::from_str(&text).map_err(|_| SignalingError::UnknownFormat)?;
            if let PeerEvent::Signal { sender, data } = &event {
                if let Err(reason) = check_signal(data) {
                    tracing::warn!(
                        "dropped a malformed WebRTC signal from peer {sender}: {reason}"
                    );
                    continue;
                }
            }
            return Ok(event);
        }
    }
}

/// Whether matchbox can take this signal without panicking: offers and answers must parse
/// as SDP (matchbox unwraps the parse), candidates must be bounded JSON objects or `null`.
pub(super) fn check_signal(signal: &PeerSignal) -> Result<(), String> {
    match signal {
        PeerSignal::Offer(sdp) => check_sdp("offer", sdp),
        PeerSignal::Answer(sdp) => check_sdp("answer", sdp),
        PeerSignal::IceCandidate(json) => check_candidate(json),
    }
}

fn check_sdp(kind: &str, sdp: &str) -> Result<(), String> {
    if sdp.len() > MAX_SDP_BYTES {
        return Err(format!(
            "{kind} of {} bytes (at most {MAX_SDP_BYTES})",
            sdp.len()
        ));
    }
    rtc_sdp::description::session::SessionDescription::unmarshal(&mut Cursor::new(sdp))
        .map(|_| ())
        .map_err(|error| format!("{kind} is not SDP: {error}"))
}

fn check_candidate(json: &str) -> Result<(), String> {
    if json.len() > MAX_CANDIDATE_BYTES {
        return Err(format!(
            "ICE candidate of {} bytes (at most {MAX_CANDIDATE_BYTES})",
            json.len()
        ));
    }
    match serde_json::from_str::<serde_json::Value>(json) {
        Ok(serde_json::Value::Null) => Ok(()),
        Ok(serde_json::Value::Object(fields))
            if fields.get("candidate").is_some_and(|c| c.is_string()) =>
        {
            Ok(())
        }
        _ => Err("ICE candidate is not a JSON candidate object".to_string()),
    }
}
