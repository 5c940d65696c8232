//! Replicas: a fleet with more donors than one chain needs runs several chains side by side,
//! each a single-chain `Coordinator` over its own donors, behind one `front::Generator`.
//!
//! `Replicas::connect` gathers the donors once, lets `replica::plan_replicas` choose between
//! depth and replicas from their memory and measured speed (or deals them into a given number
//! of chains), and loads every chain at once. Each chain receives through its own `Lane` of the
//! shared transport, so joins, losses, recovery and verification work inside a chain exactly
//! as they do for a lone one, while the other chains keep serving.
//!
//! `generate` spreads the requests over the chains, least loaded first (`generate_fed`, in
//! `fed.rs`, lets them take a server's requests as their slots free instead), and runs the chains
//! concurrently in one future (no runtime: it builds for wasm). A chain whose donors can no
//! longer hold the model (its re-plan waited the join timeout in vain) is retired: its donors
//! are dismissed (staying donors greet again and join the next chain to re-plan) and its
//! requests run again from the start on the chains left. Their tokens already passed to the
//! caller are not passed again; the ids are the same, since a request's ids depend only on
//! its prompt, options and seed.

use std::cell::RefCell;
use std::collections::HashMap;
use std::ops::ControlFlow;

use serde::Serialize;

mod fed;

use super::super::plan::Plan;
use super::super::replica::{plan_chains, plan_replicas};
use super::super::transport::{MaybeSync, Transport};
use super::coordinator::{Coordinator, CoordinatorConfig, RunReport};
use super::lanes::{Lane, Lanes};
use super::RoleError;
use crate::front::{GenerateRequest, Generated, Generator, OnEvent, TextFront, TokenEvent};

/// The planner's cost of one hop between peers (transfer and queueing), in ms: about what a
/// loopback WebRTC step spends outside the stages' forwards (`transfer_ms_mean`).
const HOP_MS: f64 = 1.0;

/// How many chains to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChainCount {
    /// As many as the planner finds fastest for `requests` requests in flight.
    Auto { requests: usize },
    /// Exactly this many, the donors dealt as the planner deals them.
    Exactly(usize),
}

/// One chain's figures, as a lone coordinator reports them.
#[derive(Clone, Debug, Serialize)]
pub struct ChainReport {
    /// The chain's number, fixed for the fleet's life (`served_by` refers to it).
    pub chain: usize,
    #[serde(flatten)]
    pub run: RunReport,
}

/// What the fleet did, for `--json`.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ReplicaReport {
    pub chains: Vec<ChainReport>,
    /// The chain that produced each request's output in the last `generate`.
    pub served_by: Vec<usize>,
    /// Requests run again on another chain after theirs was retired.
    pub moved: u32,
    /// Chains retired because their donors could no longer hold the model.
    pub retired: Vec<usize>,
    /// The chains' decode rates added up.
    pub decode_tokens_per_s: f64,
    pub recoveries: u32,
    pub joins: u32,
    /// Times the room was joined again while gathering donors.
    pub rejoins: u32,
}

struct Chain<T: Transport + MaybeSync> {
    id: usize,
    coordinator: Coordinator<Lane<T>>,
}

/// Several chains over one transport, one `Generator`.
pub struct Replicas<T: Transport + MaybeSync> {
    chains: Vec<Chain<T>>,
    lanes: Lanes<T>,
    report: ReplicaReport,
    /// Hellos refused while gathering, before the chains existed.
    refused_while_gathering: u32,
}

impl<T: Transport + MaybeSync> Replicas<T> {
    /// Reads the model's header, waits for `config.donors` donors, plans `count` chains and
    /// loads them all.
    pub async fn connect(
        transport: T,
        config: CoordinatorConfig,
        count: ChainCount,
    ) -> Result<Replicas<T>, RoleError> {
        let mut gatherer = Coordinator::open(transport, config).await?;
        gatherer.gather_donors().await?;
        let donors = std::mem::take(&mut gatherer.standby);
        let plans = match count {
            ChainCount::Auto { requests } => {
                plan_replicas(&gatherer.sizes, &donors, requests, HOP_MS)?.chains
            }
            ChainCount::Exactly(chains) => plan_chains(&gatherer.sizes, &donors, chains)?,
        };
        tracing::info!(chains = plans.len(), "planned the fleet");
        let mut replicas = gatherer.into_replicas(&plans)?;
        let loads = replicas
            .chains
            .iter_mut()
            .zip(plans)
            .map(|(chain, plan)| chain.coordinator.establish(plan));
        futures::future::try_join_all(loads).await?;
        Ok(replicas)
    }

    /// Each chain's number and plan now.
    pub fn plans(&self) -> Vec<(usize, &Plan)> {
        let chains = self.chains.iter();
        chains.map(|c| (c.id, c.coordinator.plan())).collect()
    }

    pub fn report(&self) -> ReplicaReport {
        let mut report = self.report.clone();
        report.chains = (self.chains.iter())
            .map(|c| ChainReport {
                chain: c.id,
                run: c.coordinator.report().clone(),
            })
            .collect();
        for chain in &report.chains {
            report.decode_tokens_per_s += chain.run.decode_tokens_per_s;
            report.recoveries += chain.run.recoveries;
            report.joins += chain.run.joins;
        }
        report
    }

    pub fn refused_hellos(&self) -> u32 {
        let chains = self.chains.iter().map(|c| c.coordinator.refused_hellos);
        self.refused_while_gathering + chains.sum::<u32>()
    }

    /// Dismisses every chain's donors.
    pub async fn shutdown(self, reason: &str) {
        let chains = self.chains.into_iter();
        futures::future::join_all(chains.map(|c| c.coordinator.shutdown(reason))).await;
    }

    /// Runs each chain's share of `pending` at once; one result per chain, in chain order.
    async fn run_round(
        &mut self,
        requests: &[GenerateRequest],
        shares: &[Vec<usize>],
        relay: &RefCell<Relay<'_, '_>>,
    ) -> Vec<Result<Vec<Generated>, RoleError>> {
        let runs = self.chains.iter_mut().zip(shares).map(|(chain, share)| {
            let batch: Vec<GenerateRequest> = share.iter().map(|&i| requests[i].clone()).collect();
            async move {
                if batch.is_empty() {
                    // Not run at all: an empty generation would reset the chain's figures.
                    return Ok(Vec::new());
                }
                let mut forward =
                    |event: TokenEvent<'_>| relay.borrow_mut().pass(share[event.request], event);
                chain.coordinator.generate(&batch, &mut forward).await
            }
        });
        futures::future::join_all(runs).await
    }

    /// Takes the chains at `failed` out of the fleet; newcomers go to the first chain left.
    async fn retire(&mut self, failed: &[usize]) {
        let chains = std::mem::take(&mut self.chains).into_iter().enumerate();
        let (gone, live): (Vec<_>, Vec<_>) = chains.partition(|(at, _)| failed.contains(at));
        self.chains = live.into_iter().map(|(_, chain)| chain).collect();
        let heir = self.chains[0].id;
        for (_, chain) in gone {
            tracing::warn!(
                chain = chain.id,
                "the chain's donors cannot hold the model; its requests move to the other chains"
            );
            self.lanes.retire(chain.id, heir);
            self.report.retired.push(chain.id);
            self.refused_while_gathering += chain.coordinator.refused_hellos;
            (chain.coordinator)
                .shutdown("this chain's donors can no longer hold the model")
                .await;
        }
    }
}

/// Spreads `pending` over `chains` chains, each request to the least loaded chain so far
/// (the lowest numbered among equals): the chains are alike in slots, and a chain's
/// requests share its pipeline.
fn spread(pending: &[usize], chains: usize) -> Vec<Vec<usize>> {
    let mut shares = vec![Vec::new(); chains];
    for &request in pending {
        let least = (0..chains).min_by_key(|&c| shares[c].len()).unwrap_or(0);
        shares[least].push(request);
    }
    shares
}

/// Passes every chain's token events to the caller under the request's index in the whole
/// call, once each: a moved request starts over on another chain, so tokens already passed
/// are held back, and a cancellation is given again where the caller gave it.
struct Relay<'e, 'f> {
    on_event: &'e mut OnEvent<'f>,
    passed: Vec<u32>,
    cancelled_at: Vec<Option<u32>>,
}

impl<'e, 'f> Relay<'e, 'f> {
    fn new(on_event: &'e mut OnEvent<'f>, requests: usize) -> Relay<'e, 'f> {
        Relay {
            on_event,
            passed: vec![0; requests],
            cancelled_at: vec![None; requests],
        }
    }

    /// Passes `event` as request `request`'s (a fed run's requests are counted as they come).
    fn pass(&mut self, request: usize, event: TokenEvent<'_>) -> ControlFlow<()> {
        if request >= self.passed.len() {
            self.passed.resize(request + 1, 0);
            self.cancelled_at.resize(request + 1, None);
        }
        if event.index < self.passed[request] {
            return match self.cancelled_at[request] == Some(event.index) {
                true => ControlFlow::Break(()),
                false => ControlFlow::Continue(()),
            };
        }
        self.passed[request] = event.index + 1;
        let flow = (self.on_event)(TokenEvent { request, ..event });
        if flow.is_break() {
            self.cancelled_at[request] = Some(event.index);
        }
        flow
    }
}

#[async_trait::async_trait(?Send)]
impl<T: Transport + MaybeSync> Generator for Replicas<T> {
    type Error = RoleError;

    fn text(&self) -> &TextFront {
        &self.chains[0].coordinator.text
    }

    fn vocab(&self) -> u32 {
        self.chains[0].coordinator.vocab()
    }

    fn max_context(&self) -> u32 {
        self.chains[0].coordinator.max_context()
    }

    /// Generates every request on the chains, a share each; requests of a chain retired
    /// meanwhile run again on the others.
    async fn generate(
        &mut self,
        requests: &[GenerateRequest],
        on_event: &mut OnEvent<'_>,
    ) -> Result<Vec<Generated>, RoleError> {
        // Bad requests fail before any chain starts, as on a lone chain.
        for request in requests {
            self.chains[0].coordinator.check_request(request)?;
        }
        let relay = RefCell::new(Relay::new(on_event, requests.len()));
        let mut outputs = vec![None; requests.len()];
        let mut served_by = vec![0; requests.len()];
        let mut pending: Vec<usize> = (0..requests.len()).collect();
        while !pending.is_empty() {
            let shares = spread(&pending, self.chains.len());
            let results = self.run_round(requests, &shares, &relay).await;
            pending.clear();
            let mut failed = Vec::new();
            let mut shortage = None;
            for (at, (share, result)) in shares.into_iter().zip(results).enumerate() {
                match result {
                    Ok(generated) => {
                        for (index, output) in share.into_iter().zip(generated) {
                            outputs[index] = Some(output);
                            served_by[index] = self.chains[at].id;
                        }
                    }
                    Err(RoleError::Plan(error)) if error.is_shortage() => {
                        pending.extend(share);
                        failed.push(at);
                        shortage = Some(error);
                    }
                    Err(error) => return Err(error),
                }
            }
            if let Some(error) = shortage.filter(|_| failed.len() == self.chains.len()) {
                return Err(error.into());
            }
            pending.sort_unstable();
            self.report.moved += pending.len() as u32;
            self.retire(&failed).await;
        }
        self.report.served_by = served_by;
        Ok(outputs.into_iter().map(Option::unwrap_or_default).collect())
    }
}

impl<T: Transport + MaybeSync> Coordinator<T> {
    /// Hands the transport and the admitted donors over to one chain per plan.
    fn into_replicas(self, plans: &[Plan]) -> Result<Replicas<T>, RoleError> {
        let owner: HashMap<_, _> = (plans.iter().enumerate())
            .flat_map(|(lane, plan)| plan.donors.iter().map(move |d| (d.id, lane)))
            .collect();
        let (lanes, each) = Lanes::new(self.transport, owner, plans.len());
        let mut chains = Vec::with_capacity(plans.len());
        for ((id, lane), plan) in each.into_iter().enumerate().zip(plans) {
            let (model, sizes) = (self.model.clone(), self.sizes.clone());
            let mut coordinator = Coordinator::with_model(lane, self.config.clone(), model, sizes)?;
            for donor in &plan.donors {
                if let Some(info) = self.donors.get(&donor.id) {
                    coordinator.donors.insert(donor.id, info.clone());
                }
            }
            chains.push(Chain { id, coordinator });
        }
        Ok(Replicas {
            chains,
            lanes,
            report: ReplicaReport {
                rejoins: self.report.rejoins,
                ..ReplicaReport::default()
            },
            refused_while_gathering: self.refused_hellos,
        })
    }
}
