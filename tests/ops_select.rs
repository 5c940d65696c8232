//! GPU argmax and top-k against the CPU references: exact ids and values, every device and
//! variant in both work splits (each case in one variant, in turn), vocabulary sizes of the
//! real models, and ties.

use std::sync::Arc;

use webshard::gpu::{self, testing, Gpu, Recorder, Variant};
use webshard::ops::select;

const SIZES: [usize; 5] = [1, 1000, 49_152, 151_936, 262_144];

/// Every device in both work splits, with its variants: each case of a test runs in one of
/// them in turn (`testing::variant_for_case`), and every test has at least as many cases as a
/// device has variants.
fn devices() -> Vec<(Arc<Gpu>, Vec<Variant>)> {
    let devices = pollster::block_on(testing::devices_both_splits()).expect("gpu devices");
    devices
        .into_iter()
        .map(|gpu| {
            let variants = gpu.caps.all_variants();
            (gpu, variants)
        })
        .collect()
}

fn logits(n: usize, seed: u64) -> Vec<f32> {
    testing::random_f32(n, seed)
        .into_iter()
        .map(|v| v * 20.0)
        .collect()
}

fn random_index(n: usize, seed: u64) -> usize {
    (seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 11) as usize % n
}

fn gpu_argmax(gpu: &Gpu, variant: Variant, values: &[f32]) -> u32 {
    let out = gpu::storage_buffer(gpu, "argmax", 4);
    gpu::poison_f32(gpu, &out);
    let mut rec = Recorder::with_variant(gpu, variant);
    select::argmax(
        &mut rec,
        &gpu::upload_f32(gpu, "logits", values),
        values.len() as u32,
        &out,
    );
    let bytes = pollster::block_on(rec.submit_and_read(&out, 0, 4)).unwrap();
    u32::from_le_bytes(bytes[..4].try_into().unwrap())
}

fn gpu_top_k(gpu: &Gpu, variant: Variant, values: &[f32], k: usize) -> (Vec<u32>, Vec<f32>) {
    let ids = gpu::storage_buffer(gpu, "ids", (k * 4) as u64);
    let out_values = gpu::storage_buffer(gpu, "values", (k * 4) as u64);
    gpu::poison_f32(gpu, &ids);
    gpu::poison_f32(gpu, &out_values);
    let mut rec = Recorder::with_variant(gpu, variant);
    let logits_buf = gpu::upload_f32(gpu, "logits", values);
    select::top_k(
        &mut rec,
        &logits_buf,
        values.len() as u32,
        k as u32,
        &ids,
        &out_values,
    );
    rec.submit();
    let id_bytes = pollster::block_on(gpu::read_back(gpu, &ids, 0, (k * 4) as u64)).unwrap();
    let got_values = pollster::block_on(gpu::read_f32(gpu, &out_values, 0, k as u64)).unwrap();
    (bytemuck::pod_collect_to_vec(&id_bytes), got_values)
}

/// Logits with their maximum raised above the rest at `at`, and again at `twin` if given.
fn with_maximum(mut values: Vec<f32>, at: usize, twin: Option<usize>) -> Vec<f32> {
    values[at] = 25.0;
    if let Some(twin) = twin {
        values[twin] = 25.0;
    }
    values
}

#[test]
fn argmax_finds_the_first_maximum() {
    let seed = testing::fresh_seed();
    for (gpu, variants) in devices() {
        let mut turn = 0;
        for n in SIZES {
            let random = random_index(n, seed);
            let mut cases = vec![
                ("first", with_maximum(logits(n, seed), 0, None)),
                ("last", with_maximum(logits(n, seed + 1), n - 1, None)),
                ("random", with_maximum(logits(n, seed + 2), random, None)),
                ("plain", logits(n, seed + 3)),
            ];
            if n > 1 {
                let twin = (random + n / 2) % n;
                cases.push((
                    "duplicate",
                    with_maximum(logits(n, seed + 4), random, Some(twin)),
                ));
                cases.push((
                    "first and last",
                    with_maximum(logits(n, seed + 5), n - 1, Some(0)),
                ));
            }
            for (case, values) in cases {
                let variant = testing::variant_for_case(&variants, turn, seed);
                turn += 1;
                let got = gpu_argmax(&gpu, variant, &values);
                let want = select::argmax_reference(&values);
                assert_eq!(
                    got, want,
                    "argmax n={n} {case} {} ({}) {variant} seed={seed}",
                    gpu.caps.adapter, gpu.caps.backend
                );
            }
        }
    }
}

#[test]
fn top_k_matches_a_stable_sort() {
    let seed = testing::fresh_seed();
    for (gpu, variants) in devices() {
        let mut turn = 0;
        for n in SIZES {
            for k in [1usize, 5, 40, 64].into_iter().filter(|&k| k <= n) {
                let variant = testing::variant_for_case(&variants, turn, seed);
                turn += 1;
                let case_seed = seed + (n * 100 + k) as u64;
                let mut values = logits(n, case_seed);
                // Ties inside the top k, across chunks: copies of a high value far apart.
                for copy in 0..3.min(n) {
                    values[random_index(n, case_seed + copy as u64)] = 21.5;
                }
                let (ids, got_values) = gpu_top_k(&gpu, variant, &values, k);
                let want = select::top_k_reference(&values, k);
                let what = format!(
                    "top_k n={n} k={k} {} ({}) {variant} seed={case_seed}",
                    gpu.caps.adapter, gpu.caps.backend
                );
                assert_eq!(ids, want, "{what}: ids");
                let want_values: Vec<f32> = want.iter().map(|&i| values[i as usize]).collect();
                assert_eq!(got_values, want_values, "{what}: values");
            }
        }
    }
}

/// Orders that defeat sampling shortcuts: sorted runs, plateaus of equal values, few levels.
fn structured_logits(n: usize, seed: u64) -> Vec<(&'static str, Vec<f32>)> {
    let noise = testing::random_f32(n, seed);
    vec![
        ("ascending", (0..n).map(|i| i as f32 * 1e-3).collect()),
        ("descending", (0..n).map(|i| -(i as f32) * 1e-3).collect()),
        ("all equal", vec![1.5; n]),
        (
            "three levels",
            noise.iter().map(|v| (v * 1.5).round()).collect(),
        ),
        ("sawtooth", (0..n).map(|i| (i % 97) as f32).collect()),
    ]
}

#[test]
fn top_k_of_structured_logits() {
    let seed = testing::fresh_seed();
    for (gpu, variants) in devices() {
        let mut turn = 0;
        for n in [64usize, 65, 1000, 151_936] {
            for (name, values) in structured_logits(n, seed + n as u64) {
                let variant = testing::variant_for_case(&variants, turn, seed);
                turn += 1;
                for k in [1usize, 7, 40, 64] {
                    let (ids, _) = gpu_top_k(&gpu, variant, &values, k);
                    let want = select::top_k_reference(&values, k);
                    assert_eq!(
                        ids, want,
                        "top_k {name} n={n} k={k} {} {variant} seed={seed}",
                        gpu.caps.backend
                    );
                }
                let want = select::argmax_reference(&values);
                assert_eq!(
                    gpu_argmax(&gpu, variant, &values),
                    want,
                    "argmax {name} n={n}"
                );
            }
        }
    }
}

#[test]
fn top_k_orders_infinities_and_nan() {
    let values = [
        f32::NEG_INFINITY,
        1.0,
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        -3.0,
    ];
    // Small and quick: every variant, not one in turn.
    let pairs = pollster::block_on(testing::device_variants_both_splits()).expect("gpu devices");
    for (gpu, variant) in pairs {
        let (ids, got_values) = gpu_top_k(&gpu, variant, &values, values.len());
        let what = format!("{} {variant}", gpu.caps.backend);
        // NaN ranks as -inf: after the real -inf at index 0, before the one at index 4.
        assert_eq!(ids, vec![3, 1, 5, 0, 2, 4], "{what}: ids");
        assert_eq!(
            &got_values[..4],
            &[f32::INFINITY, 1.0, -3.0, f32::NEG_INFINITY],
            "{what}"
        );
        assert_eq!(gpu_argmax(&gpu, variant, &values[..3]), 1, "{what}: argmax");
        assert_eq!(
            gpu_argmax(&gpu, variant, &[f32::NEG_INFINITY; 9]),
            0,
            "{what}: all -inf"
        );
    }
}

#[test]
fn top_k_reference_is_a_stable_descending_sort() {
    let values = [2.0, 5.0, -1.0, 5.0, 0.0, 2.0];
    assert_eq!(select::top_k_reference(&values, 6), vec![1, 3, 0, 5, 4, 2]);
    assert_eq!(select::argmax_reference(&values), 1);
}

fn gpu_argmax_rows(gpu: &Gpu, variant: Variant, values: &[f32], n: usize) -> Vec<u32> {
    let rows = values.len() / n;
    let out = gpu::storage_buffer(gpu, "argmax rows", (rows * 4) as u64);
    gpu::poison_f32(gpu, &out);
    let mut rec = Recorder::with_variant(gpu, variant);
    select::argmax_rows(
        &mut rec,
        &gpu::upload_f32(gpu, "logits", values),
        n as u32,
        rows as u32,
        &out,
    );
    let bytes = pollster::block_on(rec.submit_and_read(&out, 0, (rows * 4) as u64)).unwrap();
    bytemuck::pod_collect_to_vec(&bytes)
}

/// Each row's argmax on its own, as a speculative step reads the greedy token after each of
/// its positions: rows with their maxima at different places, one row's maximum below
/// another's, and a tie within a row.
#[test]
fn argmax_rows_takes_each_rows_own_maximum() {
    let seed = testing::fresh_seed();
    for (gpu, variants) in devices() {
        for (turn, (n, rows)) in [(1, 3), (1000, 16), (49_152, 5), (151_936, 9)]
            .into_iter()
            .enumerate()
        {
            let variant = testing::variant_for_case(&variants, turn, seed);
            let mut values = Vec::with_capacity(n * rows);
            for row in 0..rows {
                let row_seed = seed + 10 * row as u64;
                let at = random_index(n, row_seed);
                let twin = (row % 3 == 0 && n > 1).then_some((at + n / 2) % n);
                let mut row_values = with_maximum(logits(n, row_seed), at, twin);
                // Rows' maxima differ, so an argmax that looks past its own row is caught.
                row_values[at] += row as f32;
                if let Some(twin) = twin {
                    row_values[twin] = row_values[at];
                }
                values.extend(row_values);
            }
            let got = gpu_argmax_rows(&gpu, variant, &values, n);
            let want: Vec<u32> = values.chunks(n).map(select::argmax_reference).collect();
            assert_eq!(
                got, want,
                "argmax_rows n={n} rows={rows} {} ({}) {variant} seed={seed}",
                gpu.caps.adapter, gpu.caps.backend
            );
        }
    }
}

/// A random allowed set of `n` ids as `select::mask_words(n)` words: each id allowed with
/// probability `density / 256` (0 allows one random id only), bits past `n` set to show that
/// the mask ignores them.
fn allowed_set(n: usize, density: u32, seed: u64) -> Vec<u32> {
    let words = select::mask_words(n as u32) as usize;
    let mut allowed = vec![0u32; words];
    if density == 0 {
        let only = random_index(n, seed);
        allowed[only / 32] = 1 << (only % 32);
    } else {
        for (id, &byte) in testing::random_bytes(n, seed).iter().enumerate() {
            if u32::from(byte) < density {
                allowed[id / 32] |= 1 << (id % 32);
            }
        }
    }
    if !n.is_multiple_of(32) {
        allowed[words - 1] |= u32::MAX << (n % 32);
    }
    allowed
}

/// The best allowed id, found without the mask: the first id of the largest allowed logit.
fn argmax_among_allowed(values: &[f32], allowed: &[u32]) -> u32 {
    let is_allowed = |id: usize| allowed[id / 32] & (1 << (id % 32)) != 0;
    let mut best: Option<usize> = None;
    for id in (0..values.len()).filter(|&id| is_allowed(id)) {
        if best.is_none_or(|b| values[id] > values[b]) {
            best = Some(id);
        }
    }
    best.expect("an allowed id") as u32
}

/// Masks `values` on the GPU, then takes the argmax and the top `k` of the masked logits in
/// the same submit: (masked logits, argmax, top-k ids, top-k values).
fn gpu_masked(
    gpu: &Gpu,
    variant: Variant,
    values: &[f32],
    allowed: &[u32],
    k: usize,
) -> (Vec<f32>, u32, Vec<u32>, Vec<f32>) {
    let n = values.len() as u32;
    let logits_buf = gpu::upload_f32(gpu, "logits", values);
    let allowed_buf = gpu::upload_u32(gpu, "allowed", allowed);
    let argmax = gpu::storage_buffer(gpu, "argmax", 4);
    let ids = gpu::storage_buffer(gpu, "ids", (k * 4) as u64);
    let out_values = gpu::storage_buffer(gpu, "values", (k * 4) as u64);
    for out in [&argmax, &ids, &out_values] {
        gpu::poison_f32(gpu, out);
    }
    let mut rec = Recorder::with_variant(gpu, variant);
    select::mask(&mut rec, &logits_buf, n, &allowed_buf);
    select::argmax(&mut rec, &logits_buf, n, &argmax);
    select::top_k(&mut rec, &logits_buf, n, k as u32, &ids, &out_values);
    rec.submit();
    let read_u32 = |buffer: &wgpu::Buffer, count: usize| -> Vec<u32> {
        let bytes = pollster::block_on(gpu::read_back(gpu, buffer, 0, (count * 4) as u64));
        bytemuck::pod_collect_to_vec(&bytes.unwrap())
    };
    let masked = pollster::block_on(gpu::read_f32(gpu, &logits_buf, 0, n as u64)).unwrap();
    let top_values = pollster::block_on(gpu::read_f32(gpu, &out_values, 0, k as u64)).unwrap();
    (
        masked,
        read_u32(&argmax, 1)[0],
        read_u32(&ids, k),
        top_values,
    )
}

#[test]
fn masked_argmax_and_top_k_pick_among_the_allowed_ids() {
    let seed = testing::fresh_seed();
    for (gpu, variants) in devices() {
        let mut turn = 0;
        for n in [1000usize, 49_152, 151_936] {
            // One id, about 1%, about half, and all of them allowed.
            for density in [0u32, 3, 128, 256] {
                let variant = testing::variant_for_case(&variants, turn, seed);
                turn += 1;
                let case_seed = seed + (n as u64) * 1000 + u64::from(density);
                let mut values = logits(n, case_seed);
                // The largest logit of all, on an id the sparse sets most likely disallow.
                values[random_index(n, case_seed + 1)] = 30.0;
                let allowed = allowed_set(n, density, case_seed);
                let k = 40;
                let (masked, argmax, ids, top_values) =
                    gpu_masked(&gpu, variant, &values, &allowed, k);
                let what = format!(
                    "n={n} density={density} {} ({}) {variant} seed={case_seed}",
                    gpu.caps.adapter, gpu.caps.backend
                );
                let mut want = values.clone();
                select::mask_reference(&mut want, &allowed);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&masked), bits(&want), "{what}: masked logits");
                assert_eq!(
                    argmax,
                    argmax_among_allowed(&values, &allowed),
                    "{what}: argmax"
                );
                let want_ids = select::top_k_reference(&want, k);
                assert_eq!(ids, want_ids, "{what}: top-k ids");
                let want_values: Vec<f32> = want_ids.iter().map(|&i| want[i as usize]).collect();
                assert_eq!(
                    bits(&top_values),
                    bits(&want_values),
                    "{what}: top-k values"
                );
            }
        }
    }
}
