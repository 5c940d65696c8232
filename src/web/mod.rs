//! wasm-bindgen exports and worker glue: the only module that knows it runs in a browser.
