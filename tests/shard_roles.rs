//! The coordinator and donor roles over the in-process transport, on the real GPU with real
//! models: split generations give the single device's greedy ids, also when a donor is lost
//! or joins midway, when several requests share the chain, and a wrong donor is refused or
//! flagged; donors answer heartbeats while they compute; constrained requests give the single
//! device's constrained ids (`constrained.rs`); several chains serve requests side by side
//! (`replicas.rs`); log-probabilities are one device's (`logprobs.rs`).

use crate::roles_support;
use crate::support;

#[path = "shard_roles/constrained.rs"]
mod constrained;
#[path = "shard_roles/logprobs.rs"]
mod logprobs;
#[path = "shard_roles/loss.rs"]
mod loss;
#[path = "shard_roles/models.rs"]
mod models;
#[path = "shard_roles/replicas.rs"]
mod replicas;

use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use roles_support::run::*;
use roles_support::*;
use webshard::front::{Generator, TokenEvent};
use webshard::shard::frame::{
    Assign, ErrorCode, Forward, Reply, StageInput, StageOutput, StageRuntime,
};
use webshard::shard::roles::verify::DEFAULT_TOLERANCE;
use webshard::shard::roles::{Coordinator, CoordinatorConfig, DonorExit, VerifyConfig};
use webshard::shard::transport::send_message;
use webshard::shard::{
    decode_frame, ByteVocab, Encoding, InProcessConfig, InProcessNetwork, InProcessTransport,
    Message, Transport, TransportEvent,
};

const PROMPTS: [&str; 5] = [
    "Once upon a time, in a small village,",
    "The capital of France is",
    "def fibonacci(n):",
    "List three colors:",
    "The quick brown fox",
];
#[test]
fn two_and_three_donors_give_the_single_device_ids() {
    let file = support::SMOLLM2.1;
    let reference = single_device_ids(file, &PROMPTS[..1], 16);
    let (prompt, want) = reference[0].clone();
    let gpu = gpu();
    let file_bytes = std::fs::metadata(support::model_path(file)).unwrap().len();
    for donors in [2, 3] {
        let (_network, transport, handles) = fleet(&gpu, donors);
        let run = coordinate(
            transport,
            config(file, donors),
            vec![greedy(&prompt, 16)],
            |_| {},
        );
        print_report(&format!("{donors} donors"), &run.report);
        assert_eq!(run.outputs[0].ids, want, "{donors} donors");
        assert_eq!(run.report.plan.len(), donors);
        assert_eq!(run.report.hops.len(), donors);
        assert!(run.report.hops.iter().all(|hop| hop.steps >= 16));
        let mut layers = Vec::new();
        for handle in &handles {
            assert_eq!(
                handle.exit(Duration::from_secs(30)),
                Ok(DonorExit::Dismissed("done".into()))
            );
            let status = handle.status();
            println!(
                "donor {}: layers {:?}, {} of {file_bytes} bytes",
                handle.id, status.layers, status.bytes_downloaded
            );
            assert!(status.bytes_downloaded > 0 && status.bytes_downloaded < file_bytes);
            assert_eq!(status.text, run.outputs[0].text);
            layers.push(status.layers.expect("assigned"));
        }
        layers.sort_by_key(|range| range.start);
        assert_eq!(layers.first().unwrap().start, 0);
        assert_eq!(layers.last().unwrap().end, 30);
        assert!(layers.windows(2).all(|pair| pair[0].end == pair[1].start));
    }
}

/// The network and its other two donors, kept alive for the run.
type Fleet = (InProcessNetwork, Vec<DonorHandle>);

/// A coordinator's transport and three donors, the first behind `wrap` (the fault under test),
/// with a config whose heartbeats find a silent donor within 4 s.
fn fleet_with_odd_donor<T, W>(
    file: &str,
    wrap: W,
) -> (Fleet, InProcessTransport, DonorHandle, CoordinatorConfig)
where
    T: Transport + Send + 'static,
    W: FnOnce(InProcessTransport) -> T,
{
    let gpu = gpu();
    let network = InProcessNetwork::new(InProcessConfig::default());
    let transport = network.join();
    let odd = spawn_donor(&network, &gpu, TOKEN, wrap);
    let others = (0..2)
        .map(|_| spawn_donor(&network, &gpu, TOKEN, |t| t))
        .collect();
    let mut config = config(file, 3);
    config.heartbeat_interval = Duration::from_millis(200);
    config.heartbeat_timeout = Duration::from_secs(4);
    ((network, others), transport, odd, config)
}

/// A donor's link to the next stage can still be opening when its stage has loaded (WebRTC
/// handshakes between donors on a loaded machine): the donor says Ready only once the link
/// answers, so the first Forward is not lost and the ids are the single device's.
#[test]
fn a_donor_waits_for_its_link_to_the_next_stage_before_ready() {
    let file = support::SMOLLM2.1;
    let reference = single_device_ids(file, &PROMPTS[1..2], 4);
    let (prompt, want) = reference[0].clone();
    let gpu = gpu();
    let network = InProcessNetwork::new(InProcessConfig::default());
    let transport = network.join();
    let coordinator = transport.local_id();
    let delay = Duration::from_millis(1500);
    let _donors: Vec<_> = (0..3)
        .map(|_| {
            spawn_donor(&network, &gpu, TOKEN, |inner| {
                SlowLinks::new(inner, coordinator, delay)
            })
        })
        .collect();
    let run = coordinate(transport, config(file, 3), vec![greedy(&prompt, 4)], |_| {});
    print_report("slow links", &run.report);
    assert_eq!(run.outputs[0].ids, want);
    assert_eq!(run.report.plan.len(), 3);
    assert_eq!(run.report.recoveries, 0);
}

/// A donor that stays connected but stops answering is found by heartbeats.
#[test]
fn a_silent_donor_is_found_by_heartbeats() {
    let file = support::SMOLLM2.1;
    let reference = single_device_ids(file, &PROMPTS[1..2], 12);
    let (prompt, want) = reference[0].clone();
    let frozen = Arc::new(AtomicBool::new(false));
    let switch = Arc::clone(&frozen);
    let (_fleet, transport, silent, config) = fleet_with_odd_donor(file, move |inner| Freezable {
        inner,
        frozen: switch,
    });
    let on_token = move |update: &TokenEvent<'_>| {
        if update.index == 4 {
            frozen.store(true, Ordering::SeqCst);
        }
    };
    let run = coordinate(transport, config, vec![greedy(&prompt, 12)], on_token);
    print_report("silent donor", &run.report);
    assert_eq!(run.outputs[0].ids, want);
    assert_eq!(run.report.recoveries, 1);
    assert!(run
        .report
        .plan
        .iter()
        .all(|stage| stage.donor != silent.id.to_string()));
}

/// A page coordinating a chat generates once per turn and sends nothing in between: a pause
/// longer than the heartbeat timeout must not make the stages look lost.
#[test]
fn a_pause_between_generations_loses_no_donor() {
    let file = support::SMOLLM2.1;
    let reference = single_device_ids(file, &PROMPTS[1..2], 4);
    let (prompt, want) = reference[0].clone();
    let gpu = gpu();
    let (_network, transport, _handles) = fleet(&gpu, 2);
    let mut config = config(file, 2);
    config.heartbeat_interval = Duration::from_millis(200);
    // Shorter than the pause between the two generations.
    config.heartbeat_timeout = Duration::from_secs(6);
    let (first, second, report) = with_deadline(DEADLINE, move || {
        pollster::block_on(async move {
            let mut coordinator = Coordinator::connect(transport, config)
                .await
                .expect("connect");
            let request = [greedy(&prompt, 4)];
            let first = coordinator
                .generate(&request, &mut |_| ControlFlow::Continue(()))
                .await
                .expect("first");
            std::thread::sleep(Duration::from_secs(8));
            let second = coordinator
                .generate(&request, &mut |_| ControlFlow::Continue(()))
                .await
                .expect("second");
            let report = coordinator.report().clone();
            coordinator.shutdown("done").await;
            (first, second, report)
        })
    });
    assert_eq!(first[0].ids, want);
    assert_eq!(second[0].ids, want);
    assert_eq!(report.recoveries, 0);
    assert_eq!(report.plan.len(), 2);
}

/// A donor joining mid-generation is admitted, the chain drains, and the coordinator
/// re-plans over three donors and replays: the ids are still the single device's.
#[test]
fn a_donor_joining_mid_generation_is_planned_in_and_changes_no_token() {
    let file = support::SMOLLM2.1;
    let (prompt, want) = single_device_ids(file, &PROMPTS[..1], 16)[0].clone();
    let gpu = gpu();
    let (network, transport, handles) = fleet(&gpu, 2);
    let coordinator = transport.local_id();
    let joiner = Arc::new(Mutex::new(None));
    let on_token = {
        let (joiner, gpu) = (Arc::clone(&joiner), Arc::clone(&gpu));
        move |update: &TokenEvent<'_>| {
            if update.index == 3 {
                *joiner.lock().unwrap() = Some(join_donor(&network, &gpu, coordinator));
            }
        }
    };
    let run = coordinate(
        transport,
        config(file, 2),
        vec![greedy(&prompt, 16)],
        on_token,
    );
    print_report("a donor joins after 4 tokens", &run.report);
    assert_eq!(run.outputs[0].ids, want);
    assert_eq!((run.report.joins, run.report.recoveries), (1, 0));
    assert_eq!(run.report.join_ms.len(), 1);
    let joiner = joiner.lock().unwrap().take().expect("a donor joined");
    let planned: Vec<&str> = run.report.plan.iter().map(|s| s.donor.as_str()).collect();
    assert_eq!(planned.len(), 3, "{planned:?}");
    for donor in handles.iter().chain([&joiner]) {
        assert!(
            planned.contains(&donor.id.to_string().as_str()),
            "{planned:?}"
        );
        assert_eq!(
            donor.exit(Duration::from_secs(30)),
            Ok(DonorExit::Dismissed("done".into()))
        );
    }
    // The stages of the last plan computed the steps after the join.
    assert!(run.report.hops.iter().all(|hop| hop.steps >= 12));
}

/// A coordinator that admits nobody for `rejoin_after` joins the room again and admits every
/// donor anew (they greet again): with 2 of 3 donors present it rejoins, the third arrives,
/// and the run gives the single device's ids.
#[test]
fn a_coordinator_waiting_for_donors_rejoins_and_admits_them_again() {
    let file = support::SMOLLM2.1;
    let (prompt, want) = single_device_ids(file, &PROMPTS[1..2], 8)[0].clone();
    let gpu = gpu();
    let (network, transport, handles) = fleet(&gpu, 2);
    let mut config = config(file, 3);
    // Donors greet again every 2 s; a rejoin must leave them time to.
    config.rejoin_after = Duration::from_secs(3);
    let late = std::thread::spawn({
        let gpu = Arc::clone(&gpu);
        move || {
            std::thread::sleep(Duration::from_secs(5));
            spawn_donor(&network, &gpu, TOKEN, |t| t)
        }
    });
    let run = coordinate(transport, config, vec![greedy(&prompt, 8)], |_| {});
    print_report("a coordinator rejoins while gathering", &run.report);
    assert_eq!(run.outputs[0].ids, want);
    assert!(run.report.rejoins >= 1, "{:?}", run.report.rejoins);
    let late = late.join().expect("the late donor");
    for donor in handles.iter().chain([&late]) {
        assert_eq!(
            donor.exit(Duration::from_secs(30)),
            Ok(DonorExit::Dismissed("done".into()))
        );
    }
}

/// A donor that falls silent (a suspended tab) is planned out by heartbeats; once it answers
/// again it is planned back in, and the ids are still the single device's.
#[test]
fn a_silent_donor_that_answers_again_is_planned_back_in() {
    let file = support::SMOLLM2.1;
    let (prompt, want) = single_device_ids(file, &PROMPTS[..1], 16)[0].clone();
    let paused = Arc::new(AtomicBool::new(false));
    let switch = Arc::clone(&paused);
    let (_fleet, transport, sleeper, config) = fleet_with_odd_donor(file, move |inner| Pausable {
        inner,
        paused: switch,
    });
    // Token 3 comes only after the recovery: the paused stage held the chain up.
    let on_token = move |update: &TokenEvent<'_>| match update.index {
        2 => paused.store(true, Ordering::SeqCst),
        3 => paused.store(false, Ordering::SeqCst),
        _ => {}
    };
    let run = coordinate(transport, config, vec![greedy(&prompt, 16)], on_token);
    print_report("a silent donor answers again", &run.report);
    assert_eq!(run.outputs[0].ids, want);
    assert_eq!((run.report.recoveries, run.report.joins), (1, 1));
    assert_eq!(run.report.plan.len(), 3);
    assert!(run
        .report
        .plan
        .iter()
        .any(|stage| stage.donor == sleeper.id.to_string()));
}

/// A step longer than the heartbeat timeout (a cold first step, a long prompt on a CPU
/// adapter) loses no donor: donors answer heartbeats while they compute.
#[test]
fn heartbeats_are_answered_while_a_step_computes() {
    let file = support::SMOLLM2.1;
    // About 90 tokens: each stage's prefill step takes seconds on a CPU adapter.
    let prompt = PROMPTS.join(" ").repeat(3);
    let gpu = gpu();
    let (_network, transport, _handles) = fleet(&gpu, 2);
    let mut config = config(file, 2);
    config.runtime.max_context = 512;
    config.heartbeat_interval = Duration::from_millis(50);
    config.heartbeat_timeout = Duration::from_millis(1000);
    let prompt_ids = prompt_ids(file, &prompt);
    assert!(prompt_ids.len() > 64, "{} prompt tokens", prompt_ids.len());
    let run = coordinate(transport, config, vec![greedy(&prompt_ids, 4)], |_| {});
    print_report("steps longer than the heartbeat timeout", &run.report);
    let slowest = run
        .report
        .hops
        .iter()
        .map(|hop| hop.compute_ms_max)
        .fold(0.0, f64::max);
    assert!(
        slowest > 1000.0,
        "no step outlasted the timeout: {slowest} ms"
    );
    assert_eq!(run.report.recoveries, 0);
    assert_eq!(run.outputs[0].ids.len(), 4);
}

#[test]
fn a_donor_with_the_wrong_token_is_refused() {
    let file = support::SMOLLM2.1;
    let reference = single_device_ids(file, &PROMPTS[1..2], 4);
    let (prompt, want) = reference[0].clone();
    let gpu = gpu();
    let network = InProcessNetwork::new(InProcessConfig::default());
    let transport = network.join();
    let run = std::thread::spawn({
        let config = config(file, 1);
        move || coordinate(transport, config, vec![greedy(&prompt, 4)], |_| {})
    });
    let intruder = spawn_donor(&network, &gpu, "not-the-token", |t| t);
    let refused = intruder
        .exit(Duration::from_secs(120))
        .expect_err("refused");
    assert!(
        refused.contains("Refused") && refused.contains("wrong fleet token"),
        "{refused}"
    );
    let _donor = spawn_donor(&network, &gpu, TOKEN, |t| t);
    let run = run.join().expect("coordinator");
    assert_eq!(run.refused_hellos, 1);
    assert_eq!(run.outputs[0].ids, want);
}

/// Under `verify`, honest stages stay within the tolerance and a donor that perturbs its
/// outputs by 5% of their RMS is flagged, and no other.
#[test]
fn verify_flags_a_donor_with_wrong_activations() {
    let file = support::SMOLLM2.1;
    let gpu = gpu();
    let prompt = single_device_ids(file, &PROMPTS[3..4], 1)[0].0.clone();
    let verify = VerifyConfig {
        fraction: 1.0,
        tolerance: DEFAULT_TOLERANCE,
        seed: 7,
        gpu: Arc::clone(&gpu),
    };
    for faulty in [false, true] {
        let network = InProcessNetwork::new(InProcessConfig::default());
        let transport = network.join();
        let scale = if faulty { 0.05 } else { 0.0 };
        let suspect = spawn_donor(&network, &gpu, TOKEN, move |inner| Perturbing {
            inner,
            scale,
        });
        let _honest = spawn_donor(&network, &gpu, TOKEN, |t| t);
        let mut config = config(file, 2);
        config.verify = Some(verify.clone());
        let run = coordinate(transport, config, vec![greedy(&prompt, 6)], |_| {});
        print_report(
            if faulty {
                "verify, faulty"
            } else {
                "verify, honest"
            },
            &run.report,
        );
        assert!(run.report.verified_steps >= 6);
        if faulty {
            assert!(!run.report.flags.is_empty());
            assert!(run
                .report
                .flags
                .iter()
                .all(|flag| flag.donor == suspect.id.to_string()));
        } else {
            assert!(run.report.flags.is_empty(), "{:?}", run.report.flags);
            let worst = run
                .report
                .verify_max_error
                .iter()
                .copied()
                .fold(0.0, f32::max);
            assert!(worst < DEFAULT_TOLERANCE / 5.0, "honest error {worst}");
        }
    }
}

/// Five requests through a chain with four KV slots: four at once, the fifth when a slot is
/// free; each gets its own single-device ids.
#[test]
fn concurrent_requests_get_their_own_ids() {
    let file = support::SMOLLM2.1;
    let reference = single_device_ids(file, &PROMPTS, 8);
    let gpu = gpu();
    let (_network, transport, _handles) = fleet(&gpu, 2);
    let requests = reference
        .iter()
        .map(|(prompt, _)| greedy(prompt, 8))
        .collect();
    let run = coordinate(transport, config(file, 2), requests, |_| {});
    print_report("5 requests, 4 slots", &run.report);
    assert_eq!(run.report.max_in_flight, 4);
    for (index, ((_, want), got)) in reference.iter().zip(&run.outputs).enumerate() {
        assert_eq!(&got.ids, want, "request {index}");
    }
}

/// The next message on `transport` other than greetings and peer events.
async fn next_message(transport: &InProcessTransport) -> (webshard::shard::PeerId, Message) {
    loop {
        if let TransportEvent::Frame { from, frame } = transport.recv().await.expect("recv") {
            match decode_frame(&frame).expect("donor frames decode") {
                Message::Hello(_) | Message::Heartbeat(_) => {}
                message => return (from, message),
            }
        }
    }
}

fn expect_error(message: Message, code: ErrorCode, needle: &str) {
    match message {
        Message::Error(report) => {
            assert_eq!(report.code, code, "{}", report.message);
            assert!(report.message.contains(needle), "{}", report.message);
        }
        other => panic!("expected Error({code:?}), got {other:?}"),
    }
}

/// A test playing the coordinator (and a stranger) feeds a donor bad frames: each is answered
/// with an Error, and the donor still serves good ones correctly.
#[test]
fn a_donor_answers_bad_frames_and_keeps_serving() {
    let file = support::SMOLLM2.1;
    let (prompt, want) = single_device_ids(file, &PROMPTS[1..2], 2)[0].clone();
    let gpu = gpu();
    let network = InProcessNetwork::new(InProcessConfig::default());
    let coordinator = network.join();
    let stranger = network.join();
    let donor = spawn_donor(&network, &gpu, TOKEN, |t| t);
    let url = model_url(file);
    with_deadline(DEADLINE, move || {
        pollster::block_on(async move {
            let source = webshard::gguf::open_source(&url).await.unwrap();
            let header = webshard::gguf::read_header(source.as_ref()).await.unwrap();
            let tokenizer =
                webshard::tokenizer::Tokenizer::from_metadata(&header.metadata).unwrap();
            let me = coordinator.local_id();
            let assign = Assign {
                epoch: 1,
                stage_id: 0,
                n_stages: 1,
                model_url: url.clone(),
                layer_start: 0,
                layer_end: 30,
                n_layers: 30,
                embedding: true,
                head: true,
                d_model: 576,
                upstream: me,
                downstream: me,
                vocab: ByteVocab::from_tokenizer(&tokenizer).unwrap().to_bytes(),
                runtime: StageRuntime {
                    max_context: 64,
                    max_batch: 16,
                    kv_slots: 2,
                    hidden: Encoding::F16,
                },
            };
            let send = |to, message: Message| {
                let coordinator = &coordinator;
                async move { send_message(coordinator, to, &message).await.unwrap() }
            };
            send(donor.id, Message::Assign(assign)).await;
            assert!(
                matches!(next_message(&coordinator).await.1, Message::Ready(r) if r.epoch == 1)
            );
            let step = |request_id, seq, start_pos: u32, ids: Vec<u32>| Forward {
                epoch: 1,
                request_id,
                seq,
                stage_id: 0,
                start_pos,
                n_tokens: ids.len() as u32,
                input: StageInput::Tokens(ids),
                reply: Reply::Greedy,
                tap: false,
                trace: Vec::new(),
                allowed: None,
            };
            coordinator.send(donor.id, b"not a frame").await.unwrap();
            expect_error(
                next_message(&coordinator).await.1,
                ErrorCode::BadFrame,
                "magic",
            );
            let wrong_stage = Forward {
                stage_id: 1,
                ..step(2, 0, 0, prompt.clone())
            };
            send(donor.id, Message::Forward(wrong_stage)).await;
            expect_error(
                next_message(&coordinator).await.1,
                ErrorCode::BadFrame,
                "stage",
            );
            send_message(
                &stranger,
                donor.id,
                &Message::Forward(step(4, 0, 0, prompt.clone())),
            )
            .await
            .unwrap();
            expect_error(
                next_message(&stranger).await.1,
                ErrorCode::BadFrame,
                "upstream",
            );
            send(donor.id, Message::Forward(step(6, 0, 5, vec![1]))).await;
            expect_error(
                next_message(&coordinator).await.1,
                ErrorCode::Compute,
                "replay",
            );
            stranger
                .send_raw_chunk(donor.id, vec![0xC1; 3])
                .await
                .unwrap();
            send(donor.id, Message::Forward(step(2, 0, 0, prompt.clone()))).await;
            let (_, first) = next_message(&coordinator).await;
            assert!(
                matches!(&first, Message::Result(r) if r.output == StageOutput::Sampled(want[0])),
                "{first:?}"
            );
            let next = step(2, 1, prompt.len() as u32, vec![want[0]]);
            send(donor.id, Message::Forward(next)).await;
            let (_, second) = next_message(&coordinator).await;
            assert!(
                matches!(&second, Message::Result(r) if r.output == StageOutput::Sampled(want[1])),
                "{second:?}"
            );
            assert!(donor.status().refused_frames >= 4);
        })
    });
}
