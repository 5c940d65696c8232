//! Counters and gauges for `GET /metrics`, in Prometheus' text exposition format.
//!
//! Written out by hand: a handful of atomics printed as `name{labels} value` lines needs no
//! registry, and a metrics crate would add a global recorder for a dozen lines of output.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use super::worker::{Finished, ModelHandle};

/// One model's numbers; the worker and the handlers update them.
#[derive(Debug, Default)]
pub struct ModelMetrics {
    pub requests: AtomicU64,
    pub prompt_tokens: AtomicU64,
    pub completion_tokens: AtomicU64,
    pub cached_tokens: AtomicU64,
    /// Jobs waiting in the queue.
    pub queued: AtomicU64,
    /// Sequences in the batch now (prefilling or decoding).
    pub running: AtomicU64,
    /// Tokens whose keys and values running sequences hold in the KV pool, and how many the
    /// pool can hold.
    pub kv_used: AtomicU64,
    pub kv_capacity: AtomicU64,
    /// The pool in blocks: held by running sequences, kept as the prefix cache, in all.
    pub kv_blocks_used: AtomicU64,
    pub kv_blocks_cached: AtomicU64,
    pub kv_blocks_total: AtomicU64,
    /// Sequences the pool holds at once (`--parallel`).
    pub slots: AtomicU64,
    /// 1 once the model is loaded.
    pub ready: AtomicU64,
    /// Batched decode steps, the rows they fed, and their time (GPU step and read-back).
    pub decode_steps: AtomicU64,
    pub decode_rows: AtomicU64,
    pub decode_micros: AtomicU64,
    /// Draft tokens verified, and those kept (speculative decoding).
    pub draft_tokens: AtomicU64,
    pub draft_accepted_tokens: AtomicU64,
}

impl ModelMetrics {
    pub fn record(&self, finished: &Finished) {
        let add = |counter: &AtomicU64, n: u32| counter.fetch_add(u64::from(n), Ordering::SeqCst);
        add(&self.prompt_tokens, finished.usage.prompt_tokens);
        add(&self.completion_tokens, finished.usage.completion_tokens);
        add(&self.cached_tokens, finished.usage.cached_tokens);
    }

    /// One batched decode step of `rows` rows that took `took`.
    pub fn decoded_step(&self, rows: usize, took: std::time::Duration) {
        self.decode_steps.fetch_add(1, Ordering::SeqCst);
        self.decode_rows.fetch_add(rows as u64, Ordering::SeqCst);
        let micros = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        self.decode_micros.fetch_add(micros, Ordering::SeqCst);
    }

    /// One verification step of `drafted` draft tokens, `accepted` of them kept.
    pub fn drafted(&self, drafted: u32, accepted: u32) {
        let add = |counter: &AtomicU64, n: u32| counter.fetch_add(u64::from(n), Ordering::SeqCst);
        add(&self.draft_tokens, drafted);
        add(&self.draft_accepted_tokens, accepted);
    }
}

/// One per-model row of `/metrics`: name, type, help, and where its value lives.
type Row = (
    &'static str,
    &'static str,
    &'static str,
    fn(&ModelMetrics) -> &AtomicU64,
);

/// API responses by status code, across models.
#[derive(Debug, Default)]
pub struct Responses(Mutex<BTreeMap<u16, u64>>);

impl Responses {
    pub fn count(&self, status: u16) {
        if let Ok(mut counts) = self.0.lock() {
            *counts.entry(status).or_default() += 1;
        }
    }
}

/// The exposition text for all models.
pub fn render(models: &[ModelHandle], responses: &Responses) -> String {
    let mut out = String::new();
    let per_model: [Row; 18] = [
        (
            "webshard_requests_total",
            "counter",
            "Generation requests accepted.",
            |m| &m.requests,
        ),
        (
            "webshard_prompt_tokens_total",
            "counter",
            "Prompt tokens of finished requests.",
            |m| &m.prompt_tokens,
        ),
        (
            "webshard_completion_tokens_total",
            "counter",
            "Generated tokens.",
            |m| &m.completion_tokens,
        ),
        (
            "webshard_cached_tokens_total",
            "counter",
            "Prompt tokens reused from the KV cache.",
            |m| &m.cached_tokens,
        ),
        (
            "webshard_queue_depth",
            "gauge",
            "Requests waiting for the model.",
            |m| &m.queued,
        ),
        (
            "webshard_batch_size",
            "gauge",
            "Sequences in the batch (prefilling or decoding).",
            |m| &m.running,
        ),
        (
            "webshard_kv_used_tokens",
            "gauge",
            "Tokens running sequences hold in the KV pool.",
            |m| &m.kv_used,
        ),
        (
            "webshard_kv_capacity_tokens",
            "gauge",
            "Tokens the KV pool can hold.",
            |m| &m.kv_capacity,
        ),
        (
            "webshard_kv_blocks_used",
            "gauge",
            "KV pool blocks held by running sequences.",
            |m| &m.kv_blocks_used,
        ),
        (
            "webshard_kv_blocks_cached",
            "gauge",
            "KV pool blocks of free slots kept as the prefix cache.",
            |m| &m.kv_blocks_cached,
        ),
        (
            "webshard_kv_blocks_total",
            "gauge",
            "KV pool blocks in all.",
            |m| &m.kv_blocks_total,
        ),
        (
            "webshard_parallel_slots",
            "gauge",
            "Sequences the KV pool holds at once (--parallel).",
            |m| &m.slots,
        ),
        (
            "webshard_model_ready",
            "gauge",
            "1 once the model is loaded.",
            |m| &m.ready,
        ),
        (
            "webshard_decode_steps_total",
            "counter",
            "Batched decode steps run.",
            |m| &m.decode_steps,
        ),
        (
            "webshard_decode_rows_total",
            "counter",
            "Sequence rows fed by batched decode steps.",
            |m| &m.decode_rows,
        ),
        (
            "webshard_decode_step_microseconds_total",
            "counter",
            "Time in batched decode steps (GPU step and read-back).",
            |m| &m.decode_micros,
        ),
        (
            "webshard_draft_tokens_total",
            "counter",
            "Draft tokens verified by speculative decoding.",
            |m| &m.draft_tokens,
        ),
        (
            "webshard_draft_accepted_tokens_total",
            "counter",
            "Draft tokens kept (they agreed with the model's choice).",
            |m| &m.draft_accepted_tokens,
        ),
    ];
    for (name, kind, help, field) in per_model {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for model in models {
            let value = field(&model.metrics).load(Ordering::SeqCst);
            let _ = writeln!(out, "{name}{{model=\"{}\"}} {value}", escape(&model.name));
        }
    }
    let name = "webshard_http_responses_total";
    let _ = writeln!(
        out,
        "# HELP {name} API responses by status.\n# TYPE {name} counter"
    );
    if let Ok(counts) = responses.0.lock() {
        for (status, count) in counts.iter() {
            let _ = writeln!(out, "{name}{{status=\"{status}\"}} {count}");
        }
    }
    out
}

/// A label value with `\`, `"` and newlines escaped.
fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}
