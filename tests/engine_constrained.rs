//! Constrained decoding through the engine, where the GPU masks the logits and reads back only
//! the argmax: every greedy token is the best allowed one of the step's logits, computed here
//! on the CPU from teacher-forced logits and a replayed constraint. Sampling reads back only
//! the top k; `tests/sampler.rs` proves that draw equal to one from the whole masked vector.

use crate::support;

use std::ops::ControlFlow;

use serde_json::json;
use webshard::front::{GenerateOptions, GenerateRequest, Generator, Prompt};
use webshard::gpu::GpuOptions;
use webshard::sample::{Constraint, ConstraintSpec, SamplerConfig};
use webshard::tokenizer::ChatMessage;

/// Logits of the decode path and of teacher-forced scoring differ by rounding: a token
/// within this of the best allowed logit is a tie the two paths may break differently.
const NEAR_TIE: f32 = 0.02;

#[test]
fn constrained_greedy_is_the_argmax_over_the_allowed_tokens() {
    pollster::block_on(async {
        let backend = support::backends()[0];
        let options = GpuOptions {
            backend,
            ..Default::default()
        };
        let mut engine = support::load_engine(support::SMOLLM2.1, options).await;
        let spec = ConstraintSpec::JsonSchema {
            schema: json!({
                "type": "object",
                "properties": {
                    "name": {"type": "string", "maxLength": 8},
                    "age": {"type": "integer", "minimum": 0, "maximum": 120},
                },
                "required": ["name", "age"],
            }),
        };
        let ask = ChatMessage::new("user", "Give a person as JSON.");
        let request = GenerateRequest::new(
            Prompt::Chat(vec![ask]),
            GenerateOptions {
                max_tokens: 10,
                sampler: SamplerConfig::greedy(),
                stop: Vec::new(),
                constraint: Some(spec.clone()),
                ..GenerateOptions::default()
            },
        );
        let out = engine
            .generate_one(&request, &mut |_| ControlFlow::Continue(()))
            .await
            .expect("constrained generation");
        assert!(!out.ids.is_empty(), "no tokens");

        let all: Vec<u32> = out.prompt_ids.iter().chain(&out.ids).copied().collect();
        let rows = engine.score(&all).await.expect("teacher-forced logits");
        let mut constraint = Constraint::new(&engine.token_view().unwrap(), &spec).unwrap();
        let prompt_len = out.prompt_ids.len();
        for (step, &id) in out.ids.iter().enumerate() {
            let mask = constraint.allowed().expect("a mask");
            let logits = &rows[prompt_len - 1 + step];
            let allowed = mask.ids();
            let best = allowed
                .iter()
                .copied()
                .filter(|&a| (a as usize) < logits.len())
                .max_by(|&a, &b| {
                    logits[a as usize]
                        .total_cmp(&logits[b as usize])
                        .then(b.cmp(&a))
                })
                .expect("an allowed token");
            assert!(
                mask.is_allowed(id),
                "step {step}: token {id} is not allowed ({} allowed)",
                allowed.len()
            );
            let gap = logits[best as usize] - logits[id as usize];
            assert!(
                id == best || gap <= NEAR_TIE,
                "step {step}: the engine chose {id} (logit {}), the best allowed is {best} (logit {}) of {} allowed",
                logits[id as usize],
                logits[best as usize],
                allowed.len()
            );
            constraint.commit(id).expect("commit");
        }
        println!(
            "{} constrained greedy tokens checked: {:?}",
            out.ids.len(),
            out.text
        );
    });
}
