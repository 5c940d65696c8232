//! Tensors larger than a binding are split across buffers: forcing an 8 MiB binding limit must
//! give the same logits as the device's own limit. Scoring from a later position gives the same
//! rows for the positions it scores.

use crate::support;

use webshard::gpu::GpuOptions;

#[test]
fn forced_small_bindings_give_the_same_logits() {
    pollster::block_on(async {
        let ids = [1u32, 504, 3575, 282, 4649, 314, 7042, 30];
        let mut whole = support::load_engine(support::SMOLLM2.1, GpuOptions::default()).await;
        let split_options = GpuOptions {
            max_binding_override: Some(8 << 20),
            ..Default::default()
        };
        let mut split = support::load_engine(support::SMOLLM2.1, split_options).await;
        assert_eq!(split.stage.gpu.caps.max_binding, 8 << 20);
        let want = whole.score(&ids).await.expect("score");
        let got = split.score(&ids).await.expect("score split");
        assert_eq!(got.len(), ids.len());
        assert_close_rows(&want, &got, 0, "split bindings");
        // The engine's tail-only scoring (the fidelity tests' teacher-forced pass) gives the
        // same rows for the positions it scores, and none for the others.
        let tail = whole.score_from(&ids, 5).await.expect("score_from");
        assert_eq!(tail.len(), ids.len() - 5);
        assert_close_rows(&want[5..], &tail, 5, "score_from");
        assert!(whole
            .score_from(&ids, 99)
            .await
            .expect("past the end")
            .is_empty());
    });
}

/// Rows of logits equal within f32 rounding (other chunkings of the same kernels); positions
/// named from `first`.
fn assert_close_rows(want: &[Vec<f32>], got: &[Vec<f32>], first: usize, what: &str) {
    assert_eq!(want.len(), got.len(), "{what}: rows");
    for (index, (a, b)) in want.iter().zip(got).enumerate() {
        let worst = a
            .iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0f32, f32::max);
        assert!(
            worst <= 1e-4,
            "{what}: position {}: logits differ by {worst}",
            first + index
        );
    }
}
