//! Choosing the next token from logits, in llama.cpp's default chain order:
//! repetition penalty → frequency/presence penalties → top-k → top-p → min-p → temperature →
//! seeded draw.
//!
//! As in llama.cpp, top-p and min-p look at the untempered distribution; temperature only
//! reshapes what survives them. A temperature of zero or less means greedy (argmax after the
//! penalty).

use serde::{Deserialize, Serialize};

use super::rng::Rng;

/// Sampling settings; each filter is off at its neutral value.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SamplerConfig {
    /// Divides logits before the draw; `<= 0` is greedy.
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens; `0` is off.
    pub top_k: usize,
    /// Keep the smallest set of most likely tokens whose probability reaches `top_p`; `>= 1` is off.
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` times the most likely one; `<= 0` is off.
    pub min_p: f32,
    /// Penalty for tokens in the last `repeat_last_n` of the history; `1` is off.
    pub repeat_penalty: f32,
    /// How much history the penalty looks at; `0` is off.
    pub repeat_last_n: usize,
    /// OpenAI's `frequency_penalty`: subtracted from a token's logit once per time it occurs
    /// in the completion so far; `0` is off.
    #[serde(default)]
    pub frequency_penalty: f32,
    /// OpenAI's `presence_penalty`: subtracted once from the logit of every token that occurs
    /// in the completion so far; `0` is off.
    #[serde(default)]
    pub presence_penalty: f32,
    /// Seed of the draw: the same seed, logits and history give the same tokens.
    pub seed: u64,
}

impl Default for SamplerConfig {
    /// llama.cpp's defaults.
    fn default() -> SamplerConfig {
        SamplerConfig {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            seed: 0,
        }
    }
}

impl SamplerConfig {
    /// Plain argmax, no penalty.
    pub fn greedy() -> SamplerConfig {
        SamplerConfig {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repeat_penalty: 1.0,
            repeat_last_n: 0,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            seed: 0,
        }
    }

    /// Whether the choice is deterministic argmax (temperature `<= 0` or `top_k == 1`).
    pub fn is_greedy(&self) -> bool {
        self.temperature <= 0.0 || self.top_k == 1
    }

    /// Whether the next token is the plain argmax of the logits (greedy, no penalty), which
    /// the device can pick itself instead of sending the logits back. Any penalty changes
    /// which token is the argmax, so the logits come back and the CPU takes it.
    pub fn argmax_suffices(&self) -> bool {
        self.is_greedy() && !self.penalises()
    }

    /// How many of the best logits decide the draw exactly as the whole vector would, when at
    /// most `max` can be had (below the vocabulary's size: a top-k keeping every id leaves them
    /// in id order, which the best k in order would not match): 1 for greedy, `top_k` when it
    /// is on and within `max`. `None`
    /// when the sampler needs every logit: a penalty (it changes logits by the history, so
    /// the best ones before it are not the best after) or top-k off or beyond `max`.
    pub fn candidates_needed(&self, max: usize) -> Option<usize> {
        if self.penalises() {
            return None;
        }
        match self.top_k {
            _ if self.is_greedy() => Some(1),
            k @ 1.. if k <= max => Some(k),
            _ => None,
        }
    }

    /// Whether any penalty (repetition, frequency, presence) can change a logit.
    pub fn penalises(&self) -> bool {
        (self.repeat_penalty != 1.0 && self.repeat_last_n > 0)
            || self.frequency_penalty != 0.0
            || self.presence_penalty != 0.0
    }
}

#[derive(Clone, Copy, Debug)]
struct Candidate {
    id: u32,
    logit: f32,
}

/// Descending by logit; ties by ascending id so the order never depends on the input order.
fn by_logit_desc(a: &Candidate, b: &Candidate) -> std::cmp::Ordering {
    b.logit.total_cmp(&a.logit).then(a.id.cmp(&b.id))
}

/// A sampler with its own seeded random stream.
#[derive(Clone, Debug)]
pub struct Sampler {
    config: SamplerConfig,
    rng: Rng,
    candidates: Vec<Candidate>,
}

impl Sampler {
    pub fn new(config: SamplerConfig) -> Sampler {
        Sampler {
            rng: Rng::new(config.seed),
            config,
            candidates: Vec::new(),
        }
    }

    pub fn config(&self) -> &SamplerConfig {
        &self.config
    }

    /// Picks the next token. `history` is every token so far, oldest first, all of it counted
    /// as completion by the frequency and presence penalties (see `sample_completion`).
    /// Empty `logits` give token 0; NaN logits count as impossible.
    pub fn sample(&mut self, logits: &[f32], history: &[u32]) -> u32 {
        self.sample_completion(logits, history, 0)
    }

    /// `sample` where `history[prompt_len..]` is the completion: the repetition penalty looks
    /// at the whole history (llama.cpp), the frequency and presence penalties only at the
    /// completion (OpenAI).
    pub fn sample_completion(&mut self, logits: &[f32], history: &[u32], prompt_len: usize) -> u32 {
        self.candidates.clear();
        self.candidates
            .extend(logits.iter().enumerate().map(|(id, &logit)| Candidate {
                id: id as u32,
                logit: possible_or_not(logit),
            }));
        if self.candidates.is_empty() {
            return 0;
        }
        apply_repeat_penalty(&mut self.candidates, history, &self.config);
        let completion = history.get(prompt_len..).unwrap_or_default();
        apply_occurrence_penalties(&mut self.candidates, completion, &self.config);
        self.choose()
    }

    /// Picks the next token from only the best logits: `ids` and their `values`, best first
    /// (lower id first on ties), as many as `SamplerConfig::candidates_needed` said (the GPU's
    /// masked top-k). The same token and random stream as `sample` on the whole vector.
    pub fn sample_among(&mut self, ids: &[u32], values: &[f32]) -> u32 {
        self.candidates.clear();
        self.candidates
            .extend(ids.iter().zip(values).map(|(&id, &logit)| Candidate {
                id,
                logit: possible_or_not(logit),
            }));
        if self.candidates.is_empty() {
            return 0;
        }
        self.choose()
    }

    /// The filters and the draw over `self.candidates` (penalties already applied).
    fn choose(&mut self) -> u32 {
        if self.config.is_greedy() {
            return argmax(&self.candidates);
        }
        let config = self.config.clone();
        keep_top_k(&mut self.candidates, config.top_k);
        keep_top_p(&mut self.candidates, config.top_p);
        keep_min_p(&mut self.candidates, config.min_p);
        let temperature = config.temperature;
        for c in &mut self.candidates {
            c.logit /= temperature;
        }
        draw(&self.candidates, self.rng.next_f64())
    }
}

/// A NaN logit counts as impossible (−∞).
fn possible_or_not(logit: f32) -> f32 {
    if logit.is_nan() {
        f32::NEG_INFINITY
    } else {
        logit
    }
}

/// llama.cpp's penalty: each distinct recent token's logit is divided by the penalty when
/// positive and multiplied by it when not, so the token always becomes less likely.
fn apply_repeat_penalty(candidates: &mut [Candidate], history: &[u32], config: &SamplerConfig) {
    if config.repeat_penalty == 1.0 || config.repeat_last_n == 0 {
        return;
    }
    let window = &history[history.len().saturating_sub(config.repeat_last_n)..];
    let mut seen = std::collections::HashSet::with_capacity(window.len());
    for &id in window {
        // `candidates` is still indexed by id here.
        let Some(c) = candidates.get_mut(id as usize) else {
            continue;
        };
        if !seen.insert(id) {
            continue;
        }
        if c.logit <= 0.0 {
            c.logit *= config.repeat_penalty;
        } else {
            c.logit /= config.repeat_penalty;
        }
    }
}

/// OpenAI's penalties: `logit -= count * frequency_penalty + (count > 0) * presence_penalty`
/// for each token that occurs `count` times in the completion.
fn apply_occurrence_penalties(
    candidates: &mut [Candidate],
    completion: &[u32],
    config: &SamplerConfig,
) {
    if config.frequency_penalty == 0.0 && config.presence_penalty == 0.0 {
        return;
    }
    let mut counts = std::collections::HashMap::with_capacity(completion.len());
    for &id in completion {
        *counts.entry(id).or_insert(0u32) += 1;
    }
    for (id, count) in counts {
        // `candidates` is still indexed by id here.
        if let Some(c) = candidates.get_mut(id as usize) {
            c.logit -= count as f32 * config.frequency_penalty + config.presence_penalty;
        }
    }
}

/// First index of the largest logit (llama.cpp's greedy tie-break).
fn argmax(candidates: &[Candidate]) -> u32 {
    let mut best = candidates[0];
    for &c in &candidates[1..] {
        if c.logit > best.logit {
            best = c;
        }
    }
    best.id
}

/// Moves the `k` best candidates to the front, sorted; the rest stay after them unsorted.
fn sort_prefix(candidates: &mut [Candidate], k: usize) {
    let k = k.min(candidates.len());
    if k < candidates.len() {
        candidates.select_nth_unstable_by(k, by_logit_desc);
    }
    candidates[..k].sort_unstable_by(by_logit_desc);
}

fn keep_top_k(candidates: &mut Vec<Candidate>, k: usize) {
    if k == 0 || k >= candidates.len() {
        return;
    }
    sort_prefix(candidates, k);
    candidates.truncate(k);
}

/// Keeps the shortest most-likely prefix whose probability mass reaches `p` (at least one).
fn keep_top_p(candidates: &mut Vec<Candidate>, p: f32) {
    if p >= 1.0 || candidates.len() <= 1 {
        return;
    }
    let max = candidates
        .iter()
        .map(|c| c.logit)
        .fold(f32::NEG_INFINITY, f32::max);
    let total: f64 = candidates
        .iter()
        .map(|c| ((c.logit - max) as f64).exp())
        .sum();
    // Sort only as much as needed: grow the sorted prefix until it holds the nucleus.
    let mut sorted = 0;
    let mut chunk = 64;
    let mut cumulative = 0.0f64;
    loop {
        let upto = (sorted + chunk).min(candidates.len());
        sort_prefix(&mut candidates[sorted..], upto - sorted);
        for i in sorted..upto {
            cumulative += ((candidates[i].logit - max) as f64).exp() / total;
            if cumulative >= p as f64 {
                candidates.truncate(i + 1);
                return;
            }
        }
        if upto == candidates.len() {
            return;
        }
        sorted = upto;
        chunk *= 4;
    }
}

/// Keeps tokens with probability at least `p` times the top one (compared in logit space).
fn keep_min_p(candidates: &mut Vec<Candidate>, p: f32) {
    if p <= 0.0 || candidates.is_empty() {
        return;
    }
    let max = candidates
        .iter()
        .map(|c| c.logit)
        .fold(f32::NEG_INFINITY, f32::max);
    let threshold = max + p.ln();
    candidates.retain(|c| c.logit >= threshold);
}

/// Draws from the softmax of the candidates' logits with the uniform `u` in `[0, 1)`.
fn draw(candidates: &[Candidate], u: f64) -> u32 {
    let max = candidates
        .iter()
        .map(|c| c.logit)
        .fold(f32::NEG_INFINITY, f32::max);
    if max == f32::NEG_INFINITY {
        return argmax(candidates);
    }
    let weights: Vec<f64> = candidates
        .iter()
        .map(|c| ((c.logit - max) as f64).exp())
        .collect();
    let total: f64 = weights.iter().sum();
    let mut target = u * total;
    for (c, w) in candidates.iter().zip(&weights) {
        if target < *w {
            return c.id;
        }
        target -= w;
    }
    // Rounding left a sliver past the last weight: take the last possible token.
    candidates
        .iter()
        .zip(&weights)
        .rev()
        .find(|(_, &w)| w > 0.0)
        .map_or(candidates[0].id, |(c, _)| c.id)
}

/// `ln Σ exp(logit)`, summed in f64 after the largest is taken out (no overflow); at least the
/// largest logit. Non-finite logits give a non-finite result, which the frame check refuses.
pub fn log_sum_exp(logits: &[f32]) -> f32 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&l| f64::from(l - max).exp()).sum();
    (f64::from(max) + sum.ln()) as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cands(logits: &[f32]) -> Vec<Candidate> {
        logits
            .iter()
            .enumerate()
            .map(|(id, &logit)| Candidate {
                id: id as u32,
                logit,
            })
            .collect()
    }

    fn ids(c: &[Candidate]) -> Vec<u32> {
        let mut v: Vec<u32> = c.iter().map(|c| c.id).collect();
        v.sort_unstable();
        v
    }

    #[test]
    fn top_p_keeps_the_minimal_nucleus_across_sort_chunks() {
        // 300 tokens: one holding half the mass, 299 sharing the other half (1/598 each).
        let mut logits = vec![0.0f32; 300];
        logits[123] = (299.0f32).ln();
        let mut c = cands(&logits);
        keep_top_p(&mut c, 0.49);
        assert_eq!(ids(&c), vec![123]);
        // 0.51 needs six small ones: 0.5 + 6/598 >= 0.51 > 0.5 + 5/598.
        let mut c = cands(&logits);
        keep_top_p(&mut c, 0.51);
        assert_eq!(c.len(), 7);
        // Needing 200 of the small ones crosses the first sorted chunk of 64.
        let mut c = cands(&logits);
        keep_top_p(&mut c, 0.5 + 200.0 / 598.0 - 1e-6);
        assert_eq!(c.len(), 201);
    }

    #[test]
    fn draw_follows_weights_at_the_edges() {
        let c = cands(&[0.0, 0.0]);
        assert_eq!(draw(&c, 0.0), 0);
        assert_eq!(draw(&c, 0.49), 0);
        assert_eq!(draw(&c, 0.51), 1);
        assert_eq!(draw(&c, 0.999_999), 1);
        let c = cands(&[f32::NEG_INFINITY, 1.0]);
        assert_eq!(draw(&c, 0.0), 1);
    }

    #[test]
    fn log_sum_exp_is_exact_without_overflow_and_at_least_the_largest() {
        assert!((log_sum_exp(&[0.0, 0.0]) - std::f32::consts::LN_2).abs() < 1e-7);
        // exp(1000) overflows f32 and f64: the largest is taken out first.
        let big = log_sum_exp(&[1000.0, 1000.0, -5.0]);
        assert!(
            (big - (1000.0 + std::f32::consts::LN_2)).abs() < 1e-3,
            "{big}"
        );
        let logits = [3.5, -1.25, 0.0, 2.0, -30.0];
        let want = logits.iter().map(|&l| f64::from(l).exp()).sum::<f64>().ln();
        assert!((f64::from(log_sum_exp(&logits)) - want).abs() < 1e-6);
        assert!(log_sum_exp(&[-3.0]) >= -3.0);
        assert!(!log_sum_exp(&[1.0, f32::NAN]).is_finite());
    }
}
