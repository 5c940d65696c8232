//! Timers without a runtime: the roles run under any executor (pollster in tests, tokio in
//! the runner, the browser's event loop), so they cannot use tokio's timers.
//!
//! Natively `futures-timer` keeps one helper thread; in a browser tab or worker a timer is a
//! `setTimeout` promise.

use std::future::Future;
use std::time::Duration;

use futures::FutureExt;

/// Completes after `duration`.
pub async fn sleep(duration: Duration) {
    platform::sleep(duration).await
}

/// The elapsed limit of `with_timeout`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Elapsed;

/// Runs `future` for at most `limit`.
pub async fn with_timeout<F: Future>(limit: Duration, future: F) -> Result<F::Output, Elapsed> {
    let future = future.fuse();
    let timer = sleep(limit).fuse();
    futures::pin_mut!(future, timer);
    futures::select_biased! {
        output = future => Ok(output),
        () = timer => Err(Elapsed),
    }
}

/// Milliseconds since the Unix epoch (heartbeat send times).
pub fn unix_ms() -> u64 {
    web_time::SystemTime::now()
        .duration_since(web_time::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_millis() as u64)
}

#[cfg(not(target_arch = "wasm32"))]
mod platform {
    use std::time::Duration;

    pub async fn sleep(duration: Duration) {
        futures_timer::Delay::new(duration).await
    }
}

#[cfg(target_arch = "wasm32")]
mod platform {
    use std::time::Duration;

    use wasm_bindgen::{JsCast, JsValue};

    /// `setTimeout` from the global scope, so it works in a window and in a worker alike.
    pub async fn sleep(duration: Duration) {
        let millis = duration.as_millis().min(i32::MAX as u128) as i32;
        let promise = js_sys::Promise::new(&mut |resolve, _reject| {
            let global = js_sys::global();
            let set_timeout = js_sys::Reflect::get(&global, &JsValue::from_str("setTimeout"))
                .ok()
                .and_then(|f| f.dyn_into::<js_sys::Function>().ok());
            match set_timeout {
                Some(set_timeout) => {
                    let _ = set_timeout.call2(&global, &resolve, &JsValue::from(millis));
                }
                // No timers in this scope: resolve at once rather than never.
                None => {
                    let _ = resolve.call0(&JsValue::NULL);
                }
            }
        });
        let _ = wasm_bindgen_futures::JsFuture::from(promise).await;
    }
}
