//! The background half of a `WebRtcTransport`: it reads everything matchbox delivers, applies
//! credits to the send windows at once (a peer that only sends must still see them), answers
//! pings and completes flushes on pongs (whatever the application is doing), and queues peer
//! changes and data messages, in arrival order, for `recv`.
//!
//! The queue is unbounded as a channel but bounded in bytes: each peer may have at most one
//! flow-control window of data unacknowledged, and `recv` acknowledges only what it takes.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use futures::channel::mpsc::{UnboundedReceiver, UnboundedSender};
use futures::channel::oneshot;
use futures::{select_biased, FutureExt, StreamExt};
use matchbox_socket::{Packet, PeerState, WebRtcSocket};
use tokio::sync::Semaphore;

use crate::shard::chunk::ChunkError;
use crate::shard::flow::{
    encode_control, parse_credit, parse_echo, Echo, ReceiveWindow, PONG_TAG, WINDOW_BYTES,
};
use crate::shard::transport::{PeerId, TransportError};

/// What the driver hands to `recv`, in one queue so that a peer's departure comes after the
/// messages it sent before leaving.
pub(super) enum Inbound {
    Joined(PeerId),
    Left(PeerId),
    Data(PeerId, Packet),
    /// The peer went past its window; its later messages are dropped.
    Breach(PeerId, ChunkError),
}

/// One connected peer, seen from both directions.
struct Link {
    /// Bytes we may still send to the peer; closed when the peer leaves.
    send_window: Arc<Semaphore>,
    receive_window: ReceiveWindow,
    breached: bool,
    /// Flushes waiting for their pong, oldest first.
    flushes: VecDeque<(u32, oneshot::Sender<()>)>,
    last_ping: u32,
}

/// What happened to a data message from a peer.
enum Arrival {
    Queue,
    Breach(ChunkError),
    Drop,
}

/// The connected peers, shared by the driver, `send` and `recv`.
#[derive(Default)]
pub(super) struct Links(Mutex<HashMap<PeerId, Link>>);

impl Links {
    fn lock(&self) -> MutexGuard<'_, HashMap<PeerId, Link>> {
        // Plain counters and handles: a panic elsewhere leaves them consistent.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn peers(&self) -> Vec<PeerId> {
        let mut peers: Vec<PeerId> = self.lock().keys().copied().collect();
        peers.sort();
        peers
    }

    pub(super) fn send_window(&self, peer: PeerId) -> Option<Arc<Semaphore>> {
        self.lock()
            .get(&peer)
            .map(|link| Arc::clone(&link.send_window))
    }

    /// `recv` took a data message of `len` bytes from `peer`: the credit to send back, if due.
    pub(super) fn consumed(&self, peer: PeerId, len: usize) -> Option<u32> {
        self.lock()
            .get_mut(&peer)
            .and_then(|link| link.receive_window.consumed(len))
    }

    /// Registers a flush to `peer`: the ping to send, and what its pong completes.
    pub(super) fn begin_flush(
        &self,
        peer: PeerId,
    ) -> Result<(u32, oneshot::Receiver<()>), TransportError> {
        let mut links = self.lock();
        let link = links
            .get_mut(&peer)
            .ok_or(TransportError::UnknownPeer(peer))?;
        link.last_ping = link.last_ping.wrapping_add(1);
        let (done, acknowledged) = oneshot::channel();
        link.flushes.push_back((link.last_ping, done));
        Ok((link.last_ping, acknowledged))
    }

    /// The peer answered a ping: the flushes up to it are done. Pongs come back in ping
    /// order; one for no pending flush is ignored.
    fn pong(&self, peer: PeerId, value: u32) {
        let mut links = self.lock();
        let Some(link) = links.get_mut(&peer) else {
            return;
        };
        if link.flushes.iter().any(|(ping, _)| *ping == value) {
            while let Some((ping, done)) = link.flushes.pop_front() {
                let _ = done.send(());
                if ping == value {
                    break;
                }
            }
        }
    }

    /// Adds a peer; false if it was already there.
    fn insert(&self, peer: PeerId) -> bool {
        let mut links = self.lock();
        if links.contains_key(&peer) {
            return false;
        }
        let link = Link {
            send_window: Arc::new(Semaphore::new(WINDOW_BYTES as usize)),
            receive_window: ReceiveWindow::default(),
            breached: false,
            flushes: VecDeque::new(),
            last_ping: 0,
        };
        links.insert(peer, link);
        true
    }

    /// Removes a peer and fails the sends and flushes waiting on it; false if it was not there.
    fn remove(&self, peer: PeerId) -> bool {
        let Some(link) = self.lock().remove(&peer) else {
            return false;
        };
        link.send_window.close();
        true
    }

    fn close_all(&self) {
        for (_, link) in self.lock().drain() {
            link.send_window.close();
        }
    }

    /// Returns up to `bytes` of window to our sends to `peer`. A peer crediting more than is
    /// in flight is only clamped: it can only hurt its own receive side.
    fn credit(&self, peer: PeerId, bytes: u32) {
        if let Some(link) = self.lock().get(&peer) {
            let in_flight =
                (WINDOW_BYTES as usize).saturating_sub(link.send_window.available_permits());
            link.send_window
                .add_permits((bytes as usize).min(in_flight));
        }
    }

    fn arrived(&self, peer: PeerId, len: usize) -> Arrival {
        let mut links = self.lock();
        let Some(link) = links.get_mut(&peer) else {
            return Arrival::Drop;
        };
        if link.breached {
            return Arrival::Drop;
        }
        match link.receive_window.arrived(len) {
            Ok(()) => Arrival::Queue,
            Err(error) => {
                link.breached = true;
                Arrival::Breach(error)
            }
        }
    }
}

/// What the driver waits for.
enum Event {
    Packet(Option<(matchbox_socket::PeerId, Packet)>),
    Peer(Option<(matchbox_socket::PeerId, PeerState)>),
    TransportDropped,
}

pub(super) struct Driver {
    pub(super) socket: WebRtcSocket,
    pub(super) packets: UnboundedReceiver<(matchbox_socket::PeerId, Packet)>,
    /// For pongs; the transport holds the other sender.
    pub(super) outgoing: UnboundedSender<(matchbox_socket::PeerId, Packet)>,
    pub(super) links: Arc<Links>,
    pub(super) inbox: UnboundedSender<Inbound>,
    /// Completes when the transport is dropped: the driver's own `outgoing` would otherwise
    /// keep matchbox's message loop, and every connection, alive.
    pub(super) dropped: oneshot::Receiver<()>,
    /// Peers that left: matchbox ids are never reused, and a late message from one of them
    /// must not make it join again. Grows by 16 bytes per departure.
    pub(super) departed: HashSet<PeerId>,
}

impl Driver {
    /// Runs until the transport is dropped, matchbox's message loop ends (signaling was lost
    /// with no peer left) or nobody reads the queue any more.
    pub(super) async fn run(mut self) {
        loop {
            // Messages first: a peer's last messages are queued before its departure.
            let event = select_biased! {
                _ = (&mut self.dropped).fuse() => Event::TransportDropped,
                packet = self.packets.next() => Event::Packet(packet),
                change = self.socket.next().fuse() => Event::Peer(change),
            };
            let delivered = match event {
                Event::Packet(Some((peer, packet))) => self.on_packet(to_peer(peer), packet),
                Event::Peer(Some((peer, state))) => self.on_peer_state(to_peer(peer), state),
                Event::Packet(None) | Event::Peer(None) | Event::TransportDropped => false,
            };
            if !delivered {
                break;
            }
        }
        self.links.close_all();
    }

    /// False once `recv`'s side is gone.
    fn queue(&self, item: Inbound) -> bool {
        self.inbox.unbounded_send(item).is_ok()
    }

    fn on_peer_state(&mut self, peer: PeerId, state: PeerState) -> bool {
        match state {
            PeerState::Connected => self.join(peer),
            PeerState::Disconnected => {
                self.departed.insert(peer);
                !self.links.remove(peer) || self.queue(Inbound::Left(peer))
            }
        }
    }

    /// Adds `peer` unless it is already there or has left.
    fn join(&mut self, peer: PeerId) -> bool {
        if self.departed.contains(&peer) || !self.links.insert(peer) {
            return true;
        }
        self.queue(Inbound::Joined(peer))
    }

    fn on_packet(&mut self, peer: PeerId, packet: Packet) -> bool {
        if let Some(Ok(bytes)) = parse_credit(&packet) {
            self.links.credit(peer, bytes);
            return true;
        }
        match parse_echo(&packet) {
            // Answered at once; it fails only once matchbox's loop has ended.
            Some(Echo::Ping(value)) => {
                let pong = encode_control(PONG_TAG, value).to_vec().into();
                let _ = self.outgoing.unbounded_send((to_matchbox(peer), pong));
                return true;
            }
            Some(Echo::Pong(value)) => {
                self.links.pong(peer, value);
                return true;
            }
            None => {}
        }
        // A data channel may deliver a message before matchbox reports the peer connected.
        if !self.join(peer) {
            return false;
        }
        match self.links.arrived(peer, packet.len()) {
            Arrival::Queue => self.queue(Inbound::Data(peer, packet)),
            Arrival::Breach(error) => self.queue(Inbound::Breach(peer, error)),
            Arrival::Drop => true,
        }
    }
}

pub(super) fn to_peer(peer: matchbox_socket::PeerId) -> PeerId {
    PeerId(peer.0.as_u128())
}

pub(super) fn to_matchbox(peer: PeerId) -> matchbox_socket::PeerId {
    matchbox_socket::PeerId(uuid::Uuid::from_u128(peer.0))
}
