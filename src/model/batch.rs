//! One decode step of several sequences at once (continuous batching).
//!
//! Row `i` of the step is sequence `i`'s next token, at its own position in its own KV cache.
//! The weight products run over all rows together (up to 16 rows through the decode
//! path's fused matrix-vector products, one per row; more through the prompt path's tiled
//! kernels), while rope and the cache write run per row on the row's own cache
//! (`block::attend`), and attention runs in one dispatch over all rows when their caches
//! are slots of one pool (the serving pool's `KvCache::pooled`; a row table in the scratch
//! gives each row's position and slot), else per row. One row alone takes the single-token
//! path unchanged, so a batch of one decodes exactly as a lone sequence does. A greedy step's
//! argmax stays in the id buffer too, so the next step can be submitted before the host reads
//! this one (`RowTokens::FedBack`).

use std::ops::Range;

use crate::gpu::{PendingRead, Recorder};
use crate::ops::attention::{self, KvCache};
use crate::ops::select;

use super::scratch::HEAD_ROWS;
use super::stage::Stage;
use super::ModelError;

/// One sequence's place in a batched step.
#[derive(Clone, Copy, Debug)]
pub struct BatchRow<'a> {
    /// The token to feed (the last one sampled).
    pub token: u32,
    /// Its position: the number of tokens the cache holds before it.
    pub position: u32,
    /// The sequence's own cache, shaped like the stage's (`Stage::new_kv_cache`).
    pub cache: &'a KvCache,
}

/// A batched step's rows as its blocks see them, with what every layer asks of them worked
/// out once for the step.
pub struct StepRows<'a> {
    pub rows: &'a [BatchRow<'a>],
    /// Where the step wrote the rows' table (`attention::row_table`) when their caches are one
    /// pool's, so that one dispatch serves every row; `None`: row by row.
    pub table: Option<&'a wgpu::Buffer>,
    /// Each row's position, in row order.
    pub positions: Vec<u32>,
    /// Whether no two rows share a cache region (a slot, or a seat's page table): rows of one
    /// sequence (a seat's few tokens) must each see the keys the others write.
    pub distinct_sequences: bool,
}

impl<'a> StepRows<'a> {
    pub fn new(rows: &'a [BatchRow<'a>], table: Option<&'a wgpu::Buffer>) -> StepRows<'a> {
        let mut regions: Vec<u32> = rows.iter().map(|row| row.cache.row_region()).collect();
        regions.sort_unstable();
        StepRows {
            rows,
            table,
            positions: rows.iter().map(|row| row.position).collect(),
            distinct_sequences: regions.windows(2).all(|pair| pair[0] != pair[1]),
        }
    }
}

impl Stage {
    /// Feeds every row's token at its position into its cache and returns each row's logits,
    /// in row order. At most `max_batch` rows.
    pub async fn forward_batch_logits(
        &self,
        rows: &[BatchRow<'_>],
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        self.submit_batch_blocks(rows)?;
        let vocab = self.cfg.vocab as usize;
        let reads = self
            .read_head_chunks(rows.len() as u32, "head", |mut rec, chunk| {
                let count = chunk.len() as u64;
                self.record_head(&mut rec, chunk)?;
                Ok(rec.submit_with_read(&self.scratch.logits, 0, count * vocab as u64 * 4))
            })
            .await?;
        let values = reads
            .iter()
            .flat_map(|bytes| bytemuck::pod_collect_to_vec::<u8, f32>(bytes));
        let values: Vec<f32> = values.collect();
        Ok(values.chunks(vocab).map(<[f32]>::to_vec).collect())
    }

    /// Like `forward_batch_logits`, but each row's greedy token, taken on the device: 4 bytes
    /// a row come back instead of a vocabulary of logits.
    pub async fn forward_batch_argmax(
        &self,
        rows: &[BatchRow<'_>],
    ) -> Result<Vec<u32>, ModelError> {
        self.submit_batch_argmax(rows, RowTokens::Given)?
            .wait(self)
            .await
    }

    /// Submits a greedy step over `rows` without waiting for it. Each row's argmax is also
    /// left in the id buffer, so the step submitted next may take it as its tokens
    /// (`RowTokens::FedBack`, the rows in the same order) before the host has seen it: the
    /// scheduler keeps a step in flight while it records the next, as `GreedyDecoder` does
    /// for one sequence.
    pub fn submit_batch_argmax(
        &self,
        rows: &[BatchRow<'_>],
        tokens: RowTokens,
    ) -> Result<PendingArgmax, ModelError> {
        self.submit_batch_rows(rows, tokens)?;
        let s = &self.scratch;
        let reads = head_chunks(rows.len() as u32)
            .map(|chunk| {
                self.with_recorder(("head argmax", chunk.len() as u32), |mut rec| {
                    let count = chunk.len() as u32;
                    self.record_head(&mut rec, chunk.clone())?;
                    select::argmax_rows(&mut rec, &s.logits, self.cfg.vocab, count, &s.argmax);
                    let bytes = u64::from(count) * 4;
                    rec.copy(&s.argmax, 0, &s.ids, u64::from(chunk.start) * 4, bytes);
                    Ok(rec.submit_with_read(&s.argmax, 0, bytes))
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(PendingArgmax { reads })
    }

    /// Records and submits `record` for each head chunk of `rows` rows (the scratch holds
    /// `HEAD_ROWS` rows of logits), all before waiting for the first, then their bytes in order.
    async fn read_head_chunks(
        &self,
        rows: u32,
        name: &'static str,
        record: impl Fn(Recorder<'_>, Range<u32>) -> Result<PendingRead, ModelError>,
    ) -> Result<Vec<Vec<u8>>, ModelError> {
        let pending = head_chunks(rows)
            .map(|chunk| self.with_recorder((name, chunk.len() as u32), |rec| record(rec, chunk)))
            .collect::<Result<Vec<_>, _>>()?;
        let mut reads = Vec::with_capacity(pending.len());
        for read in pending {
            reads.push(read.wait(&self.gpu).await?);
        }
        Ok(reads)
    }

    /// Checks the rows and submits the embedding and blocks of the step, leaving each row's
    /// final residual in the scratch for the head.
    fn submit_batch_blocks(&self, rows: &[BatchRow<'_>]) -> Result<(), ModelError> {
        self.submit_batch_rows(rows, RowTokens::Given)
    }

    /// `submit_batch_blocks`, with the rows' tokens from the host or already on the device.
    fn submit_batch_rows(&self, rows: &[BatchRow<'_>], given: RowTokens) -> Result<(), ModelError> {
        self.check_rows(rows, given)?;
        let tokens = rows.len() as u32;
        if given == RowTokens::Given {
            let ids: Vec<u32> = rows.iter().map(|row| row.token).collect();
            self.gpu
                .queue
                .write_buffer(&self.scratch.ids, 0, bytemuck::cast_slice(&ids));
        }
        let table = pooled_row_table(rows).map(|words| {
            let buffer = row_table_buffer(rows, &self.scratch.row_table);
            self.gpu
                .queue
                .write_buffer(buffer, 0, bytemuck::cast_slice(&words));
            buffer
        });
        self.with_recorder(("batch", tokens), |mut rec| {
            self.record_embedding(&mut rec, tokens)?;
            self.record_row_blocks(&mut rec, &StepRows::new(rows, table));
            rec.submit();
            Ok(())
        })
    }

    /// `tokens` tokens of this stage's own cache from `start_pos`, when it is a seat of a
    /// paged pool and they are few (a speculative verification through the HTTP API), as a
    /// batched step's rows at consecutive positions, their table written: each row's rope and
    /// cache write then go in one `rope_store_rows` dispatch a layer over all rows, where the
    /// prompt path takes three (`rope_store` has no binding left for a page table), and row
    /// `i` attends over keys up to its own position, as the prompt path's causal mask does.
    /// `None`: the prompt path.
    pub(super) fn seat_rows(&self, start_pos: u32, tokens: u32) -> Option<Vec<BatchRow<'_>>> {
        let pages = self.cache.pages()?;
        let few = (2..=HEAD_ROWS).contains(&tokens) && 2 * tokens <= pages.row_words;
        if !few || !crate::ops::rope::rope_store_rows_supported(&self.gpu) {
            return None;
        }
        let positions: Vec<u32> = (start_pos..start_pos + tokens).collect();
        let caches = vec![&self.cache; tokens as usize];
        let words = attention::row_table(&caches, &positions).ok()?;
        self.gpu
            .queue
            .write_buffer(&pages.table, 0, bytemuck::cast_slice(&words));
        // The tokens are in the scratch already (embedded by the caller): the rows kernels
        // read each row's cache and position only.
        let row = |position| BatchRow {
            token: 0,
            position,
            cache: &self.cache,
        };
        Some(positions.into_iter().map(row).collect())
    }

    /// The blocks over one row per sequence; one row is an ordinary decode step in its cache,
    /// except in a seat of a paged pool, whose attention `block::attend` sends through its pages
    /// (the fused one-token kernel where it runs, else the rows kernels).
    pub(super) fn record_row_blocks(&self, rec: &mut Recorder, step_rows: &StepRows<'_>) {
        let rows = step_rows.rows;
        let single = rows.len() == 1 && rows[0].cache.pages().is_none();
        let (cache, position, tokens) = (rows[0].cache, rows[0].position, rows.len() as u32);
        let rows = (!single).then_some(step_rows);
        for index in 0..self.layers.len() {
            let step = self.layer_step(rec, index, cache, position, tokens, rows);
            (self.cfg.arch.forward_layer)(rec, &step);
        }
    }

    /// Rows within the batch limit, tokens in the vocabulary, positions inside caches shaped
    /// like this stage's (the tokens only where the host gives them).
    fn check_rows(&self, rows: &[BatchRow<'_>], given: RowTokens) -> Result<(), ModelError> {
        if rows.is_empty() || rows.len() > self.spec.max_batch as usize {
            return Err(ModelError::Plan(format!(
                "{} sequences in one step (1..={})",
                rows.len(),
                self.spec.max_batch
            )));
        }
        for row in rows {
            let cache = row.cache;
            let shaped = cache.layers == self.spec.layers.len() as u32
                && cache.kv_heads == self.cfg.n_kv_heads
                && cache.head_dim == self.cfg.head_dim;
            if !shaped {
                return Err(ModelError::Plan(
                    "a batch row's KV cache is not shaped like the stage's".into(),
                ));
            }
            if row.position >= cache.max_ctx {
                return Err(ModelError::ContextFull {
                    needed: row.position + 1,
                    max: cache.max_ctx,
                });
            }
            if given == RowTokens::Given && row.token >= self.cfg.vocab {
                return Err(ModelError::Plan(format!(
                    "token {} outside the vocabulary of {}",
                    row.token, self.cfg.vocab
                )));
            }
        }
        Ok(())
    }
}

/// Where a batched step's tokens come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RowTokens {
    /// Each row's `token`, written from the host.
    Given,
    /// The argmax of the same row of the step submitted just before (each row's `token` is
    /// not read): nothing else may be submitted between the two steps.
    FedBack,
}

/// A submitted `Stage::submit_batch_argmax` step: one read per head chunk.
pub struct PendingArgmax {
    reads: Vec<PendingRead>,
}

impl PendingArgmax {
    /// Each row's greedy token, in row order, once the step has run.
    pub async fn wait(self, stage: &Stage) -> Result<Vec<u32>, ModelError> {
        let mut ids = Vec::new();
        for read in self.reads {
            let bytes = read.wait(&stage.gpu).await?;
            ids.extend(bytemuck::pod_collect_to_vec::<u8, u32>(&bytes));
        }
        Ok(ids)
    }
}

/// The row table of rows whose caches are slots of one pool (several rows) or seats of one
/// paged pool (any rows), else `None`.
fn pooled_row_table(rows: &[BatchRow<'_>]) -> Option<Vec<u32>> {
    let paged = rows.first()?.cache.pages().is_some();
    if rows.len() < 2 && !paged {
        return None;
    }
    let caches: Vec<&KvCache> = rows.iter().map(|row| row.cache).collect();
    let positions: Vec<u32> = rows.iter().map(|row| row.position).collect();
    attention::row_table(&caches, &positions).ok()
}

/// Where the row table of `rows` goes: a paged pool's own page table (the words in front of
/// its seats' entries), else the scratch's table.
fn row_table_buffer<'a>(
    rows: &[BatchRow<'a>],
    scratch_table: &'a wgpu::Buffer,
) -> &'a wgpu::Buffer {
    match rows[0].cache.pages() {
        Some(pages) => &pages.table,
        None => scratch_table,
    }
}

/// `0..tokens` in pieces of at most `HEAD_ROWS` rows.
fn head_chunks(tokens: u32) -> impl Iterator<Item = Range<u32>> {
    (0..tokens)
        .step_by(HEAD_ROWS as usize)
        .map(move |start| start..(start + HEAD_ROWS).min(tokens))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn head_chunks_cover_the_rows_in_order() {
        let chunks: Vec<Range<u32>> = head_chunks(2 * HEAD_ROWS + 3).collect();
        let expected = vec![
            0..HEAD_ROWS,
            HEAD_ROWS..2 * HEAD_ROWS,
            2 * HEAD_ROWS..2 * HEAD_ROWS + 3,
        ];
        assert_eq!(chunks, expected);
    }
}
