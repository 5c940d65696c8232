//! Fault injection for tests: a transport that makes its donor wrong on purpose. Used by the
//! in-process role tests and by `runner donor`'s hidden `--fault-perturb`, which exists only
//! so that process-level tests can check that `--verify` flags a faulty donor. Nothing else
//! should use it.

use super::activations::Activations;
use super::frame::{decode_frame, encode_frame, Message, StageInput, StageOutput};
use super::transport::{PeerId, Transport, TransportError, TransportEvent, TransportStats};

/// Adds `scale` × the RMS of every outgoing activation tensor and top-k logit list to it:
/// a donor whose results are wrong but well formed.
pub struct Perturbing<T> {
    pub inner: T,
    pub scale: f32,
}

fn perturb(values: &mut [f32], scale: f32) {
    let rms = (values.iter().map(|v| v * v).sum::<f32>() / values.len().max(1) as f32).sqrt();
    for (index, value) in values.iter_mut().enumerate() {
        let sign = if index % 2 == 0 { 1.0 } else { -1.0 };
        *value += sign * scale * rms;
    }
}

fn perturb_activations(hidden: &mut Activations, scale: f32) {
    let mut values = hidden.to_f32();
    perturb(&mut values, scale);
    if let Ok(encoded) = Activations::encode(&values, hidden.d_model, hidden.encoding) {
        *hidden = encoded;
    }
}

/// The frame with its activations and logits perturbed; frames that do not decode or
/// re-encode are passed on unchanged.
fn perturb_frame(frame: &[u8], scale: f32) -> Option<Vec<u8>> {
    let mut message = decode_frame(frame).ok()?;
    match &mut message {
        Message::Forward(forward) => match &mut forward.input {
            StageInput::Hidden(hidden) => perturb_activations(hidden, scale),
            StageInput::Tokens(_) => return None,
        },
        Message::Result(result) => match &mut result.output {
            StageOutput::Hidden(hidden) => perturb_activations(hidden, scale),
            StageOutput::TopK {
                logits, log_norm, ..
            } => {
                perturb(logits, scale);
                // As a faulty GPU would: its own sum over its own (wrong) logits.
                if let Some(norm) = log_norm {
                    *norm = logits.iter().fold(*norm, |norm, &l| norm.max(l));
                }
            }
            StageOutput::Sampled(_) => return None,
        },
        _ => return None,
    }
    encode_frame(&message).ok()
}

#[cfg_attr(target_arch = "wasm32", async_trait::async_trait(?Send))]
#[cfg_attr(not(target_arch = "wasm32"), async_trait::async_trait)]
impl<T: Transport + Send + Sync> Transport for Perturbing<T> {
    fn local_id(&self) -> PeerId {
        self.inner.local_id()
    }
    fn peers(&self) -> Vec<PeerId> {
        self.inner.peers()
    }
    fn stats(&self) -> TransportStats {
        self.inner.stats()
    }
    async fn send(&self, to: PeerId, frame: &[u8]) -> Result<(), TransportError> {
        match perturb_frame(frame, self.scale) {
            Some(perturbed) => self.inner.send(to, &perturbed).await,
            None => self.inner.send(to, frame).await,
        }
    }
    async fn flush(&self, to: PeerId) -> Result<(), TransportError> {
        self.inner.flush(to).await
    }
    async fn recv(&self) -> Result<TransportEvent, TransportError> {
        self.inner.recv().await
    }
    async fn rejoin(&mut self) -> Result<(), TransportError> {
        self.inner.rejoin().await
    }
}
