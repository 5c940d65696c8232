//! Frame validation: every field rule of `Message::check`, and the receiver's expectations
//! in `FrameValidator` (epoch, stage, input kind, sequence, position, request bound).

use crate::shard_support;

use shard_support::*;
use webshard::shard::frame::{
    Assign, DonorInfo, Forward, Hello, Leave, Reply, StageInput, StageOutput, StageResult,
    StageRuntime, TokenEvent,
};
use webshard::shard::AllowedTokens::{self, Bits, Runs};
use webshard::shard::{
    Activations, Encoding, FrameError, FrameLimits, FrameValidator, Kind, Message, VocabError,
};

#[path = "shard_validate/allowed.rs"]
mod allowed;

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
        (
            Assign {
                runtime: StageRuntime {
                    kv_slots: 0,
                    ..a.runtime
                },
                ..a.clone()
            },
            FrameError::BadRuntime {
                field: "kv_slots",
                value: 0,
                max: 256,
            },
        ),
        (
            Assign {
                runtime: StageRuntime {
                    max_batch: 4097,
                    ..a.runtime
                },
                ..a.clone()
            },
            FrameError::BadRuntime {
                field: "max_batch",
                value: 4097,
                max: 4096,
            },
        ),
    ];
    for (bad, expected) in cases {
        assert_rejects(Message::Assign(bad), expected);
    }
    let mut corrupt = a.clone();
    corrupt.vocab[0] = b'X';
    assert!(matches!(
        checked(&Message::Assign(corrupt)),
        Err(FrameError::Vocab(VocabError::BadMagic { .. }))
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
            reply: Reply::TopK {
                k: VOCAB + 1,
                normalised: false,
            },
            ..f.clone()
        }),
        FrameError::BadTopK {
            found: VOCAB + 1,
            max: VOCAB,
        },
    );
    assert_rejects(
        Message::Forward(Forward {
            reply: Reply::TopK {
                k: 0,
                normalised: true,
            },
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
    let top_normed = |ids: Vec<u32>, logits: Vec<f32>, log_norm: Option<f32>| {
        Message::Result(result(
            0,
            0,
            StageOutput::TopK {
                ids,
                logits,
                log_norm,
            },
        ))
    };
    let top = |ids: Vec<u32>, logits: Vec<f32>| top_normed(ids, logits, None);
    // A log-sum-exp below the largest logit would make a log-probability positive.
    assert_rejects(
        top_normed(vec![1, 2], vec![1.0, 0.5], Some(0.75)),
        FrameError::BadLogNorm {
            log_norm: 0.75,
            largest: 1.0,
        },
    );
    assert_rejects(
        top_normed(vec![1, 2], vec![1.0, 0.5], Some(f32::INFINITY)),
        FrameError::BadLogNorm {
            log_norm: f32::INFINITY,
            largest: 1.0,
        },
    );
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
