//! Running a coordinator over an in-process fleet: the configuration the role tests share,
//! a run from connect to shutdown, and its report.

use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Duration;

use webshard::front::{GenerateOptions, GenerateRequest, Generated, Generator, Prompt, TokenEvent};
use webshard::gpu::Gpu;
use webshard::sample::{ConstraintSpec, SamplerConfig};
use webshard::shard::roles::coordinator::RunReport;
use webshard::shard::roles::{
    ChainCount, Coordinator, CoordinatorConfig, Feed, ReplicaReport, Replicas, RoleError,
};
use webshard::shard::{InProcessConfig, InProcessNetwork, InProcessTransport, Plan};

use super::{model_url, spawn_donor, with_deadline, DonorHandle, TOKEN};

pub const DEADLINE: Duration = Duration::from_secs(600);

pub fn config(file: &str, donors: usize) -> CoordinatorConfig {
    let mut config = CoordinatorConfig::new(&model_url(file), TOKEN, donors);
    config.runtime.max_context = 256;
    config.heartbeat_timeout = Duration::from_secs(60);
    config.join_timeout = Duration::from_secs(120);
    config.load_timeout = Duration::from_secs(300);
    config.step_timeout = Duration::from_secs(120);
    config
}

pub fn greedy(prompt_ids: &[u32], max_tokens: u32) -> GenerateRequest {
    let options = GenerateOptions {
        max_tokens,
        sampler: SamplerConfig::greedy(),
        stop: Vec::new(),
        constraint: None,
        ..GenerateOptions::default()
    };
    GenerateRequest::new(Prompt::Ids(prompt_ids.to_vec()), options)
}

/// Greedy under `constraint`, from text as `runner generate` tokenizes it.
pub fn constrained(prompt: &str, max_tokens: u32, constraint: ConstraintSpec) -> GenerateRequest {
    let options = GenerateOptions {
        max_tokens,
        sampler: SamplerConfig::greedy(),
        stop: Vec::new(),
        constraint: Some(constraint),
        ..GenerateOptions::default()
    };
    GenerateRequest::new(Prompt::Text(prompt.to_string()), options)
}

pub struct Run {
    pub outputs: Vec<Generated>,
    pub report: RunReport,
    pub refused_hellos: u32,
}

/// Connects a coordinator on `transport`, generates, dismisses the donors.
pub fn coordinate(
    transport: InProcessTransport,
    config: CoordinatorConfig,
    requests: Vec<GenerateRequest>,
    mut on_token: impl FnMut(&TokenEvent<'_>) + Send + 'static,
) -> Run {
    with_deadline(DEADLINE, move || {
        pollster::block_on(async move {
            let mut coordinator = Coordinator::connect(transport, config)
                .await
                .expect("connect");
            let outputs = coordinator
                .generate(&requests, &mut |update| {
                    on_token(&update);
                    ControlFlow::Continue(())
                })
                .await
                .expect("generate");
            let report = coordinator.report().clone();
            let refused_hellos = coordinator.refused_hellos;
            coordinator.shutdown("done").await;
            Run {
                outputs,
                report,
                refused_hellos,
            }
        })
    })
}

pub fn fleet(
    gpu: &Arc<Gpu>,
    donors: usize,
) -> (InProcessNetwork, InProcessTransport, Vec<DonorHandle>) {
    let network = InProcessNetwork::new(InProcessConfig::default());
    let coordinator = network.join();
    let handles = (0..donors)
        .map(|_| spawn_donor(&network, gpu, TOKEN, |t| t))
        .collect();
    (network, coordinator, handles)
}

pub fn print_report(label: &str, report: &RunReport) {
    println!("{label}: {}", serde_json::to_string(report).unwrap());
}

pub struct ReplicaRun {
    pub outputs: Vec<Generated>,
    pub report: ReplicaReport,
    /// Each chain's number and plan once connected.
    pub plans: Vec<(usize, Plan)>,
    /// Every token event passed to the caller, in order: (request, index).
    pub events: Vec<(usize, u32)>,
}

/// How a replica run is driven.
#[derive(Clone, Copy, PartialEq)]
pub enum Drive {
    /// `Generator::generate`: the requests spread over the chains up front.
    Generate,
    /// `Replicas::generate_fed`: the chains take the requests as their slots free.
    Fed,
}

/// A feed of a fixed list of requests, keeping each result.
struct ListFeed {
    requests: std::collections::VecDeque<GenerateRequest>,
    outputs: Vec<Option<Generated>>,
}

impl Feed for ListFeed {
    fn next(&mut self) -> Option<GenerateRequest> {
        self.requests.pop_front()
    }

    fn done(&mut self, index: usize, result: Result<Generated, RoleError>) {
        self.outputs[index] = Some(result.expect("each fed request ends well"));
    }
}

/// Connects a fleet of `chains` chains on `transport`, calls `connected` with their plans,
/// generates, dismisses the donors.
pub fn coordinate_replicas(
    transport: InProcessTransport,
    config: CoordinatorConfig,
    chains: ChainCount,
    requests: Vec<GenerateRequest>,
    connected: impl FnOnce(&[(usize, Plan)]) + Send + 'static,
    on_token: impl FnMut(&TokenEvent<'_>) + Send + 'static,
) -> ReplicaRun {
    let hooks = (connected, on_token);
    drive_replicas(transport, config, chains, requests, hooks, Drive::Generate)
}

/// `coordinate_replicas`, driven as `drive` says.
pub fn drive_replicas(
    transport: InProcessTransport,
    config: CoordinatorConfig,
    chains: ChainCount,
    requests: Vec<GenerateRequest>,
    hooks: (
        impl FnOnce(&[(usize, Plan)]) + Send + 'static,
        impl FnMut(&TokenEvent<'_>) + Send + 'static,
    ),
    drive: Drive,
) -> ReplicaRun {
    let (connected, mut on_token) = hooks;
    with_deadline(DEADLINE, move || {
        pollster::block_on(async move {
            let mut replicas = Replicas::connect(transport, config, chains)
                .await
                .expect("connect");
            let plans: Vec<(usize, Plan)> = (replicas.plans().into_iter())
                .map(|(chain, plan)| (chain, plan.clone()))
                .collect();
            connected(&plans);
            let mut events = Vec::new();
            let mut on_event = |update: TokenEvent<'_>| {
                events.push((update.request, update.index));
                on_token(&update);
                ControlFlow::Continue(())
            };
            let outputs = match drive {
                Drive::Generate => {
                    (replicas.generate(&requests, &mut on_event).await).expect("generate")
                }
                Drive::Fed => {
                    let mut feed = ListFeed {
                        outputs: vec![None; requests.len()],
                        requests: requests.into(),
                    };
                    let fed = replicas.generate_fed(&mut feed, &mut on_event).await;
                    fed.expect("generate_fed");
                    feed.outputs
                        .into_iter()
                        .map(|o| o.expect("a result"))
                        .collect()
                }
            };
            let report = replicas.report();
            replicas.shutdown("done").await;
            ReplicaRun {
                outputs,
                report,
                plans,
                events,
            }
        })
    })
}
