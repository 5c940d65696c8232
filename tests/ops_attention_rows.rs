//! Batched decode attention (`attention_decode_rows`) on every device and variant against its
//! CPU reference: rows at their own positions, each in its own slot of a KV pool, rows not in
//! slot order, positions around the tiles and beyond one key split, the three model shapes,
//! a sliding window with soft-capping; caches and output poisoned first, the layer before the
//! one attended filled with other keys.

use std::time::Instant;

use webshard::gpu::{self, testing, Gpu, Recorder, Variant};
use webshard::ops::attention::{
    attention_decode_rows, attention_rows_reference, kv_write, row_table, AttentionParams,
    DecodeRows, KvCache, ReferenceRow,
};

const LAYER: u32 = 1;
const SLOTS: u32 = 5;
const CONTEXT: u32 = 720;
/// Row r sits in slot SLOT_OF[r] at position POSITIONS[r].
const SLOT_OF: [u32; 5] = [3, 0, 4, 1, 2];
const POSITIONS: [u32; 5] = [700, 0, 63, 300, 5];

struct Shape {
    heads: u32,
    kv_heads: u32,
    head_dim: u32,
    window: Option<u32>,
    softcap: Option<f32>,
}

const SHAPES: [Shape; 3] = [
    Shape {
        heads: 9,
        kv_heads: 3,
        head_dim: 64,
        window: None,
        softcap: None,
    },
    Shape {
        heads: 14,
        kv_heads: 2,
        head_dim: 64,
        window: None,
        softcap: None,
    },
    Shape {
        heads: 4,
        kv_heads: 1,
        head_dim: 256,
        window: Some(512),
        softcap: Some(5.0),
    },
];

/// One case's inputs: q of every row, and each row's own keys and values.
struct Case {
    params: AttentionParams,
    q: Vec<f32>,
    keys: Vec<Vec<f32>>,
    values: Vec<Vec<f32>>,
    want: Vec<f32>,
}

impl Case {
    fn new(shape: &Shape, seed: u64) -> Case {
        let params = AttentionParams {
            window: shape.window,
            softcap: shape.softcap,
            ..AttentionParams::standard(shape.heads, shape.kv_heads, shape.head_dim)
        };
        let width = (shape.heads * shape.head_dim) as usize;
        let row = (shape.kv_heads * shape.head_dim) as usize;
        // Scaled queries make the softmax peaked, so a row reading another slot shows.
        let q: Vec<f32> = testing::random_f32(POSITIONS.len() * width, seed)
            .into_iter()
            .map(|x| x * 4.0)
            .collect();
        let data = |r: usize, salt: u64| {
            let len = (POSITIONS[r] as usize + 1) * row;
            testing::random_f32(len, seed + 10 * r as u64 + salt)
        };
        let keys: Vec<Vec<f32>> = (0..POSITIONS.len()).map(|r| data(r, 1)).collect();
        let values: Vec<Vec<f32>> = (0..POSITIONS.len()).map(|r| data(r, 2)).collect();
        let rows: Vec<ReferenceRow> = (0..POSITIONS.len())
            .map(|r| ReferenceRow {
                k: &keys[r],
                v: &values[r],
                position: POSITIONS[r],
            })
            .collect();
        let want = attention_rows_reference(&q, &rows, &params);
        Case {
            params,
            q,
            keys,
            values,
            want,
        }
    }

    /// Fills a poisoned pool (each row's keys in its slot, decoys in the layer before), runs
    /// the batched kernel, and reads the output.
    fn run(&self, gpu: &Gpu, variant: Variant) -> Vec<f32> {
        let p = &self.params;
        let pool = KvCache::pooled(gpu, LAYER + 1, CONTEXT, p.kv_heads, p.head_dim, SLOTS).unwrap();
        for buffer in pool[0].k.iter().chain(&pool[0].v) {
            gpu::poison_f32(gpu, buffer);
        }
        let mut rec = Recorder::with_variant(gpu, variant);
        let mut uploads = Vec::new();
        for (r, &slot) in SLOT_OF.iter().enumerate() {
            let k = gpu::upload_f32(gpu, "k", &self.keys[r]);
            let v = gpu::upload_f32(gpu, "v", &self.values[r]);
            let tokens = POSITIONS[r] + 1;
            let cache = &pool[slot as usize];
            kv_write(&mut rec, cache, LAYER, &k, &v, 0, tokens);
            // The layer before holds the values as keys: a wrong layer offset cannot pass.
            kv_write(&mut rec, cache, LAYER - 1, &v, &k, 0, tokens);
            uploads.push((k, v));
        }
        let caches: Vec<&KvCache> = SLOT_OF.iter().map(|&s| &pool[s as usize]).collect();
        let table = gpu::upload_u32(gpu, "rows", &row_table(&caches, &POSITIONS).unwrap());
        let q = gpu::upload_f32(gpu, "q", &self.q);
        let out = gpu::storage_buffer(gpu, "out", (self.q.len() * 4) as u64);
        gpu::poison_f32(gpu, &out);
        let rows = DecodeRows {
            cache: caches[0],
            table: &table,
            positions: &POSITIONS,
        };
        attention_decode_rows(&mut rec, &q, &rows, LAYER, &out, p);
        let bytes = pollster::block_on(rec.submit_and_read(&out, 0, (self.q.len() * 4) as u64));
        bytemuck::pod_collect_to_vec(&bytes.unwrap())
    }
}

fn device_variants() -> Vec<(std::sync::Arc<Gpu>, Variant)> {
    pollster::block_on(testing::device_variants()).expect("devices under test")
}

#[test]
fn batched_rows_match_the_reference_in_every_variant() {
    let seed = testing::fresh_seed();
    let cases: Vec<Case> = SHAPES
        .iter()
        .enumerate()
        .map(|(i, shape)| Case::new(shape, seed + 1000 * i as u64))
        .collect();
    for (gpu, variant) in device_variants() {
        let started = Instant::now();
        let mut worst = 0.0f32;
        for case in &cases {
            let got = case.run(&gpu, variant);
            let p = &case.params;
            let what = format!(
                "{} {variant} heads {}/{} of {} seed {seed}",
                gpu.caps.adapter, p.heads, p.kv_heads, p.head_dim
            );
            testing::assert_close(&got, &case.want, 2e-5, &what);
            worst = worst.max(testing::relative_error(&got, &case.want));
        }
        println!(
            "{} {} {variant}: worst relative error {worst:.2e} ({:.1} s)",
            gpu.caps.adapter,
            gpu.caps.backend,
            started.elapsed().as_secs_f32()
        );
    }
}

#[test]
fn a_row_table_refuses_caches_of_another_pool_and_positions_past_the_context() {
    let gpu = &device_variants()[0].0;
    let pool = KvCache::pooled(gpu, 1, 16, 1, 16, 2).unwrap();
    let other = KvCache::new(gpu, 1, 16, 1, 16).unwrap();
    let table = row_table(&[&pool[0], &pool[1]], &[3, 15]).unwrap();
    assert_eq!(table, vec![3, 0, 15, pool[1].row_region()]);
    let foreign = row_table(&[&pool[0], &other], &[0, 0]).unwrap_err();
    assert!(foreign.contains("row 1"), "{foreign}");
    let past = row_table(&[&pool[1]], &[16]).unwrap_err();
    assert!(past.contains("position 16"), "{past}");
}

/// `rope_store_rows` (a batched step's rope and cache write in one dispatch, through the row
/// table) against `rope_store_scaled` row by row (itself checked against the CPU reference in
/// `ops_rope`): the same q afterwards (and q against `rope_reference` directly), and the same
/// pool, every byte, from identically poisoned pools; rows out of slot order, with per-head
/// norms, in both rope layouts.
#[test]
fn rope_store_rows_writes_each_row_where_rope_store_would() {
    use webshard::gpu::read_f32;
    use webshard::ops::rope::{self, HeadNorms, RopeParams, Section, StoreTarget};
    let seed = testing::fresh_seed();
    for (gpu, variant) in device_variants() {
        if !rope::rope_store_rows_supported(&gpu) {
            continue;
        }
        for (neox, heads, kv_heads) in [(false, 9u32, 3u32), (true, 14, 2)] {
            let p = RopeParams {
                head_dim: 64,
                rope_dims: 64,
                freq_base: 10_000.0,
                freq_scale: 1.0,
                neox,
            };
            let rows = POSITIONS.len();
            let hd = p.head_dim as usize;
            let q = testing::random_f32(rows * heads as usize * hd, seed);
            let k = testing::random_f32(rows * kv_heads as usize * hd, seed ^ 1);
            let v = testing::random_f32(rows * kv_heads as usize * hd, seed ^ 2);
            let norm_q = testing::random_f32(hd, seed ^ 3);
            let norm_k = testing::random_f32(hd, seed ^ 4);
            let upload = |data: &[f32]| gpu::upload_f32(&gpu, "in", data);
            let (nq, nk) = (upload(&norm_q), upload(&norm_k));
            let norms = HeadNorms {
                q: &nq,
                k: &nk,
                eps: 1e-6,
            };
            let run = |batched: bool| {
                let pool = KvCache::pooled(&gpu, LAYER + 1, CONTEXT, kv_heads, 64, SLOTS).unwrap();
                pool[0]
                    .k
                    .iter()
                    .chain(&pool[0].v)
                    .for_each(|b| gpu::poison_f32(&gpu, b));
                let (qb, kb, vb) = (upload(&q), upload(&k), upload(&v));
                let caches: Vec<&KvCache> = SLOT_OF.iter().map(|&s| &pool[s as usize]).collect();
                let words = row_table(&caches, &POSITIONS).unwrap();
                let table = gpu::upload_u32(&gpu, "rows", &words);
                let mut rec = Recorder::with_variant(&gpu, variant);
                let target = |r: usize| StoreTarget {
                    q: Section {
                        buffer: &qb,
                        offset: (r * heads as usize * hd) as u32,
                    },
                    k: Section {
                        buffer: &kb,
                        offset: (r * kv_heads as usize * hd) as u32,
                    },
                    v: Section {
                        buffer: &vb,
                        offset: (r * kv_heads as usize * hd) as u32,
                    },
                    cache: caches[r],
                    cache_layer: LAYER,
                    heads,
                    kv_heads,
                };
                if batched {
                    let count = rows as u32;
                    rope::rope_store_rows(
                        &mut rec,
                        &target(0),
                        Some(&norms),
                        None,
                        count,
                        &table,
                        &p,
                    );
                } else {
                    for (r, &position) in POSITIONS.iter().enumerate() {
                        let t = target(r);
                        rope::rope_store_scaled(&mut rec, &t, Some(&norms), None, 1, position, &p);
                    }
                }
                rec.submit();
                let read = |b: &wgpu::Buffer| {
                    pollster::block_on(read_f32(&gpu, b, 0, b.size() / 4)).unwrap()
                };
                let q_after = read(&qb);
                let caches: Vec<Vec<f32>> = pool[0].k.iter().chain(&pool[0].v).map(read).collect();
                (q_after, caches)
            };
            let what = format!("{} {variant} neox={neox} seed={seed}", gpu.caps.adapter);
            let (q_rows, pool_rows) = run(true);
            let (q_each, pool_each) = run(false);
            testing::assert_close(&q_rows, &q_each, 1e-5, &format!("q {what}"));
            for (a, b) in pool_rows.iter().zip(&pool_each) {
                let same = a
                    .iter()
                    .zip(b)
                    .all(|(x, y)| x.to_bits() == y.to_bits() || (x - y).abs() <= 1e-5);
                assert!(
                    same,
                    "the pool after rope_store_rows differs from row-by-row rope_store: {what}"
                );
            }
            let mut want_q = Vec::new();
            for (r, &position) in POSITIONS.iter().enumerate() {
                let row = &q[r * heads as usize * hd..][..heads as usize * hd];
                let mut normed = webshard::ops::norm::rms_norm_reference(row, &norm_q, 1e-6);
                rope::rope_reference(&mut normed, 1, heads, position, &p);
                want_q.extend(normed);
            }
            testing::assert_close(
                &q_rows,
                &want_q,
                1e-3,
                &format!("q against rope_reference {what}"),
            );
        }
    }
}
