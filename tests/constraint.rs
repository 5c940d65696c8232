//! Constrained decoding on SmolLM2's real vocabulary, without a GPU: the mask against a CPU
//! computation of the allowed set, greedy under a constraint against the argmax over that
//! set, and seeded random walks through 100 generated JSON Schemas, regexes and a Lark
//! grammar, every output checked by an independent validator.

use crate::constraint_support;
use crate::tokenizer_support;

use std::sync::OnceLock;

use constraint_support::{generated_schema, is_arithmetic, ARITHMETIC_LARK, REGEXES};
use serde_json::{json, Value};
use webshard::sample::{
    Constraint, ConstraintError, ConstraintSpec, Rng, Sampler, SamplerConfig, TokenView,
};
use webshard::tokenizer::Tokenizer;

fn smollm2() -> &'static (Tokenizer, TokenView) {
    static VIEW: OnceLock<(Tokenizer, TokenView)> = OnceLock::new();
    VIEW.get_or_init(|| {
        let model = &tokenizer_support::golden_models()[0];
        let tokenizer = tokenizer_support::load_tokenizer(model);
        let view = TokenView::new(&tokenizer).expect("token view");
        (tokenizer, view)
    })
}

fn random_logits(rng: &mut Rng, n: usize) -> Vec<f32> {
    (0..n)
        .map(|_| (rng.next_f64() * 20.0 - 10.0) as f32)
        .collect()
}

/// First index of the largest logit among `allowed`, computed directly.
fn argmax_among(logits: &[f32], allowed: &[u32]) -> u32 {
    let mut best = allowed[0];
    for &id in allowed {
        if logits[id as usize] > logits[best as usize] {
            best = id;
        }
    }
    best
}

fn argmax(logits: &[f32]) -> u32 {
    let all: Vec<u32> = (0..logits.len() as u32).collect();
    argmax_among(logits, &all)
}

/// The tokens that keep the output a prefix of one of `words`, plus end-of-generation ones
/// once it is one of them: the allowed set of a one-of-words constraint, by brute force.
fn reachable(tokenizer: &Tokenizer, words: &[&str], prefix: &[u8]) -> Vec<u32> {
    let complete = words.iter().any(|w| w.as_bytes() == prefix);
    (0..tokenizer.vocab_size() as u32)
        .filter(|&id| {
            if tokenizer.is_eog(id) {
                return complete;
            }
            let bytes = tokenizer.token_bytes(id);
            let mut text = prefix.to_vec();
            text.extend_from_slice(&bytes);
            !bytes.is_empty() && words.iter().any(|w| w.as_bytes().starts_with(&text))
        })
        .collect()
}

fn greedy() -> Sampler {
    Sampler::new(SamplerConfig::greedy())
}

#[test]
fn the_mask_is_the_set_of_tokens_that_keep_a_word_reachable() {
    let (tokenizer, view) = smollm2();
    let words = ["red", "redwood", "green", "blue sky", "bluebird"];
    let pattern = format!("({})", words.join("|"));
    let specs = [
        ConstraintSpec::Regex { pattern },
        ConstraintSpec::Lark {
            grammar: format!("start: {}", words.map(|w| format!("{w:?}")).join(" | ")),
        },
    ];
    for (index, spec) in specs.iter().enumerate() {
        for seed in 0..6u64 {
            let mut rng = Rng::new(seed * 31 + index as u64);
            let mut constraint = Constraint::new(view, spec).expect("compile");
            let mut prefix = Vec::new();
            loop {
                let expected = reachable(tokenizer, &words, &prefix);
                let mask = constraint.allowed().expect("mask");
                assert_eq!(mask.ids(), expected, "{spec:?} after {prefix:?}");
                let logits = random_logits(&mut rng, tokenizer.vocab_size());
                let mut masked = logits.clone();
                mask.apply(&mut masked);
                let chosen = greedy().sample(&masked, &[]);
                assert_eq!(
                    chosen,
                    argmax_among(&logits, &expected),
                    "greedy = argmax over allowed"
                );
                let free = argmax(&logits);
                if expected.contains(&free) {
                    assert_eq!(
                        chosen, free,
                        "constrained greedy keeps an allowed free choice"
                    );
                }
                constraint.commit(chosen).expect("commit");
                if tokenizer.is_eog(chosen) {
                    assert!(words.iter().any(|w| w.as_bytes() == prefix));
                    break;
                }
                prefix.extend(tokenizer.token_bytes(chosen));
                if constraint.is_complete() {
                    assert!(words.iter().any(|w| w.as_bytes() == prefix), "{prefix:?}");
                    break;
                }
            }
        }
    }
}

#[test]
fn greedy_under_a_constraint_is_the_argmax_over_the_allowed_tokens() {
    let (tokenizer, view) = smollm2();
    let specs = [
        ConstraintSpec::Json,
        ConstraintSpec::Regex {
            pattern: "[0-9]{1,6}".into(),
        },
    ];
    let mut rng = Rng::new(5);
    for spec in &specs {
        let mut constraint = Constraint::new(view, spec).expect("compile");
        for _ in 0..40 {
            let mask = constraint.allowed().expect("mask");
            let allowed = mask.ids();
            // Padded heads give more logits than tokens: those must never win.
            let mut logits = random_logits(&mut rng, tokenizer.vocab_size() + 64);
            logits[tokenizer.vocab_size() + 3] = 1e9;
            let raw = logits.clone();
            mask.apply(&mut logits);
            let chosen = greedy().sample(&logits, &[]);
            assert_eq!(chosen, argmax_among(&raw, &allowed));
            for (id, value) in logits.iter().enumerate() {
                assert_eq!(value.is_finite(), mask.is_allowed(id as u32), "id {id}");
            }
            constraint.commit(chosen).expect("commit");
            if tokenizer.is_eog(chosen) || constraint.is_complete() {
                break;
            }
        }
    }
}

/// Sampled output (temperature 1 on seeded random logits) until the constraint ends it.
/// End-of-generation logits are drawn high so that outputs end at varied lengths.
fn random_walk(spec: &ConstraintSpec, seed: u64) -> String {
    let (tokenizer, view) = smollm2();
    let mut constraint = Constraint::new(view, spec).unwrap_or_else(|e| panic!("{spec:?}: {e}"));
    let mut sampler = Sampler::new(SamplerConfig {
        temperature: 1.0,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        repeat_penalty: 1.0,
        repeat_last_n: 0,
        frequency_penalty: 0.0,
        presence_penalty: 0.0,
        seed,
    });
    let mut rng = Rng::new(seed ^ 0xA5A5);
    let mut bytes = Vec::new();
    for _ in 0..3000 {
        let mut logits = random_logits(&mut rng, tokenizer.vocab_size());
        for id in tokenizer.eog_ids() {
            logits[id as usize] = (rng.next_f64() * 20.0) as f32;
        }
        constraint.allowed().expect("mask").apply(&mut logits);
        let id = sampler.sample(&logits, &[]);
        constraint.commit(id).expect("commit");
        if tokenizer.is_eog(id) {
            break;
        }
        bytes.extend(tokenizer.token_bytes(id));
        if constraint.is_complete() {
            break;
        }
    }
    assert!(
        constraint.is_complete() || constraint.can_end(),
        "{spec:?}: no end after 3000 tokens"
    );
    String::from_utf8(bytes).expect("constrained output is UTF-8")
}

#[test]
fn hundred_generated_schemas_validate_under_random_logits() {
    for seed in 0..100u64 {
        let schema = generated_schema(seed, 2);
        let validator = jsonschema::validator_for(&schema).expect("the generated schema is valid");
        let spec = ConstraintSpec::JsonSchema {
            schema: schema.clone(),
        };
        let text = random_walk(&spec, seed);
        let value: Value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("seed {seed}: {e}: {text}"));
        let errors: Vec<String> = validator
            .iter_errors(&value)
            .map(|e| e.to_string())
            .collect();
        assert!(
            errors.is_empty(),
            "seed {seed}: {text} against {schema}: {errors:?}"
        );
    }
}

#[test]
fn tool_calls_name_a_function_with_valid_arguments() {
    let weather = json!({
        "type": "object",
        "properties": {
            "city": {"type": "string", "minLength": 1, "maxLength": 12},
            "unit": {"enum": ["celsius", "fahrenheit"]},
        },
        "required": ["city", "unit"],
        "additionalProperties": false,
    });
    let time = json!({"type": "object", "properties": {}, "additionalProperties": false});
    let tools = ConstraintSpec::tool_call([("get_weather", &weather), ("get_time", &time)]);
    for seed in 0..10 {
        let text = random_walk(&tools, seed);
        let call: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
        let parameters = match call["name"].as_str() {
            Some("get_weather") => &weather,
            Some("get_time") => &time,
            other => panic!("unknown function {other:?} in {text}"),
        };
        assert!(
            jsonschema::is_valid(parameters, &call["arguments"]),
            "{text}"
        );
    }
}

/// The call inside Hermes' tags, parsed, or None when `text` is not one.
fn hermes_call(text: &str) -> Option<Value> {
    let json = text
        .strip_prefix("<tool_call>\n")?
        .strip_suffix("\n</tool_call>")?;
    serde_json::from_str(json).ok()
}

#[test]
fn hermes_tool_calls_are_tagged_calls_or_free_text() {
    let weather = json!({
        "type": "object",
        "properties": {"city": {"type": "string", "minLength": 1, "maxLength": 12}},
        "required": ["city"],
        "additionalProperties": false,
    });
    let required = ConstraintSpec::hermes_tool_call([("get_weather", &weather)], false);
    for seed in 0..10 {
        let text = random_walk(&required, seed);
        let call = hermes_call(&text).unwrap_or_else(|| panic!("not a tagged call: {text:?}"));
        assert_eq!(call["name"], "get_weather", "{text}");
        assert!(jsonschema::is_valid(&weather, &call["arguments"]), "{text}");
        // The template's own separators, so the call reads as the model was trained on.
        assert!(
            text.starts_with("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {"),
            "{text}"
        );
    }
    let auto = ConstraintSpec::hermes_tool_call([("get_weather", &weather)], true);
    let mut texts = 0;
    for seed in 0..30 {
        let text = random_walk(&auto, seed);
        assert!(!text.starts_with('{'), "bare JSON is not text: {text}");
        match text.starts_with('<') {
            true => {
                let call = hermes_call(&text).unwrap_or_else(|| panic!("bad call: {text:?}"));
                assert!(jsonschema::is_valid(&weather, &call["arguments"]), "{text}");
            }
            false => texts += 1,
        }
    }
    assert!(texts > 0, "auto allows free text");
    // Random logits rarely pick `<` first: the call branch is open all the same.
    let (tokenizer, view) = smollm2();
    let mut constraint = Constraint::new(view, &auto).expect("compile");
    let lt = tokenizer.encode("<", false, false)[0];
    assert!(constraint.allowed().expect("mask").is_allowed(lt));
}

#[test]
fn regex_outputs_match_in_full() {
    for pattern in REGEXES {
        let full = regex::Regex::new(&format!("^(?:{pattern})$")).expect("test regex");
        let spec = ConstraintSpec::Regex {
            pattern: pattern.to_string(),
        };
        for seed in 0..10 {
            let text = random_walk(&spec, seed);
            assert!(full.is_match(&text), "{pattern}: {text:?}");
        }
    }
}

#[test]
fn lark_arithmetic_outputs_parse() {
    let spec = ConstraintSpec::Lark {
        grammar: ARITHMETIC_LARK.into(),
    };
    let mut lengths = Vec::new();
    for seed in 0..20 {
        let text = random_walk(&spec, seed);
        assert!(is_arithmetic(&text), "{text:?}");
        lengths.push(text.len());
    }
    assert!(
        lengths.iter().any(|&n| n > 3),
        "some expressions go past one number: {lengths:?}"
    );
}

#[test]
fn bad_constraints_are_clear_errors() {
    let cases = [
        (
            ConstraintSpec::Regex {
                pattern: "(ab".into(),
            },
            "regex",
        ),
        (
            ConstraintSpec::JsonSchema {
                schema: json!({"type": "wat"}),
            },
            "wat",
        ),
        (
            ConstraintSpec::JsonSchema {
                schema: json!({"$ref": "#/$defs/missing"}),
            },
            "missing",
        ),
        (
            ConstraintSpec::Lark {
                grammar: "start: nothing_defined".into(),
            },
            "nothing_defined",
        ),
    ];
    for (spec, needle) in cases {
        match spec.check() {
            Err(ConstraintError::Compile(message)) => {
                assert!(
                    message.to_lowercase().contains(needle),
                    "{spec:?}: {message}"
                )
            }
            other => panic!("{spec:?}: expected a compile error, got {other:?}"),
        }
    }
    assert_eq!(ConstraintSpec::Json.check(), Ok(()));
}

#[test]
fn specs_round_trip_with_a_type_tag() {
    let spec: ConstraintSpec =
        serde_json::from_value(json!({"type": "json_schema", "schema": {"type": "object"}}))
            .expect("tagged spec");
    assert_eq!(spec, ConstraintSpec::json_object());
    let regex = ConstraintSpec::Regex {
        pattern: "a+".into(),
    };
    let text = serde_json::to_value(&regex).expect("serialize");
    assert_eq!(text, json!({"type": "regex", "pattern": "a+"}));
}
