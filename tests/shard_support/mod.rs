//! Fixtures shared by the frame and validation tests: a tiny model shape, one message of
//! every kind, and a donor's validator.
#![allow(dead_code)]

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use webshard::shard::frame::{
    Assign, DonorInfo, ErrorCode, ErrorReport, Forward, Heartbeat, Hello, Leave, Ready, Reply,
    StageInput, StageOutput, StageResult, StageRuntime, TokenEvent, PROTOCOL_VERSION,
};
use webshard::shard::{
    encode_frame, Activations, AllowedTokens, ByteVocab, Encoding, FrameError, FrameLimits,
    FrameValidator, InputKind, Kind, Message, ModelShape, PeerId,
};

pub const D_MODEL: u32 = 8;
pub const VOCAB: u32 = 5;
pub const SHAPE: ModelShape = ModelShape {
    vocab_size: VOCAB,
    d_model: D_MODEL,
};

pub fn vocab_blob() -> Vec<u8> {
    ByteVocab::from_pieces(["a", "b", "c", "d", ""], [4])
        .unwrap()
        .to_bytes()
}

pub fn values(n_tokens: u32, seed: u64) -> Vec<f32> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..n_tokens * D_MODEL)
        .map(|_| rng.random_range(-8.0f32..8.0))
        .collect()
}

pub fn hidden(n_tokens: u32, encoding: Encoding) -> Activations {
    Activations::encode(&values(n_tokens, 7), D_MODEL, encoding).unwrap()
}

pub fn assign() -> Assign {
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
        runtime: StageRuntime {
            max_context: 2048,
            max_batch: 128,
            kv_slots: 4,
            hidden: Encoding::F16,
        },
    }
}

pub fn forward(seq: u64, start_pos: u32, n_tokens: u32) -> Forward {
    Forward {
        epoch: 3,
        request_id: 42,
        seq,
        stage_id: 1,
        start_pos,
        n_tokens,
        input: StageInput::Hidden(hidden(n_tokens, Encoding::F16)),
        reply: Reply::TopK {
            k: 3,
            normalised: true,
        },
        tap: false,
        trace: Vec::new(),
        allowed: None,
    }
}

pub fn result(seq: u64, start_pos: u32, output: StageOutput) -> StageResult {
    StageResult {
        epoch: 3,
        request_id: 42,
        seq,
        stage_id: 2,
        start_pos,
        n_tokens: 1,
        output,
        trace: Vec::new(),
    }
}

pub fn every_kind() -> Vec<Message> {
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
            allowed: Some(AllowedTokens::Bits(vec![0b1_0110])),
            ..forward(0, 0, 4)
        }),
        Message::Forward(Forward {
            input: StageInput::Tokens(vec![0, 4, 2]),
            reply: Reply::Greedy,
            allowed: Some(AllowedTokens::Runs(vec![[0, 2], [3, 5]])),
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
                log_norm: Some(12.75),
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

pub fn checked(message: &Message) -> Result<(), FrameError> {
    message.check(&FrameLimits::default(), Some(SHAPE))
}

pub fn valid_frame() -> Vec<u8> {
    encode_frame(&Message::Forward(forward(0, 0, 2))).unwrap()
}

/// Rewrites the header's body length after editing the body.
pub fn with_body(kind: Kind, body: &[u8]) -> Vec<u8> {
    let mut frame = vec![b'W', b'S', PROTOCOL_VERSION, kind as u8];
    frame.extend_from_slice(&(body.len() as u32).to_le_bytes());
    frame.extend_from_slice(body);
    frame
}

pub fn donor_validator() -> FrameValidator {
    let mut validator = FrameValidator::new(FrameLimits::default());
    validator.set_model(SHAPE);
    validator.begin_epoch(3);
    validator.expect_stage(1, InputKind::Hidden);
    validator
}

pub fn accept(validator: &mut FrameValidator, forward: Forward) -> Result<(), FrameError> {
    let frame = encode_frame(&Message::Forward(forward)).unwrap();
    validator.decode(&frame).map(|_| ())
}
