//! Prefill attention on cooperative matrices (`wgsl/attention_prefill_coop.wgsl`) against the
//! CPU references, on every device under test that has them, and the probe that chooses it.
//!
//! As with the prefill products (`ops_matmul_coop.rs`), CI's devices have no cooperative
//! matrices: there the test checks that the probe says so (the FP32 kernel's cases are in
//! `ops_attention.rs`). The kernel itself runs on the H200, where `WEBSHARD_REQUIRE_COOP_MATRIX=1`
//! makes a run without such a device fail.

use std::sync::Arc;

use webshard::gpu::{testing, Gpu};
use webshard::ops::attention::prefill_uses_coop_matrix;

use super::ops_attention::{Case, Path, Shape, GEMMA3, MHA, MINILM, QWEN25, SMOLLM2};

/// Phi-3's heads (96 wide: two subgroups share a row group, the second with two blocks).
const PHI3: Shape = Shape {
    name: "phi3",
    heads: 4,
    kv_heads: 4,
    head_dim: 96,
};

/// q and k, p and v each rounded to f16 before their products (the FP32 kernel's f16 variant
/// rounds only keys and values: 3e-3); the queries are scaled by 4 to make the softmax peaked.
const TOLERANCE: f32 = 6e-3;

/// Row blocks that end inside a 16-row group, keys past one split and one tile, chunked prefill
/// after start_pos > 0, sliding windows, soft-capping, GQA groups 1 to 7, head_dim 32 to 256.
fn causal_cases(seed: u64) -> Vec<Case> {
    let mut cases = Vec::new();
    for shape in [SMOLLM2, QWEN25, GEMMA3, MHA, PHI3] {
        for (start_pos, tokens, window, softcap) in [
            (0u32, 17u32, None, None),
            (0, 37, None, None),
            (0, 300, None, None),
            (236, 64, Some(100), None),
            (1436, 70, None, Some(5.0)),
            (3, 129, Some(7), Some(2.0)),
        ] {
            let case_seed = seed.wrapping_add(cases.len() as u64 * 10);
            cases.push(Case::new(
                shape, start_pos, tokens, window, softcap, case_seed,
            ));
        }
    }
    cases
}

fn check_coop_device(gpu: &Arc<Gpu>, seed: u64) {
    let variant = gpu.caps.best_variant();
    let mut cases: Vec<(Case, Path)> = causal_cases(seed)
        .into_iter()
        .map(|case| (case, Path::Prefill))
        .collect();
    for (i, tokens) in [17u32, 130, 512].into_iter().enumerate() {
        let case = Case::bidirectional(MINILM, tokens, seed ^ (0xb1d + i as u64));
        cases.push((case, Path::Bidirectional));
    }
    let mut worst = 0.0f32;
    for (case, path) in &cases {
        let head_dim = case.shape.head_dim;
        assert!(
            prefill_uses_coop_matrix(gpu, variant, head_dim, case.tokens),
            "{} {variant}: {} does not take the cooperative kernel",
            gpu.caps.adapter,
            case.label()
        );
        let got = case.run(gpu, variant, *path);
        let what = format!(
            "{} {variant} {path:?} {} seed {seed}",
            gpu.caps.adapter,
            case.label()
        );
        testing::assert_close(&got, &case.want, TOLERANCE, &what);
        worst = worst.max(testing::relative_error(&got, &case.want));
    }
    eprintln!(
        "{}: cooperative-matrix prefill attention, worst relative error {worst:e} over {} cases",
        gpu.caps.adapter,
        cases.len()
    );
}

#[test]
fn prefill_attention_on_cooperative_matrices_matches_the_reference() {
    let seed = testing::fresh_seed();
    let devices = pollster::block_on(testing::devices_under_test()).expect("devices under test");
    let mut coop_devices = 0;
    for gpu in &devices {
        let variant = gpu.caps.best_variant();
        if gpu.caps.coop_matrix {
            check_coop_device(gpu, seed);
            coop_devices += 1;
        } else {
            assert!(!prefill_uses_coop_matrix(gpu, variant, 64, 512));
        }
        // A speculative or batched step's tokens, and heads wider than four subgroups' blocks,
        // keep the FP32 kernel.
        assert!(!prefill_uses_coop_matrix(gpu, variant, 64, 16));
        assert!(!prefill_uses_coop_matrix(gpu, variant, 320, 512));
    }
    if std::env::var("WEBSHARD_REQUIRE_COOP_MATRIX").is_ok_and(|v| v == "1") {
        assert!(
            coop_devices > 0,
            "WEBSHARD_REQUIRE_COOP_MATRIX=1 but no device under test has cooperative matrices"
        );
    }
}
