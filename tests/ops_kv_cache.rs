//! The KV cache (`kv_write` into one layer, impossible shapes refused) and softmax on every
//! device and variant against the CPU references.

use std::sync::Arc;

use webshard::gpu::{self, testing, BackendChoice, Gpu, GpuOptions, Recorder, Variant};
use webshard::ops::attention::{kv_write, softmax, softmax_reference, KvCache};

fn devices() -> Vec<Arc<Gpu>> {
    pollster::block_on(testing::devices_under_test()).expect("devices under test")
}

fn device_variants(devices: &[Arc<Gpu>]) -> Vec<(&Arc<Gpu>, Variant)> {
    devices
        .iter()
        .flat_map(|g| g.caps.all_variants().into_iter().map(move |v| (g, v)))
        .collect()
}

#[test]
fn softmax_matches_reference() {
    let seed = testing::fresh_seed();
    let devices = devices();
    for (gpu, variant) in device_variants(&devices) {
        for (rows, cols) in [(7u32, 1u32), (3, 17), (5, 1000), (2, 1500), (300, 33)] {
            let count = (rows * cols) as usize;
            let input: Vec<f32> = testing::random_f32(count, seed + u64::from(cols))
                .into_iter()
                .map(|x| x * 8.0)
                .collect();
            let x = gpu::upload_f32(gpu, "x", &input);
            let mut rec = Recorder::with_variant(gpu, variant);
            softmax(&mut rec, &x, rows, cols);
            let bytes = pollster::block_on(rec.submit_and_read(&x, 0, count as u64 * 4));
            let got: Vec<f32> = bytemuck::pod_collect_to_vec(&bytes.unwrap());
            let want = softmax_reference(&input, cols as usize);
            let what = format!(
                "{} {variant} softmax {rows}x{cols} seed {seed}",
                gpu.caps.backend
            );
            testing::assert_close(&got, &want, 1e-5, &what);
            println!(
                "{what}: relative error {:.2e}",
                testing::relative_error(&got, &want)
            );
        }
    }
}

#[test]
fn kv_write_fills_exactly_its_rows_of_one_layer() {
    let seed = testing::fresh_seed();
    let (layers, max_ctx, kv_heads, head_dim) = (3u32, 37u32, 3u32, 16u32);
    let (layer, start_pos, tokens) = (1u32, 5u32, 12u32);
    let row = (kv_heads * head_dim) as usize;
    for gpu in devices() {
        let cache = KvCache::new(&gpu, layers, max_ctx, kv_heads, head_dim).unwrap();
        assert_eq!(cache.k.len(), 1, "3 small layers fit one binding");
        for buffer in cache.k.iter().chain(&cache.v) {
            gpu::poison_f32(&gpu, buffer);
        }
        let k = testing::random_f32(tokens as usize * row, seed);
        let v = testing::random_f32(tokens as usize * row, seed + 1);
        let (k_buf, v_buf) = (
            gpu::upload_f32(&gpu, "k", &k),
            gpu::upload_f32(&gpu, "v", &v),
        );
        let mut rec = Recorder::new(&gpu);
        kv_write(&mut rec, &cache, layer, &k_buf, &v_buf, start_pos, tokens);
        rec.submit();
        for (buffer, data) in [(&cache.k[0], &k), (&cache.v[0], &v)] {
            let bytes = pollster::block_on(gpu::read_back(&gpu, buffer, 0, buffer.size())).unwrap();
            let words: Vec<u32> = bytemuck::pod_collect_to_vec(&bytes);
            let layer_start = (cache.layer_stride / 4) as usize * layer as usize;
            let first = layer_start + start_pos as usize * row;
            for (i, word) in words.iter().enumerate() {
                let expected = match i.checked_sub(first) {
                    Some(offset) if offset < data.len() => data[offset].to_bits(),
                    _ => gpu::POISON,
                };
                assert_eq!(*word, expected, "{} word {i} seed {seed}", gpu.caps.adapter);
            }
        }
    }
}

#[test]
fn impossible_cache_shapes_are_errors() {
    let options = GpuOptions {
        backend: BackendChoice::Vulkan,
        max_binding_override: Some(4096),
        ..Default::default()
    };
    let gpu = pollster::block_on(Gpu::new(&options)).expect("gpu");
    let error = KvCache::new(&gpu, 2, 100, 1, 64).unwrap_err();
    assert!(error.to_string().contains("kv_cache layer"), "{error}");
    assert!(error.to_string().contains("25600"), "{error}");
    let error = KvCache::new(&gpu, 2, 10, 1, 6).unwrap_err();
    assert!(error.to_string().contains("head_dim 6"), "{error}");
    let error = KvCache::new(&gpu, 0, 10, 1, 8).unwrap_err();
    assert!(error.to_string().contains("layers 0"), "{error}");
}
