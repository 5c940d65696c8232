//! The background half of a `WebRtcTransport`: it reads everything matchbox delivers, applies
//! credits to the send windows at once (a peer that only sends must still see them), answers
//! pings, confirms new links, and queues peer changes and data messages, in arrival order, for
//! `recv`.
//!
//! The queue is unbounded as a channel but bounded in bytes: each peer may have at most one
//! flow-control window of data unacknowledged, and `recv` acknowledges only what it takes.
//!
//! A new link is not usable at once: a message sent as a data channel opens can be lost
//! (matchbox drops what is sent to a peer whose handshake it has not finished on its side,
//! and webrtc-rs what reaches a negotiated channel before its SCTP stream is set up). So a
//! link's send window stays closed until the peer has answered a ping, sent again every
//! `PROBE_INTERVAL` until it does; the channel is ordered, so what follows the answered ping
//! arrives too. The peer is announced to `recv` (`Joined`, `peers`) only then, so the
//! application never waits on a link that is not open; what the peer sends before that is held
//! and queued right after its `Joined`.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use futures::channel::mpsc::{UnboundedReceiver, UnboundedSender};
use futures::channel::oneshot;
use futures::{select_biased, FutureExt, StreamExt};
use futures_timer::Delay;
use matchbox_socket::{Packet, PeerState, WebRtcSocket};
use tokio::sync::Semaphore;

use crate::shard::chunk::ChunkError;
use crate::shard::flow::{
    encode_control, parse_credit, parse_echo, Echo, ReceiveWindow, PING_TAG, PONG_TAG, WINDOW_BYTES,
};
use crate::shard::transport::{PeerId, TransportError};

/// How often an unconfirmed link is pinged again.
const PROBE_INTERVAL: Duration = Duration::from_millis(50);
/// The ping that confirms a link; flushes use the values after it.
const PROBE_PING: u32 = 0;

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
    /// Bytes we may still send to the peer: none until the link is confirmed, closed when the
    /// peer leaves.
    send_window: Arc<Semaphore>,
    receive_window: ReceiveWindow,
    breached: bool,
    /// The peer has answered a ping: our messages reach it, and `recv` has been told.
    confirmed: bool,
    /// What the peer sent before that, for `recv` after its `Joined`.
    held: Vec<Inbound>,
    /// Flushes waiting for their pong, oldest first.
    flushes: VecDeque<(u32, oneshot::Sender<()>)>,
    last_ping: u32,
}

impl Link {
    fn new() -> Link {
        Link {
            send_window: Arc::new(Semaphore::new(0)),
            receive_window: ReceiveWindow::default(),
            breached: false,
            confirmed: false,
            held: Vec::new(),
            flushes: VecDeque::new(),
            last_ping: PROBE_PING,
        }
    }
}

/// What becomes of a data message from a peer.
enum Arrival {
    Queue(Inbound),
    /// Kept until the link is confirmed.
    Held,
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

    /// The peers `recv` has announced.
    pub(super) fn peers(&self) -> Vec<PeerId> {
        let mut peers: Vec<PeerId> = self
            .lock()
            .iter()
            .filter(|(_, link)| link.confirmed)
            .map(|(peer, _)| *peer)
            .collect();
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

    /// Registers a flush to `peer`: the ping to send and what its pong completes. `None` while
    /// the link is unconfirmed, when no send to it can have completed yet.
    pub(super) fn begin_flush(
        &self,
        peer: PeerId,
    ) -> Result<Option<(u32, oneshot::Receiver<()>)>, TransportError> {
        let mut links = self.lock();
        let link = links
            .get_mut(&peer)
            .ok_or(TransportError::UnknownPeer(peer))?;
        if !link.confirmed {
            return Ok(None);
        }
        link.last_ping = match link.last_ping.wrapping_add(1) {
            PROBE_PING => PROBE_PING + 1,
            value => value,
        };
        let (done, acknowledged) = oneshot::channel();
        link.flushes.push_back((link.last_ping, done));
        Ok(Some((link.last_ping, acknowledged)))
    }

    /// Adds an unconfirmed peer; false if it was already there.
    fn insert(&self, peer: PeerId) -> bool {
        let mut links = self.lock();
        if links.contains_key(&peer) {
            return false;
        }
        links.insert(peer, Link::new());
        true
    }

    /// Removes a peer, failing the sends and flushes waiting on it. Whether `recv` had
    /// been told of it; `None` if it was not there.
    fn remove(&self, peer: PeerId) -> Option<bool> {
        let link = self.lock().remove(&peer)?;
        link.send_window.close();
        Some(link.confirmed)
    }

    fn close_all(&self) {
        for (_, link) in self.lock().drain() {
            link.send_window.close();
        }
    }

    /// The peer answered a ping: the flushes up to that ping are done, and the link is
    /// confirmed (its window opens) if it was not yet, in which case what it held is returned.
    fn pong(&self, peer: PeerId, value: u32) -> Option<Vec<Inbound>> {
        let mut links = self.lock();
        let link = links.get_mut(&peer)?;
        let held = match link.confirmed {
            true => None,
            false => {
                link.confirmed = true;
                link.send_window.add_permits(WINDOW_BYTES as usize);
                Some(std::mem::take(&mut link.held))
            }
        };
        // Pongs come back in ping order; one for no pending flush (a repeated probe) is ignored.
        if link.flushes.iter().any(|(ping, _)| *ping == value) {
            while let Some((ping, done)) = link.flushes.pop_front() {
                let _ = done.send(());
                if ping == value {
                    break;
                }
            }
        }
        held
    }

    fn unconfirmed(&self) -> Vec<PeerId> {
        self.lock()
            .iter()
            .filter(|(_, link)| !link.confirmed)
            .map(|(peer, _)| *peer)
            .collect()
    }

    /// Returns up to `bytes` of window to our sends to `peer`. A peer crediting more than is
    /// in flight is only clamped: it can only hurt its own receive side. Before the link is
    /// confirmed nothing was sent, so there is nothing to credit.
    fn credit(&self, peer: PeerId, bytes: u32) {
        if let Some(link) = self.lock().get(&peer).filter(|link| link.confirmed) {
            let in_flight =
                (WINDOW_BYTES as usize).saturating_sub(link.send_window.available_permits());
            link.send_window
                .add_permits((bytes as usize).min(in_flight));
        }
    }

    fn arrived(&self, peer: PeerId, packet: Packet) -> Arrival {
        let mut links = self.lock();
        let Some(link) = links.get_mut(&peer) else {
            return Arrival::Drop;
        };
        if link.breached {
            return Arrival::Drop;
        }
        let item = match link.receive_window.arrived(packet.len()) {
            Ok(()) => Inbound::Data(peer, packet),
            Err(error) => {
                link.breached = true;
                Inbound::Breach(peer, error)
            }
        };
        if link.confirmed {
            return Arrival::Queue(item);
        }
        // Bounded: held data counts against the receive window like queued data.
        link.held.push(item);
        Arrival::Held
    }
}

/// What the driver waits for.
enum Event {
    Packet(Option<(matchbox_socket::PeerId, Packet)>),
    Peer(Option<(matchbox_socket::PeerId, PeerState)>),
    Probe,
    TransportDropped,
}

pub(super) struct Driver {
    pub(super) socket: WebRtcSocket,
    pub(super) packets: UnboundedReceiver<(matchbox_socket::PeerId, Packet)>,
    /// For pings and pongs; the transport holds the other sender.
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
        let mut probe = Delay::new(PROBE_INTERVAL).fuse();
        loop {
            // Messages first: a peer's last messages are queued before its departure.
            let event = select_biased! {
                _ = (&mut self.dropped).fuse() => Event::TransportDropped,
                packet = self.packets.next() => Event::Packet(packet),
                change = self.socket.next().fuse() => Event::Peer(change),
                () = probe => Event::Probe,
            };
            let delivered = match event {
                Event::Packet(Some((peer, packet))) => self.on_packet(to_peer(peer), packet),
                Event::Peer(Some((peer, state))) => self.on_peer_state(to_peer(peer), state),
                Event::Probe => {
                    probe = Delay::new(PROBE_INTERVAL).fuse();
                    self.links
                        .unconfirmed()
                        .into_iter()
                        .for_each(|peer| self.control(peer, PING_TAG, PROBE_PING));
                    true
                }
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

    /// Sends a ping or a pong. It fails only once matchbox's loop has ended, and then the
    /// socket's end reaches the driver anyway.
    fn control(&self, peer: PeerId, tag: u8, value: u32) {
        let message = encode_control(tag, value).to_vec().into();
        let _ = self.outgoing.unbounded_send((to_matchbox(peer), message));
    }

    fn on_peer_state(&mut self, peer: PeerId, state: PeerState) -> bool {
        match state {
            // Matchbox can send to it now: ping at once rather than at the next probe.
            PeerState::Connected => {
                if self.link(peer) {
                    self.control(peer, PING_TAG, PROBE_PING);
                }
                true
            }
            PeerState::Disconnected => {
                self.departed.insert(peer);
                match self.links.remove(peer) {
                    Some(true) => self.queue(Inbound::Left(peer)),
                    Some(false) | None => true,
                }
            }
        }
    }

    /// Makes sure `peer` has a link unless it has left; false for a departed peer.
    fn link(&mut self, peer: PeerId) -> bool {
        if self.departed.contains(&peer) {
            return false;
        }
        self.links.insert(peer);
        true
    }

    fn on_packet(&mut self, peer: PeerId, packet: Packet) -> bool {
        if let Some(Ok(bytes)) = parse_credit(&packet) {
            self.links.credit(peer, bytes);
            return true;
        }
        // A data channel may deliver a message before matchbox reports the peer connected.
        if !self.link(peer) {
            return true;
        }
        match parse_echo(&packet) {
            Some(Echo::Ping(value)) => self.control(peer, PONG_TAG, value),
            Some(Echo::Pong(value)) => {
                if let Some(held) = self.links.pong(peer, value) {
                    tracing::debug!(%peer, held = held.len(), "link confirmed");
                    let mut items = std::iter::once(Inbound::Joined(peer)).chain(held);
                    return items.all(|item| self.queue(item));
                }
            }
            None => return self.on_data(peer, packet),
        }
        true
    }

    fn on_data(&mut self, peer: PeerId, packet: Packet) -> bool {
        match self.links.arrived(peer, packet) {
            Arrival::Queue(item) => self.queue(item),
            Arrival::Held | Arrival::Drop => true,
        }
    }
}

pub(super) fn to_peer(peer: matchbox_socket::PeerId) -> PeerId {
    PeerId(peer.0.as_u128())
}

pub(super) fn to_matchbox(peer: PeerId) -> matchbox_socket::PeerId {
    matchbox_socket::PeerId(uuid::Uuid::from_u128(peer.0))
}
