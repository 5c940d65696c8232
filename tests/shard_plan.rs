//! The layer planner: invariants on random fleets, optimality against brute force, errors,
//! re-planning, and sizes read from the real models' headers.

use std::path::PathBuf;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use webshard::gguf::{read_header, FileSource, Header};
use webshard::shard::{
    plan, plan_replicas, replan, DonorCapacity, FleetChange, ModelSizes, PeerId, Plan, PlanError,
};

const MODEL_FILES: [&str; 3] = [
    "SmolLM2-135M-Instruct.Q4_1.gguf",
    "qwen2.5-coder-0.5b-instruct-awq.Q4_K_M.gguf",
    "gemma-3-270m-q4_k_m.gguf",
];

fn read_model_header(file: &str) -> Header {
    let dir = std::env::var("WEBSHARD_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models"));
    let path = dir.join(file);
    assert!(path.is_file(), "model {} is missing", path.display());
    let source = FileSource::open(&path).expect("open model");
    pollster::block_on(read_header(&source)).expect("read header")
}

fn donor(id: u128, usable_bytes: u64, ms_per_layer: f32) -> DonorCapacity {
    DonorCapacity {
        id: PeerId(id),
        usable_bytes,
        ms_per_layer,
    }
}

/// The cost model, stated independently of the planner: memory is the stage's weights,
/// runtime bytes and edge tensors (a tied matrix once); time scales the donor's ms per
/// layer by the bytes read over the mean layer's bytes.
fn stage_cost(model: &ModelSizes, donor: &DonorCapacity, start: usize, end: usize) -> (u64, f64) {
    let n = model.layer_bytes.len();
    let weights: u64 = model.layer_bytes[start..end].iter().sum();
    let mut memory = weights + model.runtime_bytes_per_layer * (end - start) as u64;
    let mut read = weights as f64;
    if start == 0 {
        memory += model.embedding_bytes;
    }
    if end == n {
        memory += model.head_bytes;
        read += model.head_bytes as f64;
    }
    if start == 0 && end == n {
        memory -= model.shared_edge_bytes;
    }
    let mean = model.layer_bytes.iter().sum::<u64>() as f64 / n as f64;
    (memory, donor.ms_per_layer as f64 * read / mean)
}

/// The best (max stage ms, stage count) over every split of the layers in donor order.
fn brute_force(model: &ModelSizes, donors: &[DonorCapacity]) -> Option<(f64, usize)> {
    fn go(
        model: &ModelSizes,
        donors: &[DonorCapacity],
        start: usize,
        acc: (f64, usize),
        best: &mut Option<(f64, usize)>,
    ) {
        let n = model.layer_bytes.len();
        if start == n {
            if best.is_none_or(|b| acc < b) {
                *best = Some(acc);
            }
            return;
        }
        let Some((donor, rest)) = donors.split_first() else {
            return;
        };
        go(model, rest, start, acc, best);
        for end in start + 1..=n {
            let (memory, ms) = stage_cost(model, donor, start, end);
            if memory <= donor.usable_bytes {
                go(model, rest, end, (acc.0.max(ms), acc.1 + 1), best);
            }
        }
    }
    let mut best = None;
    go(model, donors, 0, (0.0, 0), &mut best);
    best
}

/// Every layer once, contiguous, in donor order, within memory, edges on the ends, and the
/// recorded bytes and times match the cost model.
fn assert_valid(model: &ModelSizes, donors: &[DonorCapacity], plan: &Plan) {
    let n = model.layer_bytes.len() as u32;
    let mut next_layer = 0;
    let mut last_donor_index = None;
    for (i, stage) in plan.stages.iter().enumerate() {
        assert_eq!(stage.stage_id as usize, i);
        assert_eq!(stage.layers.start, next_layer, "{plan:?}");
        assert!(stage.layers.end > stage.layers.start);
        next_layer = stage.layers.end;
        let index = donors.iter().position(|d| d.id == stage.donor).unwrap();
        assert!(last_donor_index < Some(index), "donor order: {plan:?}");
        last_donor_index = Some(index);
        let donor = &donors[index];
        let (memory, ms) = stage_cost(
            model,
            donor,
            stage.layers.start as usize,
            stage.layers.end as usize,
        );
        assert_eq!(stage.bytes, memory);
        assert!(memory <= donor.usable_bytes);
        assert!((stage.est_ms - ms).abs() <= 1e-9 * ms.max(1.0));
        assert_eq!(stage.embedding, i == 0);
        assert_eq!(stage.head, i + 1 == plan.stages.len());
    }
    assert_eq!(next_layer, n);
    assert_eq!(plan.donors, donors);
}

fn random_case(
    rng: &mut StdRng,
    max_layers: usize,
    max_donors: usize,
) -> (ModelSizes, Vec<DonorCapacity>) {
    let n = rng.random_range(1..=max_layers);
    let embedding_bytes = rng.random_range(0..400);
    let tied = rng.random_bool(0.5);
    let model = ModelSizes {
        layer_bytes: (0..n).map(|_| rng.random_range(50..150)).collect(),
        embedding_bytes,
        head_bytes: rng.random_range(1..20) + if tied { embedding_bytes } else { 0 },
        shared_edge_bytes: if tied { embedding_bytes } else { 0 },
        runtime_bytes_per_layer: rng.random_range(0..30),
    };
    let donors = (0..rng.random_range(1..=max_donors))
        .map(|i| {
            donor(
                i as u128 + 1,
                rng.random_range(0..1500),
                rng.random_range(0.1f32..4.0),
            )
        })
        .collect();
    (model, donors)
}

#[test]
fn random_fleets_get_valid_optimal_plans() {
    let mut rng = StdRng::seed_from_u64(0x91a4);
    let (mut planned, mut refused) = (0, 0);
    for _ in 0..1500 {
        let (model, donors) = random_case(&mut rng, 9, 4);
        let expected = brute_force(&model, &donors);
        match plan(&model, &donors) {
            Ok(plan) => {
                planned += 1;
                assert_valid(&model, &donors, &plan);
                let (best_ms, best_stages) = expected.expect("brute force finds a plan too");
                assert!((plan.max_stage_ms() - best_ms).abs() <= 1e-9 * best_ms.max(1.0));
                assert_eq!(plan.stages.len(), best_stages, "{plan:?}");
            }
            Err(err) => {
                refused += 1;
                assert_eq!(expected, None, "{err}");
                assert!(matches!(
                    err,
                    PlanError::LayerTooLarge { .. } | PlanError::CannotHold { .. }
                ));
            }
        }
    }
    assert!(
        planned > 300 && refused > 100,
        "{planned} planned, {refused} refused"
    );
}

#[test]
fn large_random_fleets_get_valid_plans() {
    let mut rng = StdRng::seed_from_u64(0x5ca1e);
    for _ in 0..100 {
        let (model, mut donors) = random_case(&mut rng, 120, 12);
        for d in &mut donors {
            d.usable_bytes *= 10;
        }
        if let Ok(plan) = plan(&model, &donors) {
            assert_valid(&model, &donors, &plan);
        }
    }
}

#[test]
fn equal_donors_split_evenly_and_the_fast_one_gets_more() {
    let model = ModelSizes {
        layer_bytes: vec![100; 12],
        embedding_bytes: 0,
        head_bytes: 0,
        shared_edge_bytes: 0,
        runtime_bytes_per_layer: 0,
    };
    let equal = [
        donor(1, 10_000, 1.0),
        donor(2, 10_000, 1.0),
        donor(3, 10_000, 1.0),
    ];
    let even = plan(&model, &equal).unwrap();
    let ranges: Vec<_> = even.stages.iter().map(|s| s.layers.clone()).collect();
    assert_eq!(ranges, [0..4, 4..8, 8..12]);
    let uneven = [donor(1, 10_000, 1.0), donor(2, 10_000, 3.0)];
    let split = plan(&model, &uneven).unwrap();
    let ranges: Vec<_> = split.stages.iter().map(|s| s.layers.clone()).collect();
    assert_eq!(ranges, [0..9, 9..12]);
    // Memory overrides speed: the fast donor holds only 5 layers.
    let small_fast = [donor(1, 500, 1.0), donor(2, 10_000, 3.0)];
    let ranges: Vec<_> = plan(&model, &small_fast)
        .unwrap()
        .stages
        .iter()
        .map(|s| s.layers.clone())
        .collect();
    assert_eq!(ranges, [0..5, 5..12]);
}

#[test]
fn impossible_fleets_get_clear_errors() {
    let model = ModelSizes {
        layer_bytes: vec![100, 300, 100],
        embedding_bytes: 50,
        head_bytes: 20,
        shared_edge_bytes: 0,
        runtime_bytes_per_layer: 0,
    };
    assert_eq!(
        plan(&model, &[donor(1, 250, 1.0), donor(2, 250, 1.0)]),
        Err(PlanError::LayerTooLarge {
            layer: 1,
            bytes: 300,
            largest: 250
        })
    );
    assert_eq!(
        plan(&model, &[donor(1, 300, 1.0), donor(2, 200, 1.0)]),
        Err(PlanError::CannotHold {
            needed: 570,
            available: 500
        })
    );
    // Enough memory in total, but no contiguous split fits.
    assert!(matches!(
        plan(
            &model,
            &[donor(1, 300, 1.0), donor(2, 150, 1.0), donor(3, 300, 1.0)]
        ),
        Err(PlanError::CannotHold { .. })
    ));
    assert_eq!(plan(&model, &[]), Err(PlanError::NoDonors));
    let no_layers = ModelSizes {
        layer_bytes: vec![],
        ..model.clone()
    };
    assert_eq!(
        plan(&no_layers, &[donor(1, 1, 1.0)]),
        Err(PlanError::NoLayers)
    );
    for bad in [0.0, -1.0, f32::NAN, f32::INFINITY] {
        assert!(matches!(
            plan(&model, &[donor(1, 1000, bad)]),
            Err(PlanError::BadProbe { .. })
        ));
    }
    assert_eq!(
        plan(&model, &[donor(1, 1000, 1.0), donor(1, 1000, 1.0)]),
        Err(PlanError::DuplicateDonor { donor: PeerId(1) })
    );
}

#[test]
fn replanning_follows_joins_and_leaves() {
    let model = ModelSizes {
        layer_bytes: vec![100; 8],
        embedding_bytes: 40,
        head_bytes: 40,
        shared_edge_bytes: 0,
        runtime_bytes_per_layer: 10,
    };
    let first = plan(&model, &[donor(1, 2000, 1.0), donor(2, 2000, 1.0)]).unwrap();
    let joined = replan(&model, &first, FleetChange::Join(donor(3, 2000, 1.0))).unwrap();
    assert_eq!(joined.stages.len(), 3);
    assert_eq!(joined.stages[2].donor, PeerId(3));
    assert!(joined.max_stage_ms() < first.max_stage_ms());
    assert_valid(&model, &joined.donors.clone(), &joined);
    let left = replan(&model, &joined, FleetChange::Leave(PeerId(2))).unwrap();
    let donors: Vec<_> = left.stages.iter().map(|s| s.donor).collect();
    assert_eq!(donors, [PeerId(1), PeerId(3)]);
    assert_eq!(
        left,
        plan(&model, &[donor(1, 2000, 1.0), donor(3, 2000, 1.0)]).unwrap()
    );
    assert_eq!(
        replan(&model, &left, FleetChange::Leave(PeerId(2))),
        Err(PlanError::UnknownDonor { donor: PeerId(2) })
    );
    let alone = replan(&model, &left, FleetChange::Leave(PeerId(1))).unwrap();
    assert_eq!(alone.stages.len(), 1);
    assert!(alone.stages[0].embedding && alone.stages[0].head);
}

#[test]
fn real_model_sizes_come_from_their_headers() {
    for file in MODEL_FILES {
        let header = read_model_header(file);
        let sizes = ModelSizes::from_header(&header).unwrap();
        let arch = header.architecture().unwrap();
        let n_layers = header
            .metadata
            .get_u32(&format!("{arch}.block_count"))
            .unwrap();
        assert_eq!(sizes.layer_bytes.len(), n_layers as usize, "{file}");
        let tensor = |name: &str| header.tensor(name).map_or(0, |t| t.bytes);
        let layer_total: u64 = header
            .tensors
            .iter()
            .filter(|t| t.name.starts_with("blk."))
            .map(|t| t.bytes)
            .sum();
        assert_eq!(sizes.layer_bytes.iter().sum::<u64>(), layer_total, "{file}");
        assert_eq!(sizes.embedding_bytes, tensor("token_embd.weight"));
        let tied = header.tensor("output.weight").is_none();
        let head_matrix = if tied {
            tensor("token_embd.weight")
        } else {
            tensor("output.weight")
        };
        assert_eq!(sizes.head_bytes, tensor("output_norm.weight") + head_matrix);
        assert_eq!(
            sizes.shared_edge_bytes,
            if tied { sizes.embedding_bytes } else { 0 }
        );
        // A single donor holds all: every tensor of the stage parts exactly once.
        let one = plan(&sizes, &[donor(1, u64::MAX, 1.0)]).unwrap();
        let all_parts = layer_total
            + tensor("token_embd.weight")
            + tensor("output_norm.weight")
            + tensor("output.weight");
        assert_eq!(one.stages[0].bytes, all_parts, "{file}");
        // Three equal donors, each able to hold three quarters of the model (Gemma's tied
        // 262k-token embedding sits on both ends): optimal and valid.
        let donors: Vec<_> = (1..=3).map(|i| donor(i, all_parts / 4 * 3, 1.0)).collect();
        let three = plan(&sizes, &donors).unwrap();
        assert_valid(&sizes, &donors, &three);
        let (best_ms, _) = brute_force(&sizes, &donors).unwrap();
        assert!((three.max_stage_ms() - best_ms).abs() <= 1e-9 * best_ms);
        println!(
            "{file}: {} layers, stages {:?}",
            n_layers,
            three
                .stages
                .iter()
                .map(|s| (
                    s.layers.clone(),
                    s.bytes,
                    (s.est_ms * 100.0).round() / 100.0
                ))
                .collect::<Vec<_>>()
        );
    }
}

/// Why a joiner can get no stage (the fleet test's "joins 0"): on SmolLM2 the last stage
/// carries the 30 MB tied head, about 14 layers' worth, and a joiner goes last. Equal to the
/// others it is planned in; probed 1.7x slower (a loaded 2-core machine does that) the chain
/// is no faster with it, and the plan rightly keeps the two stages it had.
#[test]
fn a_joiner_probed_much_slower_than_the_others_gets_no_stage() {
    let sizes = ModelSizes::from_header(&read_model_header(MODEL_FILES[0])).unwrap();
    let gib = 1 << 30;
    let first = plan(&sizes, &[donor(1, gib, 1.0), donor(2, gib, 1.0)]).unwrap();
    assert_eq!(first.stages.len(), 2);
    let equal = replan(&sizes, &first, FleetChange::Join(donor(3, gib, 1.0))).unwrap();
    assert_eq!(equal.stages.len(), 3);
    assert_eq!(equal.stages[2].donor, PeerId(3));
    let slow = replan(&sizes, &first, FleetChange::Join(donor(3, gib, 1.7))).unwrap();
    assert_eq!(slow.stages, first.stages);
}

/// Eight 100-byte layers, 40-byte edges: 880 bytes in all (runtime included).
fn small_model() -> ModelSizes {
    ModelSizes {
        layer_bytes: vec![100; 8],
        embedding_bytes: 40,
        head_bytes: 40,
        shared_edge_bytes: 0,
        runtime_bytes_per_layer: 0,
    }
}

/// Every chain of a replica plan is a valid plan over its own donors, and no donor is in two.
fn assert_valid_replicas(model: &ModelSizes, donors: &[DonorCapacity], chains: &[Plan]) {
    let mut seen = Vec::new();
    for chain in chains {
        assert_valid(model, &chain.donors.clone(), chain);
        seen.extend(chain.donors.iter().map(|d| d.id));
    }
    seen.sort_unstable_by_key(|id| id.0);
    let mut all: Vec<PeerId> = donors.iter().map(|d| d.id).collect();
    all.sort_unstable_by_key(|id| id.0);
    assert_eq!(seen, all, "every donor in exactly one chain");
}

/// Donors that each hold the whole model serve 4 requests as replicas (one hop per token
/// and no slower: the whole fleet's rate is the same or better), not as one deep chain;
/// one request at a time takes the single chain.
#[test]
fn donors_that_each_hold_the_model_become_replicas_for_concurrent_requests() {
    let model = small_model();
    let donors: Vec<_> = (1..=4).map(|i| donor(i, 10_000, 1.0)).collect();
    let fleet = plan_replicas(&model, &donors, 4, 0.5).unwrap();
    assert_eq!(fleet.chains.len(), 4, "{fleet:?}");
    assert_valid_replicas(&model, &donors, &fleet.chains);
    assert!(fleet.chains.iter().all(|c| c.stages.len() == 1));
    let deep = plan_replicas(&model, &donors, 1, 0.5).unwrap();
    assert_eq!(deep.chains.len(), 1);
    assert_eq!(deep.chains[0], plan(&model, &donors).unwrap());
}

/// Donors that hold 60% of the model each: two chains of two for 4 requests; donors that
/// need three to a chain stay one chain.
#[test]
fn memory_sets_how_many_donors_a_replica_needs() {
    let model = small_model();
    let donors: Vec<_> = (1..=4).map(|i| donor(i, 528, 1.0)).collect();
    let fleet = plan_replicas(&model, &donors, 4, 0.5).unwrap();
    assert_eq!(fleet.chains.len(), 2, "{fleet:?}");
    assert_valid_replicas(&model, &donors, &fleet.chains);
    assert!(fleet.chains.iter().all(|c| c.stages.len() == 2));
    let small: Vec<_> = (1..=4).map(|i| donor(i, 340, 1.0)).collect();
    let one = plan_replicas(&model, &small, 4, 0.5).unwrap();
    assert_eq!(one.chains, vec![plan(&model, &small).unwrap()]);
    let none = plan_replicas(&model, &[donor(1, 500, 1.0)], 4, 0.5);
    assert!(
        matches!(none, Err(PlanError::CannotHold { .. })),
        "{none:?}"
    );
}

/// Speed counts: a donor 4x slower than the others is worth less as a replica of its own
/// than as part of a chain; the estimate never prefers a plan it rates lower.
#[test]
fn a_slow_donor_is_not_made_a_replica_that_would_lower_the_fleet_rate() {
    let model = small_model();
    let donors = [donor(1, 10_000, 1.0), donor(2, 10_000, 4.0)];
    let fleet = plan_replicas(&model, &donors, 2, 0.5).unwrap();
    let replicas: Vec<Plan> = donors
        .iter()
        .map(|d| plan(&model, std::slice::from_ref(d)).unwrap())
        .collect();
    let best_single = plan_replicas(&model, &donors, 1, 0.5).unwrap();
    assert!(fleet.est_tokens_per_s >= best_single.est_tokens_per_s * 0.98);
    if fleet.chains.len() == 2 {
        assert_eq!(fleet.chains, replicas);
    }
    let mut rng = StdRng::seed_from_u64(16);
    for _ in 0..200 {
        let (model, donors) = random_case(&mut rng, 12, 6);
        let requests = rng.random_range(1..=6);
        if let Ok(fleet) = plan_replicas(&model, &donors, requests, 0.25) {
            assert_valid_replicas(&model, &donors, &fleet.chains);
            assert!(fleet.chains.len() <= requests.min(donors.len()));
            let single = plan_replicas(&model, &donors, 1, 0.25).unwrap();
            assert_eq!(single.chains.len(), 1);
        }
    }
}
