//! wasm-bindgen exports and worker glue: the only module that knows it runs in a browser.
//!
//! JavaScript sees `Engine` (load a GGUF URL into WebGPU, generate, chat, abort),
//! `EmbeddingModel` (load an embedding GGUF, embed texts: `embedder`),
//! `wasmMemoryBytes()`, `clearCache()`, `Donor` (lends this GPU to a shard fleet) and
//! `Coordinator` (generates through a fleet of donors instead of this GPU). Loads
//! read the file with ranged `fetch`es through an OPFS cache (`cache`), so interrupted
//! downloads resume and finished ones work offline.

pub mod cache;
pub mod coordinator;
pub mod donor;
pub mod embedder;
pub mod engine;
pub mod error;
pub mod fetch;
pub mod fleet_watch;
pub mod opfs;
pub mod options;
pub mod source;
pub mod stop;

use wasm_bindgen::prelude::*;

pub use engine::{wasm_memory_bytes, WebEngine};
pub use error::WebError;

/// Panics show up in the console with a Rust backtrace instead of `unreachable`.
#[wasm_bindgen(start)]
fn start() {
    console_error_panic_hook::set_once();
}

/// Deletes every cached model from OPFS.
#[wasm_bindgen(js_name = clearCache)]
pub async fn clear_cache() -> Result<(), JsValue> {
    let root = opfs::Dir::root().await?;
    root.remove(cache::CACHE_DIR).await?;
    Ok(())
}
