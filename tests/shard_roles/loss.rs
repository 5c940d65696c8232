//! Lost donors: the chain is re-planned on the others, or, where the donors left cannot hold
//! the model, the coordinator waits for donors to join; the ids stay the single device's.

use std::ops::Range;
use std::sync::{Arc, Mutex};

use webshard::front::TokenEvent;
use webshard::gguf::open_source;
use webshard::model::{OpenModel, StageSpec};
use webshard::shard::{InProcessConfig, InProcessNetwork};

use super::PROMPTS;
use crate::roles_support::run::*;
use crate::roles_support::*;
use crate::support;

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
    // Each place in the chain once, early and late; the process tests and the churn soak
    // kill more (`native-runner/tests/fleet.rs`).
    for (donors, victim, kill_at) in [(3, 0, 1), (2, 1, 3), (3, 1, 13)] {
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

/// A re-plan that moves a survivor's range keeps what it holds: of two donors one is killed
/// after 2 tokens, and the survivor, given the whole model, downloads only the tensors its
/// old stage did not hold (no layer twice, no header), with the single device's ids.
#[test]
fn a_survivor_downloads_only_the_layers_it_lacks() {
    let file = support::SMOLLM2.1;
    let (prompt, want) = single_device_ids(file, &PROMPTS[..1], 4)[0].clone();
    let gpu = gpu();
    let (_network, transport, mut handles) = fleet(&gpu, 2);
    let mut kill = Some(handles[1].take_kill());
    let survivor = Arc::clone(&handles[0].status);
    let before = Arc::new(Mutex::new(None));
    let on_token = {
        let before = Arc::clone(&before);
        move |update: &TokenEvent<'_>| {
            if update.index == 1 {
                *before.lock().unwrap() = Some(survivor.lock().unwrap().clone());
                let _ = kill.take().map(|k| k.send(()));
            }
        }
    };
    let mut config = config(file, 2);
    config.runtime.max_context = 64;
    let run = coordinate(transport, config, vec![greedy(&prompt, 4)], on_token);
    print_report("2 donors, #1 killed after 2", &run.report);
    assert_eq!(run.outputs[0].ids, want);
    assert_eq!(run.report.recoveries, 1);
    let before = before.lock().unwrap().take().expect("the kill happened");
    let after = handles[0].status();
    let (old, new) = (
        before.layers.expect("served"),
        after.layers.expect("serves"),
    );
    let (missing, whole) = tensor_bytes(file, old.clone(), new.clone());
    let fetched = after.bytes_downloaded - before.bytes_downloaded;
    eprintln!(
        "[reuse] {old:?} -> {new:?}: fetched {fetched} bytes, missing {missing}, whole {whole}"
    );
    assert_eq!(fetched, missing, "{old:?} -> {new:?}");
    assert!(missing < whole, "{old:?} -> {new:?}: nothing was reused");
}

/// Bytes of the tensors a stage over `new` needs that one over `old` does not hold, and of
/// all the tensors it needs (edges as a plan gives them: embedding first, head last).
fn tensor_bytes(file: &str, old: Range<u32>, new: Range<u32>) -> (u64, u64) {
    pollster::block_on(async {
        let source = open_source(&model_url(file)).await.expect("source");
        let model = OpenModel::read(source.as_ref()).await.expect("header");
        let n_layers = model.cfg.n_layers;
        let names = |layers: Range<u32>| {
            let spec = StageSpec {
                embedding: layers.start == 0,
                head: layers.end == n_layers,
                layers,
                max_context: 64,
                max_batch: 64,
            };
            model.tensor_plan(&spec).names
        };
        let held = names(old);
        let bytes = |name: &String| model.header.tensor(name).expect("planned").bytes;
        let needed = names(new);
        let missing = needed.iter().filter(|n| !held.contains(n)).map(bytes).sum();
        (missing, needed.iter().map(bytes).sum())
    })
}
