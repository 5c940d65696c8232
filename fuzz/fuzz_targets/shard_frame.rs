//! Any bytes as a frame, and as a stream of wire messages: decoding, validation, credit
//! parsing and reassembly must return, never panic; what is accepted must re-encode to an
//! equal message (an allowed-token set must become a mask of its own ids within the
//! vocabulary), and the reassembler and the flow-control window must stay within their
//! limits.

#![no_main]

use libfuzzer_sys::fuzz_target;
use webshard::shard::flow::{encode_credit, parse_credit, ReceiveWindow, WINDOW_BYTES};
use webshard::shard::frame::Forward;
use webshard::shard::{
    decode_frame, encode_frame, AllowedTokens, FrameLimits, FrameValidator, InputKind, Message,
    ModelShape, Reassembler, ReassemblyLimits,
};

const VOCAB: u32 = 1000;

fn validator() -> FrameValidator {
    let mut validator = FrameValidator::new(FrameLimits::default());
    validator.set_model(ModelShape {
        vocab_size: VOCAB,
        d_model: 4,
    });
    validator.begin_epoch(1);
    validator.expect_stage(1, InputKind::Hidden);
    validator
}

fn check_frame(frame: &[u8]) {
    let mut validator = validator();
    if let Ok(message) = validator.decode(frame) {
        let again = encode_frame(&message).expect("an accepted message re-encodes");
        assert_eq!(decode_frame(&again).expect("and decodes"), message);
        if let Message::Forward(Forward {
            allowed: Some(allowed),
            ..
        }) = &message
        {
            check_allowed(allowed);
        }
    }
}

/// An accepted allowed-token set becomes the last stage's mask as it is: within the
/// vocabulary, not empty, the same ids as its runs.
fn check_allowed(allowed: &AllowedTokens) {
    let ids = allowed.to_mask(VOCAB).ids();
    assert!(!ids.is_empty() && ids.iter().all(|&id| id < VOCAB));
    let runs: Vec<u32> = allowed.runs().into_iter().flatten().collect();
    assert_eq!(ids, runs);
}

/// Reads the input as wire messages, each prefixed by a u16 LE length: credits are parsed,
/// everything else counts against a receive window and goes into a small reassembler.
fn check_chunks(data: &[u8]) {
    let limits = ReassemblyLimits {
        max_frame_bytes: 1 << 16,
        max_partial_frames: 3,
        max_buffered_bytes: 1 << 16,
    };
    let mut reassembler = Reassembler::new(limits);
    let mut window = ReceiveWindow::default();
    let mut rest = data;
    while let Some((len, tail)) = rest.split_first_chunk::<2>() {
        let len = (u16::from_le_bytes(*len) as usize).min(tail.len());
        let (chunk, after) = tail.split_at(len);
        rest = after;
        match parse_credit(chunk) {
            Some(Ok(bytes)) => {
                assert!(bytes <= WINDOW_BYTES);
                assert_eq!(parse_credit(&encode_credit(bytes)), Some(Ok(bytes)));
                continue;
            }
            Some(Err(_)) => continue,
            None => {}
        }
        if window.arrived(chunk.len()).is_ok() {
            window.consumed(chunk.len());
        }
        assert!(window.unacknowledged() <= u64::from(WINDOW_BYTES));
        if let Ok(Some(frame)) = reassembler.push(chunk) {
            assert!(!frame.is_empty() && frame.len() <= limits.max_frame_bytes);
            check_frame(&frame);
        }
        assert!(reassembler.partial_frames() <= limits.max_partial_frames);
        assert!(reassembler.buffered_bytes() <= limits.max_buffered_bytes);
    }
}

fuzz_target!(|data: &[u8]| {
    check_frame(data);
    check_chunks(data);
});
