//! Protocol frames: round trips, every rejection path of decoding and validation, and random
//! inputs that must never panic.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use webshard::shard::frame::{
    Assign, DonorInfo, ErrorCode, ErrorReport, Forward, Heartbeat, Hello, Leave, Ready, Reply,
    StageInput, StageOutput, StageResult, TokenEvent, FRAME_HEADER_LEN, MAX_FRAME_BYTES,
};
use webshard::shard::{
    decode_frame, encode_frame, f16_round_trip_error, Activations, ByteVocab, Encoding, FrameError,
    FrameLimits, FrameValidator, InputKind, Kind, Message, ModelShape, PeerId,
};

const D_MODEL: u32 = 8;
const VOCAB: u32 = 5;
const SHAPE: ModelShape = ModelShape {
    vocab_size: VOCAB,
    d_model: D_MODEL,
};

fn vocab_blob() -> Vec<u8> {
    ByteVocab::from_pieces(["a", "b", "c", "d", ""], [4])
        .unwrap()
        .to_bytes()
}

fn values(n_tokens: u32, seed: u64) -> Vec<f32> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..n_tokens * D_MODEL)
        .map(|_| rng.random_range(-8.0f32..8.0))
        .collect()
}

fn hidden(n_tokens: u32, encoding: Encoding) -> Activations {
    Activations::encode(&values(n_tokens, 7), D_MODEL, encoding).unwrap()
}

fn assign() -> Assign {
    Assign {
        epoch: 3,
        stage_id: 1,
        n_stages: 3,
        model_url: "http://127.0.0.1:8080/model.gguf".into(),
        layer_start: 10,
        layer_end: 20,
        n_layers: 30,
        embedding: false,
        head: false,
        d_model: D_MODEL,
        upstream: PeerId(1),
        downstream: PeerId(u128::MAX),
        vocab: vocab_blob(),
    }
}

fn forward(seq: u64, start_pos: u32, n_tokens: u32) -> Forward {
    Forward {
        epoch: 3,
        request_id: 42,
        seq,
        stage_id: 1,
        start_pos,
        n_tokens,
        input: StageInput::Hidden(hidden(n_tokens, Encoding::F16)),
        reply: Reply::TopK { k: 3 },
    }
}

fn result(seq: u64, start_pos: u32, output: StageOutput) -> StageResult {
    StageResult {
        epoch: 3,
        request_id: 42,
        seq,
        stage_id: 2,
        start_pos,
        n_tokens: 1,
        output,
    }
}

fn every_kind() -> Vec<Message> {
    vec![
        Message::Hello(Hello {
            fleet_token: "s3cret".into(),
            donor: DonorInfo {
                adapter: "llvmpipe (Vulkan)".into(),
                usable_gpu_bytes: 3 << 30,
                ms_per_layer: 0.75,
            },
        }),
        Message::Assign(assign()),
        Message::Ready(Ready {
            epoch: 3,
            stage_id: 1,
            bytes_downloaded: 123_456_789,
            load_ms: 900,
        }),
        Message::Forward(forward(0, 0, 4)),
        Message::Forward(Forward {
            input: StageInput::Tokens(vec![0, 4, 2]),
            reply: Reply::Greedy,
            ..forward(0, 0, 3)
        }),
        Message::Forward(Forward {
            input: StageInput::Hidden(hidden(2, Encoding::F32)),
            reply: Reply::Hidden {
                encoding: Encoding::F32,
            },
            ..forward(0, 5, 2)
        }),
        Message::Result(result(0, 9, StageOutput::Sampled(3))),
        Message::Result(result(
            0,
            9,
            StageOutput::TopK {
                ids: vec![3, 1],
                logits: vec![12.5, -0.25],
            },
        )),
        Message::Result(result(0, 9, StageOutput::Hidden(hidden(1, Encoding::F16)))),
        Message::Token(TokenEvent {
            request_id: 42,
            index: 7,
            id: 2,
        }),
        Message::Heartbeat(Heartbeat {
            nonce: u64::MAX,
            sent_ms: 17,
        }),
        Message::Leave(Leave {
            reason: "tab closed".into(),
        }),
        Message::Error(ErrorReport {
            code: ErrorCode::LoadFailed,
            request_id: Some(42),
            message: "out of memory".into(),
        }),
    ]
}

fn checked(message: &Message) -> Result<(), FrameError> {
    message.check(&FrameLimits::default(), Some(SHAPE))
}

#[test]
fn every_kind_round_trips_and_passes_checks() {
    for message in every_kind() {
        let frame = encode_frame(&message).unwrap();
        assert_eq!(&frame[..2], b"WS");
        assert_eq!(frame[2], 1, "protocol version");
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

fn valid_frame() -> Vec<u8> {
    encode_frame(&Message::Forward(forward(0, 0, 2))).unwrap()
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
    bad[2] = 2;
    assert_eq!(
        decode_frame(&bad),
        Err(FrameError::UnsupportedVersion { found: 2 })
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

/// Rewrites the header's body length after editing the body.
fn with_body(kind: Kind, body: &[u8]) -> Vec<u8> {
    let mut frame = vec![b'W', b'S', 1, kind as u8];
    frame.extend_from_slice(&(body.len() as u32).to_le_bytes());
    frame.extend_from_slice(body);
    frame
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

fn assert_rejects(message: Message, expected: FrameError) {
    assert_eq!(checked(&message), Err(expected), "{message:?}");
}

#[test]
fn join_and_assign_rejections() {
    let hello = |token: &str, ms: f32| {
        Message::Hello(Hello {
            fleet_token: token.into(),
            donor: DonorInfo {
                adapter: "gpu".into(),
                usable_gpu_bytes: 1,
                ms_per_layer: ms,
            },
        })
    };
    assert_rejects(
        hello("", 1.0),
        FrameError::Empty {
            field: "fleet_token",
        },
    );
    assert_rejects(
        hello(&"t".repeat(4097), 1.0),
        FrameError::TextTooLong {
            field: "fleet_token",
            len: 4097,
            max: 4096,
        },
    );
    for ms in [0.0, -1.0, f32::NAN, f32::INFINITY] {
        assert!(matches!(
            checked(&hello("t", ms)),
            Err(FrameError::BadProbe { .. })
        ));
    }
    let a = assign();
    let cases = [
        (
            Assign {
                stage_id: 3,
                ..a.clone()
            },
            FrameError::BadStage {
                stage_id: 3,
                n_stages: 3,
            },
        ),
        (
            Assign {
                layer_end: 10,
                ..a.clone()
            },
            FrameError::BadLayers {
                start: 10,
                end: 10,
                n_layers: 30,
            },
        ),
        (
            Assign {
                layer_end: 31,
                ..a.clone()
            },
            FrameError::BadLayers {
                start: 10,
                end: 31,
                n_layers: 30,
            },
        ),
        (
            Assign {
                head: true,
                ..a.clone()
            },
            FrameError::StageEnds {
                stage_id: 1,
                n_stages: 3,
                start: 10,
                end: 20,
                embedding: false,
                head: true,
            },
        ),
        (
            Assign {
                layer_start: 0,
                ..a.clone()
            },
            FrameError::StageEnds {
                stage_id: 1,
                n_stages: 3,
                start: 0,
                end: 20,
                embedding: false,
                head: false,
            },
        ),
        (
            Assign {
                d_model: 0,
                ..a.clone()
            },
            FrameError::BadDModel {
                found: 0,
                max: 65536,
            },
        ),
        (
            Assign {
                model_url: String::new(),
                ..a.clone()
            },
            FrameError::Empty { field: "model_url" },
        ),
    ];
    for (bad, expected) in cases {
        assert_rejects(Message::Assign(bad), expected);
    }
    let mut corrupt = a.clone();
    corrupt.vocab[0] = b'X';
    assert!(matches!(
        checked(&Message::Assign(corrupt)),
        Err(FrameError::Vocab(
            webshard::shard::VocabError::BadMagic { .. }
        ))
    ));
}

#[test]
fn forward_rejections() {
    let f = forward(0, 0, 2);
    assert_rejects(
        Message::Forward(Forward {
            n_tokens: 0,
            ..f.clone()
        }),
        FrameError::TokenCount {
            found: 0,
            max: 4096,
        },
    );
    assert_rejects(
        Message::Forward(Forward {
            n_tokens: 4097,
            ..f.clone()
        }),
        FrameError::TokenCount {
            found: 4097,
            max: 4096,
        },
    );
    assert_rejects(
        Message::Forward(Forward {
            start_pos: u32::MAX,
            ..f.clone()
        }),
        FrameError::PositionOverflow {
            start_pos: u32::MAX,
            n_tokens: 2,
        },
    );
    assert_rejects(
        Message::Forward(Forward {
            input: StageInput::Tokens(vec![1]),
            ..f.clone()
        }),
        FrameError::Count {
            field: "input ids",
            expected: 2,
            found: 1,
        },
    );
    assert_rejects(
        Message::Forward(Forward {
            input: StageInput::Tokens(vec![1, VOCAB]),
            ..f.clone()
        }),
        FrameError::IdOutOfRange {
            field: "input ids",
            index: 1,
            id: VOCAB,
            vocab_size: VOCAB,
        },
    );
    assert_rejects(
        Message::Forward(Forward {
            n_tokens: 3,
            ..f.clone()
        }),
        FrameError::ShapeMismatch {
            field: "input activations",
            n_tokens: 3,
            d_model: D_MODEL,
            encoding: Encoding::F16,
            expected_bytes: 3 * 8 * 2,
            found_bytes: 2 * 8 * 2,
        },
    );
    let wide = Activations::encode(&[0.5; 18], 9, Encoding::F32).unwrap();
    assert_rejects(
        Message::Forward(Forward {
            input: StageInput::Hidden(wide),
            ..f.clone()
        }),
        FrameError::DModelMismatch {
            field: "input activations",
            expected: D_MODEL,
            found: 9,
        },
    );
    assert_rejects(
        Message::Forward(Forward {
            reply: Reply::TopK { k: VOCAB + 1 },
            ..f.clone()
        }),
        FrameError::BadTopK {
            found: VOCAB + 1,
            max: VOCAB,
        },
    );
    assert_rejects(
        Message::Forward(Forward {
            reply: Reply::TopK { k: 0 },
            ..f.clone()
        }),
        FrameError::BadTopK {
            found: 0,
            max: VOCAB,
        },
    );
}

#[test]
fn non_finite_activations_are_rejected_in_both_encodings() {
    let mut f16 = hidden(2, Encoding::F16);
    f16.data[10..12].copy_from_slice(&0x7C00u16.to_le_bytes()); // +inf
    let mut f32 = hidden(2, Encoding::F32);
    f32.data[60..64].copy_from_slice(&f32::NAN.to_le_bytes());
    for (data, index) in [(f16, 5), (f32, 15)] {
        assert_rejects(
            Message::Forward(Forward {
                input: StageInput::Hidden(data),
                ..forward(0, 0, 2)
            }),
            FrameError::NonFinite {
                field: "input activations",
                index,
            },
        );
    }
}

#[test]
fn result_and_token_rejections() {
    let top = |ids: Vec<u32>, logits: Vec<f32>| {
        Message::Result(result(0, 0, StageOutput::TopK { ids, logits }))
    };
    assert_rejects(
        top(vec![1, 2], vec![1.0]),
        FrameError::Count {
            field: "top-k logits",
            expected: 2,
            found: 1,
        },
    );
    assert_rejects(
        top(vec![], vec![]),
        FrameError::BadTopK {
            found: 0,
            max: VOCAB,
        },
    );
    assert_rejects(
        top(vec![1, 7], vec![1.0, 0.5]),
        FrameError::IdOutOfRange {
            field: "top-k ids",
            index: 1,
            id: 7,
            vocab_size: VOCAB,
        },
    );
    assert_rejects(
        top(vec![1, 2], vec![1.0, f32::NEG_INFINITY]),
        FrameError::NonFinite {
            field: "top-k logits",
            index: 1,
        },
    );
    assert_rejects(
        Message::Result(result(0, 0, StageOutput::Sampled(VOCAB))),
        FrameError::IdOutOfRange {
            field: "sampled id",
            index: 0,
            id: VOCAB,
            vocab_size: VOCAB,
        },
    );
    assert_rejects(
        Message::Token(TokenEvent {
            request_id: 1,
            index: 0,
            id: 99,
        }),
        FrameError::IdOutOfRange {
            field: "token",
            index: 0,
            id: 99,
            vocab_size: VOCAB,
        },
    );
    assert_rejects(
        Message::Leave(Leave {
            reason: "x".repeat(5000),
        }),
        FrameError::TextTooLong {
            field: "reason",
            len: 5000,
            max: 4096,
        },
    );
}

fn donor_validator() -> FrameValidator {
    let mut validator = FrameValidator::new(FrameLimits::default());
    validator.set_model(SHAPE);
    validator.begin_epoch(3);
    validator.expect_stage(1, InputKind::Hidden);
    validator
}

fn accept(validator: &mut FrameValidator, forward: Forward) -> Result<(), FrameError> {
    let frame = encode_frame(&Message::Forward(forward)).unwrap();
    validator.decode(&frame).map(|_| ())
}

#[test]
fn validator_follows_sequences_and_positions() {
    let mut v = donor_validator();
    accept(&mut v, forward(0, 0, 4)).unwrap();
    accept(&mut v, forward(1, 4, 1)).unwrap();
    assert_eq!(
        accept(&mut v, forward(1, 5, 1)),
        Err(FrameError::Sequence {
            kind: Kind::Forward,
            request_id: 42,
            expected: 2,
            found: 1
        })
    );
    assert_eq!(
        accept(&mut v, forward(3, 5, 1)),
        Err(FrameError::Sequence {
            kind: Kind::Forward,
            request_id: 42,
            expected: 2,
            found: 3
        })
    );
    assert_eq!(
        accept(&mut v, forward(2, 6, 1)),
        Err(FrameError::Position {
            kind: Kind::Forward,
            request_id: 42,
            expected: 5,
            found: 6
        })
    );
    // Rejected frames do not move the cursor.
    accept(&mut v, forward(2, 5, 1)).unwrap();
    // Another request has its own cursor.
    accept(
        &mut v,
        Forward {
            request_id: 7,
            ..forward(0, 100, 2)
        },
    )
    .unwrap();
    v.forget_request(42);
    accept(&mut v, forward(0, 0, 1)).unwrap();
    v.begin_epoch(4);
    assert_eq!(
        accept(&mut v, forward(1, 1, 1)),
        Err(FrameError::StaleEpoch {
            kind: Kind::Forward,
            expected: 4,
            found: 3
        })
    );
    accept(
        &mut v,
        Forward {
            epoch: 4,
            ..forward(0, 0, 1)
        },
    )
    .unwrap();
}

#[test]
fn validator_checks_stage_input_and_state() {
    let mut fresh = FrameValidator::new(FrameLimits::default());
    assert_eq!(
        accept(&mut fresh, forward(0, 0, 1)),
        Err(FrameError::Unexpected {
            kind: Kind::Forward,
            reason: "no stage is assigned to this peer"
        })
    );
    let mut v = donor_validator();
    assert_eq!(
        accept(
            &mut v,
            Forward {
                stage_id: 2,
                ..forward(0, 0, 1)
            }
        ),
        Err(FrameError::WrongStage {
            kind: Kind::Forward,
            expected: 1,
            found: 2
        })
    );
    assert_eq!(
        accept(
            &mut v,
            Forward {
                input: StageInput::Tokens(vec![1]),
                ..forward(0, 0, 1)
            }
        ),
        Err(FrameError::WrongInput {
            kind: Kind::Forward,
            expected: "activations",
            found: "token ids"
        })
    );
    let stale = Message::Assign(Assign {
        epoch: 2,
        ..assign()
    });
    assert_eq!(
        v.check(&stale),
        Err(FrameError::StaleEpoch {
            kind: Kind::Assign,
            expected: 3,
            found: 2
        })
    );
    v.check(&Message::Assign(assign())).unwrap();
    assert!(matches!(
        v.decode(&valid_frame()[..5]),
        Err(FrameError::Truncated { len: 5 })
    ));
}

#[test]
fn validator_bounds_tracked_requests_and_result_streams() {
    let limits = FrameLimits {
        max_requests: 2,
        ..FrameLimits::default()
    };
    let mut v = FrameValidator::new(limits);
    v.set_model(SHAPE);
    v.begin_epoch(3);
    let sampled = |request_id, seq, pos| {
        Message::Result(StageResult {
            request_id,
            ..result(seq, pos, StageOutput::Sampled(1))
        })
    };
    v.check(&sampled(1, 0, 10)).unwrap();
    v.check(&sampled(1, 1, 11)).unwrap();
    v.check(&sampled(2, 0, 0)).unwrap();
    assert_eq!(
        v.check(&sampled(3, 0, 0)),
        Err(FrameError::TooManyRequests { max: 2 })
    );
    assert_eq!(
        v.check(&sampled(1, 2, 13)),
        Err(FrameError::Position {
            kind: Kind::Result,
            request_id: 1,
            expected: 12,
            found: 13
        })
    );
    v.forget_request(2);
    v.check(&sampled(3, 0, 0)).unwrap();
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
