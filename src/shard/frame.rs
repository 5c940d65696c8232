//! Protocol frames: an 8-byte header (magic, version, kind, body length) and a postcard body.
//!
//! Layout and the reasons for postcard are in `docs/protocol.md`. Frames arrive from other
//! machines, so `decode_frame` checks the envelope and `Message::check` every field against
//! `FrameLimits` (and the model's shape when known); `FrameValidator` adds what the receiver
//! expects next (epoch, stage, sequence, position).

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::activations::{Activations, Encoding};
use super::allowed::AllowedTokens;
use super::transport::PeerId;
use super::vocab::VocabError;

/// First bytes of every frame.
pub const FRAME_MAGIC: [u8; 2] = *b"WS";
/// The protocol version this build speaks; a frame of another version is refused.
pub const PROTOCOL_VERSION: u8 = 2;
/// magic (2), version (1), kind (1), body length (u32 LE).
pub const FRAME_HEADER_LEN: usize = 8;
/// Largest frame, header included: a 2048-token prefill chunk of a d_model = 8192 model in f16
/// is 32 MiB, so 64 MiB leaves room without letting a peer make us hold gigabytes.
pub const MAX_FRAME_BYTES: usize = 64 << 20;

/// The message kinds, as the header's kind byte.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Kind {
    Hello = 1,
    Assign = 2,
    Ready = 3,
    Forward = 4,
    Result = 5,
    Token = 6,
    Heartbeat = 7,
    Leave = 8,
    Error = 9,
}

impl Kind {
    fn from_byte(byte: u8) -> Option<Kind> {
        const ALL: [Kind; 9] = [
            Kind::Hello,
            Kind::Assign,
            Kind::Ready,
            Kind::Forward,
            Kind::Result,
            Kind::Token,
            Kind::Heartbeat,
            Kind::Leave,
            Kind::Error,
        ];
        ALL.into_iter().find(|kind| *kind as u8 == byte)
    }
}

/// A donor asks to join the fleet.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Hello {
    pub fleet_token: String,
    pub donor: DonorInfo,
}

/// What a donor brings: measured at join.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct DonorInfo {
    /// Adapter name and backend, for display.
    pub adapter: String,
    /// GPU memory the donor can give to weights, KV cache and scratch.
    pub usable_gpu_bytes: u64,
    /// Milliseconds one average layer takes for one decode token (the join probe).
    pub ms_per_layer: f32,
}

/// The coordinator gives a donor its stage of a plan.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Assign {
    /// Plan generation: frames of older epochs are refused after a re-plan.
    pub epoch: u32,
    pub stage_id: u16,
    pub n_stages: u16,
    pub model_url: String,
    /// Layers `layer_start..layer_end` of `n_layers`.
    pub layer_start: u32,
    pub layer_end: u32,
    pub n_layers: u32,
    /// The first stage also embeds token ids.
    pub embedding: bool,
    /// The last stage also applies the final norm and the output head.
    pub head: bool,
    pub d_model: u32,
    /// Where this stage's input comes from and its output goes (the coordinator at the ends).
    pub upstream: PeerId,
    pub downstream: PeerId,
    /// `ByteVocab::to_bytes`, so the donor can show text.
    #[serde(with = "serde_bytes")]
    pub vocab: Vec<u8>,
    /// How the coordinator will drive the stage, so the donor sizes its caches to match.
    pub runtime: StageRuntime,
}

/// Sizes and encodings the coordinator commits to for one epoch.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub struct StageRuntime {
    /// Longest sequence (prompt and generation) any request reaches.
    pub max_context: u32,
    /// Most positions in one Forward (prefill chunk size).
    pub max_batch: u32,
    /// Requests in flight at once: each gets its own KV cache on every stage.
    pub kv_slots: u32,
    /// Encoding of the residual stream sent from stage to stage.
    pub hidden: Encoding,
}

/// A donor has loaded its stage.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Ready {
    pub epoch: u32,
    pub stage_id: u16,
    /// Weight bytes this donor fetched for its layers.
    pub bytes_downloaded: u64,
    pub load_ms: u32,
}

/// Work for one stage: a run of positions of one request.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Forward {
    pub epoch: u32,
    pub request_id: u64,
    /// Counts this request's Forward frames into `stage_id` within the epoch, from 0.
    pub seq: u64,
    /// The stage that is to process this frame.
    pub stage_id: u16,
    pub start_pos: u32,
    pub n_tokens: u32,
    pub input: StageInput,
    /// What the last stage should send back.
    pub reply: Reply,
    /// Also send this stage's output activations to the coordinator (a `Result` with
    /// `StageOutput::Hidden`), so it can check them against a reference (`--verify`).
    pub tap: bool,
    /// One entry per stage this step has passed through so far, in chain order.
    pub trace: Vec<HopTrace>,
    /// Under a constraint, the only tokens the last stage may reply with (its greedy id or
    /// top-k are taken among them); carried unchanged through the stages before it.
    pub allowed: Option<AllowedTokens>,
}

/// What one stage spent on a step, carried along the chain for per-hop reports.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HopTrace {
    /// Time in the stage's forward, microseconds.
    pub compute_us: u32,
    /// Bytes of the output the stage sent on (activations, top-k, or 4 for an id).
    pub payload_bytes: u32,
}

/// Token ids (into the first stage) or the residual stream (into any later stage).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub enum StageInput {
    Tokens(Vec<u32>),
    Hidden(Activations),
}

/// What the last stage returns for a Forward.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reply {
    /// The greedy (argmax) id of the last position.
    Greedy,
    /// The `k` highest logits of the last position, for sampling on the coordinator; with
    /// `normalised`, also the log-sum-exp over the vocabulary (a pass over every logit, so
    /// only for requests that want log-probabilities).
    TopK { k: u32, normalised: bool },
    /// The hidden state after the stage (spot checks compare these).
    Hidden { encoding: Encoding },
}

/// A stage's output sent back to the coordinator.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct StageResult {
    pub epoch: u32,
    pub request_id: u64,
    /// Counts this request's Result frames from `stage_id` within the epoch, from 0.
    pub seq: u64,
    /// The stage that produced it.
    pub stage_id: u16,
    pub start_pos: u32,
    pub n_tokens: u32,
    pub output: StageOutput,
    /// The step's trace through every stage up to and including the producing one.
    pub trace: Vec<HopTrace>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub enum StageOutput {
    Hidden(Activations),
    /// `ids[i]` has logit `logits[i]`, highest first. `log_norm`, when the Forward asked for it
    /// (`normalised`), is the log of the sum of every logit's exponential over the whole
    /// vocabulary (allowed or not), so that `logits[i] - log_norm` is `ids[i]`'s
    /// log-probability (the API's `logprobs`).
    TopK {
        ids: Vec<u32>,
        logits: Vec<f32>,
        log_norm: Option<f32>,
    },
    Sampled(u32),
}

/// A generated token, broadcast so donors can show the text.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct TokenEvent {
    pub request_id: u64,
    /// Index of this token among the request's generated tokens.
    pub index: u32,
    pub id: u32,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Heartbeat {
    pub nonce: u64,
    pub sent_ms: u64,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Leave {
    pub reason: String,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorCode {
    /// The fleet token was wrong.
    Refused,
    /// A frame failed validation.
    BadFrame,
    /// The stage could not be loaded (download, memory).
    LoadFailed,
    /// The stage failed while computing.
    Compute,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct ErrorReport {
    pub code: ErrorCode,
    pub request_id: Option<u64>,
    pub message: String,
}

/// Every protocol message.
#[derive(Clone, Debug, PartialEq)]
pub enum Message {
    Hello(Hello),
    Assign(Assign),
    Ready(Ready),
    Forward(Forward),
    Result(StageResult),
    Token(TokenEvent),
    Heartbeat(Heartbeat),
    Leave(Leave),
    Error(ErrorReport),
}

impl Message {
    pub fn kind(&self) -> Kind {
        match self {
            Message::Hello(_) => Kind::Hello,
            Message::Assign(_) => Kind::Assign,
            Message::Ready(_) => Kind::Ready,
            Message::Forward(_) => Kind::Forward,
            Message::Result(_) => Kind::Result,
            Message::Token(_) => Kind::Token,
            Message::Heartbeat(_) => Kind::Heartbeat,
            Message::Leave(_) => Kind::Leave,
            Message::Error(_) => Kind::Error,
        }
    }

    /// Roughly the body's size, so encoding allocates once.
    fn body_size_hint(&self) -> usize {
        let bulk = match self {
            Message::Assign(assign) => assign.vocab.len(),
            Message::Forward(forward) => {
                let input = match &forward.input {
                    StageInput::Tokens(ids) => 5 * ids.len(),
                    StageInput::Hidden(hidden) => hidden.data.len(),
                };
                input + forward.allowed.as_ref().map_or(0, AllowedTokens::size_hint)
            }
            Message::Result(result) => match &result.output {
                StageOutput::Hidden(hidden) => hidden.data.len(),
                StageOutput::TopK { ids, .. } => 9 * ids.len(),
                StageOutput::Sampled(_) => 0,
            },
            _ => 0,
        };
        bulk + 128
    }
}

/// Why a frame was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FrameError {
    #[error("frame of {len} bytes is over the limit of {max}")]
    TooLarge { len: usize, max: usize },
    #[error("frame of {len} bytes is shorter than its {FRAME_HEADER_LEN}-byte header")]
    Truncated { len: usize },
    #[error("bad frame magic {found:?}, expected {FRAME_MAGIC:?}")]
    BadMagic { found: [u8; 2] },
    #[error("protocol version {found} is not supported (this build speaks {PROTOCOL_VERSION})")]
    UnsupportedVersion { found: u8 },
    #[error("unknown message kind {kind}")]
    UnknownKind { kind: u8 },
    #[error("header declares a {declared}-byte body but {found} bytes follow")]
    BodyLength { declared: usize, found: usize },
    #[error("{kind:?} body does not decode: {reason}")]
    Body { kind: Kind, reason: String },
    #[error("{kind:?} body has {extra} bytes after its end")]
    TrailingBody { kind: Kind, extra: usize },
    #[error("{field} is {len} bytes, over the limit of {max}")]
    TextTooLong {
        field: &'static str,
        len: usize,
        max: usize,
    },
    #[error("{field} = {value} is out of range (1..={max})")]
    BadRuntime {
        field: &'static str,
        value: u32,
        max: u32,
    },
    #[error("{field} must not be empty")]
    Empty { field: &'static str },
    #[error("ms_per_layer {value} must be finite and positive")]
    BadProbe { value: f32 },
    #[error("layers {start}..{end} are not a non-empty range within {n_layers} layers")]
    BadLayers { start: u32, end: u32, n_layers: u32 },
    #[error("stage {stage_id} of {n_stages} stages is out of range")]
    BadStage { stage_id: u16, n_stages: u16 },
    #[error("stage {stage_id} of {n_stages} (layers {start}..{end}) has embedding={embedding}, head={head}: the first stage embeds, the last holds the head")]
    StageEnds {
        stage_id: u16,
        n_stages: u16,
        start: u32,
        end: u32,
        embedding: bool,
        head: bool,
    },
    #[error("d_model {found} is out of range (1..={max})")]
    BadDModel { found: u32, max: u32 },
    #[error("ByteVocab in Assign: {0}")]
    Vocab(#[from] VocabError),
    #[error("n_tokens {found} is out of range (1..={max})")]
    TokenCount { found: u32, max: u32 },
    #[error("positions {start_pos}+{n_tokens} overflow")]
    PositionOverflow { start_pos: u32, n_tokens: u32 },
    #[error("{field} has {found} entries, expected {expected}")]
    Count {
        field: &'static str,
        expected: usize,
        found: usize,
    },
    #[error("{field}[{index}] = {id} is outside the {vocab_size}-token vocabulary")]
    IdOutOfRange {
        field: &'static str,
        index: usize,
        id: u32,
        vocab_size: u32,
    },
    #[error("{field}: {n_tokens} tokens × d_model {d_model} in {encoding:?} needs {expected_bytes} bytes, found {found_bytes}")]
    ShapeMismatch {
        field: &'static str,
        n_tokens: u32,
        d_model: u32,
        encoding: Encoding,
        expected_bytes: u64,
        found_bytes: usize,
    },
    #[error("{values} activation values are not whole rows of d_model {d_model}")]
    RaggedActivations { values: usize, d_model: u32 },
    #[error("{field}: d_model {found} differs from the model's {expected}")]
    DModelMismatch {
        field: &'static str,
        expected: u32,
        found: u32,
    },
    #[error("{field}[{index}] is NaN or infinite")]
    NonFinite { field: &'static str, index: usize },
    #[error("activation {index} = {value} overflows f16; send f32 instead")]
    F16Overflow { index: usize, value: f32 },
    #[error("allowed tokens: a bitset of {found} bytes, but the {vocab_size}-token vocabulary needs {expected}")]
    MaskSize {
        expected: usize,
        found: usize,
        vocab_size: u32,
    },
    #[error("allowed tokens: run {index} ({start}..{end}) is empty, out of order, or not apart from the run before")]
    BadRun { index: usize, start: u32, end: u32 },
    #[error("allowed tokens: {found} runs, more than a {vocab_size}-token vocabulary can hold")]
    TooManyRuns { found: usize, vocab_size: u32 },
    #[error("top-k of {found} is out of range (1..={max})")]
    BadTopK { found: u32, max: u32 },
    #[error("top-k log-sum-exp {log_norm} is not finite or is below its largest logit {largest}")]
    BadLogNorm { log_norm: f32, largest: f32 },
    #[error("{kind:?} from epoch {found}, expected epoch {expected}")]
    StaleEpoch {
        kind: Kind,
        expected: u32,
        found: u32,
    },
    #[error("{kind:?} for stage {found}, expected stage {expected}")]
    WrongStage {
        kind: Kind,
        expected: u16,
        found: u16,
    },
    #[error("{kind:?} for request {request_id} has sequence {found}, expected {expected}")]
    Sequence {
        kind: Kind,
        request_id: u64,
        expected: u64,
        found: u64,
    },
    #[error("{kind:?} for request {request_id} starts at position {found}, expected {expected}")]
    Position {
        kind: Kind,
        request_id: u64,
        expected: u32,
        found: u32,
    },
    #[error("{kind:?} carries {found}, this stage expects {expected}")]
    WrongInput {
        kind: Kind,
        expected: &'static str,
        found: &'static str,
    },
    #[error("more than {max} requests in flight")]
    TooManyRequests { max: usize },
    #[error("{kind:?} is not expected here: {reason}")]
    Unexpected { kind: Kind, reason: &'static str },
    #[error("frame encoding failed: {0}")]
    Encode(String),
}

/// Writes a message as one frame.
pub fn encode_frame(message: &Message) -> Result<Vec<u8>, FrameError> {
    let mut frame = Vec::with_capacity(FRAME_HEADER_LEN + message.body_size_hint());
    frame.extend_from_slice(&FRAME_MAGIC);
    frame.push(PROTOCOL_VERSION);
    frame.push(message.kind() as u8);
    frame.extend_from_slice(&[0; 4]);
    // The body is serialized straight after the header: no copy of large activations.
    let mut frame = match message {
        Message::Hello(m) => append_body(m, frame),
        Message::Assign(m) => append_body(m, frame),
        Message::Ready(m) => append_body(m, frame),
        Message::Forward(m) => append_body(m, frame),
        Message::Result(m) => append_body(m, frame),
        Message::Token(m) => append_body(m, frame),
        Message::Heartbeat(m) => append_body(m, frame),
        Message::Leave(m) => append_body(m, frame),
        Message::Error(m) => append_body(m, frame),
    }?;
    if frame.len() > MAX_FRAME_BYTES {
        return Err(FrameError::TooLarge {
            len: frame.len(),
            max: MAX_FRAME_BYTES,
        });
    }
    let body_len = (frame.len() - FRAME_HEADER_LEN) as u32;
    frame[4..FRAME_HEADER_LEN].copy_from_slice(&body_len.to_le_bytes());
    Ok(frame)
}

fn append_body<T: Serialize>(value: &T, frame: Vec<u8>) -> Result<Vec<u8>, FrameError> {
    postcard::to_extend(value, frame).map_err(|err| FrameError::Encode(err.to_string()))
}

/// Reads one frame's envelope and body. Field values are not checked here: see
/// `Message::check` and `FrameValidator`.
pub fn decode_frame(frame: &[u8]) -> Result<Message, FrameError> {
    if frame.len() > MAX_FRAME_BYTES {
        return Err(FrameError::TooLarge {
            len: frame.len(),
            max: MAX_FRAME_BYTES,
        });
    }
    let Some((header, body)) = frame.split_first_chunk::<FRAME_HEADER_LEN>() else {
        return Err(FrameError::Truncated { len: frame.len() });
    };
    let magic = [header[0], header[1]];
    if magic != FRAME_MAGIC {
        return Err(FrameError::BadMagic { found: magic });
    }
    if header[2] != PROTOCOL_VERSION {
        return Err(FrameError::UnsupportedVersion { found: header[2] });
    }
    let kind = Kind::from_byte(header[3]).ok_or(FrameError::UnknownKind { kind: header[3] })?;
    let declared = u32::from_le_bytes([header[4], header[5], header[6], header[7]]) as usize;
    if declared != body.len() {
        return Err(FrameError::BodyLength {
            declared,
            found: body.len(),
        });
    }
    Ok(match kind {
        Kind::Hello => Message::Hello(from_body(kind, body)?),
        Kind::Assign => Message::Assign(from_body(kind, body)?),
        Kind::Ready => Message::Ready(from_body(kind, body)?),
        Kind::Forward => Message::Forward(from_body(kind, body)?),
        Kind::Result => Message::Result(from_body(kind, body)?),
        Kind::Token => Message::Token(from_body(kind, body)?),
        Kind::Heartbeat => Message::Heartbeat(from_body(kind, body)?),
        Kind::Leave => Message::Leave(from_body(kind, body)?),
        Kind::Error => Message::Error(from_body(kind, body)?),
    })
}

fn from_body<T: DeserializeOwned>(kind: Kind, body: &[u8]) -> Result<T, FrameError> {
    let (value, rest) = postcard::take_from_bytes(body).map_err(|err| FrameError::Body {
        kind,
        reason: err.to_string(),
    })?;
    if !rest.is_empty() {
        return Err(FrameError::TrailingBody {
            kind,
            extra: rest.len(),
        });
    }
    Ok(value)
}
