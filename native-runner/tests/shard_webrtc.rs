//! The WebRTC transport for real: native peers (webrtc-rs through matchbox) meeting at
//! `runner serve`'s `/signal` on loopback. Frames small and large, both ways, in order;
//! backpressure; departures; misbehaving peers; the fleet token at the signaling server.

use crate::common;

use std::future::Future;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use native_runner::serve::{ServeOptions, Server};
use webshard::shard::chunk::{CHUNK_PAYLOAD, MAX_CHUNK_BYTES};
use webshard::shard::flow::WINDOW_BYTES;
use webshard::shard::{
    ChunkError, PeerId, Transport, TransportError, TransportEvent, WebRtcConfig, WebRtcTransport,
};

/// Longest any single step may take before the test fails instead of hanging.
const STEP: Duration = Duration::from_secs(20);

async fn within<T>(what: &str, step: impl Future<Output = T>) -> T {
    tokio::time::timeout(STEP, step)
        .await
        .unwrap_or_else(|_| panic!("timed out after {STEP:?}: {what}"))
}

/// Host candidates only: loopback needs no STUN.
fn loopback() -> WebRtcConfig {
    WebRtcConfig {
        ice_urls: Vec::new(),
        connect_timeout: Duration::from_secs(5),
        ..WebRtcConfig::default()
    }
}

/// An in-process `runner serve`; returns its signaling URL, `ws://HOST:PORT/signal`.
async fn start_server(fleet_token: Option<&str>) -> String {
    let mut opts = ServeOptions::new(std::env::temp_dir());
    opts.fleet_token = fleet_token.map(str::to_string);
    let server = Server::bind(&opts).await.expect("bind a free port");
    let addr = server.local_addr();
    tokio::spawn(server.run());
    format!("ws://{addr}/signal")
}

fn payload(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed ^ (i >> 16) as u8)
        .collect()
}

async fn next_event(transport: &WebRtcTransport) -> TransportEvent {
    within("an event", transport.recv())
        .await
        .expect("transport open")
}

async fn next_frame(transport: &WebRtcTransport) -> (PeerId, Vec<u8>) {
    match next_event(transport).await {
        TransportEvent::Frame { from, frame } => (from, frame),
        other => panic!("expected a frame, got {other:?}"),
    }
}

/// Roles hold transports across tasks and threads.
fn assert_send_sync<T: Send + Sync + 'static>() {}

/// `n` peers in `room`, each having seen the others join.
async fn mesh(signal: &str, room: &str, n: usize) -> Vec<WebRtcTransport> {
    assert_send_sync::<WebRtcTransport>();
    let mut peers = Vec::new();
    for _ in 0..n {
        let peer = within(
            "connect",
            WebRtcTransport::connect_with(signal, room, loopback()),
        )
        .await
        .expect("connect");
        peers.push(peer);
    }
    for peer in &peers {
        let mut joined: Vec<PeerId> = Vec::new();
        while joined.len() < n - 1 {
            match next_event(peer).await {
                TransportEvent::PeerJoined(other) => joined.push(other),
                other => panic!("expected joins first, got {other:?}"),
            }
        }
        joined.sort();
        let mut expected: Vec<PeerId> = peers
            .iter()
            .map(|p| p.local_id())
            .filter(|&id| id != peer.local_id())
            .collect();
        expected.sort();
        assert_eq!(joined, expected);
        assert_eq!(peer.peers(), expected);
    }
    peers
}

/// Sends frames of `sizes`, frame `i` being `payload(sizes[i], seed ^ i)`.
async fn send_all(sender: &WebRtcTransport, to: PeerId, seed: u8, sizes: &[usize]) {
    for (i, &len) in sizes.iter().enumerate() {
        within("a send", sender.send(to, &payload(len, seed ^ i as u8)))
            .await
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frames_of_all_sizes_cross_intact_and_in_order_between_three_peers() {
    let signal = start_server(None).await;
    let peers = mesh(&signal, "sizes", 3).await;
    let (a, b, c) = (&peers[0], &peers[1], &peers[2]);
    let sizes = [
        1,
        100,
        CHUNK_PAYLOAD,
        CHUNK_PAYLOAD + 1,
        MAX_CHUNK_BYTES,
        300_000,
        5 << 20,
        7,
    ];
    // a and c both send to b while b sends to a: frames of two senders interleave at b.
    let receive_at_b = async {
        let mut next = [(a.local_id(), 0xA0u8, 0usize), (c.local_id(), 0xC0, 0)];
        for _ in 0..2 * sizes.len() {
            let (from, frame) = next_frame(b).await;
            let sender = next
                .iter_mut()
                .find(|s| s.0 == from)
                .expect("a known sender");
            let i = sender.2;
            assert_eq!(frame.len(), sizes[i], "frame {i} from {from}");
            assert!(
                frame == payload(sizes[i], sender.1 ^ i as u8),
                "frame {i} from {from}"
            );
            sender.2 += 1;
        }
    };
    let receive_at_a = async {
        for (i, &len) in sizes.iter().enumerate() {
            let (from, frame) = next_frame(a).await;
            assert_eq!(from, b.local_id());
            assert!(frame == payload(len, 0xB0 ^ i as u8), "frame {i} at a");
        }
    };
    tokio::join!(
        send_all(a, b.local_id(), 0xA0, &sizes),
        send_all(c, b.local_id(), 0xC0, &sizes),
        send_all(b, a.local_id(), 0xB0, &sizes),
        receive_at_b,
        receive_at_a,
    );
    let total: usize = sizes.iter().sum();
    let (a_stats, b_stats) = (a.stats(), b.stats());
    assert_eq!(a_stats.frames_sent, sizes.len() as u64);
    assert_eq!(b_stats.frames_received, 2 * sizes.len() as u64);
    assert!(a_stats.bytes_sent > total as u64);
    assert_eq!(
        b_stats.bytes_received,
        a_stats.bytes_sent + c.stats().bytes_sent
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_that_does_not_read_stops_its_sender_after_one_window() {
    let signal = start_server(None).await;
    let peers = mesh(&signal, "backpressure", 2).await;
    let (a, b) = (&peers[0], &peers[1]);
    let frame = payload(4 << 20, 7);
    let sending = a.send(b.local_id(), &frame);
    tokio::pin!(sending);
    // b does not read: a may put one window on the wire, then must wait.
    let stalled = tokio::time::timeout(Duration::from_millis(1500), &mut sending).await;
    assert!(
        stalled.is_err(),
        "send finished while the receiver read nothing"
    );
    let in_flight = a.stats().bytes_sent;
    assert!(
        in_flight <= u64::from(WINDOW_BYTES) && in_flight >= u64::from(WINDOW_BYTES) / 2,
        "{in_flight} bytes sent to a peer that reads nothing (window {WINDOW_BYTES})"
    );
    // Once b reads, the credits let the rest through.
    let (sent, (from, received)) = tokio::join!(within("the rest", &mut sending), next_frame(b));
    sent.unwrap();
    assert_eq!(from, a.local_id());
    assert!(received == frame);
    assert_eq!(a.stats().bytes_sent, b.stats().bytes_received);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_peer_is_reported_left_and_its_blocked_senders_fail() {
    let signal = start_server(None).await;
    let mut peers = mesh(&signal, "departures", 3).await;
    let c = peers.pop().unwrap();
    let (a, b) = (&peers[0], &peers[1]);
    let c_id = c.local_id();
    // c reads nothing, so this send blocks on c's window until c is gone.
    let frame = payload(3 << 20, 1);
    let blocked = a.send(c_id, &frame);
    tokio::pin!(blocked);
    assert!(
        tokio::time::timeout(Duration::from_millis(500), &mut blocked)
            .await
            .is_err()
    );
    drop(c);
    assert_eq!(
        within("blocked send", &mut blocked).await,
        Err(TransportError::PeerGone(c_id))
    );
    for peer in [a, b] {
        assert_eq!(next_event(peer).await, TransportEvent::PeerLeft(c_id));
        assert_eq!(
            peer.peers(),
            [a, b]
                .map(|p| p.local_id())
                .into_iter()
                .filter(|&id| id != peer.local_id())
                .collect::<Vec<_>>()
        );
    }
    assert_eq!(
        a.send(c_id, b"late").await,
        Err(TransportError::UnknownPeer(c_id))
    );
    // The others carry on.
    a.send(b.local_id(), b"still here").await.unwrap();
    assert_eq!(next_frame(b).await, (a.local_id(), b"still here".to_vec()));
}

/// A peer that rejoins comes back under a new id over new links: the others see the old id
/// leave and the new one join, and frames cross both ways.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejoining_peer_gets_a_new_id_and_new_links() {
    let signal = start_server(None).await;
    let mut peers = mesh(&signal, "rejoin", 2).await;
    let b = peers.pop().unwrap();
    let mut a = peers.pop().unwrap();
    let old_id = a.local_id();
    within("rejoin", a.rejoin()).await.expect("rejoin");
    let new_id = a.local_id();
    assert_ne!(new_id, old_id);
    let mut seen = Vec::new();
    while seen.len() < 2 {
        seen.push(next_event(&b).await);
    }
    assert!(seen.contains(&TransportEvent::PeerLeft(old_id)), "{seen:?}");
    assert!(
        seen.contains(&TransportEvent::PeerJoined(new_id)),
        "{seen:?}"
    );
    assert_eq!(
        next_event(&a).await,
        TransportEvent::PeerJoined(b.local_id())
    );
    assert_eq!(b.peers(), vec![new_id]);
    a.send(b.local_id(), b"back").await.unwrap();
    assert_eq!(next_frame(&b).await, (new_id, b"back".to_vec()));
    b.send(new_id, b"welcome").await.unwrap();
    assert_eq!(next_frame(&a).await, (b.local_id(), b"welcome".to_vec()));
}

/// `flush` returns once the peer's transport has every frame sent before it, so the sender
/// may leave at once: the peer, reading only afterwards, still gets them all before `PeerLeft`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flushed_frames_survive_the_sender_leaving_at_once() {
    let signal = start_server(None).await;
    let mut peers = mesh(&signal, "flush", 2).await;
    let a = peers.remove(0);
    let b = peers.remove(0);
    let (a_id, b_id) = (a.local_id(), b.local_id());
    let sizes = [900_000, 1, 70_000];
    send_all(&a, b_id, 0x5A, &sizes).await;
    within("flush", a.flush(b_id)).await.unwrap();
    drop(a);
    for (i, &len) in sizes.iter().enumerate() {
        let (from, frame) = next_frame(&b).await;
        assert_eq!(from, a_id);
        assert!(frame == payload(len, 0x5A ^ i as u8), "frame {i}");
    }
    assert_eq!(next_event(&b).await, TransportEvent::PeerLeft(a_id));
    assert_eq!(b.flush(a_id).await, Err(TransportError::UnknownPeer(a_id)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_messages_are_reported_as_bad_chunks_and_the_stream_goes_on() {
    let signal = start_server(None).await;
    let peers = mesh(&signal, "garbage", 2).await;
    let (a, b) = (&peers[0], &peers[1]);
    let to = b.local_id();
    a.send_raw_chunk(to, vec![0xAB; 40]).await.unwrap();
    a.send_raw_chunk(to, vec![0xC2, 0, 0]).await.unwrap();
    a.send_raw_chunk(to, vec![0xC1, 0, 0]).await.unwrap();
    a.send_raw_chunk(to, vec![0xC1; MAX_CHUNK_BYTES + 1])
        .await
        .unwrap();
    a.send(to, b"fine").await.unwrap();
    let expected = [
        ChunkError::BadTag { found: 0xAB },
        ChunkError::CreditLength { len: 3 },
        ChunkError::TooShort { len: 3 },
        ChunkError::TooLong {
            len: MAX_CHUNK_BYTES + 1,
        },
    ];
    for error in expected {
        assert_eq!(
            next_event(b).await,
            TransportEvent::BadChunk {
                from: a.local_id(),
                error
            }
        );
    }
    assert_eq!(next_frame(b).await, (a.local_id(), b"fine".to_vec()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_fleet_room_is_admitted_when_the_server_has_a_token() {
    let signal = start_server(Some("right token")).await;
    let a = within(
        "a joins",
        WebRtcTransport::join_fleet(&signal, "right token", loopback()),
    )
    .await
    .expect("the right token is admitted");
    let b = within(
        "b joins",
        WebRtcTransport::join_fleet(&signal, "right token", loopback()),
    )
    .await
    .expect("the right token is admitted");
    assert_eq!(
        next_event(&a).await,
        TransportEvent::PeerJoined(b.local_id())
    );
    for refused in [
        WebRtcTransport::join_fleet(&signal, "wrong token", loopback()).await,
        WebRtcTransport::connect_with(&signal, "lobby", loopback()).await,
    ] {
        match refused {
            Err(TransportError::Connect { reason, .. }) => {
                assert!(reason.contains("403"), "refusal reason: {reason}")
            }
            other => panic!("expected a refusal, got {:?}", other.map(|t| t.local_id())),
        }
    }
    assert_eq!(a.peers(), [b.local_id()]);
}

#[tokio::test]
async fn bad_addresses_fail_fast_with_clear_errors() {
    match WebRtcTransport::connect_with("http://127.0.0.1:1/signal", "r", loopback()).await {
        Err(TransportError::InvalidRoom { .. }) => {}
        other => panic!(
            "expected InvalidRoom, got {:?}",
            other.map(|t| t.local_id())
        ),
    }
    match WebRtcTransport::connect_with("ws://127.0.0.1:9/signal", "a/b", loopback()).await {
        Err(TransportError::InvalidRoom { .. }) => {}
        other => panic!(
            "expected InvalidRoom, got {:?}",
            other.map(|t| t.local_id())
        ),
    }
    // Nothing listens on the discard port.
    let unreachable = within(
        "connect to a closed port",
        WebRtcTransport::connect_with("ws://127.0.0.1:9/signal", "r", loopback()),
    )
    .await;
    match unreachable {
        Err(TransportError::Connect { url, .. }) => assert_eq!(url, "ws://127.0.0.1:9/signal/r"),
        other => panic!("expected Connect, got {:?}", other.map(|t| t.local_id())),
    }
}

/// `runner serve --fleet TOKEN` as a child process, killed when dropped.
struct ServeProcess(Child);

impl Drop for ServeProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runner_serve_with_a_fleet_token_signals_for_that_fleet_only() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_runner"))
        .args(["serve", "--port", "0", "--fleet", "cli token", "--root"])
        .arg(common::repo_root())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn runner serve");
    let stdout = child.stdout.take().unwrap();
    let _server = ServeProcess(child);
    let mut lines = BufReader::new(stdout).lines();
    let signal_line = lines
        .by_ref()
        .map(|line| line.unwrap())
        .find(|line| line.trim_start().starts_with("signal"))
        .expect("a signal line in the banner");
    // Keep the pipe open and drained for as long as the server runs.
    std::thread::spawn(move || lines.for_each(drop));
    // "  signal  ws://HOST:PORT/signal/fleet-…  (the fleet's room only)"
    let room_url = signal_line.split_whitespace().nth(1).unwrap();
    let (signal, room) = room_url.rsplit_once('/').unwrap();
    assert_eq!(room, webshard::shard::fleet_room("cli token"));

    let a = within(
        "a joins",
        WebRtcTransport::join_fleet(signal, "cli token", loopback()),
    )
    .await
    .unwrap();
    let b = within(
        "b joins",
        WebRtcTransport::join_fleet(signal, "cli token", loopback()),
    )
    .await
    .unwrap();
    assert_eq!(
        next_event(&a).await,
        TransportEvent::PeerJoined(b.local_id())
    );
    assert_eq!(
        next_event(&b).await,
        TransportEvent::PeerJoined(a.local_id())
    );
    b.send(a.local_id(), &payload(100_000, 3)).await.unwrap();
    assert!(next_frame(&a).await == (b.local_id(), payload(100_000, 3)));
    assert!(matches!(
        WebRtcTransport::join_fleet(signal, "other token", loopback()).await,
        Err(TransportError::Connect { .. })
    ));
}
