//! A donor's step path timed in one process (`runner bench --stage-steps`), so that a stage's
//! cost can be split without a fleet: the `StageHost` a donor builds from its Assign, Forward
//! frames as the stage before would send them (f16 activations, or token ids into the first
//! stage), each request's KV slot selected before its step, decode steps of one token. Per
//! step the host's time splits into slot selection, decoding the input, recording, submitting,
//! waiting for the GPU and encoding the output, with the bind groups and read-back buffers a
//! step creates; a second pass runs the same steps on the donor's worker thread, as
//! `on_forward` does, to show what the hand-off adds.

use std::ops::Range;
use std::sync::Arc;

use web_time::Instant;

use super::super::activations::{Activations, Encoding};
use super::super::frame::{Assign, Forward, Reply, StageInput as WireInput, StageRuntime};
use super::super::transport::PeerId;
use super::host::{HostInput, StageHost, StepOutput};
use super::offload::StepRunner;
use super::step::encode_hidden;
use super::RoleError;
use crate::gguf::open_source;
use crate::gpu::{CounterSnapshot, Gpu};
use crate::model::OpenModel;

/// What to time.
#[derive(Debug, Clone)]
pub struct StageBench {
    pub model_url: String,
    pub layers: Range<u32>,
    /// Requests in flight, taking turns step by step, each in its own KV slot.
    pub requests: u32,
    /// Timed steps (after a warm-up of two per request).
    pub steps: u32,
}

/// Mean microseconds (and counts) per step.
#[derive(Debug, Clone, Default)]
pub struct StageStepTimes {
    pub select_us: f64,
    /// The Forward's activations from f16 to f32.
    pub decode_us: f64,
    /// In the stage's forward, neither submitting nor waiting: recording the dispatches.
    pub record_us: f64,
    pub submit_us: f64,
    /// Blocked until the GPU finished (the GPU's work and the read-back's latency).
    pub wait_us: f64,
    /// The output residual stream from f32 to f16.
    pub encode_us: f64,
    /// A whole step on the donor's worker thread, from hand-off to answer (no encode).
    pub offloaded_us: f64,
    pub bind_groups: f64,
    pub read_buffers: f64,
    pub submits: f64,
}

impl StageStepTimes {
    /// Host time of a step run in place: every phase.
    pub fn step_us(&self) -> f64 {
        self.select_us
            + self.decode_us
            + self.record_us
            + self.submit_us
            + self.wait_us
            + self.encode_us
    }
}

/// Loads the stage on `gpu` as a donor would and times `bench.steps` decode steps.
pub async fn time_stage_steps(
    gpu: Arc<Gpu>,
    bench: &StageBench,
) -> Result<StageStepTimes, RoleError> {
    let requests = bench.requests.max(1);
    let warm_up = 2 * requests;
    let source = open_source(&bench.model_url)
        .await
        .map_err(|e| RoleError::Source(e.to_string()))?;
    let model = OpenModel::read(source.as_ref()).await?;
    // Both passes' positions, each request's own.
    let positions = (warm_up + 2 * bench.steps).div_ceil(requests) + 1;
    let assign = bench_assign(bench, &model, requests, positions);
    let mut host = StageHost::load(gpu.clone(), &assign).await?;
    let mut steps = Steps::new(&assign, &model, requests);
    for _ in 0..warm_up {
        let forward = steps.next();
        host.select_slot(forward.request_id, forward.start_pos)
            .map_err(RoleError::Invalid)?;
        host.run(&forward).await?;
    }
    let mut times = StageStepTimes::default();
    let before = gpu.counters.snapshot();
    for _ in 0..bench.steps {
        time_in_place(&mut host, &steps.next(), &assign, &mut times).await?;
    }
    let counts = gpu.counters.snapshot() - before;
    times.offloaded_us = time_offloaded(host, &mut steps, bench.steps).await?;
    Ok(per_step(times, counts, bench.steps))
}

fn bench_assign(bench: &StageBench, model: &OpenModel, requests: u32, positions: u32) -> Assign {
    let cfg = &model.cfg;
    Assign {
        epoch: 1,
        stage_id: 0,
        n_stages: 1,
        model_url: bench.model_url.clone(),
        layer_start: bench.layers.start,
        layer_end: bench.layers.end,
        n_layers: cfg.n_layers,
        embedding: bench.layers.start == 0,
        head: bench.layers.end == cfg.n_layers,
        d_model: cfg.d_model,
        upstream: PeerId(0),
        downstream: PeerId(0),
        vocab: Vec::new(),
        runtime: StageRuntime {
            max_context: positions,
            max_batch: 64,
            kv_slots: requests,
            hidden: Encoding::F16,
        },
    }
}

/// One step with each phase timed, added into `times` (microseconds, summed).
async fn time_in_place(
    host: &mut StageHost,
    forward: &Forward,
    assign: &Assign,
    times: &mut StageStepTimes,
) -> Result<(), RoleError> {
    let gpu = Arc::clone(&host.stage.gpu);
    let started = Instant::now();
    host.select_slot(forward.request_id, forward.start_pos)
        .map_err(RoleError::Invalid)?;
    let selected = Instant::now();
    let input = HostInput::decode(&forward.input);
    let decoded = Instant::now();
    let before = gpu.counters.snapshot();
    let output = host.run_input(forward, &input).await?;
    let computed = Instant::now();
    let counts = gpu.counters.snapshot() - before;
    if let StepOutput::Hidden(values) = &output {
        // A non-finite activation (random inputs) is an error the donor reports; timed alike.
        let _ = encode_hidden(values, assign);
    }
    let us = |from: Instant, to: Instant| (to - from).as_secs_f64() * 1e6;
    let (wait_us, submit_us) = (counts.wait_ns as f64 / 1e3, counts.submit_ns as f64 / 1e3);
    times.select_us += us(started, selected);
    times.decode_us += us(selected, decoded);
    times.record_us += us(decoded, computed) - wait_us - submit_us;
    times.submit_us += submit_us;
    times.wait_us += wait_us;
    times.encode_us += us(computed, Instant::now());
    Ok(())
}

/// Mean microseconds of a step run on the donor's worker thread (`offload::StepRunner`).
async fn time_offloaded(
    mut host: StageHost,
    steps: &mut Steps,
    count: u32,
) -> Result<f64, RoleError> {
    let mut runner = StepRunner::default();
    let started = Instant::now();
    for _ in 0..count {
        let forward = steps.next();
        host.select_slot(forward.request_id, forward.start_pos)
            .map_err(RoleError::Invalid)?;
        let (back, output) = runner
            .start(host, forward)
            .await
            .ok_or_else(|| RoleError::Invalid("the step panicked".into()))?;
        output?;
        host = back;
    }
    Ok(started.elapsed().as_secs_f64() * 1e6 / f64::from(count.max(1)))
}

fn per_step(times: StageStepTimes, counts: CounterSnapshot, steps: u32) -> StageStepTimes {
    let n = f64::from(steps.max(1));
    StageStepTimes {
        select_us: times.select_us / n,
        decode_us: times.decode_us / n,
        record_us: times.record_us / n,
        submit_us: times.submit_us / n,
        wait_us: times.wait_us / n,
        encode_us: times.encode_us / n,
        offloaded_us: times.offloaded_us,
        bind_groups: counts.bind_groups as f64 / n,
        read_buffers: counts.read_buffers as f64 / n,
        submits: counts.submits as f64 / n,
    }
}

/// The Forward frames of requests taking turns, one token each, positions counting up.
struct Steps {
    requests: u32,
    taken: u32,
    embedding: bool,
    vocab: u32,
    /// The activations every Forward into a later stage carries (residual-stream sized).
    hidden: Activations,
}

impl Steps {
    fn new(assign: &Assign, model: &OpenModel, requests: u32) -> Steps {
        let d_model = assign.d_model;
        let values: Vec<f32> = (0..d_model)
            .map(|i| ((i.wrapping_mul(2_654_435_761) >> 7) % 2001) as f32 / 1000.0 - 1.0)
            .collect();
        let hidden = Activations::encode(&values, d_model, Encoding::F16)
            .expect("values in [-1, 1] encode as f16");
        Steps {
            requests,
            taken: 0,
            embedding: assign.embedding,
            vocab: model.cfg.vocab,
            hidden,
        }
    }

    fn next(&mut self) -> Forward {
        let (request, position) = (self.taken % self.requests, self.taken / self.requests);
        self.taken += 1;
        let input = match self.embedding {
            true => WireInput::Tokens(vec![(position * 31 + request) % self.vocab]),
            false => WireInput::Hidden(self.hidden.clone()),
        };
        Forward {
            epoch: 1,
            request_id: u64::from(request),
            seq: u64::from(position),
            stage_id: 0,
            start_pos: position,
            n_tokens: 1,
            input,
            reply: Reply::Greedy,
            tap: false,
            trace: Vec::new(),
            allowed: None,
        }
    }
}
