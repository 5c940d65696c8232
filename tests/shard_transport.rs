//! The in-process transport through the trait object: peer events, the wire path (slicing
//! and reassembly), backpressure, departures, and a peer sending garbage.

use futures::executor::block_on;
use futures::future::{join, poll_fn};
use futures::FutureExt;
use std::task::Poll;
use webshard::shard::chunk::MAX_CHUNK_BYTES;
use webshard::shard::frame::{Heartbeat, Leave};
use webshard::shard::transport::send_message;
use webshard::shard::{
    decode_frame, ChunkError, InProcessConfig, InProcessNetwork, Message, PeerId, Transport,
    TransportError, TransportEvent,
};

fn payload(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

async fn next_frame(transport: &dyn Transport) -> (PeerId, Vec<u8>) {
    loop {
        match transport.recv().await.unwrap() {
            TransportEvent::Frame { from, frame } => return (from, frame),
            TransportEvent::PeerJoined(_) => continue,
            other => panic!("unexpected event {other:?}"),
        }
    }
}

#[test]
fn peers_see_each_other_join_and_leave() {
    let network = InProcessNetwork::default();
    let a = network.join();
    let b = network.join();
    let c = network.join();
    assert_eq!(a.peers(), [b.local_id(), c.local_id()]);
    block_on(async {
        let a: &dyn Transport = &a;
        assert_eq!(a.recv().await, Ok(TransportEvent::PeerJoined(b.local_id())));
        assert_eq!(a.recv().await, Ok(TransportEvent::PeerJoined(c.local_id())));
        let c_id = c.local_id();
        drop(c);
        assert_eq!(a.recv().await, Ok(TransportEvent::PeerLeft(c_id)));
        assert_eq!(a.peers(), [b.local_id()]);
        assert_eq!(
            a.send(c_id, b"hello").await,
            Err(TransportError::UnknownPeer(c_id))
        );
    });
    // b learns of a (already there) before c.
    let first = block_on(b.recv()).unwrap();
    assert_eq!(first, TransportEvent::PeerJoined(a.local_id()));
}

#[test]
fn frames_of_all_sizes_cross_the_wire_intact() {
    let network = InProcessNetwork::default();
    let a = network.join();
    let b = network.join();
    let sizes = [1, 100, MAX_CHUNK_BYTES - 12, MAX_CHUNK_BYTES, 300_000];
    block_on(async {
        let sending = async {
            for (i, &len) in sizes.iter().enumerate() {
                a.send(b.local_id(), &payload(len, i as u8)).await.unwrap();
            }
        };
        let receiving = async {
            for (i, &len) in sizes.iter().enumerate() {
                let (from, frame) = next_frame(&b).await;
                assert_eq!(from, a.local_id());
                assert_eq!(frame, payload(len, i as u8), "frame {i}");
            }
        };
        join(sending, receiving).await;
    });
    let (sent, received) = (a.stats(), b.stats());
    assert_eq!(sent.frames_sent, sizes.len() as u64);
    assert_eq!(received.frames_received, sizes.len() as u64);
    assert_eq!(sent.bytes_sent, received.bytes_received);
    let chunks: usize = sizes.iter().map(|s| s.div_ceil(MAX_CHUNK_BYTES - 12)).sum();
    assert_eq!(
        sent.bytes_sent,
        (sizes.iter().sum::<usize>() + 12 * chunks) as u64
    );
}

#[test]
fn messages_round_trip_through_a_boxed_transport() {
    let network = InProcessNetwork::default();
    let a: Box<dyn Transport> = Box::new(network.join());
    let b: Box<dyn Transport> = Box::new(network.join());
    let message = Message::Heartbeat(Heartbeat {
        nonce: 5,
        sent_ms: 99,
    });
    block_on(async {
        send_message(a.as_ref(), b.local_id(), &message)
            .await
            .unwrap();
        let (_, frame) = next_frame(b.as_ref()).await;
        assert_eq!(decode_frame(&frame).unwrap(), message);
    });
}

/// With nobody reading, a sender may get at most the send buffer (plus its own guaranteed
/// slot) ahead; reading lets it finish.
#[test]
fn send_waits_when_the_buffer_is_full() {
    let buffer = 4 * MAX_CHUNK_BYTES;
    let network = InProcessNetwork::new(InProcessConfig {
        send_buffer_bytes: buffer,
        ..InProcessConfig::default()
    });
    let a = network.join();
    let b = network.join();
    let big = payload(1 << 20, 3);
    block_on(async {
        let mut send = a.send(b.local_id(), &big);
        let mut pending_polls = 0;
        poll_fn(|cx| {
            if send.poll_unpin(cx).is_pending() {
                pending_polls += 1;
            }
            Poll::Ready(())
        })
        .await;
        assert_eq!(
            pending_polls, 1,
            "a 1 MiB send completed into a 64 KiB buffer"
        );
        let in_flight = a.stats().bytes_sent - b.stats().bytes_received;
        assert!(
            in_flight as usize <= buffer + 2 * MAX_CHUNK_BYTES,
            "{in_flight} bytes in flight"
        );
        assert!(
            in_flight as usize >= MAX_CHUNK_BYTES,
            "{in_flight} bytes in flight"
        );
        let (sent, (_, frame)) = join(send, next_frame(&b)).await;
        sent.unwrap();
        assert_eq!(frame, big);
    });
}

#[test]
fn concurrent_senders_interleave_without_mixing_frames() {
    let network = InProcessNetwork::new(InProcessConfig {
        send_buffer_bytes: 2 * MAX_CHUNK_BYTES,
        ..InProcessConfig::default()
    });
    let a = network.join();
    let b = network.join();
    let c = network.join();
    let from_a = payload(200_000, 1);
    let from_c = payload(150_000, 2);
    block_on(async {
        let sends = join(
            join(a.send(c.local_id(), b"x"), a.send(b.local_id(), &from_a)),
            c.send(b.local_id(), &from_c),
        );
        let receive = async {
            let mut got = Vec::new();
            while got.len() < 2 {
                got.push(next_frame(&b).await);
            }
            got.sort();
            got
        };
        let (((x, first), second), got) = join(sends, receive).await;
        x.unwrap();
        first.unwrap();
        second.unwrap();
        assert_eq!(got, [(a.local_id(), from_a), (c.local_id(), from_c)]);
    });
}

#[test]
fn a_departure_arrives_after_the_frames_sent_before_it() {
    let network = InProcessNetwork::default();
    let a = network.join();
    let b = network.join();
    let a_id = a.local_id();
    let goodbye = Message::Leave(Leave {
        reason: "done".into(),
    });
    block_on(async {
        send_message(&a, b.local_id(), &goodbye).await.unwrap();
        drop(a);
        let (from, frame) = next_frame(&b).await;
        assert_eq!((from, decode_frame(&frame).unwrap()), (a_id, goodbye));
        assert_eq!(b.recv().await, Ok(TransportEvent::PeerLeft(a_id)));
    });
}

#[test]
fn garbage_chunks_are_reported_and_the_link_recovers() {
    let network = InProcessNetwork::default();
    let a = network.join();
    let b = network.join();
    block_on(async {
        assert_eq!(b.recv().await, Ok(TransportEvent::PeerJoined(a.local_id())));
        a.send_raw_chunk(b.local_id(), vec![0xAB; 40])
            .await
            .unwrap();
        assert_eq!(
            b.recv().await,
            Ok(TransportEvent::BadChunk {
                from: a.local_id(),
                error: ChunkError::BadTag { found: 0xAB }
            })
        );
        a.send(b.local_id(), b"still here").await.unwrap();
        assert_eq!(next_frame(&b).await, (a.local_id(), b"still here".to_vec()));
    });
}

#[test]
fn sending_to_a_peer_that_left_fails() {
    let network = InProcessNetwork::default();
    let a = network.join();
    let b = network.join();
    let b_id = b.local_id();
    drop(b);
    assert_eq!(
        block_on(a.send(b_id, b"late")),
        Err(TransportError::UnknownPeer(b_id))
    );
    assert_eq!(
        block_on(a.send(b_id, b"")),
        Err(TransportError::Chunk(ChunkError::EmptyFrame {
            frame_id: 1
        }))
    );
}
