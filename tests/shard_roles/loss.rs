//! Lost donors: the chain is re-planned on the others, or, where the donors left cannot hold
//! the model, the coordinator waits for donors to join; the ids stay the single device's.

use std::sync::{Arc, Mutex};

use webshard::front::TokenEvent;
use webshard::shard::{InProcessConfig, InProcessNetwork};

use crate::roles_support::run::*;
use crate::roles_support::*;
use crate::{support, PROMPTS};

/// SmolLM2 needs about 144 MB at this context (weights and 4 KV slots): a donor offering
/// 100 MB cannot hold it alone, two can.
pub const TOO_SMALL_ALONE: u64 = 100_000_000;

/// Two donors that each hold under the whole model; one is killed after 3 tokens and a third
/// greets the coordinator only then. The one left cannot hold the model, so the re-plan waits
/// for the newcomer instead of ending the run, and the ids are the single device's.
#[test]
fn a_loss_the_rest_cannot_hold_waits_for_a_donor_to_join() {
    let file = support::SMOLLM2.1;
    let (prompt, want) = single_device_ids(file, &PROMPTS[..1], 8)[0].clone();
    let gpu = gpu();
    let network = InProcessNetwork::new(InProcessConfig::default());
    let transport = network.join();
    let offer = |network: &InProcessNetwork| {
        spawn_donor_offering(network, &gpu, TOKEN, TOO_SMALL_ALONE, |t| t)
    };
    let mut handles: Vec<DonorHandle> = (0..2).map(|_| offer(&network)).collect();
    let mut kill = Some(handles[1].take_kill());
    let joiner = Arc::new(Mutex::new(None));
    let on_token = {
        let (joiner, gpu) = (Arc::clone(&joiner), Arc::clone(&gpu));
        move |update: &TokenEvent<'_>| {
            if update.index == 2 {
                let _ = kill.take().map(|k| k.send(()));
                let handle = spawn_donor_offering(&network, &gpu, TOKEN, TOO_SMALL_ALONE, |t| t);
                *joiner.lock().unwrap() = Some(handle);
            }
        }
    };
    let run = coordinate(
        transport,
        config(file, 2),
        vec![greedy(&prompt, 8)],
        on_token,
    );
    print_report(
        "2 donors too small alone, one killed, one joins",
        &run.report,
    );
    assert_eq!(run.outputs[0].ids, want);
    assert_eq!(run.report.recoveries, 1);
    let joiner = joiner.lock().unwrap().take().expect("a donor joined");
    let planned: Vec<&str> = run.report.plan.iter().map(|s| s.donor.as_str()).collect();
    assert_eq!(planned.len(), 2, "{planned:?}");
    assert!(
        planned.contains(&joiner.id.to_string().as_str()),
        "{planned:?}"
    );
    assert!(
        !planned.contains(&handles[1].id.to_string().as_str()),
        "{planned:?}"
    );
}

/// Kills one donor after a given number of tokens; the chain is re-planned on the others and
/// the requests replayed, and the ids are still the single device's.
#[test]
fn a_lost_donor_changes_no_token() {
    let file = support::SMOLLM2.1;
    let reference = single_device_ids(file, &PROMPTS[..1], 16);
    let (prompt, want) = reference[0].clone();
    let gpu = gpu();
    for (donors, victim, kill_at) in [(3, 0, 1), (2, 1, 3), (3, 2, 6), (2, 0, 9), (3, 1, 13)] {
        let (_network, transport, mut handles) = fleet(&gpu, donors);
        let mut kill = Some(handles[victim].take_kill());
        let on_token = move |update: &TokenEvent<'_>| {
            if update.index + 1 == kill_at {
                let _ = kill.take().map(|k| k.send(()));
            }
        };
        let run = coordinate(
            transport,
            config(file, donors),
            vec![greedy(&prompt, 16)],
            on_token,
        );
        print_report(
            &format!("{donors} donors, #{victim} killed after {kill_at}"),
            &run.report,
        );
        assert_eq!(
            run.outputs[0].ids, want,
            "{donors} donors, #{victim} killed after {kill_at}"
        );
        assert_eq!(run.report.recoveries, 1);
        assert_eq!(run.report.plan.len(), donors - 1);
        assert!(run
            .report
            .plan
            .iter()
            .all(|stage| stage.donor != handles[victim].id.to_string()));
    }
}
