//! Attention on every device and variant against the CPU references:
//! the three model shapes (SmolLM2 9/3 heads of 64, Qwen2.5 14/2 of 64, Gemma 3 4/1 of 256),
//! contexts from 1 to 1500, sliding windows inside and beyond the context, chunked prefill
//! after start_pos > 0, both kernel paths for every token count, and a cache split over
//! buffers under a forced small binding limit. Decode runs in both work splits (lavapipe and
//! llvmpipe again as GPUs), so both decode kernels are checked. Bidirectional attention
//! (encoders: no causal mask) runs the prefill kernel's other variant against its own reference.
//! Each case runs in one of a device's variants (f32/f16, workgroup/subgroup reductions), in
//! turn from a seed-chosen start, so every variant meets long and short contexts, every shape
//! and window across the cases (`testing::variant_for_case`).

use std::sync::Arc;
use std::time::Instant;

use webshard::gpu::{self, testing, BackendChoice, Gpu, GpuOptions, Recorder, Variant};
use webshard::ops::attention::{
    attention, attention_decode, attention_prefill, attention_reference, bidirectional_attention,
    bidirectional_attention_reference, decode_supported, kv_write, AttentionCall, AttentionParams,
    KvCache,
};

#[derive(Debug, Clone, Copy)]
pub(crate) struct Shape {
    pub(crate) name: &'static str,
    pub(crate) heads: u32,
    pub(crate) kv_heads: u32,
    pub(crate) head_dim: u32,
}

pub(crate) const SMOLLM2: Shape = Shape {
    name: "smollm2",
    heads: 9,
    kv_heads: 3,
    head_dim: 64,
};
pub(crate) const QWEN25: Shape = Shape {
    name: "qwen2.5",
    heads: 14,
    kv_heads: 2,
    head_dim: 64,
};
pub(crate) const GEMMA3: Shape = Shape {
    name: "gemma3",
    heads: 4,
    kv_heads: 1,
    head_dim: 256,
};
const SHAPES: [Shape; 3] = [SMOLLM2, QWEN25, GEMMA3];
/// all-MiniLM-L6-v2 (BERT): 12 heads of 32, one kv head each.
pub(crate) const MINILM: Shape = Shape {
    name: "minilm",
    heads: 12,
    kv_heads: 12,
    head_dim: 32,
};
/// One query head per kv head, head_dim 128.
pub(crate) const MHA: Shape = Shape {
    name: "mha",
    heads: 2,
    kv_heads: 2,
    head_dim: 128,
};

/// Which entry point a case goes through.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Path {
    Auto,
    Decode,
    Prefill,
    /// `bidirectional_attention`: no causal mask (start_pos 0 only).
    Bidirectional,
}

/// The cache holds this layer's data; the layer before it holds different data, so a wrong
/// layer offset cannot pass.
const LAYER: u32 = 1;

/// Inputs of one attention case, with the CPU reference computed once for every device.
pub(crate) struct Case {
    pub(crate) shape: Shape,
    pub(crate) params: AttentionParams,
    pub(crate) start_pos: u32,
    pub(crate) tokens: u32,
    pub(crate) q: Vec<f32>,
    pub(crate) k: Vec<f32>,
    pub(crate) v: Vec<f32>,
    pub(crate) decoy_k: Vec<f32>,
    pub(crate) want: Vec<f32>,
}

impl Case {
    pub(crate) fn new(
        shape: Shape,
        start_pos: u32,
        tokens: u32,
        window: Option<u32>,
        softcap: Option<f32>,
        seed: u64,
    ) -> Case {
        let params = AttentionParams {
            window,
            softcap,
            ..AttentionParams::standard(shape.heads, shape.kv_heads, shape.head_dim)
        };
        let ctx = (start_pos + tokens) as usize;
        let kv_len = ctx * (shape.kv_heads * shape.head_dim) as usize;
        // Scaled queries make the softmax peaked, so masking or rescaling mistakes show.
        let q: Vec<f32> =
            testing::random_f32((tokens * shape.heads * shape.head_dim) as usize, seed)
                .into_iter()
                .map(|x| x * 4.0)
                .collect();
        let k = testing::random_f32(kv_len, seed + 1);
        let v = testing::random_f32(kv_len, seed + 2);
        let decoy_k = testing::random_f32(kv_len, seed + 3);
        let want = attention_reference(&q, &k, &v, start_pos, tokens, &params);
        Case {
            shape,
            params,
            start_pos,
            tokens,
            q,
            k,
            v,
            decoy_k,
            want,
        }
    }

    /// A case for the bidirectional path: the reference without the causal mask.
    pub(crate) fn bidirectional(shape: Shape, tokens: u32, seed: u64) -> Case {
        let mut case = Case::new(shape, 0, tokens, None, None, seed);
        case.want =
            bidirectional_attention_reference(&case.q, &case.k, &case.v, tokens, &case.params);
        case
    }

    pub(crate) fn label(&self) -> String {
        format!(
            "{} start_pos {} tokens {} window {:?} softcap {:?}",
            self.shape.name, self.start_pos, self.tokens, self.params.window, self.params.softcap
        )
    }

    /// Fills a fresh (poisoned) cache with kv_write, the prefix and the new tokens in separate
    /// writes as a chat does, runs attention through `path`, and reads the output.
    pub(crate) fn run(&self, gpu: &Gpu, variant: Variant, path: Path) -> Vec<f32> {
        self.run_in(gpu, variant, path, self.start_pos + self.tokens + 3)
    }

    /// `run` with a cache of `capacity` positions.
    fn run_in(&self, gpu: &Gpu, variant: Variant, path: Path, capacity: u32) -> Vec<f32> {
        self.run_counting(gpu, variant, path, capacity).0
    }

    /// `run_in`, plus the number of dispatches the attention call recorded.
    fn run_counting(
        &self,
        gpu: &Gpu,
        variant: Variant,
        path: Path,
        capacity: u32,
    ) -> (Vec<f32>, u32) {
        let s = self.shape;
        let ctx = self.start_pos + self.tokens;
        let cache = KvCache::new(gpu, LAYER + 2, capacity, s.kv_heads, s.head_dim).unwrap();
        for buffer in cache.k.iter().chain(&cache.v) {
            gpu::poison_f32(gpu, buffer);
        }
        let row = (s.kv_heads * s.head_dim) as usize;
        let split = self.start_pos as usize * row;
        let upload = |data: &[f32]| gpu::upload_f32(gpu, "kv", data);
        let (k_old, v_old) = (upload(&self.k[..split]), upload(&self.v[..split]));
        let (k_new, v_new) = (upload(&self.k[split..]), upload(&self.v[split..]));
        let (decoy_k, decoy_v) = (upload(&self.decoy_k), upload(&self.decoy_k));
        let q = gpu::upload_f32(gpu, "q", &self.q);
        let out = gpu::storage_buffer(gpu, "out", (self.q.len() * 4) as u64);
        gpu::poison_f32(gpu, &out);

        let mut rec = Recorder::with_variant(gpu, variant);
        kv_write(&mut rec, &cache, LAYER - 1, &decoy_k, &decoy_v, 0, ctx);
        kv_write(&mut rec, &cache, LAYER, &k_old, &v_old, 0, self.start_pos);
        kv_write(
            &mut rec,
            &cache,
            LAYER,
            &k_new,
            &v_new,
            self.start_pos,
            self.tokens,
        );
        let entry = match path {
            Path::Auto => attention,
            Path::Decode => attention_decode,
            Path::Prefill => attention_prefill,
            Path::Bidirectional => bidirectional_attention,
        };
        let call = AttentionCall {
            q: &q,
            cache: &cache,
            layer: LAYER,
            out: &out,
            start_pos: self.start_pos,
            tokens: self.tokens,
        };
        let before = rec.dispatch_count();
        entry(&mut rec, &call, &self.params);
        let dispatches = rec.dispatch_count() - before;
        let bytes = pollster::block_on(rec.submit_and_read(&out, 0, (self.q.len() * 4) as u64));
        (bytemuck::pod_collect_to_vec(&bytes.unwrap()), dispatches)
    }
}

fn devices() -> Vec<Arc<Gpu>> {
    pollster::block_on(testing::devices_under_test()).expect("devices under test")
}

/// Every device, CPU adapters once more with the GPU work split.
fn split_devices() -> Vec<Arc<Gpu>> {
    pollster::block_on(testing::devices_both_splits()).expect("devices under test")
}

/// f32 variants accumulate the same sums in another order; f16 variants also round the keys
/// and values of prefill tiles to f16 (11-bit mantissa). `attention` picks the decode kernels
/// for single tokens.
fn tolerance(variant: Variant, path: Path, tokens: u32) -> f32 {
    let prefill =
        matches!(path, Path::Prefill | Path::Bidirectional) || (path == Path::Auto && tokens > 1);
    if variant.f16 && prefill {
        3e-3
    } else {
        2e-5
    }
}

/// Runs every case on every device and path, each (case, path) in one of the device's
/// variants in turn (`testing::variant_for_case`); prints the worst relative error of each
/// (device, path) and fails on the first case beyond tolerance. Every path also runs in the
/// GPU work split of CPU adapters (prefill splits keys more finely there).
fn check_cases(cases: &[Case], paths: &[Path], seed: u64) {
    check_cases_on(&split_devices(), cases, paths, seed)
}

/// `check_cases` on `devices`.
fn check_cases_on(devices: &[Arc<Gpu>], cases: &[Case], paths: &[Path], seed: u64) {
    for gpu in devices {
        let variants = gpu.caps.all_variants();
        for (path_index, &path) in paths.iter().enumerate() {
            let started = Instant::now();
            let mut worst = 0.0f32;
            for (index, case) in cases.iter().enumerate() {
                let turn = index + path_index;
                let variant = testing::variant_for_case(&variants, turn, seed);
                let got = case.run(gpu, variant, path);
                let what = format!(
                    "{} {variant} {path:?} {} seed {seed}",
                    split_name(gpu),
                    case.label()
                );
                testing::assert_close(
                    &got,
                    &case.want,
                    tolerance(variant, path, case.tokens),
                    &what,
                );
                worst = worst.max(testing::relative_error(&got, &case.want));
            }
            println!(
                "{} ({}) {path:?}: worst relative error {worst:.2e} over {} cases in {} variants ({:.1} s)",
                gpu.caps.adapter,
                split_name(gpu),
                cases.len(),
                variants.len(),
                started.elapsed().as_secs_f32()
            );
        }
    }
}

/// The backend and the work split a device runs kernels in.
fn split_name(gpu: &Gpu) -> String {
    let split = if gpu.caps.cpu_work_split {
        "cpu"
    } else {
        "gpu"
    };
    format!("{} {split} split", gpu.caps.backend)
}

const WINDOWS: [Option<u32>; 3] = [None, Some(512), Some(5000)];

/// Decode of one token in every work split: GQA groups 1, 3, 4 and 7, head_dim 64, 128 and
/// 256, positions around the 64-key tiles and beyond one split, sliding windows (Gemma's 512,
/// smaller, and one of 7 keys), soft-capping on and off. In the GPU work split, contexts of up
/// to 128 keys must take one dispatch (the kernel writes `out`: every dispatch costs ~5 us on
/// a discrete GPU) and long ones a split pass plus combine.
#[test]
fn decode_in_both_work_splits_matches_reference() {
    let seed = testing::fresh_seed();
    let mut cases = Vec::new();
    for shape in [MHA, SMOLLM2, GEMMA3, QWEN25] {
        let window = if shape.head_dim == 256 { 512 } else { 100 };
        let mut variants = vec![(None, None), (Some(window), Some(5.0))];
        for pos in [0u32, 1, 63, 64, 65, 300, 1500] {
            if pos == 300 {
                variants.push((Some(7), None));
            }
            for &(window, softcap) in &variants {
                let case_seed = seed.wrapping_add(cases.len() as u64 * 10);
                cases.push(Case::new(shape, pos, 1, window, softcap, case_seed));
            }
        }
    }
    let devices = split_devices();
    assert!(
        devices.iter().any(|gpu| !gpu.caps.cpu_work_split),
        "no device under test runs the GPU work split"
    );
    for gpu in &devices {
        let variants = gpu.caps.all_variants();
        let started = Instant::now();
        let mut worst = 0.0f32;
        for (index, case) in cases.iter().enumerate() {
            let variant = testing::variant_for_case(&variants, index, seed);
            let capacity = case.start_pos + case.tokens + 3;
            let (got, dispatches) = case.run_counting(gpu, variant, Path::Decode, capacity);
            let what = format!("{} {variant} {} seed {seed}", split_name(gpu), case.label());
            testing::assert_close(&got, &case.want, 2e-5, &what);
            worst = worst.max(testing::relative_error(&got, &case.want));
            let visible = case
                .params
                .window
                .map_or(case.start_pos + 1, |w| w.min(case.start_pos + 1));
            if !gpu.caps.cpu_work_split && visible <= 128 {
                assert_eq!(dispatches, 1, "{what}: one split, no combine");
            }
            if !gpu.caps.cpu_work_split && visible >= 1000 {
                assert_eq!(dispatches, 2, "{what}: splits and combine");
            }
        }
        println!(
            "{} ({}) decode: worst relative error {worst:.2e} over {} cases in {} variants ({:.1} s)",
            gpu.caps.adapter,
            split_name(gpu),
            cases.len(),
            variants.len(),
            started.elapsed().as_secs_f32()
        );
    }
}

#[test]
fn decode_matches_reference() {
    let seed = testing::fresh_seed();
    let mut cases = Vec::new();
    for shape in SHAPES {
        for ctx in [1u32, 2, 17, 300, 1500] {
            for window in WINDOWS {
                let case_seed = seed.wrapping_add(cases.len() as u64 * 10);
                cases.push(Case::new(shape, ctx - 1, 1, window, None, case_seed));
            }
        }
    }
    check_cases(&cases, &[Path::Decode, Path::Prefill], seed);
}

/// Every shape at every start and length; the windows in turn (each shape meets each window
/// twice, at other positions each run: the seed picks the start).
#[test]
fn prefill_matches_reference() {
    let seed = testing::fresh_seed();
    let mut cases = Vec::new();
    for shape in SHAPES {
        for (start_pos, tokens) in [
            (0u32, 2u32),
            (0, 5),
            (12, 5),
            (0, 64),
            (236, 64),
            (1436, 64),
        ] {
            let window = WINDOWS[(cases.len() + seed as usize) % WINDOWS.len()];
            let case_seed = seed.wrapping_add(cases.len() as u64 * 10);
            cases.push(Case::new(shape, start_pos, tokens, window, None, case_seed));
        }
    }
    check_cases(&cases, &[Path::Decode, Path::Prefill], seed);
}

#[test]
fn small_window_and_softcap_match_reference() {
    let seed = testing::fresh_seed();
    let mut cases = Vec::new();
    for shape in [QWEN25, GEMMA3] {
        for (start_pos, tokens) in [(299u32, 1u32), (150, 64), (3, 5)] {
            for (window, softcap) in [(Some(7), None), (Some(100), Some(5.0)), (None, Some(2.0))] {
                let case_seed = seed.wrapping_add(cases.len() as u64 * 10);
                cases.push(Case::new(
                    shape, start_pos, tokens, window, softcap, case_seed,
                ));
            }
        }
    }
    check_cases(&cases, &[Path::Decode, Path::Prefill], seed);
}

/// Every query sees every key: BERT's shape and the decoders' (pooled decoders may run
/// bidirectionally too), token counts around the 64-row workgroups and key tiles, and 512
/// tokens (BERT's whole context), in both work splits.
#[test]
fn bidirectional_matches_reference() {
    let seed = testing::fresh_seed();
    let mut cases = Vec::new();
    for shape in [MINILM, SMOLLM2, GEMMA3] {
        for tokens in [1u32, 5, 64, 130] {
            let case_seed = seed.wrapping_add(cases.len() as u64 * 10);
            cases.push(Case::bidirectional(shape, tokens, case_seed));
        }
    }
    cases.push(Case::bidirectional(MINILM, 512, seed ^ 0x512));
    check_cases(&cases, &[Path::Bidirectional], seed);
}

/// The bidirectional reference differs from the causal one except in the last row, which
/// sees every key either way.
#[test]
fn bidirectional_reference_sees_later_keys() {
    let case = Case::bidirectional(MINILM, 9, testing::fresh_seed());
    let causal = attention_reference(&case.q, &case.k, &case.v, 0, 9, &case.params);
    let row = (MINILM.heads * MINILM.head_dim) as usize;
    assert_ne!(
        case.want[..row],
        causal[..row],
        "first row sees keys 1..9 too"
    );
    assert_eq!(
        case.want[8 * row..],
        causal[8 * row..],
        "last row sees all keys in both"
    );
}

/// Enough query rows that prefill needs no splits for parallelism, over more keys than one
/// llvmpipe invocation may walk (65535 loop iterations in total): only the loop-budget splits
/// keep the result whole. On the Vulkan devices (both work splits) where there are any: GL runs
/// on the same llvmpipe, so the same budget and splits, and each of the four runs cost 10-14 s
/// of compute.
#[test]
fn long_prefill_splits_keys_within_the_loop_limit() {
    let seed = testing::fresh_seed();
    let cases = [Case::new(GEMMA3, 1500, 512, None, None, seed)];
    let devices = split_devices();
    let vulkan: Vec<_> = devices
        .iter()
        .filter(|gpu| gpu.caps.backend == "Vulkan")
        .cloned()
        .collect();
    let chosen = if vulkan.is_empty() { devices } else { vulkan };
    check_cases_on(&chosen, &cases, &[Path::Prefill], seed);
}

#[test]
fn decode_handles_every_model_shape() {
    for gpu in split_devices() {
        for shape in SHAPES {
            let params = AttentionParams {
                heads: shape.heads,
                kv_heads: shape.kv_heads,
                head_dim: shape.head_dim,
                scale: 1.0,
                window: None,
                softcap: None,
            };
            assert!(decode_supported(&gpu, &params), "{}", shape.name);
        }
    }
}

#[test]
fn split_kv_cache_gives_identical_results() {
    let seed = testing::fresh_seed();
    let cases = [
        Case::new(QWEN25, 299, 1, Some(100), None, seed),
        Case::new(QWEN25, 100, 64, None, None, seed + 10),
        Case::new(GEMMA3, 40, 5, Some(17), None, seed + 20),
    ];
    // Big enough that a binding of one and a half layers still holds every partial result, so
    // both devices choose the same key splits.
    let capacity = 2048;
    for whole in devices() {
        let backend = BackendChoice::parse(&whole.caps.backend).expect("backend name");
        for case in &cases {
            let s = case.shape;
            let layer_bytes = u64::from(capacity * s.kv_heads * s.head_dim) * 4;
            let options = GpuOptions {
                backend,
                max_binding_override: Some(layer_bytes * 3 / 2),
                ..Default::default()
            };
            let split = pollster::block_on(Gpu::new(&options)).expect("gpu with small bindings");
            let cache = KvCache::new(&split, LAYER + 2, capacity, s.kv_heads, s.head_dim).unwrap();
            assert_eq!(cache.k.len(), (LAYER + 2) as usize, "one buffer per layer");
            for variant in whole.caps.all_variants() {
                for path in [Path::Decode, Path::Prefill] {
                    let want = case.run_in(&whole, variant, path, capacity);
                    let got = case.run_in(&split, variant, path, capacity);
                    let what = format!(
                        "{} {variant} {path:?} {} seed {seed}",
                        whole.caps.backend,
                        case.label()
                    );
                    assert!(
                        got.iter()
                            .zip(&want)
                            .all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{what}: split cache differs from whole cache"
                    );
                    let tolerance = tolerance(variant, path, case.tokens);
                    testing::assert_close(&got, &case.want, tolerance, &what);
                }
            }
        }
    }
}

#[test]
fn attention_picks_decode_for_one_token_and_prefill_for_more() {
    let seed = testing::fresh_seed();
    let cases = [
        Case::new(SMOLLM2, 299, 1, None, None, seed),
        Case::new(GEMMA3, 236, 64, Some(512), None, seed + 10),
    ];
    check_cases(&cases, &[Path::Auto], seed);
    for gpu in &split_devices() {
        let variants = gpu.caps.all_variants();
        for (index, (case, chosen)) in cases.iter().zip([Path::Decode, Path::Prefill]).enumerate() {
            let variant = testing::variant_for_case(&variants, index, seed);
            let auto = case.run(gpu, variant, Path::Auto);
            let direct = case.run(gpu, variant, chosen);
            assert!(
                auto.iter()
                    .zip(&direct)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{} {variant} {}: attention differs from {chosen:?}",
                split_name(gpu),
                case.label()
            );
        }
    }
}
