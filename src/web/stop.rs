//! Stopping long-running work from JavaScript: an `AbortSignal` or a `stop()` method
//! becomes a future that completes once stopping is asked, and `race` drops the work then.
//! Dropping is how the roles stop: their futures own the transport, so the other peers see
//! this one leave.

use futures::channel::oneshot;
use futures::future::Shared;
use futures::FutureExt;
use wasm_bindgen::prelude::*;
use web_sys::AbortSignal;

use super::error::WebError;

/// Completes once stopping was asked (or the asking side is gone).
pub type Stopped = Shared<oneshot::Receiver<()>>;

/// Completes once `signal` aborts.
pub fn aborted(signal: &AbortSignal) -> Stopped {
    let (sender, receiver) = oneshot::channel();
    if signal.aborted() {
        let _ = sender.send(());
    } else {
        let mut sender = Some(sender);
        let listener = Closure::<dyn FnMut()>::new(move || {
            if let Some(sender) = sender.take() {
                let _ = sender.send(());
            }
        });
        let _ = signal.add_event_listener_with_callback("abort", listener.as_ref().unchecked_ref());
        // Lives as long as the signal: an abort after the work ended finds no receiver.
        listener.forget();
    }
    receiver.shared()
}

/// Runs `work` unless `stopped` completes first, which drops it.
pub async fn race<F: std::future::Future>(
    work: F,
    stopped: Option<&Stopped>,
) -> Result<F::Output, WebError> {
    let Some(stopped) = stopped else {
        return Ok(work.await);
    };
    let work = work.fuse();
    let stopped = stopped.clone().fuse();
    futures::pin_mut!(work, stopped);
    futures::select_biased! {
        _ = stopped => Err(WebError::Aborted),
        output = work => Ok(output),
    }
}
