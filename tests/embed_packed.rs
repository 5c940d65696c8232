//! Packed encoder batches (`Embedder::embed_ids` of many inputs: several sequences in one GPU
//! pass, each attending to itself only) against one input at a time, on every backend under
//! test: MiniLM (learned positions) and nomic-bert (rotary positions), inputs of different
//! lengths (1 token, odd lengths, across the 64-token tiles), mean, CLS and last pooling, every
//! pooled vector within cosine 0.9999 of the lone run's. nomic-bert-tiny also gets more tokens
//! than one pass holds, so the batch splits over passes in order.
//!
//! Each pooling is checked on one backend per run, in turn from a start the seed chooses, so
//! that across runs every pooling meets every backend (the seed, printed, replays the choice),
//! as `fidelity.rs` shares out its records: the batches are compute, not compilation (MiniLM's
//! two poolings on lavapipe and GL took 76 s of a CPU's time, 30 s a backend), and both backends
//! run the same kernels, each checked on both by the ops tests.

use crate::support;

use webshard::embed::{cosine_similarity, EmbedOptions, Embedder, Pooling};
use webshard::gguf::open_source;
use webshard::gpu::{testing, Gpu, GpuOptions};

const MINILM: &str = "all-MiniLM-L6-v2.f16.gguf";
const NOMIC: &str = "nomic-bert-tiny.f16.gguf";
const MIN_COSINE: f64 = 0.9999;

async fn load(file: &str, options: GpuOptions) -> Embedder {
    let gpu = Gpu::new(&options).await.expect("gpu");
    let path = support::model_path(file);
    let source = open_source(path.to_str().expect("utf-8 path"))
        .await
        .expect("open model");
    Embedder::load(gpu, source.as_ref(), 512, &mut |_| {})
        .await
        .expect("load embedding model")
}

/// Random ids of each length, the first and last the tokenizer's `[CLS]`/`[SEP]` ids where it
/// adds them (a one-token input is `[CLS]` alone).
fn inputs(embedder: &Embedder, lengths: &[usize], seed: u64) -> Vec<Vec<u32>> {
    let frame = embedder.tokenize("");
    let vocab = embedder.vocab();
    lengths
        .iter()
        .enumerate()
        .map(|(index, &length)| {
            let noise = testing::random_bytes(4 * length, seed + index as u64);
            let mut ids: Vec<u32> = noise
                .chunks_exact(4)
                .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) % vocab)
                .collect();
            if let (Some(&first), Some(&last)) = (frame.first(), frame.last()) {
                ids[0] = first;
                if length > 1 {
                    ids[length - 1] = last;
                }
            }
            ids
        })
        .collect()
}

/// Embeds `lengths`' inputs together and one at a time under each pooling and compares.
fn check_packed(file: &str, lengths: &[usize], poolings: &[Pooling]) {
    let seed = testing::fresh_seed();
    let backends = support::backends();
    for (index, &backend) in backends.iter().enumerate() {
        let mine: Vec<Pooling> = (0..poolings.len())
            .filter(|&i| support::on_backend(i, index, backends.len(), seed))
            .map(|i| poolings[i])
            .collect();
        if mine.is_empty() {
            continue;
        }
        let options = GpuOptions {
            backend,
            ..Default::default()
        };
        let embedder = pollster::block_on(load(file, options));
        let inputs = inputs(&embedder, lengths, seed);
        for &pooling in &mine {
            let options = EmbedOptions {
                pooling: Some(pooling),
                normalize: false,
            };
            let packed = pollster::block_on(embedder.embed_ids(&inputs, options)).expect("packed");
            assert_eq!(packed.len(), inputs.len());
            let mut worst = 1.0f64;
            for (i, ids) in inputs.iter().enumerate() {
                let alone =
                    pollster::block_on(embedder.embed_ids(std::slice::from_ref(ids), options))
                        .expect("alone");
                let cosine = cosine_similarity(&packed[i], &alone[0]);
                assert!(
                    cosine >= MIN_COSINE,
                    "{file} {backend:?} {pooling:?} input {i} of {} tokens: cosine {cosine} \
                     packed against alone (seed {seed})",
                    ids.len()
                );
                worst = worst.min(cosine);
            }
            println!(
                "{file} {backend:?} {pooling:?}: {} inputs packed, worst cosine {worst:.7} (seed {seed})",
                inputs.len()
            );
        }
    }
}

#[test]
fn minilm_packed_batch_matches_one_at_a_time() {
    check_packed(
        MINILM,
        &[7, 1, 64, 65, 130, 2, 33],
        &[Pooling::Mean, Pooling::Cls],
    );
}

#[test]
fn nomic_bert_packed_batch_matches_one_at_a_time() {
    check_packed(
        NOMIC,
        &[7, 1, 64, 65, 130, 2, 33],
        &[Pooling::Mean, Pooling::Last],
    );
}

/// 2700 tokens: more than one pass of 2048 holds, so the inputs go in two passes.
#[test]
fn nomic_bert_batch_beyond_one_pass_keeps_its_order() {
    let mut lengths = vec![300usize; 9];
    lengths[4] = 1;
    lengths[8] = 299;
    check_packed(NOMIC, &lengths, &[Pooling::Mean]);
}
