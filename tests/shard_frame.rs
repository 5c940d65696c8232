//! Protocol frames: round trips, envelope and body rejections, activation encoding, and
//! random inputs that must never panic.

use crate::shard_support;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use shard_support::*;
use webshard::sample::TokenMask;
use webshard::shard::frame::{Assign, FRAME_HEADER_LEN, MAX_FRAME_BYTES, PROTOCOL_VERSION};
use webshard::shard::{
    decode_frame, encode_frame, f16_round_trip_error, Activations, AllowedTokens, Encoding,
    FrameError, Kind, Message,
};

#[test]
fn every_kind_round_trips_and_passes_checks() {
    for message in every_kind() {
        let frame = encode_frame(&message).unwrap();
        assert_eq!(&frame[..2], b"WS");
        assert_eq!(frame[2], PROTOCOL_VERSION, "protocol version");
        assert_eq!(frame[3], message.kind() as u8);
        let body_len = u32::from_le_bytes(frame[4..8].try_into().unwrap()) as usize;
        assert_eq!(body_len, frame.len() - FRAME_HEADER_LEN);
        assert_eq!(decode_frame(&frame).unwrap(), message);
        checked(&message).unwrap_or_else(|e| panic!("{:?}: {e}", message.kind()));
    }
}

#[test]
fn f16_is_the_default_and_halves_the_payload() {
    assert_eq!(Encoding::default(), Encoding::F16);
    let f16 = hidden(4, Encoding::F16);
    let f32 = hidden(4, Encoding::F32);
    assert_eq!(f16.data.len() * 2, f32.data.len());
    assert_eq!(f32.to_f32(), values(4, 7));
}

#[test]
fn measured_f16_error_is_the_error_the_wire_adds() {
    let original = values(16, 99);
    let decoded = Activations::encode(&original, D_MODEL, Encoding::F16)
        .unwrap()
        .to_f32();
    let max_abs = original
        .iter()
        .zip(&decoded)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    let measured = f16_round_trip_error(&original);
    assert_eq!(measured.max_abs, max_abs);
    assert!(measured.max_abs > 0.0);
    // binary16 keeps 11 significant bits: relative error at most 2^-11 per value.
    assert!(measured.relative_rms <= 2f32.powi(-11), "{measured:?}");
    assert_eq!(measured.overflowed, 0);
}

#[test]
fn activation_encoding_refuses_what_cannot_be_sent() {
    assert_eq!(
        Activations::encode(&[1.0; 7], D_MODEL, Encoding::F32),
        Err(FrameError::RaggedActivations {
            values: 7,
            d_model: D_MODEL
        })
    );
    let mut with_nan = values(1, 1);
    with_nan[3] = f32::NAN;
    assert_eq!(
        Activations::encode(&with_nan, D_MODEL, Encoding::F32),
        Err(FrameError::NonFinite {
            field: "activations",
            index: 3
        })
    );
    let mut too_big = values(1, 1);
    too_big[5] = 1e6;
    assert_eq!(
        Activations::encode(&too_big, D_MODEL, Encoding::F16),
        Err(FrameError::F16Overflow {
            index: 5,
            value: 1e6
        })
    );
    assert!(Activations::encode(&too_big, D_MODEL, Encoding::F32).is_ok());
}

#[test]
fn envelope_rejections() {
    let frame = valid_frame();
    assert_eq!(decode_frame(&[]), Err(FrameError::Truncated { len: 0 }));
    assert_eq!(
        decode_frame(&frame[..7]),
        Err(FrameError::Truncated { len: 7 })
    );
    let mut bad = frame.clone();
    bad[1] = b'X';
    assert_eq!(
        decode_frame(&bad),
        Err(FrameError::BadMagic { found: *b"WX" })
    );
    let mut bad = frame.clone();
    bad[2] = PROTOCOL_VERSION + 1;
    assert_eq!(
        decode_frame(&bad),
        Err(FrameError::UnsupportedVersion {
            found: PROTOCOL_VERSION + 1
        })
    );
    for kind in [0u8, 10, 255] {
        let mut bad = frame.clone();
        bad[3] = kind;
        assert_eq!(decode_frame(&bad), Err(FrameError::UnknownKind { kind }));
    }
    let body = frame.len() - FRAME_HEADER_LEN;
    assert_eq!(
        decode_frame(&frame[..frame.len() - 1]),
        Err(FrameError::BodyLength {
            declared: body,
            found: body - 1
        })
    );
    let mut long = frame.clone();
    long.push(0);
    assert_eq!(
        decode_frame(&long),
        Err(FrameError::BodyLength {
            declared: body,
            found: body + 1
        })
    );
    let oversized = Message::Assign(Assign {
        vocab: vec![0; MAX_FRAME_BYTES],
        ..assign()
    });
    assert!(matches!(
        encode_frame(&oversized),
        Err(FrameError::TooLarge { len, max: MAX_FRAME_BYTES }) if len > MAX_FRAME_BYTES
    ));
    let huge = vec![0u8; MAX_FRAME_BYTES + 1];
    assert_eq!(
        decode_frame(&huge),
        Err(FrameError::TooLarge {
            len: MAX_FRAME_BYTES + 1,
            max: MAX_FRAME_BYTES
        })
    );
}

#[test]
fn body_rejections() {
    let frame = valid_frame();
    let body = &frame[FRAME_HEADER_LEN..];
    let mut trailing = body.to_vec();
    trailing.extend_from_slice(&[1, 2]);
    assert_eq!(
        decode_frame(&with_body(Kind::Forward, &trailing)),
        Err(FrameError::TrailingBody {
            kind: Kind::Forward,
            extra: 2
        })
    );
    assert!(matches!(
        decode_frame(&with_body(Kind::Forward, &body[..body.len() / 2])),
        Err(FrameError::Body {
            kind: Kind::Forward,
            ..
        })
    ));
    // An empty Heartbeat body: too short for its two varints.
    assert!(matches!(
        decode_frame(&with_body(Kind::Heartbeat, &[])),
        Err(FrameError::Body {
            kind: Kind::Heartbeat,
            ..
        })
    ));
    // An enum discriminant no variant has (StageInput has two). Epoch, request id, seq,
    // stage, start and count are one-byte varints here, so the discriminant is byte 6.
    let mut bad_variant = body.to_vec();
    assert_eq!(bad_variant[6], 1, "StageInput::Hidden");
    bad_variant[6] = 9;
    assert!(matches!(
        decode_frame(&with_body(Kind::Forward, &bad_variant)),
        Err(FrameError::Body {
            kind: Kind::Forward,
            ..
        })
    ));
    assert!(matches!(
        decode_frame(&with_body(
            Kind::Leave,
            &[2, 0xff, 0xfe] // length 2 then invalid UTF-8
        )),
        Err(FrameError::Body {
            kind: Kind::Leave,
            ..
        })
    ));
}

/// Random bytes, and random edits of valid frames, give an error or a message; never a panic.
#[test]
fn random_frames_never_panic() {
    let mut rng = StdRng::seed_from_u64(0xf2a3e);
    let valid: Vec<Vec<u8>> = every_kind()
        .iter()
        .map(|m| encode_frame(m).unwrap())
        .collect();
    let mut accepted = 0;
    for round in 0..30_000 {
        let mut frame = valid[round % valid.len()].clone();
        match round % 3 {
            0 => {
                for _ in 0..rng.random_range(1..6) {
                    let at = rng.random_range(FRAME_HEADER_LEN.min(frame.len())..frame.len());
                    frame[at] = rng.random();
                }
            }
            1 => frame.truncate(rng.random_range(0..frame.len())),
            _ => {
                let len = rng.random_range(0..256);
                frame = with_body(
                    Kind::Forward,
                    &(0..len).map(|_| rng.random()).collect::<Vec<u8>>(),
                );
                frame[3] = rng.random_range(0..12);
            }
        }
        let mut validator = donor_validator();
        if let Ok(message) = validator.decode(&frame) {
            accepted += 1;
            let again = encode_frame(&message).unwrap();
            assert_eq!(decode_frame(&again).unwrap(), message);
        }
    }
    assert!(
        accepted > 0,
        "no mutated frame was valid: mutations too coarse"
    );
}

/// Random allowed sets survive `from_mask` and `to_mask` exactly; the wire form is runs when
/// the set is a few runs and the bitset when it is scattered.
#[test]
fn allowed_tokens_round_trip_in_the_smaller_form() {
    let vocab = 1000u32;
    let mut rng = StdRng::seed_from_u64(15);
    for round in 0..200 {
        let ids: Vec<u32> = match round % 3 {
            0 => (0..vocab).filter(|_| rng.random_bool(0.5)).collect(),
            1 => {
                let start = rng.random_range(0..vocab - 40);
                (start..start + rng.random_range(1..40)).collect()
            }
            _ => (0..vocab).filter(|_| rng.random_bool(0.005)).collect(),
        };
        let runs = ids.iter().map(|&id| id..id + 1);
        let mask = TokenMask::from_runs(vocab as usize, runs);
        let wire = AllowedTokens::from_mask(&mask, vocab);
        match (round % 3, &wire) {
            (0, AllowedTokens::Bits(bits)) => assert_eq!(bits.len(), 125),
            (1 | 2, AllowedTokens::Runs(_)) => {}
            (kind, other) => panic!("set kind {kind} sent as {other:?}"),
        }
        assert_eq!(wire.to_mask(vocab).ids(), ids, "round {round}");
        let runs: Vec<u32> = wire.runs().into_iter().flatten().collect();
        assert_eq!(runs, ids);
    }
    // Ids past the model's vocabulary (a tokenizer larger than the head) are not sent.
    let mask = TokenMask::from_runs(1010, std::iter::once(995..1005));
    let wire = AllowedTokens::from_mask(&mask, vocab);
    assert_eq!(wire.to_mask(vocab).ids(), (995..1000).collect::<Vec<u32>>());
}
