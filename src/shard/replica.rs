//! Replica planning: with more donors than one chain needs, the fleet can run several chains
//! (replicas), each serving its own requests, instead of one longer chain.
//!
//! Depth lowers the slowest stage, which bounds a pipelined chain's throughput; replicas
//! serve requests side by side, each crossing fewer hops. Which is better depends on the
//! donors' memory (what each chain can hold), their measured speed and how many requests are
//! in flight, so the choice is made from an estimate: a chain of stage times `t_1..t_n`
//! (`StagePlan::est_ms`) with `hop_ms` per hop takes `L = Σ t + (n + 1) · hop_ms` per token of
//! one request, and with `c` of its requests in flight it yields `min(c / L, 1 / max t)`
//! tokens per ms. Requests are spread evenly over the chains.
//!
//! Candidates are 1 to `min(donors, requests)` chains; donors are dealt to chains largest
//! memory first, round robin, so every chain gets a like share, and each chain keeps the
//! fleet's donor order and is planned by `plan`. A candidate whose chains cannot all hold
//! the model is skipped. The best estimate wins; among estimates within `TIE` of it, the one
//! with more chains (fewer hops per token, and a lost donor stops fewer requests).

use super::plan::{plan, DonorCapacity, ModelSizes, Plan, PlanError};

/// Estimates this close (relative) count as equal: the estimate is not finer than that.
const TIE: f64 = 0.02;

/// The chains a fleet runs, each a `Plan` over its own donors.
#[derive(Clone, Debug, PartialEq)]
pub struct FleetPlan {
    pub chains: Vec<Plan>,
    /// Estimated tokens per second of all chains together at the planned concurrency.
    pub est_tokens_per_s: f64,
}

/// Plans `donors` as one or more chains for `requests` requests in flight, `hop_ms` being
/// the cost of one hop between peers (transfer and queueing, not in any stage's estimate).
pub fn plan_replicas(
    model: &ModelSizes,
    donors: &[DonorCapacity],
    requests: usize,
    hop_ms: f64,
) -> Result<FleetPlan, PlanError> {
    let single = plan(model, donors)?;
    let requests = requests.max(1);
    let mut best = FleetPlan {
        est_tokens_per_s: fleet_rate(std::slice::from_ref(&single), requests, hop_ms),
        chains: vec![single],
    };
    // Ties are judged against the best rate seen, so a run of near ties cannot drift down.
    let mut top = best.est_tokens_per_s;
    for count in 2..=donors.len().min(requests) {
        let Ok(chains) = plan_chains(model, donors, count) else {
            continue;
        };
        let rate = fleet_rate(&chains, requests, hop_ms);
        if rate >= top * (1.0 - TIE) {
            best = FleetPlan {
                chains,
                est_tokens_per_s: rate,
            };
        }
        top = top.max(rate);
    }
    Ok(best)
}

/// Exactly `count` chains: `donors` dealt as `plan_replicas` deals them, each group planned.
pub fn plan_chains(
    model: &ModelSizes,
    donors: &[DonorCapacity],
    count: usize,
) -> Result<Vec<Plan>, PlanError> {
    if count == 0 || count > donors.len() {
        return Err(PlanError::ChainCount {
            chains: count,
            donors: donors.len(),
        });
    }
    deal(donors, count)
        .iter()
        .map(|group| plan(model, group))
        .collect()
}

/// `count` groups of donors: largest memory first, round robin; each group in fleet order.
fn deal(donors: &[DonorCapacity], count: usize) -> Vec<Vec<DonorCapacity>> {
    let mut by_memory: Vec<usize> = (0..donors.len()).collect();
    by_memory.sort_by_key(|&i| std::cmp::Reverse(donors[i].usable_bytes));
    let mut groups: Vec<Vec<usize>> = vec![Vec::new(); count];
    for (turn, index) in by_memory.into_iter().enumerate() {
        groups[turn % count].push(index);
    }
    groups
        .into_iter()
        .map(|mut group| {
            group.sort_unstable();
            group.into_iter().map(|i| donors[i]).collect()
        })
        .collect()
}

/// Tokens per second of `chains` with `requests` spread evenly over them.
fn fleet_rate(chains: &[Plan], requests: usize, hop_ms: f64) -> f64 {
    chains
        .iter()
        .enumerate()
        .map(|(index, chain)| {
            let share = requests / chains.len() + usize::from(index < requests % chains.len());
            chain_rate(chain, share, hop_ms)
        })
        .sum()
}

/// Tokens per second of one chain with `in_flight` of its requests in it at once.
pub fn chain_rate(chain: &Plan, in_flight: usize, hop_ms: f64) -> f64 {
    let hops = (chain.stages.len() + 1) as f64;
    let latency_ms: f64 = chain.stages.iter().map(|s| s.est_ms).sum::<f64>() + hops * hop_ms;
    let pipelined = in_flight as f64 / latency_ms.max(f64::MIN_POSITIVE);
    let bound = 1.0 / chain.max_stage_ms().max(f64::MIN_POSITIVE);
    pipelined.min(bound) * 1000.0
}
