//! The fidelity check of `tests/fidelity.rs` over a chosen subset of a model's golden records,
//! for goldens kept in the repository (tests/goldens).

use crate::support::goldens::{self, check_errors, check_prompt_ids, free_running, teacher_forced};
use webshard::gpu::GpuOptions;

/// Which records are checked, and how much of them runs free.
pub struct Coverage {
    /// Records compared teacher-forced over every golden step.
    pub records: &'static [usize],
    /// Free-running steps of each of the first `free_records` of `records`.
    pub free_steps: usize,
    pub free_records: usize,
}

/// Checks `coverage` of the goldens of `model` (in file `file`) on every backend.
pub async fn check_model(model: &str, file: &str, coverage: &Coverage) {
    let goldens = crate::support::read_goldens(model);
    let records = goldens["records"].as_array().expect("records");
    for backend in crate::support::backends() {
        let options = GpuOptions {
            backend,
            ..Default::default()
        };
        let mut engine = crate::support::load_engine(file, options).await;
        let adapter = engine.stage.gpu.caps.adapter.clone();
        let (mut errors, mut margins) = (Vec::new(), Vec::new());
        for (n, &r) in coverage.records.iter().enumerate() {
            let record = &records[r];
            let label = format!("{model} on {adapter} ({backend:?}) record {r}");
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
