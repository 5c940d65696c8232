//! Properties of every sampler option, each checked where it could fail.

use webshard::sample::{Rng, Sampler, SamplerConfig, StopChecker, StopReason};
use webshard::tokenizer::{Tokenizer, Vocab};

/// Sampling with temperature 1 and every filter off.
fn plain(seed: u64) -> SamplerConfig {
    SamplerConfig {
        temperature: 1.0,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        repeat_penalty: 1.0,
        repeat_last_n: 0,
        frequency_penalty: 0.0,
        presence_penalty: 0.0,
        seed,
    }
}

fn random_logits(rng: &mut Rng, n: usize) -> Vec<f32> {
    (0..n)
        .map(|_| (rng.next_f64() * 20.0 - 10.0) as f32)
        .collect()
}

fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &l) in logits.iter().enumerate() {
        if l > logits[best] {
            best = i;
        }
    }
    best as u32
}

fn softmax(logits: &[f32], temperature: f32) -> Vec<f64> {
    let max = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
    let w: Vec<f64> = logits
        .iter()
        .map(|&l| (((l - max) / temperature) as f64).exp())
        .collect();
    let total: f64 = w.iter().sum();
    w.iter().map(|x| x / total).collect()
}

fn frequencies(sampler: &mut Sampler, logits: &[f32], draws: usize) -> Vec<f64> {
    let mut counts = vec![0usize; logits.len()];
    for _ in 0..draws {
        counts[sampler.sample(logits, &[]) as usize] += 1;
    }
    counts.iter().map(|&c| c as f64 / draws as f64).collect()
}

#[test]
fn top_k_one_and_zero_temperature_are_argmax() {
    let mut rng = Rng::new(42);
    for trial in 0..200 {
        let logits = random_logits(&mut rng, 1000);
        let want = argmax(&logits);
        let mut top1 = Sampler::new(SamplerConfig {
            top_k: 1,
            temperature: 1.5,
            ..plain(trial)
        });
        assert_eq!(top1.sample(&logits, &[]), want);
        let mut greedy = Sampler::new(SamplerConfig::greedy());
        assert_eq!(greedy.sample(&logits, &[]), want);
    }
    assert!(SamplerConfig::greedy().is_greedy());
    assert!(SamplerConfig {
        top_k: 1,
        ..plain(0)
    }
    .is_greedy());
    assert!(!plain(0).is_greedy());
}

#[test]
fn greedy_ties_go_to_the_lowest_id_and_nan_never_wins() {
    let mut s = Sampler::new(SamplerConfig::greedy());
    assert_eq!(s.sample(&[1.0, 3.0, 3.0, 2.0], &[]), 1);
    assert_eq!(s.sample(&[f32::NAN, 0.5, f32::NAN], &[]), 1);
    let mut s = Sampler::new(plain(3));
    for _ in 0..100 {
        assert_eq!(s.sample(&[f32::NAN, 0.0, f32::NAN], &[]), 1);
    }
}

#[test]
fn draws_follow_the_tempered_softmax() {
    let logits = [1.0, 2.0, 3.0, 0.5, -1.0];
    for temperature in [0.7f32, 1.0, 1.8] {
        let mut s = Sampler::new(SamplerConfig {
            temperature,
            ..plain(11)
        });
        let got = frequencies(&mut s, &logits, 200_000);
        let want = softmax(&logits, temperature);
        for (g, w) in got.iter().zip(&want) {
            // Standard error is at most 0.0012 at 200k draws.
            assert!(
                (g - w).abs() < 0.006,
                "t={temperature}: got {got:?} want {want:?}"
            );
        }
    }
}

#[test]
fn top_k_keeps_only_the_k_best_in_softmax_proportion() {
    let logits = [0.0, 3.0, 1.0, 2.9, 2.0];
    let mut s = Sampler::new(SamplerConfig {
        top_k: 2,
        ..plain(5)
    });
    let got = frequencies(&mut s, &logits, 100_000);
    let pair = softmax(&[3.0, 2.9], 1.0);
    assert_eq!(got[0] + got[2] + got[4], 0.0, "{got:?}");
    assert!((got[1] - pair[0]).abs() < 0.01, "{got:?}");
    assert!((got[3] - pair[1]).abs() < 0.01, "{got:?}");
}

#[test]
fn top_p_keeps_the_minimal_nucleus() {
    // Probabilities 0.4, 0.3, 0.2, 0.1 (in shuffled id order).
    let probs = [0.2f32, 0.4, 0.1, 0.3];
    let logits: Vec<f32> = probs.iter().map(|p| p.ln()).collect();
    // p = 0.65 needs 0.4 + 0.3 = 0.7: ids 1 and 3, never 0 or 2.
    let mut s = Sampler::new(SamplerConfig {
        top_p: 0.65,
        ..plain(9)
    });
    let got = frequencies(&mut s, &logits, 50_000);
    assert_eq!(got[0] + got[2], 0.0, "{got:?}");
    assert!((got[1] - 0.4 / 0.7).abs() < 0.01, "{got:?}");
    // p = 0.75 needs the third token too, but still not the fourth.
    let mut s = Sampler::new(SamplerConfig {
        top_p: 0.75,
        ..plain(9)
    });
    let got = frequencies(&mut s, &logits, 50_000);
    assert!(got[0] > 0.2, "{got:?}");
    assert_eq!(got[2], 0.0, "{got:?}");
}

#[test]
fn top_p_on_a_large_vocabulary_matches_a_full_sort() {
    let mut rng = Rng::new(77);
    let logits = random_logits(&mut rng, 50_000);
    let probs = softmax(&logits, 1.0);
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| probs[b].total_cmp(&probs[a]));
    let p = 0.9;
    let mut cumulative = 0.0;
    let nucleus_len = order
        .iter()
        .position(|&i| {
            cumulative += probs[i];
            cumulative >= p
        })
        .expect("mass reaches p")
        + 1;
    let mut allowed = vec![false; logits.len()];
    for &i in &order[..nucleus_len] {
        allowed[i] = true;
    }
    let mut s = Sampler::new(SamplerConfig {
        top_p: p as f32,
        ..plain(1)
    });
    for _ in 0..2_000 {
        let id = s.sample(&logits, &[]) as usize;
        assert!(
            allowed[id],
            "token {id} outside the {nucleus_len}-token nucleus"
        );
    }
}

#[test]
fn min_p_drops_tokens_below_the_fraction_of_the_best() {
    // Probabilities 0.5, 0.3, 0.15, 0.05; min_p 0.2 cuts below 0.1.
    let logits: Vec<f32> = [0.5f32, 0.3, 0.15, 0.05].iter().map(|p| p.ln()).collect();
    let mut s = Sampler::new(SamplerConfig {
        min_p: 0.2,
        ..plain(4)
    });
    let got = frequencies(&mut s, &logits, 50_000);
    assert_eq!(got[3], 0.0, "{got:?}");
    assert!((got[2] - 0.15 / 0.95).abs() < 0.01, "{got:?}");
    // min_p 0.35 also cuts the 0.15 token.
    let mut s = Sampler::new(SamplerConfig {
        min_p: 0.35,
        ..plain(4)
    });
    let got = frequencies(&mut s, &logits, 50_000);
    assert_eq!(got[2] + got[3], 0.0, "{got:?}");
}

#[test]
fn repeat_penalty_changes_the_choice_over_its_window() {
    let penalised = |history: &[u32], logits: &[f32], last_n: usize| {
        let mut s = Sampler::new(SamplerConfig {
            repeat_penalty: 1.1,
            repeat_last_n: last_n,
            ..SamplerConfig::greedy()
        });
        s.sample(logits, history)
    };
    // Positive logits are divided: 2.0 / 1.1 < 1.9.
    assert_eq!(penalised(&[], &[2.0, 1.9], 64), 0);
    assert_eq!(penalised(&[0], &[2.0, 1.9], 64), 1);
    // Negative logits are multiplied: -1.0 * 1.1 < -1.05.
    assert_eq!(penalised(&[0], &[-1.0, -1.05], 64), 1);
    // Repeats count once: three occurrences still only divide by 1.1 (2.0/1.1 > 1.8).
    assert_eq!(penalised(&[0, 0, 0], &[2.0, 1.8], 64), 0);
    // Outside the window the token is not penalised.
    assert_eq!(penalised(&[0, 1], &[2.0, 1.9], 1), 0);
    // Out-of-vocabulary history ids are ignored, not a panic.
    assert_eq!(penalised(&[99], &[2.0, 1.9], 64), 0);
}

/// OpenAI's penalties computed on the CPU from the definition: each token's logit lowered by
/// its count in the completion times `frequency` plus `presence` once it occurs at all.
fn penalised_reference(
    logits: &[f32],
    completion: &[u32],
    frequency: f32,
    presence: f32,
) -> Vec<f32> {
    let mut out = logits.to_vec();
    for (id, logit) in out.iter_mut().enumerate() {
        let count = completion.iter().filter(|&&t| t as usize == id).count();
        if count > 0 {
            *logit -= count as f32 * frequency + presence;
        }
    }
    out
}

#[test]
fn frequency_and_presence_penalties_give_the_penalised_argmax() {
    let mut rng = Rng::new(2024);
    let vocab = 300;
    for trial in 0..300 {
        // Narrow logits so the penalties often change the winner.
        let logits: Vec<f32> = random_logits(&mut rng, vocab)
            .iter()
            .map(|l| l * 0.05)
            .collect();
        let history: Vec<u32> = (0..40)
            .map(|_| (rng.next_f64() * vocab as f64) as u32)
            .collect();
        let prompt_len = (rng.next_f64() * 20.0) as usize;
        let frequency = (rng.next_f64() * 4.0 - 2.0) as f32;
        let presence = (rng.next_f64() * 4.0 - 2.0) as f32;
        let config = SamplerConfig {
            frequency_penalty: frequency,
            presence_penalty: presence,
            ..SamplerConfig::greedy()
        };
        assert!(
            !config.argmax_suffices(),
            "a penalty needs the logits on the CPU"
        );
        let want = argmax(&penalised_reference(
            &logits,
            &history[prompt_len..],
            frequency,
            presence,
        ));
        let got = Sampler::new(config).sample_completion(&logits, &history, prompt_len);
        assert_eq!(got, want, "trial {trial}");
    }
}

#[test]
fn zero_penalties_change_nothing_and_the_prompt_is_not_penalised() {
    let mut rng = Rng::new(7);
    let logits = random_logits(&mut rng, 100);
    let best = argmax(&logits);
    let zero = SamplerConfig::greedy();
    assert!(zero.argmax_suffices() && !zero.penalises());
    assert_eq!(
        Sampler::new(zero).sample_completion(&logits, &[best, best], 0),
        best
    );
    let heavy = SamplerConfig {
        frequency_penalty: 2.0,
        presence_penalty: 2.0,
        ..SamplerConfig::greedy()
    };
    // The best token only in the prompt keeps its logit; in the completion it loses it.
    assert_eq!(
        Sampler::new(heavy.clone()).sample_completion(&logits, &[best], 1),
        best
    );
    let mut flat = vec![0.0f32; 4];
    flat[2] = 1.0;
    assert_eq!(Sampler::new(heavy).sample_completion(&flat, &[2], 0), 0);
}

#[test]
fn seeds_reproduce_and_differ() {
    let mut rng = Rng::new(5);
    let logits = random_logits(&mut rng, 1000)
        .iter()
        .map(|l| l * 0.1)
        .collect::<Vec<_>>();
    let run = |seed: u64| {
        let mut s = Sampler::new(SamplerConfig {
            seed,
            ..SamplerConfig::default()
        });
        (0..50)
            .map(|_| s.sample(&logits, &[]))
            .collect::<Vec<u32>>()
    };
    assert_eq!(run(1), run(1));
    assert_ne!(run(1), run(2));
}

fn tiny_tokenizer() -> Tokenizer {
    let tokens = ["<unk>", "<s>", "</s>", "▁Hello", "▁wor", "ld", "!"];
    Tokenizer::from_vocab(Vocab {
        model: "llama".into(),
        tokens: tokens.iter().map(|t| t.to_string()).collect(),
        token_types: vec![2, 3, 3, 1, 1, 1, 1],
        ..Vocab::default()
    })
    .expect("tokenizer")
}

#[test]
fn stop_checker_stops_on_eog_and_on_streamed_stop_strings() {
    let tok = tiny_tokenizer();
    let mut stop = StopChecker::new(["world"]);
    assert_eq!(stop.push_token(&tok, 3).text, " Hello");
    assert_eq!(
        stop.push_token(&tok, 4).text,
        " ",
        "\"wor\" may start \"world\""
    );
    let step = stop.push_token(&tok, 5);
    assert_eq!(step.text, "");
    assert_eq!(step.stop, Some(StopReason::StopString("world".into())));

    let mut stop = StopChecker::new(Vec::<String>::new());
    assert_eq!(stop.push_token(&tok, 3).text, " Hello");
    let step = stop.push_token(&tok, 2);
    assert_eq!(step.stop, Some(StopReason::EndOfGeneration(2)));
    assert_eq!(stop.push_token(&tok, 6).text, "", "nothing after the end");
}

/// The ids of the `k` best logits and their values, best first, lower id first on ties: what
/// the GPU's top-k reads back.
fn best_k(logits: &[f32], k: usize) -> (Vec<u32>, Vec<f32>) {
    let mut order: Vec<u32> = (0..logits.len() as u32).collect();
    order.sort_by(|&a, &b| {
        logits[b as usize]
            .total_cmp(&logits[a as usize])
            .then(a.cmp(&b))
    });
    order.truncate(k);
    let values = order.iter().map(|&id| logits[id as usize]).collect();
    (order, values)
}

#[test]
fn sampling_among_the_top_k_draws_as_sampling_the_whole_vector() {
    let mut rng = Rng::new(20_261_201);
    for trial in 0..300u64 {
        // More ids than k: a top-k that keeps every id leaves them in id order, not sorted.
        let n = 65 + (rng.next_f64() * 2000.0) as usize;
        let mut logits = random_logits(&mut rng, n);
        // A masked step: most ids at -inf, sometimes fewer allowed than k.
        let keep = 1 + (rng.next_f64() * 120.0) as usize;
        for (id, logit) in logits.iter_mut().enumerate() {
            if (id * 7 + trial as usize) % n >= keep {
                *logit = f32::NEG_INFINITY;
            }
        }
        let k = 1 + (rng.next_f64() * 64.0) as usize;
        let config = SamplerConfig {
            temperature: 0.2 + rng.next_f64() as f32 * 1.5,
            top_k: k,
            top_p: [1.0, 0.9, 0.5][trial as usize % 3],
            min_p: [0.0, 0.05][trial as usize % 2],
            seed: trial,
            ..plain(trial)
        };
        assert_eq!(config.candidates_needed(64), Some(k), "trial {trial}");
        let (ids, values) = best_k(&logits, k);
        let mut whole = Sampler::new(config.clone());
        let mut among = Sampler::new(config);
        for draw in 0..4 {
            assert_eq!(
                among.sample_among(&ids, &values),
                whole.sample(&logits, &[]),
                "trial {trial} draw {draw}: n={n} k={k} allowed={keep}"
            );
        }
    }
}

#[test]
fn penalties_and_top_k_off_need_every_logit() {
    let greedy = SamplerConfig::greedy();
    assert_eq!(greedy.candidates_needed(64), Some(1));
    let penalised = SamplerConfig {
        frequency_penalty: 0.5,
        ..greedy.clone()
    };
    assert_eq!(penalised.candidates_needed(64), None);
    assert_eq!(plain(1).candidates_needed(64), None, "top-k off");
    let wide = SamplerConfig {
        top_k: 65,
        ..plain(1)
    };
    assert_eq!(wide.candidates_needed(64), None);
    let repeat = SamplerConfig {
        top_k: 40,
        repeat_penalty: 1.1,
        repeat_last_n: 64,
        ..plain(1)
    };
    assert_eq!(repeat.candidates_needed(64), None);
}
