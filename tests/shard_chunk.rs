//! Wire chunks: slicing, reassembly with interleaving, and every rejection.

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use webshard::shard::chunk::{CHUNK_HEADER_LEN, CHUNK_PAYLOAD, MAX_CHUNK_BYTES};
use webshard::shard::{slice_frame, ChunkError, Reassembler, ReassemblyLimits};

fn frame(len: usize, seed: u64) -> Vec<u8> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..len).map(|_| rng.random()).collect()
}

fn limits(
    max_frame_bytes: usize,
    max_partial_frames: usize,
    max_buffered_bytes: usize,
) -> ReassemblyLimits {
    ReassemblyLimits {
        max_frame_bytes,
        max_partial_frames,
        max_buffered_bytes,
    }
}

/// A chunk with an arbitrary header, for the rejection tests.
fn raw_chunk(index: u16, frame_id: u32, frame_len: u32, payload: &[u8]) -> Vec<u8> {
    let mut chunk = vec![0xC1, 0];
    chunk.extend_from_slice(&index.to_le_bytes());
    chunk.extend_from_slice(&frame_id.to_le_bytes());
    chunk.extend_from_slice(&frame_len.to_le_bytes());
    chunk.extend_from_slice(payload);
    chunk
}

#[test]
fn frames_of_every_boundary_size_survive_slicing() {
    let sizes = [
        1,
        CHUNK_PAYLOAD - 1,
        CHUNK_PAYLOAD,
        CHUNK_PAYLOAD + 1,
        5 * CHUNK_PAYLOAD + 7,
        1 << 20,
    ];
    for (seed, len) in sizes.into_iter().enumerate() {
        let original = frame(len, seed as u64);
        let chunks = slice_frame(9, &original).unwrap();
        assert_eq!(chunks.len(), len.div_ceil(CHUNK_PAYLOAD));
        assert!(chunks.iter().all(|c| c.len() <= MAX_CHUNK_BYTES));
        assert!(chunks[..chunks.len() - 1]
            .iter()
            .all(|c| c.len() == MAX_CHUNK_BYTES));
        let mut reassembler = Reassembler::default();
        let (last, rest) = chunks.split_last().unwrap();
        for chunk in rest {
            assert_eq!(reassembler.push(chunk), Ok(None));
        }
        assert_eq!(reassembler.push(last), Ok(Some(original)), "len {len}");
        assert_eq!(reassembler.buffered_bytes(), 0);
        assert_eq!(reassembler.partial_frames(), 0);
    }
}

#[test]
fn interleaved_frames_are_all_rebuilt() {
    let mut rng = StdRng::seed_from_u64(77);
    let frames: Vec<Vec<u8>> = (0..6)
        .map(|i| frame(rng.random_range(1..5 * CHUNK_PAYLOAD), i))
        .collect();
    let mut queues: Vec<std::collections::VecDeque<Vec<u8>>> = frames
        .iter()
        .enumerate()
        .map(|(id, f)| slice_frame(id as u32, f).unwrap().into())
        .collect();
    // Random interleaving that keeps each frame's chunks in order.
    let mut order: Vec<usize> = queues
        .iter()
        .enumerate()
        .flat_map(|(i, q)| std::iter::repeat_n(i, q.len()))
        .collect();
    order.shuffle(&mut rng);
    let mut reassembler = Reassembler::new(limits(1 << 20, 6, 1 << 20));
    let mut done = vec![None; frames.len()];
    for i in order {
        let chunk = queues[i].pop_front().unwrap();
        if let Some(frame) = reassembler.push(&chunk).unwrap() {
            done[i] = Some(frame);
        }
    }
    for (i, frame) in frames.into_iter().enumerate() {
        assert_eq!(done[i].as_ref(), Some(&frame), "frame {i}");
    }
}

#[test]
fn malformed_chunks_are_rejected() {
    let mut r = Reassembler::default();
    assert_eq!(r.push(&[0xC1; 11]), Err(ChunkError::TooShort { len: 11 }));
    assert_eq!(
        r.push(&vec![0xC1; MAX_CHUNK_BYTES + 1]),
        Err(ChunkError::TooLong {
            len: MAX_CHUNK_BYTES + 1
        })
    );
    let mut bad_tag = raw_chunk(0, 1, 3, b"abc");
    bad_tag[0] = 0x00;
    assert_eq!(r.push(&bad_tag), Err(ChunkError::BadTag { found: 0 }));
    let mut flags = raw_chunk(0, 1, 3, b"abc");
    flags[1] = 4;
    assert_eq!(r.push(&flags), Err(ChunkError::ReservedFlags { flags: 4 }));
    assert_eq!(
        r.push(&raw_chunk(0, 1, 0, b"")),
        Err(ChunkError::EmptyFrame { frame_id: 1 })
    );
    assert_eq!(
        r.push(&raw_chunk(2, 1, 3, b"abc")),
        Err(ChunkError::IndexOutOfRange {
            frame_id: 1,
            index: 2,
            count: 1
        })
    );
    assert_eq!(
        r.push(&raw_chunk(0, 1, 3, b"ab")),
        Err(ChunkError::PayloadLength {
            frame_id: 1,
            index: 0,
            expected: 3,
            found: 2
        })
    );
    assert_eq!(
        r.push(&raw_chunk(0, 1, 3, b"abc")),
        Ok(Some(b"abc".to_vec()))
    );
    let mut small = Reassembler::new(limits(100, 8, 1000));
    assert_eq!(
        small.push(&raw_chunk(0, 5, 101, &[0; 101])),
        Err(ChunkError::FrameTooLarge {
            frame_id: 5,
            len: 101,
            max: 100
        })
    );
    assert_eq!(
        slice_frame(3, &[]),
        Err(ChunkError::EmptyFrame { frame_id: 3 })
    );
}

#[test]
fn out_of_order_duplicate_and_changed_chunks_drop_the_frame() {
    let original = frame(3 * CHUNK_PAYLOAD, 1);
    let chunks = slice_frame(4, &original).unwrap();
    let mut r = Reassembler::default();
    assert_eq!(
        r.push(&chunks[1]),
        Err(ChunkError::OutOfOrder {
            frame_id: 4,
            expected: 0,
            found: 1
        })
    );
    r.push(&chunks[0]).unwrap();
    assert_eq!(r.buffered_bytes(), CHUNK_PAYLOAD);
    assert_eq!(
        r.push(&chunks[0]),
        Err(ChunkError::OutOfOrder {
            frame_id: 4,
            expected: 1,
            found: 0
        })
    );
    // The broken frame is gone, and its bytes with it.
    assert_eq!((r.partial_frames(), r.buffered_bytes()), (0, 0));
    r.push(&chunks[0]).unwrap();
    let changed = raw_chunk(
        1,
        4,
        3 * CHUNK_PAYLOAD as u32 + 1,
        &chunks[1][CHUNK_HEADER_LEN..],
    );
    assert_eq!(
        r.push(&changed),
        Err(ChunkError::FrameLengthChanged {
            frame_id: 4,
            first: 3 * CHUNK_PAYLOAD,
            now: 3 * CHUNK_PAYLOAD + 1
        })
    );
    assert_eq!((r.partial_frames(), r.buffered_bytes()), (0, 0));
    for chunk in &chunks[..2] {
        assert_eq!(r.push(chunk), Ok(None));
    }
    assert_eq!(r.push(&chunks[2]), Ok(Some(original)));
}

#[test]
fn partial_frames_and_buffered_bytes_are_bounded() {
    let big = frame(4 * CHUNK_PAYLOAD, 2);
    let mut r = Reassembler::new(limits(1 << 20, 2, 3 * CHUNK_PAYLOAD));
    let a = slice_frame(1, &big).unwrap();
    let b = slice_frame(2, &big).unwrap();
    let c = slice_frame(3, &big).unwrap();
    r.push(&a[0]).unwrap();
    r.push(&b[0]).unwrap();
    assert_eq!(
        r.push(&c[0]),
        Err(ChunkError::TooManyPartialFrames { max: 2 })
    );
    r.push(&a[1]).unwrap();
    assert_eq!(
        r.push(&b[1]),
        Err(ChunkError::BufferFull {
            needed: 4 * CHUNK_PAYLOAD,
            max: 3 * CHUNK_PAYLOAD
        })
    );
    // Frame 2 was dropped, freeing room for frame 1's third chunk; its fourth would make
    // 4 chunks held at once, over the limit, so frame 1 is refused too.
    r.push(&a[2]).unwrap();
    assert!(matches!(r.push(&a[3]), Err(ChunkError::BufferFull { .. })));
    assert_eq!((r.partial_frames(), r.buffered_bytes()), (0, 0));
    // A single-chunk frame needs no buffering at all.
    assert_eq!(
        r.push(&raw_chunk(0, 9, 5, b"hello")),
        Ok(Some(b"hello".to_vec()))
    );
}

/// Random chunk streams never panic and never hold more than the limits allow.
#[test]
fn random_chunks_never_panic_and_stay_bounded() {
    let mut rng = StdRng::seed_from_u64(0xc4c4);
    let limits = limits(64 * 1024, 4, 96 * 1024);
    let mut r = Reassembler::new(limits);
    let valid: Vec<Vec<u8>> = (0..4)
        .flat_map(|id| slice_frame(id, &frame(3 * CHUNK_PAYLOAD + id as usize, id as u64)).unwrap())
        .collect();
    for _ in 0..50_000 {
        let chunk = match rng.random_range(0..3) {
            0 => {
                let len = rng.random_range(0..64);
                (0..len).map(|_| rng.random()).collect()
            }
            1 => {
                let index = rng.random_range(0..8u16);
                let frame_id = rng.random_range(0..6u32);
                let frame_len = rng.random_range(0..5 * CHUNK_PAYLOAD as u32);
                let payload = vec![7u8; rng.random_range(0..CHUNK_PAYLOAD + 2)];
                raw_chunk(index, frame_id, frame_len, &payload)
            }
            _ => valid[rng.random_range(0..valid.len())].clone(),
        };
        if let Ok(Some(frame)) = r.push(&chunk) {
            assert!(!frame.is_empty() && frame.len() <= limits.max_frame_bytes);
        }
        assert!(r.partial_frames() <= limits.max_partial_frames);
        assert!(r.buffered_bytes() <= limits.max_buffered_bytes);
    }
}
