//! One transport shared by several chains (replicas): each chain's coordinator gets a `Lane`,
//! a `Transport` that sends through the shared one and receives only the events of the
//! donors its chain owns, so every chain runs the single-chain coordinator unchanged.
//!
//! Receiving needs no task of its own (none exists on wasm): whichever lane is waiting takes
//! the reader's turn, reads the shared transport and hands each event to its owner's inbox,
//! returning the first that is its own. A lane whose coordinator is not receiving just
//! collects its events. Events from donors no chain owns (a newcomer's Hello, a donor back
//! under a new id) go to the joining lane, which then owns them: the first chain, or the last
//! one short of donors (`hear_newcomers`); a closed transport is every lane's news.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use futures::channel::mpsc::{unbounded, UnboundedReceiver, UnboundedSender};
use futures::lock::Mutex as AsyncMutex;
use futures::{FutureExt, StreamExt};
use tokio::sync::RwLock;

use super::super::transport::{
    MaybeSync, PeerId, Transport, TransportError, TransportEvent, TransportStats,
};

type Event = Result<TransportEvent, TransportError>;

/// Who gets each peer's events.
struct Routes {
    owner: HashMap<PeerId, usize>,
    /// The lane of peers no chain owns.
    joining: usize,
    inboxes: Vec<UnboundedSender<Event>>,
}

struct Shared<T> {
    /// Read by every send and receive; written only to join the room again.
    transport: RwLock<T>,
    /// Held by the lane reading the transport for all of them.
    reader: AsyncMutex<()>,
    routes: Mutex<Routes>,
    /// The transport said `Closed` and has not joined the room again since.
    closed: AtomicBool,
    /// The transport's id, kept here so `local_id` never waits for the lock.
    local_id: Mutex<PeerId>,
}

/// The routing side, kept by whoever owns the chains (to move donors between them).
pub struct Lanes<T> {
    shared: Arc<Shared<T>>,
}

/// One chain's view of the shared transport.
pub struct Lane<T> {
    index: usize,
    shared: Arc<Shared<T>>,
    inbox: AsyncMutex<UnboundedReceiver<Event>>,
}

fn lock<V>(mutex: &Mutex<V>) -> std::sync::MutexGuard<'_, V> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl<T: Transport + MaybeSync> Lanes<T> {
    /// `count` lanes over `transport`; `owner` says which lane each known donor's events go to.
    pub fn new(
        transport: T,
        owner: HashMap<PeerId, usize>,
        count: usize,
    ) -> (Lanes<T>, Vec<Lane<T>>) {
        let (senders, receivers): (Vec<_>, Vec<_>) = (0..count).map(|_| unbounded()).unzip();
        let shared = Arc::new(Shared {
            local_id: Mutex::new(transport.local_id()),
            transport: RwLock::new(transport),
            reader: AsyncMutex::new(()),
            routes: Mutex::new(Routes {
                owner,
                joining: 0,
                inboxes: senders,
            }),
            closed: AtomicBool::new(false),
        });
        let lanes = receivers
            .into_iter()
            .enumerate()
            .map(|(index, inbox)| Lane {
                index,
                shared: Arc::clone(&shared),
                inbox: AsyncMutex::new(inbox),
            })
            .collect();
        (Lanes { shared }, lanes)
    }

    /// Lane `from` is gone: its donors become no chain's, and newcomers go to lane `to`.
    pub fn retire(&self, from: usize, to: usize) {
        let mut routes = lock(&self.shared.routes);
        routes.owner.retain(|_, lane| *lane != from);
        if routes.joining == from {
            routes.joining = to;
        }
    }
}

impl<T: Transport> Shared<T> {
    /// Delivers `event` to its lane; returns it when that is `me`. A closed transport is
    /// told to every lane.
    fn route(&self, me: usize, event: Event) -> Option<Event> {
        let mut routes = lock(&self.routes);
        let peer = match &event {
            Err(_) => {
                // Told once per closure: each lane recovers once, not once per read.
                if !self.closed.swap(true, Ordering::SeqCst) {
                    for (lane, inbox) in routes.inboxes.iter().enumerate() {
                        if lane != me {
                            let _ = inbox.unbounded_send(event.clone());
                        }
                    }
                }
                return Some(event);
            }
            Ok(TransportEvent::PeerJoined(_)) => None,
            Ok(TransportEvent::PeerLeft(peer))
            | Ok(TransportEvent::Frame { from: peer, .. })
            | Ok(TransportEvent::BadChunk { from: peer, .. }) => Some(*peer),
        };
        let joining = routes.joining;
        let lane = match (peer, &event) {
            (Some(peer), Ok(TransportEvent::PeerLeft(_))) => {
                routes.owner.remove(&peer).unwrap_or(joining)
            }
            // A newcomer belongs to the lane that hears it first, wherever newcomers go later.
            (Some(peer), _) => *routes.owner.entry(peer).or_insert(joining),
            (None, _) => joining,
        };
        if lane == me {
            return Some(event);
        }
        // A lane's receiver lives as long as its chain; a retired one's events are dropped.
        let _ = routes.inboxes[lane].unbounded_send(event);
        None
    }
}

#[cfg_attr(target_arch = "wasm32", async_trait::async_trait(?Send))]
#[cfg_attr(not(target_arch = "wasm32"), async_trait::async_trait)]
impl<T: Transport + MaybeSync> Transport for Lane<T> {
    fn local_id(&self) -> PeerId {
        *lock(&self.shared.local_id)
    }

    fn peers(&self) -> Vec<PeerId> {
        let transport = self.shared.transport.try_read();
        transport.map(|t| t.peers()).unwrap_or_default()
    }

    fn stats(&self) -> TransportStats {
        let transport = self.shared.transport.try_read();
        transport.map(|t| t.stats()).unwrap_or_default()
    }

    /// This chain is short of donors: newcomers come here until another chain asks.
    fn hear_newcomers(&self) {
        lock(&self.shared.routes).joining = self.index;
    }

    async fn send(&self, to: PeerId, frame: &[u8]) -> Result<(), TransportError> {
        self.shared.transport.read().await.send(to, frame).await
    }

    async fn flush(&self, to: PeerId) -> Result<(), TransportError> {
        self.shared.transport.read().await.flush(to).await
    }

    /// This lane's next event: from its inbox, or read from the shared transport while no
    /// other lane is reading.
    async fn recv(&self) -> Result<TransportEvent, TransportError> {
        let mut inbox = self.inbox.lock().await;
        loop {
            let turn = {
                let next = inbox.next().fuse();
                let turn = self.shared.reader.lock().fuse();
                futures::pin_mut!(next, turn);
                futures::select_biased! {
                    event = next => return event.unwrap_or(Err(TransportError::Closed)),
                    turn = turn => turn,
                }
            };
            // What the last reader handed over while this lane waited for its turn comes first.
            if let Ok(event) = inbox.try_recv() {
                return event;
            }
            let event = self.shared.transport.read().await.recv().await;
            drop(turn);
            if let Some(event) = self.shared.route(self.index, event) {
                return event;
            }
        }
    }

    /// Joins the room again once for all lanes: the first lane to ask after the transport
    /// closed does it, the others (told of the same closure) find it done.
    async fn rejoin(&mut self) -> Result<(), TransportError> {
        let mut transport = self.shared.transport.write().await;
        if self.shared.closed.load(Ordering::SeqCst) {
            transport.rejoin().await?;
            *lock(&self.shared.local_id) = transport.local_id();
            self.shared.closed.store(false, Ordering::SeqCst);
        }
        Ok(())
    }
}
