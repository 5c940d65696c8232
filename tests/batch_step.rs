//! A batched decode step (`Stage::forward_batch_logits`, what `runner serve` runs for several
//! requests) gives each row the logits that row's own single-token step gives, on both block
//! paths: llama's (Qwen2.5, a qwen2: the llama block with q/k/v biases) and gemma3's (per-head
//! norms, post-norms into the residual, sliding window). The devices run with the GPU work
//! split, where a batched step's products go through the fused matrix-vector path one product
//! per row (on CPU adapters' own split they take the tiled kernel, covered by `api_batch`).
//! Fresh prompts each run: random ids of different lengths in the slots of one KV pool.

use crate::support;

use webshard::engine::Engine;
use webshard::gpu::{testing, BackendChoice, GpuOptions};
use webshard::model::batch::{BatchRow, RowTokens};
use webshard::model::StageInput;
use webshard::ops::attention::KvCache;

const ROWS: usize = 5;

/// Random prompts of 3 to 3 + ROWS - 1 ids, and each one's next token.
fn prompts(vocab: u32, seed: u64) -> Vec<(Vec<u32>, u32)> {
    let ids = |count: usize, salt: u64| -> Vec<u32> {
        let values = testing::random_f32(count, seed ^ salt);
        values
            .iter()
            .map(|v| ((v.abs() * 1e6) as u32) % vocab)
            .collect()
    };
    (0..ROWS)
        .map(|row| {
            let prompt = ids(3 + row, row as u64 * 31 + 1);
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

async fn check_model(file: &str, seed: u64, disable_subgroups: bool) {
    let options = GpuOptions {
        backend: BackendChoice::Vulkan,
        gpu_work_split: true,
        disable_subgroups,
        ..Default::default()
    };
    let mut engine = support::load_engine(file, options).await;
    let cases = prompts(engine.model.cfg.vocab, seed);
    let pooled = engine.stage.new_pooled_kv_caches(ROWS as u32);
    let mut slots: Vec<Option<KvCache>> = pooled.expect("a pool").into_iter().map(Some).collect();
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
    for (row, (got, want)) in batched.iter().zip(&lone).enumerate() {
        let what = format!("{file} row {row} of {ROWS}, seed {seed}");
        testing::assert_close(got, want, 2e-3, &what);
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
    pollster::block_on(check_model(support::QWEN25.1, testing::fresh_seed(), false));
}

#[test]
fn batched_rows_match_their_single_steps_gemma3() {
    pollster::block_on(check_model(support::GEMMA3.1, testing::fresh_seed(), false));
}

/// Without subgroups, lavapipe's GPU split stages Gemma 3's 640-wide rows (32 threads a row),
/// so its single steps fold the post-norms into the next products (`block::Stream`, as the
/// H200 does with subgroups of 32), while the batched rows still take separate norms.
#[test]
fn batched_rows_match_their_single_steps_gemma3_folded() {
    pollster::block_on(check_model(support::GEMMA3.1, testing::fresh_seed(), true));
}
