//! Speculative decoding with prompt-lookup drafts (`--spec lookup`) against plain decoding on
//! SmolLM2: the same ids, greedy and sampled, on an answer that copies its prompt (drafts
//! accepted, so the comparison is not vacuous) and on one that does not; rejected drafts
//! rolled back (later tokens still right, and the cache the next request reuses still holds
//! the sequence's keys and values). Plain greedy decoding at other depths of its pipeline gives
//! the same ids too. One model load for the binary.

use crate::support;

use std::ops::ControlFlow;
use std::sync::{Mutex, OnceLock};

use webshard::engine::Engine;
use webshard::front::{GenerateOptions, GenerateRequest, Generated, Generator, Prompt};
use webshard::gpu::GpuOptions;
use webshard::model::decode::DEFAULT_DEPTH;
use webshard::sample::{SamplerConfig, SpecConfig};
use webshard::tokenizer::ChatMessage;

/// An answer that copies a span of its prompt.
const REPEATS: &str = "Repeat this list exactly, once: apple, banana, cherry, grape, lemon, mango, orange, peach, plum.";
/// An answer that does not.
const FRESH: &str = "Write one sentence about the sea.";

fn engine() -> &'static Mutex<Engine> {
    static ENGINE: OnceLock<Mutex<Engine>> = OnceLock::new();
    ENGINE.get_or_init(|| {
        let file = support::SMOLLM2.1;
        Mutex::new(pollster::block_on(support::load_engine(
            file,
            GpuOptions::default(),
        )))
    })
}

fn chat(text: &str) -> Prompt {
    Prompt::Chat(vec![ChatMessage::new("user", text)])
}

fn options(max_tokens: u32, sampler: SamplerConfig) -> GenerateOptions {
    GenerateOptions {
        max_tokens,
        sampler,
        ..GenerateOptions::default()
    }
}

/// Drafts of up to 6 tokens whatever they cost (`min_gain` 0: on lavapipe a multi-token step
/// costs several plain ones, and the cost rule would pause the drafts these comparisons need),
/// each verified as soon as the lookup finds it (`confirm` 0), so that some are rejected.
fn eager() -> Option<SpecConfig> {
    Some(SpecConfig {
        confirm: 0,
        ..gated().expect("a config")
    })
}

/// As `eager`, but a draft is verified only once its lookup has come true for the built-in
/// number of plain tokens (or while a span goes on), as requests draft by default.
fn gated() -> Option<SpecConfig> {
    Some(SpecConfig {
        min_gain: 0.0,
        ..SpecConfig::lookup(6).expect("draft-max 6")
    })
}

/// One generation from an empty cache, with speculation `spec` or without.
fn run(
    engine: &mut Engine,
    prompt: Prompt,
    mut options: GenerateOptions,
    spec: Option<SpecConfig>,
) -> Generated {
    engine.reset();
    options.speculation = spec;
    let request = GenerateRequest::new(prompt, options);
    pollster::block_on(engine.generate_one(&request, &mut |_| ControlFlow::Continue(())))
        .expect("generate")
}

#[test]
fn greedy_ids_are_the_same_with_drafts_and_drafts_are_accepted() {
    let mut engine = engine().lock().unwrap_or_else(|e| e.into_inner());
    let greedy = options(14, SamplerConfig::greedy());
    let plain = run(&mut engine, chat(REPEATS), greedy.clone(), None);
    assert_eq!(plain.timings.drafted, 0, "no drafts without --spec");
    assert_eq!(
        plain.timings.verifications, 0,
        "no verifications without --spec"
    );
    for (name, config) in [("eager", eager()), ("gated", gated())] {
        let spec = run(&mut engine, chat(REPEATS), greedy.clone(), config);
        assert_eq!(
            spec.ids, plain.ids,
            "{name} ids with drafts: {:?}",
            spec.text
        );
        assert!(
            spec.timings.accepted >= 3,
            "{name}: an answer that copies its prompt accepts drafts: {} of {} ({:?})",
            spec.timings.accepted,
            spec.timings.drafted,
            spec.text
        );
        assert_spent_where_said(name, config, &spec);
    }
}

/// A speculative run's time split: each verification step gave its kept draft tokens and one
/// of its own, inside the decode time; behind the gate (`confirm` > 0) the pipelined decoder
/// started first.
fn assert_spent_where_said(name: &str, config: Option<SpecConfig>, spec: &Generated) {
    let t = &spec.timings;
    let produced = (spec.ids.len() + 1) as u32;
    assert!(
        t.verifications >= 1 && t.accepted + t.verifications <= produced,
        "{name}: {} verifications keeping {} draft tokens for {} tokens",
        t.verifications,
        t.accepted,
        spec.ids.len()
    );
    assert!(
        t.verify_seconds > 0.0 && t.verify_seconds <= t.decode_seconds,
        "{name}: verifications took {} s of a {} s decode",
        t.verify_seconds,
        t.decode_seconds
    );
    if config.is_some_and(|c| c.confirm > 0) {
        assert!(t.decoder_starts >= 1, "{name}: plain tokens come first");
    }
}

#[test]
fn greedy_ids_are_the_same_when_drafts_are_rejected() {
    let mut engine = engine().lock().unwrap_or_else(|e| e.into_inner());
    let greedy = options(24, SamplerConfig::greedy());
    let plain = run(&mut engine, chat(FRESH), greedy.clone(), None);
    let gated_run = run(&mut engine, chat(FRESH), greedy.clone(), gated());
    assert_eq!(gated_run.ids, plain.ids, "gated: {:?}", gated_run.text);
    let spec = run(&mut engine, chat(FRESH), greedy, eager());
    assert_eq!(spec.ids, plain.ids, "ids with drafts: {:?}", spec.text);
    assert!(
        spec.timings.drafted > spec.timings.accepted,
        "drafts were rejected and rolled back: {} of {}",
        spec.timings.accepted,
        spec.timings.drafted
    );
}

/// Sampling each verified position in order with the request's seeded sampler draws exactly
/// as plain decoding does, so a seed gives the same text.
#[test]
fn sampled_ids_are_the_same_for_a_seed() {
    let mut engine = engine().lock().unwrap_or_else(|e| e.into_inner());
    let sampler = SamplerConfig {
        temperature: 0.7,
        seed: 7,
        ..SamplerConfig::default()
    };
    let plain = run(
        &mut engine,
        chat(REPEATS),
        options(8, sampler.clone()),
        None,
    );
    let spec = run(&mut engine, chat(REPEATS), options(8, sampler), eager());
    assert_eq!(spec.ids, plain.ids, "ids with drafts: {:?}", spec.text);
    assert!(spec.timings.drafted > 0, "the sampled path drafted");
}

/// After a speculative answer the cache holds exactly the sequence (rejected drafts rolled
/// back), so a follow-up request reusing it continues as one from an empty cache does.
#[test]
fn the_cache_after_drafts_serves_the_next_request() {
    let mut engine = engine().lock().unwrap_or_else(|e| e.into_inner());
    let greedy = options(10, SamplerConfig::greedy());
    let first = run(&mut engine, chat(REPEATS), greedy.clone(), eager());
    assert!(first.timings.drafted > first.timings.accepted || first.timings.accepted > 0);
    let mut follow_up = first.prompt_ids.clone();
    follow_up.extend(&first.ids);
    follow_up.extend(engine.tokenize_prompt(" and then").iter().skip(1));
    let request = GenerateRequest::new(
        Prompt::Ids(follow_up.clone()),
        options(3, SamplerConfig::greedy()),
    );
    let reused =
        pollster::block_on(engine.generate_one(&request, &mut |_| ControlFlow::Continue(())))
            .expect("generate");
    assert!(
        reused.cached_tokens as usize > first.prompt_ids.len(),
        "the cache was reused"
    );
    let fresh = run(
        &mut engine,
        Prompt::Ids(follow_up),
        options(3, SamplerConfig::greedy()),
        None,
    );
    assert_eq!(
        reused.ids, fresh.ids,
        "continuation after a speculative answer"
    );
}

/// Greedy decoding keeps `set_decode_depth` steps in flight, its token fed back on the GPU:
/// one, the default two and five give the same ids; five deep, a request of 4 tokens submits 4
/// steps more than one deep (past its stop), and the cache they leave serves the next request,
/// which continues the sequence exactly.
#[test]
fn greedy_ids_are_the_same_at_every_decode_depth() {
    let mut engine = engine().lock().unwrap_or_else(|e| e.into_inner());
    let greedy = options(10, SamplerConfig::greedy());
    let default = run(&mut engine, chat(FRESH), greedy.clone(), None);
    // Four tokens one deep, then five deep: the second run's cache serves the continuation.
    let mut submits = Vec::new();
    let mut first = None;
    for depth in [1, 5] {
        engine.set_decode_depth(depth);
        let other = run(&mut engine, chat(FRESH), greedy.clone(), None);
        assert_eq!(other.ids, default.ids, "{depth} steps in flight");
        let before = engine.stage.gpu.counters.snapshot();
        first = Some(run(
            &mut engine,
            chat(FRESH),
            options(4, SamplerConfig::greedy()),
            None,
        ));
        submits.push((engine.stage.gpu.counters.snapshot() - before).submits);
    }
    assert_eq!(
        submits[1],
        submits[0] + 4,
        "submits at depth 1 and 5: {submits:?}"
    );
    let first = first.expect("the five-deep run");
    let mut sequence = first.prompt_ids.clone();
    sequence.extend(&first.ids);
    let request = GenerateRequest::new(Prompt::Ids(sequence), options(6, SamplerConfig::greedy()));
    let next =
        pollster::block_on(engine.generate_one(&request, &mut |_| ControlFlow::Continue(())))
            .expect("generate");
    engine.set_decode_depth(DEFAULT_DEPTH);
    assert!(
        next.cached_tokens as usize >= first.prompt_ids.len(),
        "the cache was reused"
    );
    assert_eq!(
        next.ids,
        default.ids[4..],
        "the continuation after a stop five steps deep"
    );
}
