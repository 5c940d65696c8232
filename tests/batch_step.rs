//! A batched decode step (`Stage::forward_batch_logits`, what `runner serve` runs for several
//! requests) gives each row the logits that row's own single-token step gives, on both block
//! paths: llama's (Qwen2.5, a qwen2: the llama block with q/k/v biases) and gemma3's (per-head
//! norms, post-norms into the residual, sliding window). The devices run with the GPU work
//! split, where a batched step's products go through the fused matrix-vector path one product
//! per row (on CPU adapters' own split they take the tiled kernel, covered by `api_batch`).
//! Fresh prompts each run: random ids of different lengths in the slots of one KV pool, or in
//! the seats of a paged pool (`KvCache::paged`) whose pages interleave, prompts crossing pages.

use crate::support;

use webshard::engine::Engine;
use webshard::gpu::{testing, BackendChoice, GpuOptions, Int8Products};
use webshard::model::batch::{BatchRow, RowTokens};
use webshard::model::StageInput;
use webshard::ops::attention::{KvCache, PAGE_TOKENS};

const ROWS: usize = 5;

/// `count` random ids below `vocab`, from `seed` and a `salt` for each list.
fn random_ids(vocab: u32, seed: u64, count: usize, salt: u64) -> Vec<u32> {
    let values = testing::random_f32(count, seed ^ salt);
    values
        .iter()
        .map(|v| ((v.abs() * 1e6) as u32) % vocab)
        .collect()
}

/// Random prompts of 3 + `step` * row ids, and each one's next token.
fn prompts(vocab: u32, seed: u64, step: usize) -> Vec<(Vec<u32>, u32)> {
    let ids = |count: usize, salt: u64| random_ids(vocab, seed, count, salt);
    (0..ROWS)
        .map(|row| {
            let prompt = ids(3 + step * row, row as u64 * 31 + 1);
            let next = ids(1, row as u64 * 31 + 2)[0];
            (prompt, next)
        })
        .collect()
}

/// Runs `body` with slot `index`'s cache in the stage.
async fn in_slot<T>(
    engine: &mut Engine,
    slots: &mut [Option<KvCache>],
    index: usize,
    body: impl AsyncFnOnce(&Engine) -> T,
) -> T {
    let cache = slots[index].take().expect("slot cache");
    let own = engine.stage.swap_kv_cache(cache);
    let result = body(engine).await;
    slots[index] = Some(engine.stage.swap_kv_cache(own));
    result
}

/// Where the rows' caches live.
#[derive(Clone, Copy, PartialEq)]
enum Pool {
    Slots,
    Pages,
}

/// `ROWS` caches of the stage: slots of one pool, or seats of a paged pool whose seat `i`
/// holds every `ROWS`-th page from the far end, so no two consecutive positions of a row
/// across a page boundary are neighbours in memory.
fn caches(engine: &Engine, pool: Pool) -> Vec<Option<KvCache>> {
    let stage = &engine.stage;
    let caches = match pool {
        Pool::Slots => stage.new_pooled_kv_caches(ROWS as u32).expect("a pool"),
        Pool::Pages => {
            let entries = stage.spec.max_context.div_ceil(PAGE_TOKENS);
            let pages = ROWS as u32 * entries + 1;
            let seats = stage.new_paged_kv_caches(ROWS as u32, pages);
            let seats = seats.expect("a paged pool");
            for (i, seat) in seats.iter().enumerate() {
                let list: Vec<u32> = (0..entries)
                    .map(|j| pages - 1 - (j * ROWS as u32 + i as u32))
                    .collect();
                seat.set_pages(&stage.gpu, &list);
            }
            seats
        }
    };
    caches.into_iter().map(Some).collect()
}

async fn check_model(file: &str, seed: u64, disable_subgroups: bool, pool: Pool) {
    check_products(file, seed, disable_subgroups, pool, Int8Products::Off).await
}

async fn check_products(
    file: &str,
    seed: u64,
    disable_subgroups: bool,
    pool: Pool,
    int8: Int8Products,
) {
    let options = GpuOptions {
        backend: BackendChoice::Vulkan,
        gpu_work_split: true,
        disable_subgroups,
        int8_products: Some(int8),
        ..Default::default()
    };
    let mut engine = support::load_engine(file, options).await;
    let step = if pool == Pool::Pages { 11 } else { 1 };
    let cases = prompts(engine.model.cfg.vocab, seed, step);
    let mut slots = caches(&engine, pool);
    let mut lone = Vec::new();
    for (index, (prompt, next)) in cases.iter().enumerate() {
        let logits = in_slot(&mut engine, &mut slots, index, async |engine: &Engine| {
            let stage = &engine.stage;
            stage
                .forward(&StageInput::Tokens(prompt), 0)
                .expect("prompt");
            let input = [*next];
            let at = prompt.len() as u32;
            let rows = stage
                .forward_logits(&StageInput::Tokens(&input), at, 1)
                .await;
            rows.expect("lone step").remove(0)
        })
        .await;
        lone.push(logits);
    }
    let rows: Vec<BatchRow> = cases
        .iter()
        .zip(&slots)
        .map(|((prompt, next), cache)| BatchRow {
            token: *next,
            position: prompt.len() as u32,
            cache: cache.as_ref().expect("slot cache"),
        })
        .collect();
    let stage = &engine.stage;
    let batched = stage
        .forward_batch_logits(&rows)
        .await
        .expect("batched step");
    // f32 products: a single step's own product kernels and folds round differently from a
    // batched step's; integer products: the same bits (`check_integer_rows`).
    let tolerance = match int8 {
        Int8Products::Decode => 0.0,
        _ => 2e-3,
    };
    for (row, (got, want)) in batched.iter().zip(&lone).enumerate() {
        let what = format!("{file} row {row} of {ROWS}, seed {seed}");
        testing::assert_close(got, want, tolerance, &what);
    }
    if pool == Pool::Pages {
        // A paged seat alone in its step decodes through the rows kernels too, its q, k and
        // v packed as a one-token step packs them (rewriting the same position's keys).
        let alone = stage.forward_batch_logits(&rows[..1]).await;
        let what = format!("{file} row 0 alone, seed {seed}");
        testing::assert_close(&alone.expect("one row")[0], &lone[0], 2e-3, &what);
    }
    let greedy = stage
        .submit_batch_argmax(&rows, RowTokens::Given)
        .expect("argmax step")
        .wait(stage)
        .await
        .expect("argmax ids");
    let argmax = |logits: &Vec<f32>| {
        let best = logits.iter().copied().fold(f32::MIN, f32::max);
        logits.iter().position(|&v| v == best).unwrap() as u32
    };
    let expected: Vec<u32> = batched.iter().map(argmax).collect();
    assert_eq!(
        greedy, expected,
        "{file}: device argmax of the batched rows, seed {seed}"
    );
}

#[test]
fn batched_rows_match_their_single_steps_qwen25() {
    pollster::block_on(check_model(
        support::QWEN25.1,
        testing::fresh_seed(),
        false,
        Pool::Slots,
    ));
}

#[test]
fn batched_rows_match_their_single_steps_gemma3() {
    pollster::block_on(check_model(
        support::GEMMA3.1,
        testing::fresh_seed(),
        false,
        Pool::Slots,
    ));
}

/// With every decode product on 8-bit integers (`Int8Products::Decode`), a batched row's
/// logits are its single step's to the last bit: a token's integer products do not depend on
/// the tokens beside it (`ops_matvec_int8`), and the batched and single kernels around them
/// agree bit for bit (the fused one-token attention scores its fresh key and sums its per-head
/// norms in the rows kernels' order). Any last-bit difference would matter here: it can round a
/// value of x to the neighbouring integer, and the rows then drifted apart by up to 2e-2 of the
/// largest logit (Gemma 3, docs/perf.md, session 32).
fn check_integer_rows(file: &str) {
    let seed = testing::fresh_seed();
    let int8 = Int8Products::Decode;
    pollster::block_on(check_products(file, seed, false, Pool::Slots, int8));
}

#[test]
fn batched_rows_on_integers_match_their_single_steps_qwen25() {
    check_integer_rows(support::QWEN25.1);
}

#[test]
fn batched_rows_on_integers_match_their_single_steps_gemma3() {
    check_integer_rows(support::GEMMA3.1);
}

/// Gemma 3 (head_dim 256, sliding windows, per-head norms) on pages: the prompts go through
/// the prefill kernel and `kv_write` over pages, the lone steps too, the batched step through
/// the rows kernels.
#[test]
fn batched_rows_match_their_single_steps_gemma3_paged() {
    let seed = testing::fresh_seed();
    pollster::block_on(check_model(support::GEMMA3.1, seed, false, Pool::Pages));
}

/// Without subgroups, lavapipe's GPU split stages Gemma 3's 640-wide rows (32 threads a row),
/// so its single steps fold the post-norms into the next products (`block::Stream`, as the
/// H200 does with subgroups of 32), while the batched rows still take separate norms.
#[test]
fn batched_rows_match_their_single_steps_gemma3_folded() {
    pollster::block_on(check_model(
        support::GEMMA3.1,
        testing::fresh_seed(),
        true,
        Pool::Slots,
    ));
}

/// A few tokens (a speculative verification) match the same tokens decoded one a step, in the
/// stage's own contiguous cache (the prompt path's `rope_store` and the prefill attention, its
/// tiles in f32 for so few tokens) and in a seat of a paged pool, where they go as rows at
/// consecutive positions (`rope_store_rows`, the rows attention over pages); a longer prompt
/// before them takes the prompt path in either cache, and the keys the few tokens leave serve
/// the next step alike.
async fn few_tokens_match_single_steps(file: &str, seed: u64) {
    let options = GpuOptions {
        backend: BackendChoice::Vulkan,
        gpu_work_split: true,
        ..Default::default()
    };
    let mut engine = support::load_engine(file, options).await;
    let vocab = engine.model.cfg.vocab;
    let ids = |count: usize, salt: u64| random_ids(vocab, seed, count, salt);
    // A prompt that ends mid-page, then 2..=5 tokens crossing a page boundary, then one.
    let (prompt, few, next) = (ids(PAGE_TOKENS as usize + 13, 1), ids(5, 2), ids(1, 3));
    let in_pieces = [&few[..2], &few[2..], &next[..]];
    let singles: Vec<&[u32]> = few.iter().chain(&next).map(std::slice::from_ref).collect();
    let run = async |engine: &Engine, pieces: &[&[u32]]| -> Vec<Vec<f32>> {
        let stage = &engine.stage;
        stage
            .forward(&StageInput::Tokens(&prompt), 0)
            .expect("prompt");
        let mut rows = Vec::new();
        let mut at = prompt.len() as u32;
        for piece in pieces {
            let step = StageInput::Tokens(piece);
            let got = stage.forward_logits(&step, at, piece.len() as u32).await;
            rows.extend(got.expect("few tokens"));
            at += piece.len() as u32;
        }
        rows
    };
    let single = run(&engine, &singles).await;
    let own = run(&engine, &in_pieces).await;
    let mut seats = caches(&engine, Pool::Pages);
    let paged = in_slot(&mut engine, &mut seats, 2, async |engine: &Engine| {
        run(engine, &in_pieces).await
    })
    .await;
    assert_eq!((own.len(), paged.len()), (single.len(), single.len()));
    // A seat's rows take a single step's arithmetic (per-token products, the decode
    // attention's core over pages): equal to the bit on lavapipe, within the batched rows'
    // bound elsewhere. The own cache's step differs in the attention's order of sums only:
    // 2e-6 on lavapipe, where f16 tiles gave 6e-4 to 1.05e-2 of the largest logit and rows one
    // position off 0.08-0.97.
    for (row, ((paged, own), want)) in paged.iter().zip(&own).zip(&single).enumerate() {
        let what = format!("{file} position {row} of the few tokens, seed {seed}");
        testing::assert_close(paged, want, 2e-3, &format!("{what}, paged"));
        testing::assert_close(own, want, 1e-4, &format!("{what}, own cache"));
    }
}

#[test]
fn few_tokens_match_single_steps_qwen25() {
    let seed = testing::fresh_seed();
    pollster::block_on(few_tokens_match_single_steps(support::QWEN25.1, seed));
}

#[test]
fn few_tokens_match_single_steps_gemma3() {
    let seed = testing::fresh_seed();
    pollster::block_on(few_tokens_match_single_steps(support::GEMMA3.1, seed));
}
