//! Moving frames between peers: the `Transport` trait, and an in-process implementation that
//! runs the real wire path (slicing into chunks, reassembly, backpressure) for tests.
//!
//! The trait follows matchbox_socket's model so a WebRTC implementation is a thin adapter:
//! peers are addressed by id (matchbox's `PeerId` is a UUID, hence `u128`), peer arrival and
//! departure are events (`update_peers`), and frames go over one reliable, ordered channel
//! as chunks of at most 16 KiB (`chunk`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use futures::channel::mpsc;
use futures::lock::Mutex as AsyncMutex;
use futures::{SinkExt, StreamExt};
use serde::{Deserialize, Serialize};

use super::chunk::{slice_frame, ChunkError, Reassembler, ReassemblyLimits, MAX_CHUNK_BYTES};
use super::frame::{encode_frame, FrameError, Message};

/// A peer's address on the fleet.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PeerId(pub u128);

impl std::fmt::Display for PeerId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

/// What `Transport::recv` hands out, in arrival order.
#[derive(Debug, Clone, PartialEq)]
pub enum TransportEvent {
    PeerJoined(PeerId),
    /// The peer is gone; frames it sent before leaving came first.
    PeerLeft(PeerId),
    /// A whole frame, reassembled; not yet decoded or validated.
    Frame {
        from: PeerId,
        frame: Vec<u8>,
    },
    /// A peer sent a chunk that breaks the wire rules; the frame it belonged to is dropped.
    BadChunk {
        from: PeerId,
        error: ChunkError,
    },
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TransportError {
    #[error("no peer {0} on this transport")]
    UnknownPeer(PeerId),
    #[error("peer {0} went away")]
    PeerGone(PeerId),
    #[error("the transport is closed")]
    Closed,
    #[error("cannot slice frame: {0}")]
    Chunk(#[from] ChunkError),
    #[error("cannot encode frame: {0}")]
    Frame(#[from] FrameError),
    #[error("cannot join room {room:?} at {signal_url:?}: the URL must be ws:// or wss:// and the room 1 to 64 of A-Z a-z 0-9 - _")]
    InvalidRoom { signal_url: String, room: String },
    #[error("cannot join signaling room {url}: {reason}")]
    Connect { url: String, reason: String },
    #[error("no answer from signaling room {url} within {ms} ms")]
    ConnectTimeout { url: String, ms: u64 },
    #[error("the WebRTC transport must be created inside a tokio runtime: a spawned task drives its connections")]
    NoRuntime,
}

/// Byte and frame counters since the transport started (wire bytes, chunk headers included).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TransportStats {
    pub bytes_sent: u64,
    pub bytes_received: u64,
    pub frames_sent: u64,
    pub frames_received: u64,
}

/// Peer-addressed frame delivery over a reliable, ordered channel.
///
/// `send` returns once every chunk of the frame is handed to the channel; it waits while
/// more than the implementation's send buffer is in flight to the peer, so a fast stage
/// cannot queue unbounded activations behind a slow one.
#[cfg_attr(target_arch = "wasm32", async_trait::async_trait(?Send))]
#[cfg_attr(not(target_arch = "wasm32"), async_trait::async_trait)]
pub trait Transport: MaybeSend {
    fn local_id(&self) -> PeerId;

    /// Peers connected now.
    fn peers(&self) -> Vec<PeerId>;

    fn stats(&self) -> TransportStats;

    /// Sends one encoded frame (`encode_frame`) to `to`. Cancelling it midway leaves the
    /// receiver a partial frame, which counts against its reassembly limits.
    async fn send(&self, to: PeerId, frame: &[u8]) -> Result<(), TransportError>;

    /// Returns once every frame whose `send` to `to` returned before this call has reached
    /// `to`'s transport (not necessarily its application). Dropping a transport discards
    /// what its connections still queue, so a peer about to go flushes first. Fails with
    /// `PeerGone` if `to` leaves first.
    async fn flush(&self, to: PeerId) -> Result<(), TransportError>;

    /// The next event; `Closed` once nothing more can arrive.
    async fn recv(&self) -> Result<TransportEvent, TransportError>;

    /// Leaves and joins again, under a new id, so that every link is made anew: for a peer
    /// that waits on links that may never open (a WebRTC handshake can fail without a word,
    /// about once in a hundred on a loaded loopback). The others see it leave and a new peer
    /// join. Transports whose links cannot fail keep them.
    async fn rejoin(&mut self) -> Result<(), TransportError> {
        Ok(())
    }

    /// Asks that peers nobody hears yet (a newcomer's Hello, a donor back under a new id) be
    /// heard here from now on: a chain that shares its transport with other chains
    /// (`roles::lanes`) and is short of donors calls it. A transport with one reader has
    /// nothing to do.
    fn hear_newcomers(&self) {}
}

/// `Send` natively, where roles move transports across threads (and `rejoin`'s future holds
/// `&mut self`); nothing in browsers, whose transports live on one thread.
#[cfg(not(target_arch = "wasm32"))]
pub trait MaybeSend: Send {}
#[cfg(not(target_arch = "wasm32"))]
impl<T: Send> MaybeSend for T {}
#[cfg(target_arch = "wasm32")]
pub trait MaybeSend {}
#[cfg(target_arch = "wasm32")]
impl<T> MaybeSend for T {}

/// `Sync` natively, where a transport shared by several chains (`roles::lanes`) is used from
/// `Send` futures; nothing in browsers.
#[cfg(not(target_arch = "wasm32"))]
pub trait MaybeSync: Sync {}
#[cfg(not(target_arch = "wasm32"))]
impl<T: Sync> MaybeSync for T {}
#[cfg(target_arch = "wasm32")]
pub trait MaybeSync {}
#[cfg(target_arch = "wasm32")]
impl<T> MaybeSync for T {}

/// Encodes and sends a message.
pub async fn send_message(
    transport: &dyn Transport,
    to: PeerId,
    message: &Message,
) -> Result<(), TransportError> {
    let frame = encode_frame(message)?;
    transport.send(to, &frame).await
}

/// Settings of an in-process network.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InProcessConfig {
    /// Chunk bytes a peer's inbox holds before senders wait (each concurrent `send` may
    /// add one chunk beyond it).
    pub send_buffer_bytes: usize,
    pub reassembly: ReassemblyLimits,
}

impl Default for InProcessConfig {
    fn default() -> InProcessConfig {
        InProcessConfig {
            send_buffer_bytes: 1 << 20,
            reassembly: ReassemblyLimits::default(),
        }
    }
}

/// What travels through a peer's inbox, in one ordered queue so that a peer's departure is
/// seen after the frames it sent.
enum Inbound {
    Joined(PeerId),
    Left(PeerId),
    Chunk(PeerId, Vec<u8>),
}

#[derive(Default)]
struct Directory {
    next_id: u128,
    inboxes: HashMap<PeerId, mpsc::Sender<Inbound>>,
}

/// A set of peers in one process; `join` adds one.
#[derive(Clone, Default)]
pub struct InProcessNetwork {
    directory: Arc<Mutex<Directory>>,
    config: InProcessConfig,
}

impl InProcessNetwork {
    pub fn new(config: InProcessConfig) -> InProcessNetwork {
        InProcessNetwork {
            directory: Arc::default(),
            config,
        }
    }

    /// A new peer; every peer already present gets `PeerJoined` for it, and it gets
    /// `PeerJoined` for each of them.
    pub fn join(&self) -> InProcessTransport {
        let buffer = (self.config.send_buffer_bytes / MAX_CHUNK_BYTES).max(1);
        let (inbox_sender, inbox) = mpsc::channel(buffer);
        let mut directory = lock(&self.directory);
        directory.next_id += 1;
        let id = PeerId(directory.next_id);
        for (&other, other_inbox) in directory.inboxes.iter() {
            notify(other_inbox, Inbound::Joined(id));
            notify(&inbox_sender, Inbound::Joined(other));
        }
        directory.inboxes.insert(id, inbox_sender);
        InProcessTransport {
            id,
            directory: Arc::clone(&self.directory),
            next_frame_id: AtomicU32::new(0),
            counters: Counters::default(),
            inbox: AsyncMutex::new(InboxState {
                inbox,
                frames: PeerFrames::new(self.config.reassembly),
            }),
        }
    }
}

/// Queues a notification without waiting: a fresh sender always has one guaranteed slot in
/// a futures bounded channel. A closed inbox means that peer is leaving too; nothing to tell.
fn notify(inbox: &mpsc::Sender<Inbound>, message: Inbound) {
    let _ = inbox.clone().try_send(message);
}

fn lock(directory: &Mutex<Directory>) -> std::sync::MutexGuard<'_, Directory> {
    // The directory is a plain map; a panic elsewhere leaves it consistent.
    directory.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What `stats` reports, shared with the other transports of this module tree.
#[derive(Default)]
pub(super) struct Counters {
    pub(super) bytes_sent: AtomicU64,
    pub(super) bytes_received: AtomicU64,
    pub(super) frames_sent: AtomicU64,
    pub(super) frames_received: AtomicU64,
}

impl Counters {
    pub(super) fn add(counter: &AtomicU64, amount: usize) {
        counter.fetch_add(amount as u64, Ordering::Relaxed);
    }

    pub(super) fn snapshot(&self) -> TransportStats {
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        TransportStats {
            bytes_sent: load(&self.bytes_sent),
            bytes_received: load(&self.bytes_received),
            frames_sent: load(&self.frames_sent),
            frames_received: load(&self.frames_received),
        }
    }
}

/// Every transport's receive side: one reassembler per peer, turning chunks into frames.
pub(super) struct PeerFrames {
    reassemblers: HashMap<PeerId, Reassembler>,
    limits: ReassemblyLimits,
}

impl PeerFrames {
    pub(super) fn new(limits: ReassemblyLimits) -> PeerFrames {
        PeerFrames {
            reassemblers: HashMap::new(),
            limits,
        }
    }

    pub(super) fn joined(&mut self, peer: PeerId) {
        self.reassemblers
            .insert(peer, Reassembler::new(self.limits));
    }

    pub(super) fn left(&mut self, peer: PeerId) {
        self.reassemblers.remove(&peer);
    }

    /// The event `chunk` from `from` completes, or `None` while its frame is incomplete;
    /// whole frames are counted in `counters`.
    pub(super) fn push(
        &mut self,
        from: PeerId,
        chunk: &[u8],
        counters: &Counters,
    ) -> Option<TransportEvent> {
        let limits = self.limits;
        let reassembler = self
            .reassemblers
            .entry(from)
            .or_insert_with(|| Reassembler::new(limits));
        match reassembler.push(chunk) {
            Ok(None) => None,
            Ok(Some(frame)) => {
                Counters::add(&counters.frames_received, 1);
                Some(TransportEvent::Frame { from, frame })
            }
            Err(error) => Some(TransportEvent::BadChunk { from, error }),
        }
    }
}

struct InboxState {
    inbox: mpsc::Receiver<Inbound>,
    frames: PeerFrames,
}

/// One peer of an `InProcessNetwork`. Dropping it is leaving: the others get `PeerLeft`.
pub struct InProcessTransport {
    id: PeerId,
    directory: Arc<Mutex<Directory>>,
    next_frame_id: AtomicU32,
    counters: Counters,
    inbox: AsyncMutex<InboxState>,
}

impl InProcessTransport {
    /// Puts raw bytes on the wire to `to` as one chunk, bypassing slicing: for tests that
    /// play a misbehaving peer.
    pub async fn send_raw_chunk(&self, to: PeerId, chunk: Vec<u8>) -> Result<(), TransportError> {
        let mut inbox = self.inbox_of(to)?;
        inbox
            .feed(Inbound::Chunk(self.id, chunk))
            .await
            .map_err(|_| TransportError::PeerGone(to))
    }

    fn inbox_of(&self, peer: PeerId) -> Result<mpsc::Sender<Inbound>, TransportError> {
        lock(&self.directory)
            .inboxes
            .get(&peer)
            .cloned()
            .ok_or(TransportError::UnknownPeer(peer))
    }

    /// Turns one inbox item into an event, or `None` while a frame is still incomplete.
    fn receive(&self, state: &mut InboxState, item: Inbound) -> Option<TransportEvent> {
        match item {
            Inbound::Joined(peer) => {
                state.frames.joined(peer);
                Some(TransportEvent::PeerJoined(peer))
            }
            Inbound::Left(peer) => {
                state.frames.left(peer);
                Some(TransportEvent::PeerLeft(peer))
            }
            Inbound::Chunk(from, chunk) => {
                Counters::add(&self.counters.bytes_received, chunk.len());
                state.frames.push(from, &chunk, &self.counters)
            }
        }
    }
}

#[cfg_attr(target_arch = "wasm32", async_trait::async_trait(?Send))]
#[cfg_attr(not(target_arch = "wasm32"), async_trait::async_trait)]
impl Transport for InProcessTransport {
    fn local_id(&self) -> PeerId {
        self.id
    }

    fn peers(&self) -> Vec<PeerId> {
        let mut peers: Vec<PeerId> = lock(&self.directory)
            .inboxes
            .keys()
            .copied()
            .filter(|&peer| peer != self.id)
            .collect();
        peers.sort();
        peers
    }

    fn stats(&self) -> TransportStats {
        self.counters.snapshot()
    }

    async fn send(&self, to: PeerId, frame: &[u8]) -> Result<(), TransportError> {
        let frame_id = self.next_frame_id.fetch_add(1, Ordering::Relaxed);
        let chunks = slice_frame(frame_id, frame)?;
        let mut inbox = self.inbox_of(to)?;
        for chunk in chunks {
            let len = chunk.len() as u64;
            // `feed` returns once the chunk is queued; `send` would also wait for room for
            // the next one, which the next chunk's `feed` waits for anyway.
            inbox
                .feed(Inbound::Chunk(self.id, chunk))
                .await
                .map_err(|_| TransportError::PeerGone(to))?;
            self.counters.bytes_sent.fetch_add(len, Ordering::Relaxed);
        }
        self.counters.frames_sent.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// A sent chunk is in the peer's inbox already, which outlives the sender.
    async fn flush(&self, to: PeerId) -> Result<(), TransportError> {
        self.inbox_of(to).map(drop)
    }

    async fn recv(&self) -> Result<TransportEvent, TransportError> {
        let mut state = self.inbox.lock().await;
        loop {
            let item = state.inbox.next().await.ok_or(TransportError::Closed)?;
            if let Some(event) = self.receive(&mut state, item) {
                return Ok(event);
            }
        }
    }
}

impl Drop for InProcessTransport {
    fn drop(&mut self) {
        let mut directory = lock(&self.directory);
        directory.inboxes.remove(&self.id);
        for other_inbox in directory.inboxes.values() {
            notify(other_inbox, Inbound::Left(self.id));
        }
    }
}
