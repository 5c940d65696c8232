//! The fidelity check of `tests/fidelity.rs` over a chosen subset of a model's golden records,
//! for goldens kept in the repository (tests/goldens).

use crate::support::goldens::{self, check_errors, check_prompt_ids, free_running, teacher_forced};
use webshard::gpu::GpuOptions;

/// Which records are checked, and how much of them runs free.
pub struct Coverage {
    /// Records compared teacher-forced over every golden step.
    pub records: &'static [usize],
    /// Free-running steps of each of the first `free_records` of `records` (on the backend
    /// that checks it).
    pub free_steps: usize,
    pub free_records: usize,
}

/// Checks `coverage` of the goldens of `model` (in file `file`): each record on one backend a
/// run, in turn from a start the seed chooses, so that every record is checked every run and
/// across runs on every backend (the seed, printed, replays the choice), as `fidelity.rs`
/// shares out its records. Both backends run the same kernels, each checked on both by the ops
/// tests; every record on every backend took 65-75 s a model on lavapipe and GL.
pub async fn check_model(model: &str, file: &str, coverage: &Coverage) {
    let goldens = crate::support::read_goldens(model);
    let records = goldens["records"].as_array().expect("records");
    let seed = webshard::gpu::testing::fresh_seed();
    let backends = crate::support::backends();
    for (b, &backend) in backends.iter().enumerate() {
        let mine = |n: usize| crate::support::on_backend(n, b, backends.len(), seed);
        if !(0..coverage.records.len()).any(mine) {
            continue;
        }
        let options = GpuOptions {
            backend,
            ..Default::default()
        };
        let mut engine = crate::support::load_engine(file, options).await;
        let adapter = engine.stage.gpu.caps.adapter.clone();
        let (mut errors, mut margins) = (Vec::new(), Vec::new());
        for (n, &r) in coverage.records.iter().enumerate() {
            if !mine(n) {
                continue;
            }
            let record = &records[r];
            let label = format!("{model} on {adapter} ({backend:?}) record {r} seed {seed}");
            check_prompt_ids(&engine, record, &label);
            errors.extend(teacher_forced(&mut engine, record, &label).await);
            margins.extend(goldens::steps(record).iter().map(|s| s.margin()));
            if n < coverage.free_records {
                free_running(&mut engine, record, coverage.free_steps, &label).await;
            }
        }
        margins.sort_by(f64::total_cmp);
        println!(
            "{model}: median golden margin {:.3}",
            margins[margins.len() / 2]
        );
        check_errors(&errors, &format!("{model} on {adapter} ({backend:?})"));
    }
}
