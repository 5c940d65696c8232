//! Constrained output on a fleet: each request's constraint runs on the coordinator, its
//! allowed tokens go down the chain, and the last stage picks among them.

use std::ops::ControlFlow;

use serde_json::{json, Value};
use webshard::front::{FinishReason, Generator, TokenEvent};
use webshard::sample::{ConstraintError, ConstraintSpec, SamplerConfig};
use webshard::shard::roles::{Coordinator, RoleError};

use crate::roles_support::run::*;
use crate::roles_support::*;
use crate::support;

fn color_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "color": {"enum": ["red", "green", "blue"]},
            "count": {"type": "integer", "minimum": 0, "maximum": 99}
        },
        "required": ["color", "count"],
        "additionalProperties": false
    })
}

const DATE: &str = "[0-9]{4}-[0-9]{2}-[0-9]{2}";

/// A JSON Schema request, a regex request and a sampled JSON Schema request in the chain
/// together, each with its own constraint, give the single device's ids under the same
/// constraints, and end as it does when the constraint is complete. A constraint that does not compile is refused
/// before any step.
#[test]
fn constrained_requests_on_two_donors_give_the_single_device_ids() {
    let file = support::SMOLLM2.1;
    let mut requests = vec![
        constrained(
            "Pick a color and a count, as JSON:",
            24,
            ConstraintSpec::JsonSchema {
                schema: color_schema(),
            },
        ),
        constrained(
            "The date today is",
            16,
            ConstraintSpec::Regex {
                pattern: DATE.into(),
            },
        ),
    ];
    // Sampled: the last stage's top-k (64) among the allowed tokens holds the sampler's 40
    // best, so the same seed draws the same tokens as over the whole masked vocabulary.
    let mut sampled = constrained(
        "Pick a color and a count, as JSON:",
        24,
        ConstraintSpec::JsonSchema {
            schema: color_schema(),
        },
    );
    sampled.options.sampler = SamplerConfig {
        temperature: 1.0,
        seed: 15,
        ..SamplerConfig::default()
    };
    requests.push(sampled);
    let want = single_device(file, &requests);
    let gpu = gpu();
    let (_network, transport, _handles) = fleet(&gpu, 2);
    let config = config(file, 2);
    let bad = constrained(
        "x",
        4,
        ConstraintSpec::Regex {
            pattern: "(".into(),
        },
    );
    let (refused, got) = with_deadline(DEADLINE, move || {
        pollster::block_on(async move {
            let mut coordinator = Coordinator::connect(transport, config)
                .await
                .expect("connect");
            let mut on_event = |_: TokenEvent<'_>| ControlFlow::Continue(());
            let refused = coordinator.generate(&[bad], &mut on_event).await.err();
            let got = coordinator
                .generate(&requests, &mut on_event)
                .await
                .expect("generate");
            coordinator.shutdown("done").await;
            (refused, got)
        })
    });
    assert!(
        matches!(
            refused,
            Some(RoleError::Constraint(ConstraintError::Compile(_)))
        ),
        "{refused:?}"
    );
    for (index, (want, got)) in want.iter().zip(&got).enumerate() {
        println!("request {index}: {:?} ({:?})", got.text, got.finish_reason);
        assert_eq!(got.ids, want.ids, "request {index}");
        assert_eq!(got.finish_reason, want.finish_reason, "request {index}");
        assert_eq!(got.finish_reason, FinishReason::Stop, "request {index}");
    }
    for json in [&got[0], &got[2]] {
        let value: Value = serde_json::from_str(&json.text).expect("JSON");
        assert!(["red", "green", "blue"].contains(&value["color"].as_str().unwrap()));
        assert!((0..=99).contains(&value["count"].as_i64().unwrap()));
    }
    let date = regex::Regex::new(&format!("^{DATE}$")).unwrap();
    assert!(date.is_match(&got[1].text), "{:?}", got[1].text);
}
