//! Where the transport's background task runs: a tokio task natively, the browser's
//! microtask queue on wasm; and who carries its signals (`signaller`, which switches its
//! websocket half by platform). matchbox hides the rest.

use std::future::Future;

use matchbox_socket::WebRtcSocketBuilder;

use crate::shard::transport::TransportError;

/// Runs `task` in the background on the current tokio runtime.
#[cfg(not(target_arch = "wasm32"))]
pub(super) fn spawn(task: impl Future<Output = ()> + Send + 'static) -> Result<(), TransportError> {
    let runtime = tokio::runtime::Handle::try_current().map_err(|_| TransportError::NoRuntime)?;
    // Detached: the task ends by itself once the transport is dropped (see `driver`).
    drop(runtime.spawn(task));
    Ok(())
}

/// Runs `task` in the background on the page's (or worker's) event loop.
#[cfg(target_arch = "wasm32")]
pub(super) fn spawn(task: impl Future<Output = ()> + 'static) -> Result<(), TransportError> {
    wasm_bindgen_futures::spawn_local(task);
    Ok(())
}

/// Peers' signals are checked before matchbox sees them (`signaller`).
pub(super) fn checked_signals(builder: WebRtcSocketBuilder) -> WebRtcSocketBuilder {
    builder.signaller_builder(std::sync::Arc::new(
        super::signaller::CheckedSignallerBuilder,
    ))
}
