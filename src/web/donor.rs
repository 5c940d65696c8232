//! The `Donor` class JavaScript sees: lends this browser's GPU to a shard fleet.
//!
//! `Donor.start({ signal, fleet, gpuMemMib, adapter, disableF16, disableSubgroups, onStatus,
//! abortSignal })` opens a WebGPU device, joins the fleet's room at the signaling server over
//! WebRTC, and runs `shard::roles::Donor` until the coordinator dismisses it, leaves, or
//! `abortSignal` fires. Every status change reaches `onStatus` as a plain object with the
//! fields of `DonorStatus` as Rust names them (`bytes_downloaded`, `layers: { start, end }`,
//! `last_step_ms`...). The promise resolves to `{ exit, reason }`.
//!
//! It runs where it is called. Chromium has no `RTCPeerConnection` in workers, so
//! `web/donor.js` calls it on the page; GPU and network work are all asynchronous, so the page
//! stays responsive.

use std::sync::Arc;

use js_sys::Function;
use serde::{Deserialize, Serialize};
use wasm_bindgen::prelude::*;
use web_sys::AbortSignal;

use super::coordinator::explain_join;
use super::engine::{member, open_gpu};
use super::error::WebError;
use super::options::{self, to_js};
use super::stop::{aborted, race};
use crate::gpu::Gpu;
use crate::shard::roles::{Donor, DonorConfig, DonorExit, DonorStatus};
use crate::shard::webrtc::{WebRtcConfig, WebRtcTransport};
use crate::shard::FrameLimits;

/// Largest GPU memory a page may offer, in MiB (a sanity bound on a typed-in number).
const MAX_GPU_MEM_MIB: u64 = 1 << 20;

/// The plain-data part of `Donor.start`'s options (callbacks and the abort signal are read
/// apart).
#[derive(Debug, Clone, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct DonorSettings {
    /// Signaling server, `ws://HOST:PORT/signal`.
    signal: String,
    /// Fleet token: the coordinator refuses donors with another one.
    fleet: String,
    /// GPU memory offered for weights, KV caches and scratch: WebGPU does not say how much
    /// there is, so the page asks.
    gpu_mem_mib: u64,
    /// The adapter's name as the page reads it from `GPUAdapter.info` (wgpu leaves it empty
    /// in browsers); shown to the coordinator in `Hello`.
    adapter: String,
    disable_f16: bool,
    disable_subgroups: bool,
}

impl Default for DonorSettings {
    fn default() -> DonorSettings {
        DonorSettings {
            signal: String::new(),
            fleet: String::new(),
            gpu_mem_mib: 1024,
            adapter: String::new(),
            disable_f16: false,
            disable_subgroups: false,
        }
    }
}

impl DonorSettings {
    fn check(&self) -> Result<(), WebError> {
        if !(self.signal.starts_with("ws://") || self.signal.starts_with("wss://")) {
            return Err(WebError::Options(format!(
                "the signaling address must start with ws:// or wss://, not \"{}\"",
                self.signal
            )));
        }
        if self.fleet.is_empty() {
            return Err(WebError::Options("fleet (the fleet token) is empty".into()));
        }
        if !(1..=MAX_GPU_MEM_MIB).contains(&self.gpu_mem_mib) {
            return Err(WebError::Options(format!(
                "gpuMemMib {} must be 1..={MAX_GPU_MEM_MIB}",
                self.gpu_mem_mib
            )));
        }
        Ok(())
    }
}

/// How `Donor.start` ended.
#[derive(Serialize)]
struct StartResult {
    /// `dismissed`, `coordinator-left`, `closed` or `stopped` (the abort signal fired).
    exit: &'static str,
    reason: String,
}

impl From<DonorExit> for StartResult {
    fn from(exit: DonorExit) -> StartResult {
        match exit {
            DonorExit::Dismissed(reason) => StartResult {
                exit: "dismissed",
                reason,
            },
            DonorExit::CoordinatorLeft => StartResult {
                exit: "coordinator-left",
                reason: "the coordinator left".into(),
            },
            DonorExit::Closed => StartResult {
                exit: "closed",
                reason: "the connection to the fleet closed".into(),
            },
        }
    }
}

/// A browser donor. Only the static `start` is exported: a donor lives as long as its
/// promise.
#[wasm_bindgen(js_name = Donor)]
pub struct WebDonor;

#[wasm_bindgen(js_class = Donor)]
impl WebDonor {
    /// Joins the fleet and serves until dismissed, disconnected or aborted (see the module
    /// documentation for the options).
    pub async fn start(options: JsValue) -> Result<JsValue, JsValue> {
        Ok(start(options).await?)
    }
}

async fn start(options: JsValue) -> Result<JsValue, WebError> {
    let settings: DonorSettings = options::parse(&options, "donor options")?;
    settings.check()?;
    let on_status: Option<Function> = member(&options, "onStatus");
    let abort: Option<AbortSignal> = member(&options, "abortSignal");
    let stopped = abort.as_ref().map(aborted);
    let gpu = open_named_gpu(&settings).await?;
    let joined = WebRtcTransport::join_fleet(
        &settings.signal,
        &settings.fleet,
        // Loopback and LAN fleets need no STUN; a public fleet would pass ICE servers here.
        WebRtcConfig {
            ice_urls: Vec::new(),
            ..WebRtcConfig::default()
        },
    );
    let transport = race(joined, stopped.as_ref())
        .await?
        .map_err(explain_join)?;
    let config = DonorConfig {
        fleet_token: settings.fleet.clone(),
        gpu,
        usable_gpu_bytes: settings.gpu_mem_mib << 20,
        limits: FrameLimits::default(),
        pinned_ms_per_layer: None,
    };
    let mut donor = Donor::new(transport, config);
    if let Some(callback) = on_status {
        donor.on_status(move |status: &DonorStatus| {
            if let Ok(value) = to_js(status) {
                let _ = callback.call1(&JsValue::NULL, &value);
            }
        });
    }
    let exit = match race(donor.run(), stopped.as_ref()).await {
        Ok(exit) => StartResult::from(exit?),
        Err(WebError::Aborted) => StartResult {
            exit: "stopped",
            reason: "stopped on this page".into(),
        },
        Err(other) => return Err(other),
    };
    to_js(&exit).map_err(WebError::Options)
}

/// The WebGPU device, named as the page reads its adapter (wgpu leaves the name empty in
/// browsers).
async fn open_named_gpu(settings: &DonorSettings) -> Result<Arc<Gpu>, WebError> {
    let mut gpu = open_gpu(settings.disable_f16, settings.disable_subgroups).await?;
    if gpu.caps.adapter.is_empty() {
        // Nothing else holds the device yet, so the name can still be set.
        if let Some(only) = Arc::get_mut(&mut gpu) {
            only.caps.adapter = settings.adapter.chars().take(256).collect();
        }
    }
    Ok(gpu)
}
