//! `Transport` over WebRTC data channels, through matchbox_socket: web-sys in browsers,
//! webrtc-rs natively, one API. Peers meet in a room of a matchbox signaling server
//! (`runner serve` serves one at `/signal`) and connect in a full mesh, each pair over one
//! reliable, ordered data channel.
//!
//! Frames travel as 16 KiB chunks (`chunk`). Matchbox queues without bound and has no
//! backpressure, so the transport adds a credit window per peer (`flow`): `send` waits while
//! a window's worth is unacknowledged, and `recv` acknowledges what it takes. `flush` waits for
//! the pong to a ping, which the peer's background task (`driver`) answers.

mod cause;
mod driver;
mod signaller;
mod spawn;

pub use signaller::SignalGate;

use std::collections::HashSet;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::channel::mpsc::{self, UnboundedReceiver, UnboundedSender};
use futures::channel::oneshot;
use futures::lock::Mutex as AsyncMutex;
use futures::{select, FutureExt, StreamExt};
use futures_timer::Delay;
use matchbox_socket::{ChannelConfig, Packet, RtcIceServerConfig, WebRtcSocket};
use tokio::sync::Semaphore;

use self::driver::{to_matchbox, to_peer, Driver, Inbound, Links};
use super::chunk::{slice_frame, ChunkError, ReassemblyLimits};
use super::fleet::{fleet_room, room_url, signal_base};
use super::flow::{encode_control, encode_credit, parse_credit, PING_TAG};
use super::transport::{
    Counters, PeerFrames, PeerId, Transport, TransportError, TransportEvent, TransportStats,
};

/// Largest message `send_raw_chunk` puts on the wire: matchbox's native data channels take
/// up to 64 KiB.
pub const MAX_RAW_MESSAGE: usize = 64 << 10;
/// How often `connect` looks for the id the signaling server assigns (matchbox only offers
/// a non-blocking getter).
const ID_POLL: Duration = Duration::from_millis(5);
/// How long `rejoin` waits for the old socket to close before joining again; it closes at
/// matchbox's next poll, so this only bounds a stuck runtime.
const LEAVE_WAIT: Duration = Duration::from_secs(2);

/// How a `WebRtcTransport` connects.
#[derive(Clone, Debug, PartialEq)]
pub struct WebRtcConfig {
    /// STUN/TURN URLs for ICE (`stun:host:port`, `turn:host:port`); empty on a LAN or
    /// loopback, where host candidates suffice.
    pub ice_urls: Vec<String>,
    pub ice_username: Option<String>,
    pub ice_credential: Option<String>,
    /// Until the signaling server has admitted us to the room.
    pub connect_timeout: Duration,
    pub reassembly: ReassemblyLimits,
}

impl Default for WebRtcConfig {
    /// Matchbox's public STUN servers, 10 s to connect, default reassembly limits.
    fn default() -> WebRtcConfig {
        WebRtcConfig {
            ice_urls: RtcIceServerConfig::default().urls,
            ice_username: None,
            ice_credential: None,
            connect_timeout: Duration::from_secs(10),
            reassembly: ReassemblyLimits::default(),
        }
    }
}

/// `recv`'s state: the driver's queue and one reassembler per peer.
struct RecvState {
    inbox: UnboundedReceiver<Inbound>,
    frames: PeerFrames,
}

/// One peer of a WebRTC full mesh. Dropping it is leaving: its connections close, what they
/// still queue is lost (`flush` first), and the others get `PeerLeft`.
pub struct WebRtcTransport {
    id: PeerId,
    outgoing: UnboundedSender<(matchbox_socket::PeerId, Packet)>,
    links: Arc<Links>,
    counters: Counters,
    next_frame_id: AtomicU32,
    inbox: AsyncMutex<RecvState>,
    /// Where and how it joined, to join again (`rejoin`).
    joined: (String, String, WebRtcConfig),
    /// Dropped with the transport, which ends the driver.
    _alive: oneshot::Sender<()>,
    /// Completes when matchbox's message loop has ended (its sender is dropped then).
    loop_ended: oneshot::Receiver<()>,
}

impl WebRtcTransport {
    /// Joins `room` at a matchbox signaling server (`ws://HOST:PORT/signal`) with the default
    /// configuration. Returns once the server has admitted us; peers then arrive as
    /// `PeerJoined` events.
    pub async fn connect(signal_url: &str, room: &str) -> Result<WebRtcTransport, TransportError> {
        WebRtcTransport::connect_with(signal_url, room, WebRtcConfig::default()).await
    }

    /// Joins the room of the fleet with this token (`fleet_room`). `signal_url` is the
    /// server's (`ws://HOST:PORT/signal`) or the room's own, as `runner serve` prints it.
    pub async fn join_fleet(
        signal_url: &str,
        fleet_token: &str,
        config: WebRtcConfig,
    ) -> Result<WebRtcTransport, TransportError> {
        let room = fleet_room(fleet_token);
        WebRtcTransport::connect_with(signal_base(signal_url, &room), &room, config).await
    }

    /// `connect` with ICE servers, timeout and reassembly limits of one's own. Fails with
    /// `InvalidRoom`, `Connect` (refused or unreachable: the reason says which) or
    /// `ConnectTimeout`; natively, `NoRuntime` outside a tokio runtime.
    pub async fn connect_with(
        signal_url: &str,
        room: &str,
        config: WebRtcConfig,
    ) -> Result<WebRtcTransport, TransportError> {
        let url = room_url(signal_url, room).ok_or_else(|| TransportError::InvalidRoom {
            signal_url: signal_url.to_string(),
            room: room.to_string(),
        })?;
        let builder = spawn::checked_signals(WebRtcSocket::builder(url.clone()));
        let (mut socket, message_loop) = builder
            .ice_server(RtcIceServerConfig {
                urls: config.ice_urls.clone(),
                username: config.ice_username.clone(),
                credential: config.ice_credential.clone(),
            })
            // A refused or unreachable server is an answer; matchbox would retry every 3 s.
            .reconnect_attempts(Some(1))
            .add_channel(ChannelConfig::reliable())
            .build();

        let (ended_sender, mut ended) = oneshot::channel();
        let (loop_alive, loop_ended) = oneshot::channel::<()>();
        let loop_url = url.clone();
        spawn::spawn(async move {
            let _loop_alive = loop_alive;
            // A panic inside matchbox ends this socket only, as an error: its links close and
            // `recv` says the transport is closed; the runner goes on.
            let result = match AssertUnwindSafe(message_loop).catch_unwind().await {
                Ok(result) => result.map_err(|error| describe(&error)),
                Err(panic) => Err(format!("matchbox panicked: {}", panic_text(&panic))),
            };
            // Once `connect` has returned, nobody listens: say why the socket ended.
            if let Err(Err(reason)) = ended_sender.send(result) {
                tracing::warn!("WebRTC socket for {loop_url} ended: {reason}");
            }
        })?;

        let id = {
            let mut deadline = Delay::new(config.connect_timeout).fuse();
            let mut admitted = Box::pin(wait_for_id(&mut socket).fuse());
            select! {
                id = admitted => id,
                result = ended => return Err(connect_error(&url, result)),
                () = deadline => return Err(TransportError::ConnectTimeout {
                    url,
                    ms: config.connect_timeout.as_millis() as u64,
                }),
            }
        };

        let channel = socket
            .take_channel(0)
            .map_err(|error| TransportError::Connect {
                url: url.clone(),
                reason: error.to_string(),
            })?;
        let (outgoing, packets) = channel.split();
        let (inbox_sender, inbox) = mpsc::unbounded();
        let links = Arc::new(Links::default());
        let (alive, dropped) = oneshot::channel();
        let driver = Driver {
            socket,
            packets,
            outgoing: outgoing.clone(),
            links: Arc::clone(&links),
            inbox: inbox_sender,
            dropped,
            departed: HashSet::new(),
        };
        spawn::spawn(driver.run())?;
        Ok(WebRtcTransport {
            id: to_peer(id),
            outgoing,
            links,
            counters: Counters::default(),
            next_frame_id: AtomicU32::new(0),
            inbox: AsyncMutex::new(RecvState {
                inbox,
                frames: PeerFrames::new(config.reassembly),
            }),
            joined: (signal_url.to_string(), room.to_string(), config),
            _alive: alive,
            loop_ended,
        })
    }

    /// Puts raw bytes on the wire to `to` as one message, bypassing slicing (it still counts
    /// against the window): for tests that play a misbehaving peer.
    pub async fn send_raw_chunk(&self, to: PeerId, message: Vec<u8>) -> Result<(), TransportError> {
        if message.len() > MAX_RAW_MESSAGE {
            return Err(ChunkError::TooLong { len: message.len() }.into());
        }
        let window = self
            .links
            .send_window(to)
            .ok_or(TransportError::UnknownPeer(to))?;
        self.put(to, &window, message).await
    }

    /// Waits for room in the window, then hands one message to matchbox.
    async fn put(
        &self,
        to: PeerId,
        window: &Semaphore,
        message: Vec<u8>,
    ) -> Result<(), TransportError> {
        let len = message.len();
        // `len` is at most `MAX_RAW_MESSAGE`, so it fits and never exceeds the window.
        window
            .acquire_many(len as u32)
            .await
            .map_err(|_| TransportError::PeerGone(to))?
            .forget();
        self.outgoing
            .unbounded_send((to_matchbox(to), message.into()))
            .map_err(|_| TransportError::Closed)?;
        Counters::add(&self.counters.bytes_sent, len);
        Ok(())
    }

    /// Turns one queued item into an event, or `None` while a frame is still incomplete.
    fn receive(&self, state: &mut RecvState, item: Inbound) -> Option<TransportEvent> {
        match item {
            Inbound::Joined(peer) => {
                state.frames.joined(peer);
                Some(TransportEvent::PeerJoined(peer))
            }
            Inbound::Left(peer) => {
                state.frames.left(peer);
                Some(TransportEvent::PeerLeft(peer))
            }
            Inbound::Breach(from, error) => Some(TransportEvent::BadChunk { from, error }),
            Inbound::Data(from, message) => {
                Counters::add(&self.counters.bytes_received, message.len());
                if let Some(credit) = self.links.consumed(from, message.len()) {
                    // Fails only when the socket is gone, and then nobody waits for credit.
                    let _ = self
                        .outgoing
                        .unbounded_send((to_matchbox(from), encode_credit(credit).to_vec().into()));
                }
                // Well-formed credits never reach the queue; this one is malformed.
                if let Some(Err(error)) = parse_credit(&message) {
                    return Some(TransportEvent::BadChunk { from, error });
                }
                state.frames.push(from, &message, &self.counters)
            }
        }
    }
}

#[cfg_attr(target_arch = "wasm32", async_trait::async_trait(?Send))]
#[cfg_attr(not(target_arch = "wasm32"), async_trait::async_trait)]
impl Transport for WebRtcTransport {
    fn local_id(&self) -> PeerId {
        self.id
    }

    fn peers(&self) -> Vec<PeerId> {
        self.links.peers()
    }

    fn stats(&self) -> TransportStats {
        self.counters.snapshot()
    }

    async fn send(&self, to: PeerId, frame: &[u8]) -> Result<(), TransportError> {
        let frame_id = self.next_frame_id.fetch_add(1, Ordering::Relaxed);
        let chunks = slice_frame(frame_id, frame)?;
        let window = self
            .links
            .send_window(to)
            .ok_or(TransportError::UnknownPeer(to))?;
        for chunk in chunks {
            self.put(to, &window, chunk).await?;
        }
        Counters::add(&self.counters.frames_sent, 1);
        Ok(())
    }

    async fn flush(&self, to: PeerId) -> Result<(), TransportError> {
        let (ping, acknowledged) = self.links.begin_flush(to)?;
        let message = encode_control(PING_TAG, ping).to_vec().into();
        self.outgoing
            .unbounded_send((to_matchbox(to), message))
            .map_err(|_| TransportError::Closed)?;
        // The pong's sender is dropped when the peer leaves.
        acknowledged.await.map_err(|_| TransportError::PeerGone(to))
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

    /// Leaves under the old id, then joins the room again as a new peer; the byte counts go
    /// on. Leaving first matters: the old socket would otherwise offer a link to the new one
    /// and drop it half made, and matchbox panics on a data channel closed before it opened,
    /// ending the new socket. Should joining fail, the transport stays closed.
    async fn rejoin(&mut self) -> Result<(), TransportError> {
        let (signal_url, room, config) = self.joined.clone();
        // Matchbox's loop ends once its outgoing queue is closed, and the server then sees
        // the old id leave.
        self.outgoing.close_channel();
        let mut ended = (&mut self.loop_ended).map(|_| ()).fuse();
        let mut deadline = Delay::new(LEAVE_WAIT).fuse();
        select! {
            () = ended => {},
            () = deadline => tracing::warn!("the old WebRTC socket did not close within {LEAVE_WAIT:?}"),
        }
        let mut fresh = WebRtcTransport::connect_with(&signal_url, &room, config).await?;
        fresh.counters = std::mem::take(&mut self.counters);
        *self = fresh;
        Ok(())
    }
}

/// The id the signaling server assigned, once it has.
async fn wait_for_id(socket: &mut WebRtcSocket) -> matchbox_socket::PeerId {
    loop {
        if let Some(id) = socket.id() {
            return id;
        }
        Delay::new(ID_POLL).await;
    }
}

/// Why matchbox's socket ended before we were admitted.
fn connect_error(
    url: &str,
    result: Result<Result<(), String>, oneshot::Canceled>,
) -> TransportError {
    let reason = match result {
        Ok(Err(reason)) => reason,
        Ok(Ok(())) | Err(oneshot::Canceled) => {
            "the socket closed before the server assigned an id".to_string()
        }
    };
    TransportError::Connect {
        url: url.to_string(),
        reason,
    }
}

/// Matchbox's errors keep their cause in a field their message leaves out.
fn describe(error: &matchbox_socket::Error) -> String {
    match error {
        matchbox_socket::Error::ConnectionFailed(cause) => {
            format!("connection failed: {}", cause::signaling_cause(cause))
        }
        matchbox_socket::Error::Disconnected(cause) => {
            format!("disconnected: {}", cause::signaling_cause(cause))
        }
    }
}

/// A panic's message, when it has one.
fn panic_text(panic: &Box<dyn std::any::Any + Send>) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(no message)")
}
