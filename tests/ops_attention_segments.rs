//! Segmented attention (`segmented_attention`: several sequences packed into one call, each
//! query seeing only its own sequence's keys, no causal mask) on every device and variant, in
//! both work splits, against its CPU reference: sequences of 1 token and of odd lengths, one
//! that crosses the 64-row workgroup and 64-key tile boundaries, BERT's shape and a
//! grouped-query one, and a batch long enough that the keys split over workgroups (whose
//! partial results are merged). Cache and output poisoned first; the layer before the one
//! attended holds other keys.

use std::time::Instant;

use webshard::gpu::{self, testing, Gpu, Recorder, Variant};
use webshard::ops::attention::{
    bidirectional_attention_reference, kv_write, segment_table, segmented_attention,
    segmented_attention_reference, AttentionParams, KvCache, Segments,
};

const LAYER: u32 = 1;

/// (name, heads, kv_heads, head_dim).
const MINILM: (&str, u32, u32, u32) = ("minilm", 12, 12, 32);
const SMOLLM2: (&str, u32, u32, u32) = ("smollm2", 9, 3, 64);

struct Case {
    name: &'static str,
    params: AttentionParams,
    lengths: Vec<u32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    want: Vec<f32>,
}

impl Case {
    fn new(
        (name, heads, kv_heads, head_dim): (&'static str, u32, u32, u32),
        lengths: &[u32],
        seed: u64,
    ) -> Case {
        let params = AttentionParams::standard(heads, kv_heads, head_dim);
        let tokens: u32 = lengths.iter().sum();
        // Scaled queries make the softmax peaked, so a key from another sequence shows.
        let q: Vec<f32> = testing::random_f32((tokens * heads * head_dim) as usize, seed)
            .into_iter()
            .map(|x| x * 4.0)
            .collect();
        let kv_len = (tokens * kv_heads * head_dim) as usize;
        let k = testing::random_f32(kv_len, seed + 1);
        let v = testing::random_f32(kv_len, seed + 2);
        let want = segmented_attention_reference(&q, &k, &v, lengths, &params);
        Case {
            name,
            params,
            lengths: lengths.to_vec(),
            q,
            k,
            v,
            want,
        }
    }

    fn run(&self, gpu: &Gpu, variant: Variant) -> Vec<f32> {
        let p = &self.params;
        let tokens: u32 = self.lengths.iter().sum();
        let cache = KvCache::new(gpu, LAYER + 1, tokens + 3, p.kv_heads, p.head_dim).unwrap();
        for buffer in cache.k.iter().chain(&cache.v) {
            gpu::poison_f32(gpu, buffer);
        }
        let (k, v) = (
            gpu::upload_f32(gpu, "k", &self.k),
            gpu::upload_f32(gpu, "v", &self.v),
        );
        let decoy = gpu::upload_f32(gpu, "decoy", &testing::random_f32(self.k.len(), 7));
        let q = gpu::upload_f32(gpu, "q", &self.q);
        let out = gpu::storage_buffer(gpu, "out", (self.q.len() * 4) as u64);
        gpu::poison_f32(gpu, &out);
        let table = gpu::upload_u32(gpu, "segments", &segment_table(&self.lengths));
        let segments = Segments {
            lengths: &self.lengths,
            table: &table,
        };
        let mut rec = Recorder::with_variant(gpu, variant);
        kv_write(&mut rec, &cache, LAYER - 1, &decoy, &decoy, 0, tokens);
        kv_write(&mut rec, &cache, LAYER, &k, &v, 0, tokens);
        segmented_attention(&mut rec, &q, &cache, LAYER, &out, &segments, p);
        let bytes = pollster::block_on(rec.submit_and_read(&out, 0, (self.q.len() * 4) as u64));
        bytemuck::pod_collect_to_vec(&bytes.unwrap())
    }
}

/// Lengths 1 and odd ones; 70 tokens from token 69 on cross the workgroup boundary at 64 rows
/// (MiniLM: one row a token) and at 192 (SMOLLM2: three rows a token), and the key tile at 64.
const PACKED: &[u32] = &[1, 5, 63, 70, 1, 3, 64, 9];

#[test]
fn segmented_matches_reference_in_every_variant() {
    let seed = testing::fresh_seed();
    let cases = [
        Case::new(MINILM, PACKED, seed),
        Case::new(SMOLLM2, PACKED, seed ^ 0x5e9),
        Case::new(MINILM, &[1], seed ^ 1),
        // 900 keys in two sequences: the CPU split spreads them over several workgroups.
        Case::new(MINILM, &[511, 389], seed ^ 0x900),
    ];
    // With cooperative matrices, packed encoder batches take the cooperative prefill kernel
    // (ops_attention_coop.rs) in the device's best variant.
    let variants = pollster::block_on(testing::device_variants_both_splits()).expect("devices");
    for (gpu, variant) in testing::with_coop_variants(variants) {
        let started = Instant::now();
        let mut worst = 0.0f32;
        for case in &cases {
            let got = case.run(&gpu, variant);
            let what = format!(
                "{} ({}, cpu split {}) {variant} {} lengths {:?} seed {seed}",
                gpu.caps.adapter,
                gpu.caps.backend,
                gpu.caps.cpu_work_split,
                case.name,
                case.lengths
            );
            // f16 variants round the key and value tiles to f16.
            let tolerance = match (variant.coop_matrix, variant.f16) {
                (true, _) => 6e-3,
                (false, true) => 3e-3,
                (false, false) => 2e-5,
            };
            testing::assert_close(&got, &case.want, tolerance, &what);
            worst = worst.max(testing::relative_error(&got, &case.want));
        }
        println!(
            "{} ({}, cpu split {}) {variant}: worst relative error {worst:.2e} ({:.1} s)",
            gpu.caps.adapter,
            gpu.caps.backend,
            gpu.caps.cpu_work_split,
            started.elapsed().as_secs_f32()
        );
    }
}

/// The reference itself: each packed sequence gets exactly what the bidirectional reference
/// gives it alone.
#[test]
fn segmented_reference_is_bidirectional_per_sequence() {
    let case = Case::new(MINILM, &[3, 1, 6], testing::fresh_seed());
    let p = &case.params;
    let row = (p.heads * p.head_dim) as usize;
    let kv_row = (p.kv_heads * p.head_dim) as usize;
    let mut start = 0usize;
    for &length in &case.lengths {
        let n = length as usize;
        let alone = bidirectional_attention_reference(
            &case.q[start * row..(start + n) * row],
            &case.k[start * kv_row..(start + n) * kv_row],
            &case.v[start * kv_row..(start + n) * kv_row],
            length,
            p,
        );
        assert_eq!(alone, case.want[start * row..(start + n) * row]);
        start += n;
    }
}
