//! Checking incoming frames: every field against bounds and the model's shape
//! (`Message::check`), then against what the receiver expects next (`FrameValidator`).

use std::collections::HashMap;

use super::activations::Activations;
use super::allowed::{set_bits, AllowedTokens};
use super::frame::{
    decode_frame, Assign, DonorInfo, Forward, FrameError, HopTrace, Kind, Message, Reply,
    StageInput, StageOutput, StageResult, StageRuntime,
};
use super::plan::MAX_DONORS;
use super::vocab::ByteVocab;

/// Bounds on message fields, beyond the frame size limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameLimits {
    /// Longest string field (tokens, names, URLs, messages).
    pub max_text_bytes: usize,
    /// Most positions in one Forward or Result (prefill is sent in chunks of at most this).
    pub max_tokens: u32,
    pub max_top_k: u32,
    pub max_d_model: u32,
    /// Most requests tracked at once by a `FrameValidator` (and KV slots an Assign may ask).
    pub max_requests: usize,
    /// Longest context an Assign may ask a donor to cache.
    pub max_context: u32,
}

impl Default for FrameLimits {
    fn default() -> FrameLimits {
        FrameLimits {
            max_text_bytes: 4096,
            max_tokens: 4096,
            max_top_k: 1024,
            max_d_model: 65536,
            max_requests: 256,
            max_context: 1 << 20,
        }
    }
}

/// The model facts frames are checked against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModelShape {
    pub vocab_size: u32,
    pub d_model: u32,
}

/// What a stage takes in: the first stage embeds ids, the others continue the residual stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InputKind {
    Tokens,
    Hidden,
}

impl InputKind {
    fn of(input: &StageInput) -> InputKind {
        match input {
            StageInput::Tokens(_) => InputKind::Tokens,
            StageInput::Hidden(_) => InputKind::Hidden,
        }
    }

    fn name(self) -> &'static str {
        match self {
            InputKind::Tokens => "token ids",
            InputKind::Hidden => "activations",
        }
    }
}

impl Message {
    /// Checks every field against `limits`, and ids and activation shapes against `model`
    /// when it is known.
    pub fn check(&self, limits: &FrameLimits, model: Option<ModelShape>) -> Result<(), FrameError> {
        match self {
            Message::Hello(hello) => {
                check_text("fleet_token", &hello.fleet_token, limits, false)?;
                check_donor(&hello.donor, limits)
            }
            Message::Assign(assign) => check_assign(assign, limits),
            Message::Ready(_) | Message::Heartbeat(_) => Ok(()),
            Message::Forward(forward) => check_forward(forward, limits, model),
            Message::Result(result) => check_result(result, limits, model),
            Message::Token(token) => check_id("token", 0, token.id, model),
            Message::Leave(leave) => check_text("reason", &leave.reason, limits, true),
            Message::Error(report) => check_text("message", &report.message, limits, true),
        }
    }
}

fn check_text(
    field: &'static str,
    text: &str,
    limits: &FrameLimits,
    may_be_empty: bool,
) -> Result<(), FrameError> {
    if text.len() > limits.max_text_bytes {
        return Err(FrameError::TextTooLong {
            field,
            len: text.len(),
            max: limits.max_text_bytes,
        });
    }
    if text.is_empty() && !may_be_empty {
        return Err(FrameError::Empty { field });
    }
    Ok(())
}

fn check_donor(donor: &DonorInfo, limits: &FrameLimits) -> Result<(), FrameError> {
    check_text("adapter", &donor.adapter, limits, true)?;
    if !(donor.ms_per_layer.is_finite() && donor.ms_per_layer > 0.0) {
        return Err(FrameError::BadProbe {
            value: donor.ms_per_layer,
        });
    }
    Ok(())
}

fn check_assign(assign: &Assign, limits: &FrameLimits) -> Result<(), FrameError> {
    check_text("model_url", &assign.model_url, limits, false)?;
    if assign.stage_id >= assign.n_stages {
        return Err(FrameError::BadStage {
            stage_id: assign.stage_id,
            n_stages: assign.n_stages,
        });
    }
    let (start, end) = (assign.layer_start, assign.layer_end);
    if start >= end || end > assign.n_layers {
        return Err(FrameError::BadLayers {
            start,
            end,
            n_layers: assign.n_layers,
        });
    }
    let first = assign.stage_id == 0;
    let last = assign.stage_id + 1 == assign.n_stages;
    let consistent = assign.embedding == first
        && assign.head == last
        && (start == 0) == first
        && (end == assign.n_layers) == last;
    if !consistent {
        return Err(FrameError::StageEnds {
            stage_id: assign.stage_id,
            n_stages: assign.n_stages,
            start,
            end,
            embedding: assign.embedding,
            head: assign.head,
        });
    }
    check_d_model(assign.d_model, limits)?;
    check_runtime(&assign.runtime, limits)?;
    ByteVocab::from_bytes(&assign.vocab)?;
    Ok(())
}

/// Bounds what an Assign may ask a donor to allocate; whether it fits the donor's memory is
/// the donor's own check when it loads.
fn check_runtime(runtime: &StageRuntime, limits: &FrameLimits) -> Result<(), FrameError> {
    let bounds = [
        ("max_context", runtime.max_context, limits.max_context),
        ("max_batch", runtime.max_batch, limits.max_tokens),
        ("kv_slots", runtime.kv_slots, limits.max_requests as u32),
    ];
    for (field, value, max) in bounds {
        if value == 0 || value > max {
            return Err(FrameError::BadRuntime { field, value, max });
        }
    }
    Ok(())
}

fn check_d_model(d_model: u32, limits: &FrameLimits) -> Result<(), FrameError> {
    if d_model == 0 || d_model > limits.max_d_model {
        return Err(FrameError::BadDModel {
            found: d_model,
            max: limits.max_d_model,
        });
    }
    Ok(())
}

fn check_span(start_pos: u32, n_tokens: u32, limits: &FrameLimits) -> Result<(), FrameError> {
    if n_tokens == 0 || n_tokens > limits.max_tokens {
        return Err(FrameError::TokenCount {
            found: n_tokens,
            max: limits.max_tokens,
        });
    }
    if start_pos.checked_add(n_tokens).is_none() {
        return Err(FrameError::PositionOverflow {
            start_pos,
            n_tokens,
        });
    }
    Ok(())
}

fn check_forward(
    forward: &Forward,
    limits: &FrameLimits,
    model: Option<ModelShape>,
) -> Result<(), FrameError> {
    check_span(forward.start_pos, forward.n_tokens, limits)?;
    check_trace(&forward.trace)?;
    match &forward.input {
        StageInput::Tokens(ids) => {
            check_count("input ids", forward.n_tokens as usize, ids.len())?;
            check_ids("input ids", ids, model)?;
        }
        StageInput::Hidden(hidden) => {
            check_hidden("input activations", hidden, forward.n_tokens, limits, model)?
        }
    }
    match forward.reply {
        Reply::TopK { k, .. } => check_top_k(k, limits, model)?,
        Reply::Greedy => {}
        Reply::Hidden { .. } if forward.allowed.is_some() => {
            return Err(FrameError::Unexpected {
                kind: Kind::Forward,
                reason: "allowed tokens with a Hidden reply",
            })
        }
        Reply::Hidden { .. } => {}
    }
    forward
        .allowed
        .as_ref()
        .map_or(Ok(()), |allowed| check_allowed(allowed, model))
}

/// An allowed-token set covers exactly the model's vocabulary and allows at least one id.
fn check_allowed(allowed: &AllowedTokens, model: Option<ModelShape>) -> Result<(), FrameError> {
    let vocab_size = model.map(|m| m.vocab_size);
    match allowed {
        AllowedTokens::Bits(bits) => {
            if bits.iter().all(|&byte| byte == 0) {
                return Err(FrameError::Empty {
                    field: "allowed tokens",
                });
            }
            if let Some(vocab_size) = vocab_size {
                let expected = vocab_size.div_ceil(8) as usize;
                if bits.len() != expected {
                    return Err(FrameError::MaskSize {
                        expected,
                        found: bits.len(),
                        vocab_size,
                    });
                }
                if let Some(id) = set_bits(&bits[bits.len() - 1..]).last() {
                    let id = id + 8 * (bits.len() as u32 - 1);
                    check_id("allowed tokens", id as usize, id, model)?;
                }
            }
        }
        AllowedTokens::Runs(runs) => check_runs(runs, vocab_size)?,
    }
    Ok(())
}

/// Runs ascend, are non-empty, apart from each other, and end within the vocabulary.
fn check_runs(runs: &[[u32; 2]], vocab_size: Option<u32>) -> Result<(), FrameError> {
    if runs.is_empty() {
        return Err(FrameError::Empty {
            field: "allowed tokens",
        });
    }
    if let Some(vocab_size) = vocab_size {
        // Apart and non-empty runs: at most one in two ids starts one.
        if runs.len() > vocab_size.div_ceil(2) as usize {
            return Err(FrameError::TooManyRuns {
                found: runs.len(),
                vocab_size,
            });
        }
    }
    let mut previous_end = None;
    for (index, &[start, end]) in runs.iter().enumerate() {
        let ordered = previous_end.is_none_or(|previous| start > previous);
        let within = vocab_size.is_none_or(|vocab| end <= vocab);
        if start >= end || !ordered || !within {
            return Err(FrameError::BadRun { index, start, end });
        }
        previous_end = Some(end);
    }
    Ok(())
}

fn check_result(
    result: &StageResult,
    limits: &FrameLimits,
    model: Option<ModelShape>,
) -> Result<(), FrameError> {
    check_span(result.start_pos, result.n_tokens, limits)?;
    check_trace(&result.trace)?;
    match &result.output {
        StageOutput::Hidden(hidden) => {
            check_hidden("output activations", hidden, result.n_tokens, limits, model)
        }
        StageOutput::TopK {
            ids,
            logits,
            log_norm,
        } => {
            check_top_k(ids.len().min(u32::MAX as usize) as u32, limits, model)?;
            check_count("top-k logits", ids.len(), logits.len())?;
            check_ids("top-k ids", ids, model)?;
            if let Some(index) = logits.iter().position(|v| !v.is_finite()) {
                return Err(FrameError::NonFinite {
                    field: "top-k logits",
                    index,
                });
            }
            log_norm.map_or(Ok(()), |norm| check_log_norm(norm, logits))
        }
        StageOutput::Sampled(id) => check_id("sampled id", 0, *id, model),
    }
}

/// A log-sum-exp is finite and at least every logit it sums (else a log-probability > 0).
fn check_log_norm(log_norm: f32, logits: &[f32]) -> Result<(), FrameError> {
    let largest = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if !log_norm.is_finite() || log_norm < largest {
        return Err(FrameError::BadLogNorm { log_norm, largest });
    }
    Ok(())
}

/// A trace has at most one entry per stage, and stages are bounded by the planner.
fn check_trace(trace: &[HopTrace]) -> Result<(), FrameError> {
    if trace.len() > MAX_DONORS {
        return Err(FrameError::Count {
            field: "trace",
            expected: MAX_DONORS,
            found: trace.len(),
        });
    }
    Ok(())
}

fn check_count(field: &'static str, expected: usize, found: usize) -> Result<(), FrameError> {
    if expected != found {
        return Err(FrameError::Count {
            field,
            expected,
            found,
        });
    }
    Ok(())
}

fn check_top_k(k: u32, limits: &FrameLimits, model: Option<ModelShape>) -> Result<(), FrameError> {
    let max = model.map_or(limits.max_top_k, |m| m.vocab_size.min(limits.max_top_k));
    if k == 0 || k > max {
        return Err(FrameError::BadTopK { found: k, max });
    }
    Ok(())
}

fn check_ids(
    field: &'static str,
    ids: &[u32],
    model: Option<ModelShape>,
) -> Result<(), FrameError> {
    ids.iter()
        .enumerate()
        .try_for_each(|(index, &id)| check_id(field, index, id, model))
}

fn check_id(
    field: &'static str,
    index: usize,
    id: u32,
    model: Option<ModelShape>,
) -> Result<(), FrameError> {
    match model {
        Some(shape) if id >= shape.vocab_size => Err(FrameError::IdOutOfRange {
            field,
            index,
            id,
            vocab_size: shape.vocab_size,
        }),
        _ => Ok(()),
    }
}

fn check_hidden(
    field: &'static str,
    hidden: &Activations,
    n_tokens: u32,
    limits: &FrameLimits,
    model: Option<ModelShape>,
) -> Result<(), FrameError> {
    check_d_model(hidden.d_model, limits)?;
    if let Some(shape) = model {
        if hidden.d_model != shape.d_model {
            return Err(FrameError::DModelMismatch {
                field,
                expected: shape.d_model,
                found: hidden.d_model,
            });
        }
    }
    hidden.check(n_tokens, field)
}

/// Where a request's stream stands on one link.
#[derive(Clone, Copy, Debug)]
struct Cursor {
    next_seq: u64,
    next_pos: u32,
}

/// Checks incoming frames against the model, the current plan epoch, this receiver's stage,
/// and per-request sequence numbers and positions. Accepting a frame advances the cursors.
#[derive(Debug)]
pub struct FrameValidator {
    limits: FrameLimits,
    model: Option<ModelShape>,
    epoch: Option<u32>,
    stage: Option<(u16, InputKind)>,
    /// Keyed by (kind, request id, stage id).
    cursors: HashMap<(Kind, u64, u16), Cursor>,
}

impl FrameValidator {
    pub fn new(limits: FrameLimits) -> FrameValidator {
        FrameValidator {
            limits,
            model: None,
            epoch: None,
            stage: None,
            cursors: HashMap::new(),
        }
    }

    pub fn limits(&self) -> &FrameLimits {
        &self.limits
    }

    /// From now on, ids and activation shapes are checked against `model`.
    pub fn set_model(&mut self, model: ModelShape) {
        self.model = Some(model);
    }

    /// Starts a plan epoch: frames of other epochs are refused and every request's sequence
    /// starts again from 0.
    pub fn begin_epoch(&mut self, epoch: u32) {
        self.epoch = Some(epoch);
        self.cursors.clear();
    }

    /// Makes this a donor's validator: Forward frames must be for `stage_id` and carry `input`.
    pub fn expect_stage(&mut self, stage_id: u16, input: InputKind) {
        self.stage = Some((stage_id, input));
    }

    /// Drops a finished request's cursors.
    pub fn forget_request(&mut self, request_id: u64) {
        self.cursors.retain(|&(_, id, _), _| id != request_id);
    }

    /// Decodes a frame and checks it.
    pub fn decode(&mut self, frame: &[u8]) -> Result<Message, FrameError> {
        let message = decode_frame(frame)?;
        self.check(&message)?;
        Ok(message)
    }

    /// Checks a decoded message; on success its request's cursor moves past it.
    pub fn check(&mut self, message: &Message) -> Result<(), FrameError> {
        message.check(&self.limits, self.model)?;
        match message {
            Message::Assign(assign) => self.check_not_stale(Kind::Assign, assign.epoch),
            Message::Ready(ready) => self.check_epoch(Kind::Ready, ready.epoch),
            Message::Forward(forward) => self.check_forward(forward),
            Message::Result(result) => {
                self.check_epoch(Kind::Result, result.epoch)?;
                let key = (Kind::Result, result.request_id, result.stage_id);
                self.advance(key, result.seq, result.start_pos, result.n_tokens)
            }
            _ => Ok(()),
        }
    }

    fn check_forward(&mut self, forward: &Forward) -> Result<(), FrameError> {
        let Some((stage_id, input)) = self.stage else {
            return Err(FrameError::Unexpected {
                kind: Kind::Forward,
                reason: "no stage is assigned to this peer",
            });
        };
        self.check_epoch(Kind::Forward, forward.epoch)?;
        if forward.stage_id != stage_id {
            return Err(FrameError::WrongStage {
                kind: Kind::Forward,
                expected: stage_id,
                found: forward.stage_id,
            });
        }
        let found = InputKind::of(&forward.input);
        if found != input {
            return Err(FrameError::WrongInput {
                kind: Kind::Forward,
                expected: input.name(),
                found: found.name(),
            });
        }
        let key = (Kind::Forward, forward.request_id, forward.stage_id);
        self.advance(key, forward.seq, forward.start_pos, forward.n_tokens)
    }

    fn check_epoch(&self, kind: Kind, found: u32) -> Result<(), FrameError> {
        match self.epoch {
            None => Err(FrameError::Unexpected {
                kind,
                reason: "no plan epoch has begun",
            }),
            Some(expected) if expected != found => Err(FrameError::StaleEpoch {
                kind,
                expected,
                found,
            }),
            Some(_) => Ok(()),
        }
    }

    fn check_not_stale(&self, kind: Kind, found: u32) -> Result<(), FrameError> {
        match self.epoch {
            Some(expected) if found < expected => Err(FrameError::StaleEpoch {
                kind,
                expected,
                found,
            }),
            _ => Ok(()),
        }
    }

    /// The first frame of a request in an epoch has sequence 0 and may start anywhere (a
    /// stage that kept its cache continues where it was); later ones follow on exactly.
    fn advance(
        &mut self,
        key: (Kind, u64, u16),
        seq: u64,
        start_pos: u32,
        n_tokens: u32,
    ) -> Result<(), FrameError> {
        let (kind, request_id, _) = key;
        let expected = self.cursors.get(&key).copied();
        if expected.is_none() && self.cursors.len() >= self.limits.max_requests {
            return Err(FrameError::TooManyRequests {
                max: self.limits.max_requests,
            });
        }
        let expected_seq = expected.map_or(0, |c| c.next_seq);
        if seq != expected_seq {
            return Err(FrameError::Sequence {
                kind,
                request_id,
                expected: expected_seq,
                found: seq,
            });
        }
        if let Some(cursor) = expected {
            if start_pos != cursor.next_pos {
                return Err(FrameError::Position {
                    kind,
                    request_id,
                    expected: cursor.next_pos,
                    found: start_pos,
                });
            }
        }
        // check_span has ruled out overflow.
        let cursor = Cursor {
            next_seq: seq + 1,
            next_pos: start_pos + n_tokens,
        };
        self.cursors.insert(key, cursor);
        Ok(())
    }
}
