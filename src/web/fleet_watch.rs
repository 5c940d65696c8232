//! What the page sees of its fleet while the coordinator works: a transport that passes
//! every frame through unchanged and reports the protocol events a person wants to watch
//! (donors arriving, the plan, stages loading, each step's hops, donors lost) to a JS
//! callback. Watching the wire keeps the roles free of any UI hook.

use std::cell::RefCell;
use std::collections::HashMap;

use js_sys::Function;
use serde::Serialize;
use wasm_bindgen::JsValue;

use super::options::to_js;
use crate::shard::frame::{decode_frame, Assign, ErrorReport, Hello, Message, Ready, StageResult};
use crate::shard::transport::{PeerId, Transport, TransportError, TransportEvent, TransportStats};

/// One event for `onEvent`, as `{ type: "donor", peer, adapter, ... }`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(
    tag = "type",
    rename_all = "kebab-case",
    rename_all_fields = "camelCase"
)]
pub enum FleetEvent {
    /// A peer entered the signaling room (not yet known as a donor).
    Joined { peer: String },
    /// A donor's first Hello; `accepted` is false when its fleet token is another one.
    Donor {
        peer: String,
        adapter: String,
        gpu_mib: u64,
        ms_per_layer: f32,
        accepted: bool,
    },
    /// Every stage of a plan epoch was assigned.
    Plan {
        epoch: u32,
        stages: Vec<PlannedStage>,
    },
    /// A stage finished loading its layers.
    Ready {
        peer: String,
        epoch: u32,
        stage_id: u16,
        bytes_downloaded: u64,
        load_ms: u32,
    },
    /// A step came back from the chain, with each stage's share.
    Step {
        start_pos: u32,
        n_tokens: u32,
        hops: Vec<Hop>,
    },
    /// A donor reported an error (a stage that failed to load, a refused frame...).
    DonorError {
        peer: String,
        code: String,
        message: String,
    },
    /// A peer left the room; `in_plan` when it held a stage (the coordinator re-plans).
    Left { peer: String, in_plan: bool },
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PlannedStage {
    pub stage_id: u16,
    pub peer: String,
    pub adapter: String,
    /// First layer and one past the last.
    pub layers: [u32; 2],
    pub embedding: bool,
    pub head: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Hop {
    pub stage_id: u16,
    pub compute_ms: f64,
    pub bytes_out: u32,
}

/// What the watcher remembers to put events in context.
#[derive(Default)]
struct Watch {
    /// Donors that said Hello, with their adapter's name.
    adapters: HashMap<PeerId, String>,
    /// The newest epoch's Assigns sent so far.
    epoch: u32,
    assigned: Vec<(PeerId, PlannedStage)>,
    /// Donors of the last complete plan.
    planned: Vec<PeerId>,
}

impl Watch {
    fn incoming(&mut self, token: &str, event: &TransportEvent) -> Option<FleetEvent> {
        match event {
            TransportEvent::PeerJoined(peer) => Some(FleetEvent::Joined {
                peer: peer.to_string(),
            }),
            TransportEvent::PeerLeft(peer) => Some(FleetEvent::Left {
                peer: peer.to_string(),
                in_plan: self.planned.contains(peer),
            }),
            TransportEvent::Frame { from, frame } => match decode_frame(frame).ok()? {
                Message::Hello(hello) => self.hello(token, *from, hello),
                Message::Ready(ready) => Some(ready_event(*from, ready)),
                Message::Result(result) => Some(step_event(result)),
                Message::Error(report) => Some(error_event(*from, report)),
                _ => None,
            },
            TransportEvent::BadChunk { .. } => None,
        }
    }

    fn outgoing(&mut self, to: PeerId, frame: &[u8]) -> Option<FleetEvent> {
        match decode_frame(frame).ok()? {
            Message::Assign(assign) => self.assign(to, assign),
            _ => None,
        }
    }

    /// Only the first Hello: donors repeat theirs until they are assigned a stage.
    fn hello(&mut self, token: &str, from: PeerId, hello: Hello) -> Option<FleetEvent> {
        if self.adapters.contains_key(&from) {
            return None;
        }
        self.adapters.insert(from, hello.donor.adapter.clone());
        Some(FleetEvent::Donor {
            peer: from.to_string(),
            adapter: hello.donor.adapter,
            gpu_mib: hello.donor.usable_gpu_bytes >> 20,
            ms_per_layer: hello.donor.ms_per_layer,
            accepted: hello.fleet_token == token,
        })
    }

    /// Collects an epoch's Assigns; the last one completes the plan.
    fn assign(&mut self, to: PeerId, assign: Assign) -> Option<FleetEvent> {
        if assign.epoch != self.epoch {
            self.epoch = assign.epoch;
            self.assigned.clear();
        }
        let stage = PlannedStage {
            stage_id: assign.stage_id,
            peer: to.to_string(),
            adapter: self.adapters.get(&to).cloned().unwrap_or_default(),
            layers: [assign.layer_start, assign.layer_end],
            embedding: assign.embedding,
            head: assign.head,
        };
        self.assigned.push((to, stage));
        if self.assigned.len() < usize::from(assign.n_stages) {
            return None;
        }
        let mut assigned = std::mem::take(&mut self.assigned);
        assigned.sort_by_key(|(_, stage)| stage.stage_id);
        self.planned = assigned.iter().map(|(peer, _)| *peer).collect();
        Some(FleetEvent::Plan {
            epoch: assign.epoch,
            stages: assigned.into_iter().map(|(_, stage)| stage).collect(),
        })
    }
}

fn ready_event(from: PeerId, ready: Ready) -> FleetEvent {
    FleetEvent::Ready {
        peer: from.to_string(),
        epoch: ready.epoch,
        stage_id: ready.stage_id,
        bytes_downloaded: ready.bytes_downloaded,
        load_ms: ready.load_ms,
    }
}

/// The trace holds one entry per stage, in chain order.
fn step_event(result: StageResult) -> FleetEvent {
    let hops = result
        .trace
        .iter()
        .zip(0u16..)
        .map(|(trace, stage_id)| Hop {
            stage_id,
            compute_ms: f64::from(trace.compute_us) / 1000.0,
            bytes_out: trace.payload_bytes,
        })
        .collect();
    FleetEvent::Step {
        start_pos: result.start_pos,
        n_tokens: result.n_tokens,
        hops,
    }
}

fn error_event(from: PeerId, report: ErrorReport) -> FleetEvent {
    FleetEvent::DonorError {
        peer: from.to_string(),
        code: format!("{:?}", report.code),
        message: report.message,
    }
}

/// `inner` with every event worth showing reported to `on_event`.
pub struct Watched<T> {
    inner: T,
    fleet_token: String,
    on_event: Option<Function>,
    watch: RefCell<Watch>,
}

impl<T> Watched<T> {
    pub fn new(inner: T, fleet_token: &str, on_event: Option<Function>) -> Watched<T> {
        Watched {
            inner,
            fleet_token: fleet_token.to_string(),
            on_event,
            watch: RefCell::default(),
        }
    }

    fn report(&self, event: Option<FleetEvent>) {
        let (Some(callback), Some(event)) = (&self.on_event, event) else {
            return;
        };
        if let Ok(value) = to_js(&event) {
            // A throwing callback is the page's bug; the fleet goes on.
            let _ = callback.call1(&JsValue::NULL, &value);
        }
    }
}

#[async_trait::async_trait(?Send)]
impl<T: Transport> Transport for Watched<T> {
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
        self.inner.send(to, frame).await?;
        let event = self.watch.borrow_mut().outgoing(to, frame);
        self.report(event);
        Ok(())
    }

    async fn flush(&self, to: PeerId) -> Result<(), TransportError> {
        self.inner.flush(to).await
    }

    async fn recv(&self) -> Result<TransportEvent, TransportError> {
        let event = self.inner.recv().await?;
        let watched = self.watch.borrow_mut().incoming(&self.fleet_token, &event);
        self.report(watched);
        Ok(event)
    }

    async fn rejoin(&mut self) -> Result<(), TransportError> {
        self.inner.rejoin().await
    }
}
