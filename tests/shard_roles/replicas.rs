//! Replicas: four donors as two chains serving different requests at once, or as one deeper
//! chain when memory says so; a lost donor recovers inside its chain, and a chain that can no
//! longer hold the model hands its requests to the other, when spread up front and when fed.
//! Every request gets the single device's greedy ids.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use futures::channel::oneshot;
use webshard::front::TokenEvent;
use webshard::shard::roles::ChainCount;
use webshard::shard::{InProcessConfig, InProcessNetwork, InProcessTransport, PeerId, Plan};

use super::loss::TOO_SMALL_ALONE;
use super::PROMPTS;
use crate::roles_support::run::*;
use crate::roles_support::*;
use crate::support;

const TOKENS: u32 = 6;

/// SmolLM2 split over several stages needs about 174 MB at this context (its 30 MB tied
/// embedding sits on both ends): two donors of 64 MB cannot hold it, four can.
const TOO_SMALL_IN_PAIRS: u64 = 64_000_000;

/// The single device's ids for the first four prompts, computed once for these tests.
fn reference() -> &'static [(Vec<u32>, Vec<u32>)] {
    static REFERENCE: OnceLock<Vec<(Vec<u32>, Vec<u32>)>> = OnceLock::new();
    REFERENCE.get_or_init(|| single_device_ids(support::SMOLLM2.1, &PROMPTS[..4], TOKENS))
}

fn requests() -> Vec<webshard::front::GenerateRequest> {
    let prompts = reference().iter();
    prompts.map(|(prompt, _)| greedy(prompt, TOKENS)).collect()
}

/// A coordinator's transport and four donors offering `bytes` each.
fn four_donors(bytes: u64) -> (InProcessNetwork, InProcessTransport, Vec<DonorHandle>) {
    let gpu = gpu();
    let network = InProcessNetwork::new(InProcessConfig::default());
    let transport = network.join();
    let handles = (0..4)
        .map(|_| spawn_donor_offering(&network, &gpu, TOKEN, bytes, |t| t))
        .collect();
    (network, transport, handles)
}

fn assert_single_device_ids(run: &ReplicaRun) {
    for (index, ((_, want), got)) in reference().iter().zip(&run.outputs).enumerate() {
        assert_eq!(&got.ids, want, "request {index}");
    }
}

/// Every request's tokens reached the caller once each, in order.
fn assert_each_token_passed_once(run: &ReplicaRun) {
    for request in 0..run.outputs.len() {
        let indices: Vec<u32> = (run.events.iter())
            .filter(|(r, _)| *r == request)
            .map(|(_, index)| *index)
            .collect();
        let want: Vec<u32> = (0..run.outputs[request].ids.len() as u32).collect();
        assert_eq!(indices, want, "request {request}");
    }
}

/// The chains' donors: disjoint, and together every donor of the fleet.
fn assert_disjoint_chains(plans: &[(usize, Plan)], handles: &[DonorHandle]) {
    let mut seen = HashSet::new();
    for (chain, plan) in plans {
        for donor in &plan.donors {
            assert!(seen.insert(donor.id), "donor {} in two chains", donor.id);
        }
        assert!(!plan.stages.is_empty(), "chain {chain} has no stage");
    }
    let all: HashSet<PeerId> = handles.iter().map(|h| h.id).collect();
    assert_eq!(seen, all);
}

/// Four donors that each hold half of SmolLM2 and four requests: the planner makes two
/// chains of two, the requests are spread two a chain, both chains serve at once, and each
/// request gets its single-device ids.
#[test]
fn four_requests_over_two_replicas_give_the_single_device_ids() {
    let file = support::SMOLLM2.1;
    let _ = reference();
    let (_network, transport, handles) = four_donors(TOO_SMALL_ALONE);
    let chains = ChainCount::Auto { requests: 4 };
    let run = coordinate_replicas(
        transport,
        config(file, 4),
        chains,
        requests(),
        |_| {},
        |_| {},
    );
    println!(
        "two replicas: {}",
        serde_json::to_string(&run.report).unwrap()
    );
    assert_eq!(run.plans.len(), 2, "{:?}", run.plans);
    assert_disjoint_chains(&run.plans, &handles);
    assert!(run.plans.iter().all(|(_, plan)| plan.stages.len() == 2));
    assert_single_device_ids(&run);
    assert_each_token_passed_once(&run);
    assert_eq!(run.report.served_by, vec![0, 1, 0, 1]);
    assert!(run.report.chains.iter().all(|c| c.run.max_in_flight == 2));
    // The chains served side by side: every request's first token came before any
    // request's last one.
    let first = |r: usize| run.events.iter().position(|e| e.0 == r).unwrap();
    let last = |r: usize| run.events.iter().rposition(|e| e.0 == r).unwrap();
    for r in 0..4 {
        for s in 0..4 {
            assert!(first(r) < last(s), "request {r} started after {s} ended");
        }
    }
}

/// Four donors too small to hold SmolLM2 two by two: the planner keeps one deeper chain over
/// them, and the four requests share it with their single-device ids.
#[test]
fn donors_too_small_for_two_chains_run_one_deeper_chain() {
    let file = support::SMOLLM2.1;
    let _ = reference();
    let (_network, transport, handles) = four_donors(TOO_SMALL_IN_PAIRS);
    let chains = ChainCount::Auto { requests: 4 };
    let run = coordinate_replicas(
        transport,
        config(file, 4),
        chains,
        requests(),
        |_| {},
        |_| {},
    );
    println!("depth: {}", serde_json::to_string(&run.report).unwrap());
    assert_eq!(run.plans.len(), 1, "{:?}", run.plans);
    assert_disjoint_chains(&run.plans, &handles);
    assert!(run.plans[0].1.stages.len() >= 3, "{:?}", run.plans);
    assert_single_device_ids(&run);
    assert_eq!(run.report.served_by, vec![0; 4]);
    assert_eq!(run.report.chains[0].run.max_in_flight, 4);
}

/// Kills the first stage's donor of chain 1 after the third token of any request. The other
/// donors' switches are kept to the end: dropping one kills its donor too.
#[allow(clippy::type_complexity)] // the two hooks are closures: a type alias cannot name them
fn kill_in_chain_one(
    handles: &mut [DonorHandle],
) -> (
    impl FnOnce(&[(usize, Plan)]) + Send + 'static,
    impl FnMut(&TokenEvent<'_>) + Send + 'static,
    Arc<Mutex<Option<PeerId>>>,
) {
    let switches: Vec<(PeerId, oneshot::Sender<()>)> =
        handles.iter_mut().map(|h| (h.id, h.take_kill())).collect();
    let victim = Arc::new(Mutex::new(None));
    let connected = {
        let victim = Arc::clone(&victim);
        move |plans: &[(usize, Plan)]| {
            let chain = &plans.iter().find(|(id, _)| *id == 1).expect("chain 1").1;
            *victim.lock().unwrap() = Some(chain.stages[0].donor);
        }
    };
    let on_token = {
        let (victim, mut switches) = (Arc::clone(&victim), switches);
        move |update: &TokenEvent<'_>| {
            let target = *victim.lock().unwrap();
            if update.index == 2 {
                if let Some(at) = switches.iter().position(|(id, _)| Some(*id) == target) {
                    let _ = switches.remove(at).1.send(());
                }
            }
        }
    };
    (connected, on_token, victim)
}

/// Two chains of two donors that each could hold the model alone; a donor of chain 1 is
/// killed mid-generation. Chain 1 re-plans on its other donor and replays its requests;
/// chain 0 goes on untouched. The ids are the single device's.
#[test]
fn a_lost_donor_recovers_inside_its_chain() {
    let file = support::SMOLLM2.1;
    let _ = reference();
    let (_network, transport, mut handles) = four_donors(DONOR_BYTES);
    let (connected, on_token, victim) = kill_in_chain_one(&mut handles);
    let run = coordinate_replicas(
        transport,
        config(file, 4),
        ChainCount::Exactly(2),
        requests(),
        connected,
        on_token,
    );
    println!(
        "loss in a chain: {}",
        serde_json::to_string(&run.report).unwrap()
    );
    assert_single_device_ids(&run);
    assert_each_token_passed_once(&run);
    assert_eq!(run.report.served_by, vec![0, 1, 0, 1]);
    let recoveries: Vec<u32> = run.report.chains.iter().map(|c| c.run.recoveries).collect();
    assert_eq!(recoveries, vec![0, 1]);
    let victim = victim
        .lock()
        .unwrap()
        .expect("a donor was killed")
        .to_string();
    let chain_one = &run.report.chains[1].run.plan;
    assert!(chain_one.iter().all(|stage| stage.donor != victim));
}

/// Two chains of two donors too small alone, driven as `drive` says with `slots` requests a
/// chain at a time (the default where `None`); a donor of chain 1 is killed and none joins.
fn run_losing_chain_one(chains: ChainCount, drive: Drive, slots: Option<u32>) -> ReplicaRun {
    let file = support::SMOLLM2.1;
    let _ = reference();
    let (_network, transport, mut handles) = four_donors(TOO_SMALL_ALONE);
    let (connected, on_token, _victim) = kill_in_chain_one(&mut handles);
    let mut config = config(file, 4);
    config.join_timeout = Duration::from_secs(8);
    if let Some(slots) = slots {
        config.runtime.kv_slots = slots;
    }
    let hooks = (connected, on_token);
    let run = drive_replicas(transport, config, chains, requests(), hooks, drive);
    println!(
        "chain retired: {}",
        serde_json::to_string(&run.report).unwrap()
    );
    run
}

/// Chain 1 waits its join timeout, cannot hold the model, and is retired: its requests run
/// again on chain 0, the caller sees each token once, and the ids are the single device's.
#[test]
fn a_chain_that_cannot_hold_the_model_hands_its_requests_over() {
    let chains = ChainCount::Auto { requests: 4 };
    let run = run_losing_chain_one(chains, Drive::Generate, None);
    assert_eq!(run.plans.len(), 2, "{:?}", run.plans);
    assert_single_device_ids(&run);
    assert_each_token_passed_once(&run);
    assert_eq!(run.report.retired, vec![1]);
    assert_eq!(run.report.moved, 2);
    assert_eq!(run.report.served_by, vec![0; 4]);
    assert_eq!(run.report.chains.len(), 1);
    assert_eq!(run.report.chains[0].run.recoveries, 0);
}

/// The same through `generate_fed` (the HTTP API's fleet mode), two requests a chain at a
/// time: the chains take the four requests as their slots free (two each), chain 1 is retired
/// and its two requests move to chain 0, each token passed once, the single device's ids.
#[test]
fn a_fed_chain_that_cannot_hold_the_model_hands_its_requests_over() {
    let run = run_losing_chain_one(ChainCount::Exactly(2), Drive::Fed, Some(2));
    assert_single_device_ids(&run);
    assert_each_token_passed_once(&run);
    assert_eq!(run.report.retired, vec![1]);
    assert_eq!(run.report.moved, 2);
    assert_eq!(run.report.chains.len(), 1);
}

/// Two chains of two donors too small alone; a donor of chain 1 is killed and, a moment
/// later, a fresh donor joins the room. Its Hello reaches chain 1, the chain short of donors
/// (not chain 0, which hears newcomers otherwise): chain 1 re-plans with it and keeps its
/// requests, and the ids are the single device's.
#[test]
fn a_newcomer_joins_the_chain_short_of_donors() {
    let file = support::SMOLLM2.1;
    let _ = reference();
    let (network, transport, mut handles) = four_donors(TOO_SMALL_ALONE);
    let (connected, mut kill_on_token, _victim) = kill_in_chain_one(&mut handles);
    let newcomer = Arc::new(Mutex::new(None));
    let on_token = {
        let (newcomer, gpu) = (Arc::clone(&newcomer), gpu());
        move |update: &TokenEvent<'_>| {
            kill_on_token(update);
            let (newcomer, network, gpu) = (Arc::clone(&newcomer), network.clone(), gpu.clone());
            if update.index == 2 && newcomer.lock().unwrap().is_none() {
                *newcomer.lock().unwrap() = Some(None);
                std::thread::spawn(move || {
                    // After chain 1 has seen its loss: a Hello before it would go to chain 0.
                    std::thread::sleep(Duration::from_millis(500));
                    let handle =
                        spawn_donor_offering(&network, &gpu, TOKEN, TOO_SMALL_ALONE, |t| t);
                    *newcomer.lock().unwrap() = Some(Some(handle));
                });
            }
        }
    };
    let mut config = config(file, 4);
    config.join_timeout = Duration::from_secs(60);
    let run = coordinate_replicas(
        transport,
        config,
        ChainCount::Auto { requests: 4 },
        requests(),
        connected,
        on_token,
    );
    println!(
        "newcomer in chain 1: {}",
        serde_json::to_string(&run.report).unwrap()
    );
    assert_single_device_ids(&run);
    assert_each_token_passed_once(&run);
    assert!(run.report.retired.is_empty(), "{:?}", run.report.retired);
    assert_eq!(run.report.served_by, vec![0, 1, 0, 1]);
    let recoveries: Vec<u32> = run.report.chains.iter().map(|c| c.run.recoveries).collect();
    assert_eq!(recoveries, vec![0, 1]);
    let newcomer = newcomer.lock().unwrap();
    let id = newcomer
        .as_ref()
        .and_then(|h| h.as_ref())
        .expect("the newcomer ran")
        .id;
    let chain_one = &run.report.chains[1].run.plan;
    assert!(chain_one.iter().any(|stage| stage.donor == id.to_string()));
}
