//! Fused batched decode attention (`rope_attention_decode_rows`: each row's per-head norms,
//! rope, cache write and attention in one dispatch) against the CPU references of each part,
//! on every device and variant where it runs (GPUs, and CPU adapters under the GPU work
//! split): the head layouts and rope settings of `ops_rope_attention`, rows of distinct
//! sequences out of slot order in a pool of slots and in a paged pool of shuffled pages, at
//! positions within one key split and across several. The pool and the output are poisoned
//! first and the layer before the one attended holds decoys; every value of the attended
//! layer is checked afterwards: each row's new key and value at its position, nothing else
//! changed.

use std::sync::Arc;

use webshard::gpu::{self, testing, Gpu, Recorder, Variant};
use webshard::ops::attention::{
    kv_write, rope_attention_decode_rows, rope_attention_rows_supported, row_table, DecodeRows,
    KvCache, PAGE_TOKENS,
};
use webshard::ops::rope::{HeadNorms, StoreTarget};

use super::ops_rope_attention::{models, params, reference, Inputs, Model, EPS, LAYER, MAX_CTX};

/// Row r is the sequence in cache CACHE_OF[r] at position POSITIONS[r]: one key, a full
/// single split, several splits, and two.
const POSITIONS: [u32; 4] = [700, 0, 255, 301];
const CACHE_OF: [usize; 4] = [2, 0, 3, 1];

/// Slots of a pool, or seats of a paged pool.
#[derive(Clone, Copy, Debug)]
enum Pool {
    Slots,
    Paged,
}

/// Each seat's pages for its sequence's positions (up to POSITIONS of the row it serves): a
/// seed-shuffled draw of the pool's pages, never the sink (page 0). The pool's page count.
fn page_lists(seed: u64) -> (Vec<Vec<u32>>, u32) {
    let needed: Vec<u32> = (0..CACHE_OF.len())
        .map(|cache| {
            let row = CACHE_OF.iter().position(|&c| c == cache).unwrap();
            (POSITIONS[row] + 1).div_ceil(PAGE_TOKENS)
        })
        .collect();
    let pages = 1 + needed.iter().sum::<u32>() + 3;
    let order = testing::random_f32(pages as usize - 1, seed);
    let mut keyed: Vec<(f32, u32)> = order.into_iter().zip(1..pages).collect();
    keyed.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut shuffled = keyed.into_iter().map(|(_, page)| page);
    let lists = needed
        .iter()
        .map(|&n| shuffled.by_ref().take(n as usize).collect())
        .collect();
    (lists, pages)
}

/// The caches of `pool`'s kind, poisoned, each pointed at its pages when paged.
fn poisoned_caches(
    gpu: &Gpu,
    m: &Model,
    pool: Pool,
    lists: &[Vec<u32>],
    pages: u32,
) -> Vec<KvCache> {
    let (kv_heads, hd, count) = (m.kv_heads, m.rope.head_dim, CACHE_OF.len() as u32);
    let caches = match pool {
        Pool::Slots => KvCache::pooled(gpu, LAYER + 1, MAX_CTX, kv_heads, hd, count),
        Pool::Paged => KvCache::paged(gpu, [LAYER + 1, MAX_CTX, kv_heads, hd], count, pages, count),
    }
    .unwrap();
    for buffer in caches[0].k.iter().chain(&caches[0].v) {
        gpu::poison_f32(gpu, buffer);
    }
    if let Pool::Paged = pool {
        for (cache, list) in caches.iter().zip(lists) {
            cache.set_pages(gpu, list);
        }
    }
    caches
}

/// The element where `position`'s row begins in the pool's layer, for cache `cache`.
fn row_start(
    pool: Pool,
    caches: &[KvCache],
    lists: &[Vec<u32>],
    cache: usize,
    position: u32,
    row: usize,
) -> usize {
    match pool {
        Pool::Slots => (caches[cache].slot_offset / 4) as usize + position as usize * row,
        Pool::Paged => {
            let page = lists[cache][(position / PAGE_TOKENS) as usize];
            (page * PAGE_TOKENS + position % PAGE_TOKENS) as usize * row
        }
    }
}

/// Layer `LAYER` of the whole pool: keys, values.
fn read_pool_layer(gpu: &Gpu, caches: &[KvCache]) -> [Vec<f32>; 2] {
    let first = &caches[0];
    let (index, offset) = first.layer_location(LAYER);
    let start = (offset - first.slot_offset) / 4;
    [&first.k, &first.v].map(|buffers| {
        let read = gpu::read_f32(gpu, &buffers[index], start, first.pooled_bytes / 4);
        pollster::block_on(read).unwrap()
    })
}

fn check_case(gpu: &Arc<Gpu>, variant: Variant, m: &Model, pool: Pool, seed: u64) {
    let what = format!(
        "fused rows {} {pool:?} {} ({}) {variant} seed={seed}",
        m.name, gpu.caps.adapter, gpu.caps.backend
    );
    let mut inputs: Vec<Inputs> = POSITIONS
        .iter()
        .enumerate()
        .map(|(r, &pos)| Inputs::new(m, pos, seed + 31 * r as u64))
        .collect();
    // The norms' weights are the layer's, shared by every row.
    let (q_norm, k_norm) = (inputs[0].q_norm.clone(), inputs[0].k_norm.clone());
    for x in &mut inputs {
        (x.q_norm, x.k_norm) = (q_norm.clone(), k_norm.clone());
    }
    let (lists, pages) = page_lists(seed);
    let caches = poisoned_caches(gpu, m, pool, &lists, pages);
    let mut rec = Recorder::with_variant(gpu, variant);
    let mut uploads = Vec::new();
    for (x, (&cache, &pos)) in inputs.iter().zip(CACHE_OF.iter().zip(&POSITIONS)) {
        if pos == 0 {
            continue;
        }
        let k = gpu::upload_f32(gpu, "k", &x.k_cache);
        let v = gpu::upload_f32(gpu, "v", &x.v_cache);
        kv_write(&mut rec, &caches[cache], LAYER, &k, &v, 0, pos);
        // The layer before holds the values as keys: a wrong layer offset cannot pass.
        kv_write(&mut rec, &caches[cache], LAYER - 1, &v, &k, 0, pos);
        uploads.push((k, v));
    }
    rec.submit();
    let before = read_pool_layer(gpu, &caches);

    let hd = m.rope.head_dim as usize;
    let (q_len, row) = (m.heads as usize * hd, m.kv_heads as usize * hd);
    let section = |range: std::ops::Range<usize>| {
        inputs
            .iter()
            .flat_map(move |x| x.qkv[range.clone()].to_vec())
    };
    let sections: Vec<f32> = section(0..q_len)
        .chain(section(q_len..q_len + row))
        .chain(section(q_len + row..q_len + 2 * row))
        .collect();
    let qkv = gpu::upload_f32(gpu, "qkv", &sections);
    let row_caches: Vec<&KvCache> = CACHE_OF.iter().map(|&c| &caches[c]).collect();
    let words = row_table(&row_caches, &POSITIONS).unwrap();
    let uploaded;
    let table = match pool {
        Pool::Slots => {
            uploaded = gpu::upload_u32(gpu, "rows", &words);
            &uploaded
        }
        Pool::Paged => {
            let table = &caches[0].pages().unwrap().table;
            gpu.queue
                .write_buffer(table, 0, bytemuck::cast_slice(&words));
            table
        }
    };
    let norm_buffers = [&q_norm, &k_norm].map(|w| gpu::upload_f32(gpu, "norm", w));
    let norms = HeadNorms {
        q: &norm_buffers[0],
        k: &norm_buffers[1],
        eps: EPS,
    };
    let rows = POSITIONS.len();
    let out = gpu::storage_buffer(gpu, "out", (rows * q_len * 4) as u64);
    gpu::poison_f32(gpu, &out);
    let target = StoreTarget::sections(&qkv, rows as u32, m.heads, row_caches[0], LAYER);
    let decode_rows = DecodeRows {
        cache: row_caches[0],
        table,
        positions: &POSITIONS,
    };
    let mut rec = Recorder::with_variant(gpu, variant);
    let norms = m.norms.then_some(&norms);
    rope_attention_decode_rows(
        &mut rec,
        &target,
        norms,
        &decode_rows,
        &m.rope,
        &params(m),
        &out,
    );
    let read = rec.submit_and_read(&out, 0, (rows * q_len * 4) as u64);
    let got: Vec<f32> = bytemuck::pod_collect_to_vec(&pollster::block_on(read).unwrap());

    let [mut want_k, mut want_v] = before;
    let mut want_out = Vec::new();
    for (r, x) in inputs.iter().enumerate() {
        let want = reference(m, x, POSITIONS[r]);
        want_out.extend(want.out);
        let at = row_start(pool, &caches, &lists, CACHE_OF[r], POSITIONS[r], row);
        want_k[at..at + row].copy_from_slice(&want.k_row);
        want_v[at..at + row].copy_from_slice(&want.v_row);
    }
    testing::assert_close(&got, &want_out, 2e-5, &format!("{what}: out"));
    let [got_k, got_v] = read_pool_layer(gpu, &caches);
    let close = |(a, b): (&f32, &f32)| a.to_bits() == b.to_bits() || (a - b).abs() <= 4e-6;
    assert!(got_k.iter().zip(&want_k).all(close), "{what}: keys");
    let same = |(a, b): (&f32, &f32)| a.to_bits() == b.to_bits();
    assert!(got_v.iter().zip(&want_v).all(same), "{what}: values");
}

/// Each device's cases take its variants in turn (`testing::variant_for_case`): ten cases
/// cover a device's variants, where every case in every variant compiled five times the
/// pipelines on a cold shader cache (~110 s on llvmpipe).
#[test]
fn fused_rows_match_rope_store_rows_then_attention() {
    let seed = testing::fresh_seed();
    let devices = pollster::block_on(testing::devices_both_splits()).unwrap();
    let mut checked = 0;
    for gpu in &devices {
        let variants = gpu.caps.all_variants();
        let mut turn = 0;
        for (index, m) in models().iter().enumerate() {
            for pool in [Pool::Slots, Pool::Paged] {
                let paged = matches!(pool, Pool::Paged);
                if !rope_attention_rows_supported(gpu, &params(m), paged) {
                    continue;
                }
                let variant = testing::variant_for_case(&variants, turn, seed);
                check_case(gpu, variant, m, pool, seed + index as u64 * 7919);
                turn += 1;
            }
        }
        checked += turn;
        assert!(
            turn == 0 || turn >= variants.len(),
            "{} cases leave some of {} variants unchecked",
            turn,
            variants.len()
        );
    }
    assert!(
        checked > 0,
        "no device ran the fused rows kernel: the GPU work split of a CPU adapter should"
    );
    eprintln!("{checked} fused batched decode attention cases checked");
}
