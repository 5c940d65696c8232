//! Tensors larger than a binding are split across buffers: forcing an 8 MiB binding limit must
//! give the same logits as the device's own limit.

mod support;

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
        for (position, (a, b)) in want.iter().zip(&got).enumerate() {
            let worst = a
                .iter()
                .zip(b)
                .map(|(x, y)| (x - y).abs())
                .fold(0.0f32, f32::max);
            assert!(
                worst <= 1e-4,
                "position {position}: logits differ by {worst}"
            );
        }
    });
}
