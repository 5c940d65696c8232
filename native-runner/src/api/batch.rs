//! Continuous batching: the worker's scheduler over the KV pool.
//!
//! Every iteration of the loop (a "step") admits queued jobs into free slots (reusing cached
//! prefixes, `pool`), drops sequences whose client has gone (their slot is free at once),
//! feeds one chunk of one new prompt (chunked prefill, so streams already running wait at
//! most one chunk), then advances every sequence whose prompt is in its cache by one token in
//! a single GPU step and samples each row with its own options and seed: where every row is
//! plain greedy the device takes each row's argmax (`Stage::forward_batch_argmax`, 4 bytes a
//! row back), else every row's logits come back (`Stage::forward_batch_logits`). A
//! constrained row (JSON, a schema, a grammar, a forced tool call) masks its logits to the
//! tokens its constraint allows before sampling; the next mask is computed on the CPU while
//! the GPU runs the step (`row_constraint`). A sequence running alone may verify drafts of
//! several tokens in one step instead (`drafts`).

mod drafts;

use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::Arc;

use tokio::sync::mpsc::UnboundedSender;
use webshard::engine::{per_token_prefill_below, Engine, EngineError};
use webshard::front::{Decoding, Generator, TextFront, Timings};
use webshard::model::batch::{BatchRow, PendingArgmax, RowTokens};
use webshard::model::StageInput;
use webshard::sample::{Constraint, ConstraintError, SpecConfig};

use super::errors::ApiError;
use super::metrics::ModelMetrics;
use super::pool::{KvPool, PoolUsage};
use super::row_constraint::RowConstraint;
use super::worker::{choice_of, finished, stream_event, Event, Finished, Job, TokenChoice};
use drafts::Drafting;

/// Prompt tokens fed per step for a new request on a CPU adapter and on a GPU: a chunk costs
/// running streams one step's wait, so it is kept to about the time of a few decode steps.
const PREFILL_CHUNK_ON_CPU: usize = 32;
const PREFILL_CHUNK_ON_GPU: usize = 256;

/// One admitted request.
struct Sequence {
    /// Unique among the scheduler's sequences (a slot outlives its sequence).
    id: u64,
    job: Job,
    decoding: Decoding,
    slot: usize,
    /// Prompt tokens found in the pool.
    cached: u32,
    /// What the next token comes from, once everything before it is fed.
    next: Option<Next>,
    choices: Option<Vec<TokenChoice>>,
    constraint: Option<RowConstraint>,
    /// Speculative decoding, for an unconstrained request that asks for it.
    drafting: Option<Drafting>,
    started: f64,
    first_token: Option<f64>,
}

/// A greedy step submitted ahead: its tokens are the device's argmax of the step before,
/// which the host has accepted by the time this one is waited for.
struct Ahead {
    pending: PendingArgmax,
    /// Each row's sequence, the position it feeds and the token it feeds there (known once the
    /// step before has been read).
    rows: Vec<(u64, u32, u32)>,
}

/// A sequence's next token: logits to sample, or the device's argmax already taken.
enum Next {
    Logits(Vec<f32>),
    Greedy(u32),
}

impl Sequence {
    /// Whether the device may pick this sequence's next token itself: plain argmax, no
    /// constraint and no log-probabilities asked for.
    fn greedy_on_device(&self) -> bool {
        self.choices.is_none()
            && self.constraint.is_none()
            && self.decoding.sampler().argmax_suffices()
    }

    /// Tokens the model has seen in the slot: everything but those still to feed.
    fn to_feed<'a>(&'a self, pool: &KvPool) -> &'a [u32] {
        &self.decoding.tokens()[pool.held(self.slot)..]
    }
}

pub struct Scheduler {
    pub engine: Engine,
    pool: KvPool,
    running: Vec<Sequence>,
    /// The greedy step in flight while the host handles the one before (`decode`).
    ahead: Option<Ahead>,
    next_id: u64,
    metrics: Arc<ModelMetrics>,
    chunk: usize,
    per_token_below: usize,
    /// The speculation of requests that do not ask for their own (`runner serve --spec`).
    pub speculation: Option<SpecConfig>,
}

impl Scheduler {
    pub fn new(
        engine: Engine,
        slots: usize,
        metrics: Arc<ModelMetrics>,
    ) -> Result<Scheduler, EngineError> {
        let pool = KvPool::new(&engine.stage, slots)?;
        let gpu = &engine.stage.gpu;
        let chunk = match gpu.caps.cpu_work_split {
            true => PREFILL_CHUNK_ON_CPU,
            false => PREFILL_CHUNK_ON_GPU,
        };
        let per_token_below = per_token_prefill_below(gpu);
        let scheduler = Scheduler {
            engine,
            pool,
            running: Vec::new(),
            ahead: None,
            next_id: 0,
            metrics,
            chunk,
            per_token_below,
            speculation: None,
        };
        scheduler.publish();
        Ok(scheduler)
    }

    /// Whether nothing is running.
    pub fn idle(&self) -> bool {
        self.running.is_empty()
    }

    /// Takes `job` in: into a slot now if one is free, else back to the caller (`Err`) to
    /// wait in the queue.
    #[allow(clippy::result_large_err)] // the refused job itself goes back, not an error
    pub fn admit(&mut self, job: Job) -> Result<(), Job> {
        if !self.pool.has_free_slot() {
            return Err(job);
        }
        let prepared = match self.engine.prompt_ids(&job.request.prompt) {
            Ok(ids) => self.compile_constraint(&job).map(|c| (ids, c)),
            Err(err) => Err(err.to_string()),
        };
        let (ids, constraint) = match prepared {
            Ok(prepared) => prepared,
            Err(err) => {
                let message = format!("Generation failed: {err}");
                let _ = job.events.send(Event::Failed(ApiError::internal(message)));
                return Ok(());
            }
        };
        let gpu = Arc::clone(&self.engine.stage.gpu);
        // Room for the prompt and every token it may generate (the last needs no position;
        // the step submitted ahead may write one past it).
        let need = ids.len() + job.request.options.max_tokens as usize;
        let Some(claim) = self.pool.claim(&gpu, &ids, need) else {
            return Err(job);
        };
        let decoding = Decoding::new(0, ids, &job.request.options);
        let choices = job.request.options.logprobs.map(|_| Vec::new());
        let drafting = Drafting::for_request(&job.request.options, self.speculation);
        self.next_id += 1;
        self.running.push(Sequence {
            id: self.next_id,
            job,
            decoding,
            slot: claim.slot,
            cached: claim.reused as u32,
            next: None,
            choices,
            constraint: constraint.map(RowConstraint::start),
            drafting,
            started: now_seconds(),
            first_token: None,
        });
        self.publish();
        Ok(())
    }

    /// Moves waiting jobs from `queued` into free slots; blocks for one when idle. `false`
    /// once the queue is closed and nothing is left to do.
    pub fn admit_from(&mut self, queued: &Receiver<Job>, held: &mut Option<Job>) -> bool {
        loop {
            let job = match held.take() {
                Some(job) => job,
                None if self.idle() => match queued.recv() {
                    Ok(job) => self.dequeued(job),
                    Err(_) => return false,
                },
                None => match queued.try_recv() {
                    Ok(job) => self.dequeued(job),
                    Err(TryRecvError::Empty) => return true,
                    Err(TryRecvError::Disconnected) => return !self.idle(),
                },
            };
            if job.events.is_closed() {
                continue; // the client left while the job waited
            }
            if let Err(job) = self.admit(job) {
                *held = Some(job);
                return true;
            }
        }
    }

    /// The job's constraint compiled against the model's vocabulary, if it has one.
    fn compile_constraint(&mut self, job: &Job) -> Result<Option<Constraint>, String> {
        let Some(spec) = &job.request.options.constraint else {
            return Ok(None);
        };
        let view = self.engine.token_view().map_err(|e| e.to_string())?;
        Constraint::new(&view, spec)
            .map(Some)
            .map_err(|e| e.to_string())
    }

    fn dequeued(&self, job: Job) -> Job {
        self.metrics.queued.fetch_sub(1, Ordering::SeqCst);
        job
    }

    /// One step of the loop: prefill and decode of the batch.
    pub async fn step(&mut self) -> Result<(), EngineError> {
        if self.running.is_empty() {
            return Ok(());
        }
        self.drop_departed();
        self.prefill_chunk().await?;
        self.sample_ready().await;
        self.decode().await?;
        self.sample_ready().await;
        if self.running.is_empty() {
            // Its rows have all finished: the device runs it anyway, and nothing reads it.
            self.ahead = None;
        }
        self.publish();
        Ok(())
    }

    /// Frees the slots of sequences whose client has gone.
    fn drop_departed(&mut self) {
        let (gone, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut self.running)
            .into_iter()
            .partition(|seq| seq.job.events.is_closed());
        self.running = kept;
        for seq in gone {
            self.pool.release(seq.slot);
        }
    }

    /// Feeds one chunk of the oldest sequence with a long stretch of prompt still to feed.
    async fn prefill_chunk(&mut self) -> Result<(), EngineError> {
        let pool = &self.pool;
        let long = self.per_token_below.max(2);
        let Some(index) = self
            .running
            .iter()
            .position(|seq| seq.to_feed(pool).len() >= long)
        else {
            return Ok(());
        };
        let seq = &self.running[index];
        let slot = seq.slot;
        let pending = seq.to_feed(pool);
        let chunk = pending[..pending.len().min(self.chunk)].to_vec();
        let is_last = chunk.len() == pending.len();
        let start = self.pool.held(slot) as u32;
        let own = self.pool.lend_to(&mut self.engine.stage, slot);
        let fed = self.feed(&chunk, start, is_last).await;
        self.pool.take_back(&mut self.engine.stage, slot, own);
        let logits = fed?;
        self.pool.extend(slot, &chunk);
        if is_last {
            self.running[index].next = Some(Next::Logits(logits));
        }
        Ok(())
    }

    /// `chunk` at `start` in the stage's current cache; the last row's logits if `want`.
    async fn feed(&self, chunk: &[u32], start: u32, want: bool) -> Result<Vec<f32>, EngineError> {
        let stage = &self.engine.stage;
        let input = StageInput::Tokens(chunk);
        if !want {
            stage.forward(&input, start)?;
            return Ok(Vec::new());
        }
        let rows = stage.forward_logits(&input, start, 1).await?;
        Ok(rows.into_iter().next().unwrap_or_default())
    }

    /// One GPU step for every sequence with a token to feed and none to sample: its last
    /// sampled token, or the next of the few prompt tokens left after the cache and the chunks
    /// (where single tokens are cheaper than a chunk: `per_token_prefill_below`). Where every
    /// running sequence is greedy on the device, the step after is submitted before this one
    /// is read (`Ahead`), so the GPU does not wait for the host between steps.
    async fn decode(&mut self) -> Result<(), EngineError> {
        if let Some(ahead) = self.ahead.take() {
            return self.decode_ahead(ahead).await;
        }
        if let Some(draft) = self.lone_draft() {
            return self.verify_draft(draft).await;
        }
        let pool = &self.pool;
        let ready: Vec<usize> = (0..self.running.len())
            .filter(|&i| {
                let seq = &self.running[i];
                let left = seq.to_feed(pool).len();
                seq.next.is_none() && left >= 1 && (left == 1 || left < self.per_token_below)
            })
            .collect();
        if ready.is_empty() {
            return Ok(());
        }
        let rows: Vec<BatchRow> = ready
            .iter()
            .map(|&i| {
                let seq = &self.running[i];
                BatchRow {
                    token: seq.to_feed(pool)[0],
                    position: pool.held(seq.slot) as u32,
                    cache: pool.cache(seq.slot),
                }
            })
            .collect();
        let tokens: Vec<u32> = rows.iter().map(|row| row.token).collect();
        let stage = &self.engine.stage;
        let started = std::time::Instant::now();
        let chained = self.chains(&ready, &rows);
        let greedy = ready.iter().all(|&i| self.running[i].greedy_on_device());
        let next: Vec<Next> = if chained {
            let first = stage.submit_batch_argmax(&rows, RowTokens::Given)?;
            let after = ahead_rows(&rows);
            let second = stage.submit_batch_argmax(&after, RowTokens::FedBack)?;
            let ids = first.wait(stage).await?;
            let ahead_rows = ready.iter().zip(&after).zip(&ids);
            self.ahead = Some(Ahead {
                pending: second,
                rows: ahead_rows
                    .map(|((&i, row), &id)| (self.running[i].id, row.position, id))
                    .collect(),
            });
            ids.into_iter().map(Next::Greedy).collect()
        } else if greedy {
            let ids = stage.forward_batch_argmax(&rows).await?;
            ids.into_iter().map(Next::Greedy).collect()
        } else {
            let logits = stage.forward_batch_logits(&rows).await?;
            logits.into_iter().map(Next::Logits).collect()
        };
        self.metrics.decoded_step(ready.len(), started.elapsed());
        drop(rows);
        for ((&i, next), token) in ready.iter().zip(next).zip(tokens) {
            let seq = &mut self.running[i];
            self.pool.extend(seq.slot, &[token]);
            if seq.to_feed(&self.pool).is_empty() {
                seq.next = Some(next);
            }
        }
        Ok(())
    }

    /// Whether the step after `rows` (sequences `ready`) may be submitted before they are read:
    /// every running sequence is in it, greedy on the device, with its last prompt token fed
    /// (so its next input is the device's argmax) and room for one more position.
    fn chains(&self, ready: &[usize], rows: &[BatchRow]) -> bool {
        ready.len() == self.running.len()
            && ready.iter().zip(rows).all(|(&i, row)| {
                let seq = &self.running[i];
                seq.greedy_on_device()
                    && seq.to_feed(&self.pool).len() == 1
                    && row.position + 1 < row.cache.max_ctx
            })
    }

    /// Reads the step submitted ahead and takes each row's token where its sequence still runs
    /// and had exactly that token to feed there (a row whose sequence finished, left or was
    /// replaced is dropped). While the batch stays the same, the step after it goes in first.
    async fn decode_ahead(&mut self, ahead: Ahead) -> Result<(), EngineError> {
        let started = std::time::Instant::now();
        let pool = &self.pool;
        let running = &self.running;
        let owners: Vec<Option<usize>> = ahead
            .rows
            .iter()
            .map(|&(id, position, token)| {
                running.iter().position(|seq| {
                    seq.id == id
                        && seq.next.is_none()
                        && pool.held(seq.slot) as u32 == position
                        && seq.to_feed(pool) == [token]
                })
            })
            .collect();
        let rows: Option<Vec<BatchRow>> = owners
            .iter()
            .zip(&ahead.rows)
            .map(|(owner, &(_, position, token))| {
                owner.map(|i| BatchRow {
                    token,
                    position,
                    cache: pool.cache(running[i].slot),
                })
            })
            .collect();
        let ready: Option<Vec<usize>> = owners.iter().copied().collect();
        let stage = &self.engine.stage;
        let mut next_ahead = None;
        if let (Some(rows), Some(ready)) = (&rows, &ready) {
            // A lone sequence with a draft due verifies it next instead (`decode` takes it
            // once this step is read); `decode`'s own chaining has just found none due.
            if self.chains(ready, rows) && self.lone_draft().is_none() {
                let after = ahead_rows(rows);
                let pending = stage.submit_batch_argmax(&after, RowTokens::FedBack)?;
                next_ahead = Some((
                    pending,
                    after.iter().map(|row| row.position).collect::<Vec<_>>(),
                ));
            }
        }
        let ids = ahead.pending.wait(stage).await?;
        self.metrics.decoded_step(ids.len(), started.elapsed());
        for ((owner, &(_, _, token)), &id) in owners.iter().zip(&ahead.rows).zip(&ids) {
            let Some(i) = *owner else { continue };
            let seq = &mut self.running[i];
            self.pool.extend(seq.slot, &[token]);
            seq.next = Some(Next::Greedy(id));
        }
        self.ahead = next_ahead.map(|(pending, positions)| Ahead {
            pending,
            rows: ahead
                .rows
                .iter()
                .zip(positions)
                .zip(&ids)
                .map(|((&(id, _, _), position), &token)| (id, position, token))
                .collect(),
        });
        Ok(())
    }

    /// Samples and streams the next token of every sequence with logits; finished sequences
    /// send their result and free their slot, as does one whose constraint failed.
    async fn sample_ready(&mut self) {
        let text = &self.engine.text;
        let alone = self.running.len() == 1;
        let mut done = Vec::new();
        let mut index = 0;
        while index < self.running.len() {
            let seq = &mut self.running[index];
            let accepted = match seq.next.take() {
                Some(next) => {
                    let accepted = accept_next(seq, text, next).await;
                    if let Some(drafting) = &mut seq.drafting {
                        drafting.plain_token(alone, seq.decoding.tokens());
                    }
                    accepted
                }
                None => Ok(()),
            };
            if accepted.is_ok() && seq.decoding.finished().is_none() {
                index += 1;
                continue;
            }
            let seq = self.running.remove(index);
            self.pool.release(seq.slot);
            done.push(match accepted {
                Ok(()) => finish(seq),
                Err(err) => {
                    let message = format!("Generation failed: {err}");
                    (Err(ApiError::internal(message)), seq.job.events)
                }
            });
        }
        // The gauges first: a client that has its answer sees its slot free.
        self.publish();
        for (result, events) in done {
            let event = match result {
                Ok(result) => {
                    self.metrics.record(&result);
                    Event::Done(result)
                }
                Err(error) => Event::Failed(error),
            };
            let _ = events.send(event);
        }
    }

    /// Fails every sequence after a step went wrong and starts the pool afresh (its caches
    /// may hold half a step).
    pub fn fail_all(&mut self, error: ApiError) {
        for seq in self.running.drain(..) {
            let _ = seq.job.events.send(Event::Failed(error.clone()));
        }
        self.ahead = None;
        self.pool.clear();
        self.engine.reset();
        self.publish();
    }

    /// The batch and pool gauges of `/metrics`.
    fn publish(&self) {
        let usage: PoolUsage = self.pool.usage();
        let m = &self.metrics;
        m.running.store(self.running.len() as u64, Ordering::SeqCst);
        m.kv_used.store(usage.used_tokens, Ordering::SeqCst);
        m.kv_capacity.store(usage.total_tokens, Ordering::SeqCst);
        m.kv_blocks_used.store(usage.used_blocks, Ordering::SeqCst);
        m.kv_blocks_cached
            .store(usage.cached_blocks, Ordering::SeqCst);
        m.kv_blocks_total
            .store(usage.total_blocks, Ordering::SeqCst);
        m.slots.store(usage.slots, Ordering::SeqCst);
    }
}

/// Picks the sequence's next token (its constraint's mask first, where it has one) and takes
/// it as the engine does: the constraint consumes it, then the stop rules see it, and a
/// complete constraint ends the output. Log-probabilities are of the unmasked logits.
async fn accept_next(
    seq: &mut Sequence,
    text: &TextFront,
    next: Next,
) -> Result<(), ConstraintError> {
    let before = seq.decoding.completion_len();
    let (next, complete, logits) = match (next, seq.constraint.as_mut()) {
        (Next::Greedy(id), None) => (id, false, None),
        // Never taken: a constrained row is not greedy on the device (`greedy_on_device`).
        (Next::Greedy(_), Some(_)) => {
            let why = "the device picked a constrained row's token unmasked";
            return Err(ConstraintError::Dead(why.into()));
        }
        (Next::Logits(logits), None) => (seq.decoding.sample(&logits), false, Some(logits)),
        (Next::Logits(logits), Some(constraint)) => {
            let mut masked = logits.clone();
            let decoding = &mut seq.decoding;
            let (id, complete) = constraint.pick(&mut masked, |l| decoding.sample(l)).await?;
            (id, complete, Some(logits))
        }
    };
    let job = &seq.job;
    let finish = seq
        .decoding
        .accept(text, next, &mut |event| stream_event(job, event));
    if finish.is_none() && complete {
        seq.decoding.stop();
    }
    seq.first_token.get_or_insert_with(now_seconds);
    let (Some(choices), Some(top), Some(logits)) =
        (seq.choices.as_mut(), job.request.options.logprobs, logits)
    else {
        return Ok(());
    };
    if seq.decoding.completion_len() > before {
        choices.push(choice_of(&text.tokenizer, &logits, next, top as usize));
    }
    Ok(())
}

/// The finished sequence's result, and where it goes.
fn finish(seq: Sequence) -> (Result<Finished, ApiError>, UnboundedSender<Event>) {
    let now = now_seconds();
    let first = seq.first_token.unwrap_or(now);
    let timings = Timings {
        prefill_seconds: first - seq.started,
        decode_seconds: now - first,
        mask_seconds: seq.constraint.as_ref().map_or(0.0, |c| c.seconds),
        drafted: seq.drafting.as_ref().map_or(0, |d| d.drafted),
        accepted: seq.drafting.as_ref().map_or(0, |d| d.accepted),
        ..Timings::default()
    };
    let generated = seq.decoding.into_generated(seq.cached, timings);
    (Ok(finished(generated, seq.choices)), seq.job.events)
}

/// `rows` one position on, their tokens to come from the device (`RowTokens::FedBack`).
fn ahead_rows<'a>(rows: &[BatchRow<'a>]) -> Vec<BatchRow<'a>> {
    let after = |row: &BatchRow<'a>| BatchRow {
        token: 0,
        position: row.position + 1,
        ..*row
    };
    rows.iter().map(after).collect()
}

/// Seconds on a monotonic clock.
fn now_seconds() -> f64 {
    use std::sync::OnceLock;
    static START: OnceLock<std::time::Instant> = OnceLock::new();
    START
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_secs_f64()
}
