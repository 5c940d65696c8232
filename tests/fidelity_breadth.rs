//! Fidelity against llama.cpp's goldens (`../shared/goldens/README.md`'s rules) for the models of
//! issue 13's breadth, on every backend of `support::backends()` (lavapipe and GL in CI): the
//! small seeded-random llama (Llama 3 RoPE scaling, `rope_freqs`) and phi3 (fused qkv and
//! gate|up, partial NeoX RoPE, long factors and attention factor) models, and the llama one
//! with matrices in Q2_K, Q3_K, IQ4_NL and IQ4_XS. Their goldens are in
//! tests/goldens (made by tests/goldens/make_goldens.py); every record is checked each run,
//! teacher-forced at every golden step, and free-run 8 steps, on one backend (the seed rotates
//! them: `breadth::check_model`).
//!
//! SmolLM2 re-quantized to Q2_K and IQ4_NL has goldens there too, but its models are not in CI's
//! set (their build needs a pip build of llama-cpp-python): docs/ci.md ("Re-quantized SmolLM2")
//! has that run and its figures.

use crate::support::breadth::{check_model, Coverage};

const TINY: Coverage = Coverage {
    records: &[0, 1, 2, 3],
    free_steps: 8,
    free_records: 4,
};

#[test]
fn tiny_llama3_matches_llama_cpp() {
    pollster::block_on(check_model(
        "tiny-llama3-f16",
        "tiny-llama3.F16.gguf",
        &TINY,
    ));
}

#[test]
fn tiny_phi3_matches_llama_cpp() {
    pollster::block_on(check_model("tiny-phi3-f16", "tiny-phi3.F16.gguf", &TINY));
}

/// tiny-llama3 with its ffn_gate and ffn_up in the four issue-13 block types, one type per layer
/// (blk.0 Q2_K, blk.1 Q3_K, blk.2 IQ4_NL, blk.3 IQ4_XS; .ci/requantize_tiny.py), goldens from
/// llama.cpp running the same file.
#[test]
fn tiny_llama3_in_the_new_quant_types_matches_llama_cpp() {
    pollster::block_on(check_model(
        "tiny-llama3-mixq",
        "tiny-llama3.mixq.gguf",
        &TINY,
    ));
}
