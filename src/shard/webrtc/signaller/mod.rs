//! The signaling half of the WebRTC socket: matchbox's websocket signaller, with every peer's
//! offer, answer and ICE candidate checked (`check`) before matchbox sees it.
//!
//! Matchbox unwraps what the WebRTC stack makes of a peer's SDP and candidates, so one
//! malformed signal from a hostile or broken peer would end a runner's socket and every link
//! on it, or abort a page's wasm instance. Here such a signal is dropped with one warning;
//! that peer's handshake never completes, and the others go on. Hand-written: matchbox keeps
//! its own signallers private, so the websocket halves (`native`, `wasm`) are ours too.

mod check;
#[cfg(not(target_arch = "wasm32"))]
mod native;
#[cfg(target_arch = "wasm32")]
mod wasm;

use matchbox_socket::{PeerEvent, SignalingError};

#[cfg(not(target_arch = "wasm32"))]
pub(super) use native::CheckedSignallerBuilder;
#[cfg(not(target_arch = "wasm32"))]
use native::{stack_parses, warn};
#[cfg(target_arch = "wasm32")]
pub(super) use wasm::CheckedSignallerBuilder;
#[cfg(target_arch = "wasm32")]
use wasm::{stack_parses, warn};

/// One socket's checks: the signaling server's text in, the events matchbox may see out.
/// Public for the fuzz target (`fuzz/fuzz_targets/webrtc_signal.rs`).
#[derive(Default)]
pub struct SignalGate {
    signals: check::SignalRules,
}

impl SignalGate {
    /// The event in `text`, or `None` for a peer's signal that fails its checks.
    pub fn admit(&mut self, text: &str) -> Result<Option<PeerEvent>, SignalingError> {
        let event: PeerEvent =
            serde_json::from_str(text).map_err(|_| SignalingError::UnknownFormat)?;
        match &event {
            PeerEvent::PeerLeft(peer) => self.signals.forget(*peer),
            PeerEvent::Signal { sender, data } => {
                let checked = (self.signals.check(*sender, data)).and_then(|()| stack_parses(data));
                if let Err(reason) = checked {
                    warn(&format!(
                        "dropped a malformed WebRTC signal from peer {sender}: {reason}"
                    ));
                    return Ok(None);
                }
            }
            PeerEvent::IdAssigned(_) | PeerEvent::NewPeer(_) => {}
        }
        Ok(Some(event))
    }
}
