//! Log-probabilities through a chain: each completion token's, and its best alternatives',
//! come from the last donor's candidates and its log-sum-exp over the whole vocabulary
//! (`StageOutput::TopK`), and equal what one device's logits give for the same ids. Asking
//! for them keeps the greedy ids.

use super::PROMPTS;
use crate::roles_support::run::*;
use crate::roles_support::*;
use crate::support;
use webshard::front::TokenLogprobs;

const TOKENS: u32 = 8;
const TOP: u32 = 3;
/// A chain's logits and one device's differ by rounding only (the stages hand each other f16
/// activations: ~1e-4 relative on the logits, `verify::DEFAULT_TOLERANCE`'s note), far below
/// what a normaliser over the candidates alone, or a wrong row, would leave.
const TOLERANCE: f32 = 2e-2;

/// Every token's log-probability at each completion position, from one device's logits.
fn single_device_logprobs(file: &str, prompt: &[u32], ids: &[u32]) -> Vec<Vec<f32>> {
    pollster::block_on(async {
        let mut engine = support::load_engine_on(gpu(), file).await;
        let all: Vec<u32> = prompt.iter().chain(ids).copied().collect();
        // Row i predicts ids[i]: it is the logits after prompt + ids[..i].
        let rows = (engine.score_from(&all, prompt.len() - 1).await).expect("score");
        rows.iter()
            .take(ids.len())
            .map(|row| log_softmax(row))
            .collect()
    })
}

fn log_softmax(logits: &[f32]) -> Vec<f32> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&l| f64::from(l - max).exp()).sum();
    let norm = f64::from(max) + sum.ln();
    logits
        .iter()
        .map(|&l| (f64::from(l) - norm) as f32)
        .collect()
}

/// `|got - want|`, asserted within `TOLERANCE`.
fn assert_near(got: f32, want: f32, what: &str) -> f32 {
    let difference = (got - want).abs();
    assert!(
        difference <= TOLERANCE,
        "{what}: {got} on the chain, {want} on one device"
    );
    difference
}

/// The token's own log-probability and each alternative's match one device's for the same id;
/// the alternatives are the `TOP` best there (ranks may swap only on a near-tie). Returns the
/// largest difference.
fn assert_matches(token: &TokenLogprobs, row: &[f32], index: usize) -> f32 {
    let own = row[token.id as usize];
    let mut largest = assert_near(token.logprob, own, &format!("token {index}"));
    let mut best = row.to_vec();
    best.sort_by(|a, b| b.total_cmp(a));
    assert_eq!(
        token.top.len(),
        TOP as usize,
        "token {index}'s alternatives"
    );
    for (rank, &(id, logprob)) in token.top.iter().enumerate() {
        let what = format!("token {index}, alternative {rank} (id {id})");
        largest = largest.max(assert_near(logprob, row[id as usize], &what));
        largest = largest.max(assert_near(logprob, best[rank], &what));
    }
    // Greedy: the token is the best alternative.
    assert_eq!(token.top[0].0, token.id, "token {index}");
    largest
}

#[test]
fn log_probabilities_on_two_donors_are_the_single_device_ones() {
    let file = support::SMOLLM2.1;
    let reference = single_device_ids(file, &PROMPTS[..1], TOKENS);
    let (prompt, want) = reference[0].clone();
    let rows = single_device_logprobs(file, &prompt, &want);
    let mut request = greedy(&prompt, TOKENS);
    request.options.logprobs = Some(TOP);
    let gpu = gpu();
    let (_network, transport, _handles) = fleet(&gpu, 2);
    // As few candidates as alternatives asked for: a normaliser summed over the candidates
    // alone would then miss much of the probability, not a sliver of it.
    let mut config = config(file, 2);
    config.top_k = TOP;
    let run = coordinate(transport, config, vec![request], |_| {});
    print_report("logprobs on 2 donors", &run.report);
    assert_eq!(run.report.plan.len(), 2, "a chain of two stages");
    let output = &run.outputs[0];
    assert_eq!(
        output.ids, want,
        "asking for log-probabilities keeps the greedy ids"
    );
    let tokens = output.logprobs.as_ref().expect("log-probabilities");
    assert_eq!(tokens.len(), want.len(), "one entry per completion token");
    let mut largest = 0.0f32;
    for (index, (token, row)) in tokens.iter().zip(&rows).enumerate() {
        assert_eq!(token.id, want[index]);
        largest = largest.max(assert_matches(token, row, index));
    }
    println!("largest log-probability difference, chain against one device: {largest:e}");
}
