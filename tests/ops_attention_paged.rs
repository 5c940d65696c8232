//! Seats of a paged KV pool (`KvCache::paged`) on every device and variant against the CPU
//! references: `kv_write` through a seat's pages (every byte of the pool checked: the rows
//! where the pages say, poison everywhere else), prefill attention and one-token attention
//! over pages, the batched rows kernel and `rope_store_rows` with the row words in the pool's
//! table, `rope_store` writing a prompt through a seat's pages, and the fused one-token kernel
//! (`rope_attention_decode`) writing and reading a seat through its pages. Pages are shuffled, two seats share their first pages (a shared prompt prefix),
//! the pool and outputs are poisoned first, and the layer before the one attended holds decoys.

use std::sync::Arc;

use webshard::gpu::{self, testing, Gpu, Recorder, Variant};
use webshard::ops::attention::{
    attention, attention_decode_rows, attention_reference, attention_rows_reference, kv_write,
    row_table, AttentionCall, AttentionParams, DecodeRows, KvCache, ReferenceRow, PAGE_TOKENS,
};
use webshard::ops::rope::{self, RopeParams, Section, StoreTarget};

const LAYER: u32 = 1;
const CONTEXT: u32 = 600;
const SEATS: usize = 3;
/// Seats 0 and 1 share their first `SHARED` pages.
const SHARED: usize = 2;
/// Each seat's length: seat 1's begins with seat 0's shared pages; seat 0's keys take the
/// batched kernel three splits of at most 256.
const LENGTHS: [u32; SEATS] = [570, 130, 61];
const PAGES: u32 = 64;

fn device_variants() -> Vec<(Arc<Gpu>, Variant)> {
    pollster::block_on(testing::device_variants()).expect("devices under test")
}

/// Each seat's pages: a seed-shuffled draw of the pool's pages (the sink, page 0, never),
/// seat 1's first `SHARED` being seat 0's.
fn page_lists(seed: u64) -> Vec<Vec<u32>> {
    let mut free: Vec<u32> = (1..PAGES).collect();
    let order = testing::random_f32(free.len(), seed);
    let mut keyed: Vec<(f32, u32)> = order.into_iter().zip(free.drain(..)).collect();
    keyed.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut shuffled = keyed.into_iter().map(|(_, page)| page);
    let mut lists: Vec<Vec<u32>> = Vec::new();
    for (seat, &length) in LENGTHS.iter().enumerate() {
        let needed = length.div_ceil(PAGE_TOKENS) as usize;
        let shared = if seat == 1 { SHARED } else { 0 };
        let mut list: Vec<u32> = lists.first().map_or(Vec::new(), |l| l[..shared].to_vec());
        list.extend(shuffled.by_ref().take(needed - shared));
        lists.push(list);
    }
    lists
}

/// Keys and values of each seat's sequence ([pos][kv_head][head_dim]); seat 1's shared
/// positions are seat 0's.
fn sequences(row: usize, seed: u64) -> Vec<(Vec<f32>, Vec<f32>)> {
    let mut seqs: Vec<(Vec<f32>, Vec<f32>)> = LENGTHS
        .iter()
        .enumerate()
        .map(|(seat, &len)| {
            let n = len as usize * row;
            let salt = seed + 7 * seat as u64;
            (
                testing::random_f32(n, salt),
                testing::random_f32(n, salt + 3),
            )
        })
        .collect();
    let shared = SHARED * PAGE_TOKENS as usize * row;
    let (k0, v0) = (seqs[0].0[..shared].to_vec(), seqs[0].1[..shared].to_vec());
    seqs[1].0[..shared].copy_from_slice(&k0);
    seqs[1].1[..shared].copy_from_slice(&v0);
    seqs
}

struct Pool {
    seats: Vec<KvCache>,
    seqs: Vec<(Vec<f32>, Vec<f32>)>,
    lists: Vec<Vec<u32>>,
}

/// A poisoned pool whose seats hold their sequences at layer `LAYER` (decoys at the layer
/// before), written through `kv_write` in chunks that cross pages; seat 1 writes only past
/// the pages it shares with seat 0.
fn filled_pool(gpu: &Gpu, variant: Variant, p: &AttentionParams, seed: u64) -> Pool {
    let shape = [LAYER + 1, CONTEXT, p.kv_heads, p.head_dim];
    let seats = KvCache::paged(gpu, shape, SEATS as u32, PAGES, 4).unwrap();
    for buffer in seats[0].k.iter().chain(&seats[0].v) {
        gpu::poison_f32(gpu, buffer);
    }
    let lists = page_lists(seed);
    let row = (p.kv_heads * p.head_dim) as usize;
    let seqs = sequences(row, seed);
    let mut rec = Recorder::with_variant(gpu, variant);
    let mut uploads = Vec::new();
    for (seat, cache) in seats.iter().enumerate() {
        cache.set_pages(gpu, &lists[seat]);
        let from = if seat == 1 {
            SHARED as u32 * PAGE_TOKENS
        } else {
            0
        };
        for start in (from..LENGTHS[seat]).step_by(37) {
            let tokens = 37.min(LENGTHS[seat] - start);
            let range = start as usize * row..(start + tokens) as usize * row;
            let k = gpu::upload_f32(gpu, "k", &seqs[seat].0[range.clone()]);
            let v = gpu::upload_f32(gpu, "v", &seqs[seat].1[range]);
            kv_write(&mut rec, cache, LAYER, &k, &v, start, tokens);
            kv_write(&mut rec, cache, LAYER - 1, &v, &k, start, tokens);
            uploads.push((k, v));
        }
    }
    rec.submit();
    Pool { seats, seqs, lists }
}

fn read_layer(gpu: &Gpu, buffers: &[wgpu::Buffer], cache: &KvCache) -> Vec<f32> {
    let (index, offset) = cache.layer_location(LAYER);
    let rec = Recorder::new(gpu);
    let read = rec.submit_and_read(&buffers[index], offset, cache.pooled_bytes);
    bytemuck::pod_collect_to_vec(&pollster::block_on(read).unwrap())
}

fn shapes() -> [AttentionParams; 2] {
    [
        AttentionParams::standard(9, 3, 64),
        AttentionParams {
            window: Some(40),
            softcap: Some(5.0),
            ..AttentionParams::standard(4, 1, 256)
        },
    ]
}

#[test]
fn kv_write_puts_each_position_in_its_page_and_nothing_elsewhere() {
    let seed = testing::fresh_seed();
    let p = AttentionParams::standard(2, 2, 16);
    for (gpu, variant) in device_variants() {
        let pool = filled_pool(&gpu, variant, &p, seed);
        let row = (p.kv_heads * p.head_dim) as usize;
        let mut want = vec![f32::from_bits(gpu::POISON); pool.seats[0].pooled_bytes as usize / 4];
        for (seat, (k, _)) in pool.seqs.iter().enumerate() {
            for pos in 0..LENGTHS[seat] as usize {
                let page = pool.lists[seat][pos / PAGE_TOKENS as usize] as usize;
                let at = (page * PAGE_TOKENS as usize + pos % PAGE_TOKENS as usize) * row;
                want[at..at + row].copy_from_slice(&k[pos * row..(pos + 1) * row]);
            }
        }
        let got = read_layer(&gpu, &pool.seats[0].k, &pool.seats[0]);
        let same = got
            .iter()
            .zip(&want)
            .all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(
            same,
            "{} {variant}: the keys' layer differs, seed {seed}",
            gpu.caps.adapter
        );
    }
}

#[test]
fn attention_over_pages_matches_the_reference() {
    let seed = testing::fresh_seed();
    for (gpu, variant) in testing::with_coop_variants(device_variants()) {
        for (i, p) in shapes().iter().enumerate() {
            let pool = filled_pool(&gpu, variant, p, seed + i as u64);
            let what = format!(
                "{} {variant} head_dim {} seed {seed}",
                gpu.caps.adapter, p.head_dim
            );
            // Seat 1 (whose first pages are seat 0's): a prefill chunk, then one token.
            let (k, v) = &pool.seqs[1];
            for tokens in [23u32, 1] {
                let start = LENGTHS[1] - tokens;
                let width = (p.heads * p.head_dim) as usize;
                let q = testing::random_f32(tokens as usize * width, seed ^ u64::from(tokens));
                let want = attention_reference(&q, k, v, start, tokens, p);
                let got = run_attention(&gpu, variant, &pool.seats[1], &q, start, tokens, p);
                // The prefill kernel (one token too, over pages) keeps f16 tiles in f16 variants;
                // on cooperative matrices the chunk's queries and probabilities are f16 too.
                let tolerance = match (variant.coop_matrix, variant.f16) {
                    (true, _) => 6e-3,
                    (false, true) => 3e-3,
                    (false, false) => 2e-5,
                };
                let label = format!("{tokens} tokens {what}");
                testing::assert_close(&got, &want, tolerance, &label);
            }
            // Every seat in one batched step, rows out of seat order.
            let order = [2usize, 0, 1];
            let positions: Vec<u32> = order.iter().map(|&s| LENGTHS[s] - 1).collect();
            let width = (p.heads * p.head_dim) as usize;
            let q = testing::random_f32(order.len() * width, seed ^ 99);
            let reference: Vec<ReferenceRow> = order
                .iter()
                .zip(&positions)
                .map(|(&s, &position)| ReferenceRow {
                    k: &pool.seqs[s].0,
                    v: &pool.seqs[s].1,
                    position,
                })
                .collect();
            let want = attention_rows_reference(&q, &reference, p);
            let caches: Vec<&KvCache> = order.iter().map(|&s| &pool.seats[s]).collect();
            let got = run_rows(&gpu, variant, &caches, &positions, &q, p);
            testing::assert_close(&got, &want, 2e-5, &format!("rows {what}"));
        }
    }
}

fn run_attention(
    gpu: &Gpu,
    variant: Variant,
    cache: &KvCache,
    q: &[f32],
    start: u32,
    tokens: u32,
    p: &AttentionParams,
) -> Vec<f32> {
    let q = gpu::upload_f32(gpu, "q", q);
    let out = gpu::storage_buffer(gpu, "out", q.size());
    gpu::poison_f32(gpu, &out);
    let mut rec = Recorder::with_variant(gpu, variant);
    let call = AttentionCall {
        q: &q,
        cache,
        layer: LAYER,
        out: &out,
        start_pos: start,
        tokens,
    };
    attention(&mut rec, &call, p);
    let bytes = pollster::block_on(rec.submit_and_read(&out, 0, q.size()));
    bytemuck::pod_collect_to_vec(&bytes.unwrap())
}

fn run_rows(
    gpu: &Gpu,
    variant: Variant,
    caches: &[&KvCache],
    positions: &[u32],
    q: &[f32],
    p: &AttentionParams,
) -> Vec<f32> {
    let words = row_table(caches, positions).unwrap();
    let table = &caches[0].pages().unwrap().table;
    gpu.queue
        .write_buffer(table, 0, bytemuck::cast_slice(&words));
    let q = gpu::upload_f32(gpu, "q", q);
    let out = gpu::storage_buffer(gpu, "out", q.size());
    gpu::poison_f32(gpu, &out);
    let rows = DecodeRows {
        cache: caches[0],
        table,
        positions,
    };
    let mut rec = Recorder::with_variant(gpu, variant);
    attention_decode_rows(&mut rec, &q, &rows, LAYER, &out, p);
    let bytes = pollster::block_on(rec.submit_and_read(&out, 0, q.size()));
    bytemuck::pod_collect_to_vec(&bytes.unwrap())
}

/// `rope_store_rows` over seats: each row's rotated key and its value land in the page its
/// position maps to, and nothing else in the pool changes.
#[test]
fn rope_store_rows_writes_through_the_pages() {
    let seed = testing::fresh_seed();
    let (params, rope_params) = rope_shape(true);
    let (kv_heads, head_dim) = (params.kv_heads, params.head_dim);
    for (gpu, variant, pool) in rope_store_pools(&params, seed) {
        let before = layers(&gpu, &pool);
        // Row r rewrites position LENGTHS[s] - 5 of seat s = order[r], in its last page.
        let order = [1usize, 2];
        let positions: Vec<u32> = order.iter().map(|&s| LENGTHS[s] - 5).collect();
        let new = NewRows::upload(&gpu, &params, order.len(), seed);
        let (k, v) = (&new.k, &new.v);
        let caches: Vec<&KvCache> = order.iter().map(|&s| &pool.seats[s]).collect();
        let words = row_table(&caches, &positions).unwrap();
        let table = &pool.seats[0].pages().unwrap().table;
        gpu.queue
            .write_buffer(table, 0, bytemuck::cast_slice(&words));
        let target = new.target(caches[0], &params);
        let mut rec = Recorder::with_variant(&gpu, variant);
        let count = order.len() as u32;
        rope::rope_store_rows(&mut rec, &target, None, None, count, table, &rope_params);
        rec.submit();
        let row = (kv_heads * head_dim) as usize;
        let rewrites: Vec<Rewrite> = order
            .iter()
            .zip(&positions)
            .enumerate()
            .map(|(r, (&seat, &position))| {
                let mut rotated = k[r * row..(r + 1) * row].to_vec();
                rope::rope_reference(&mut rotated, 1, kv_heads, position, &rope_params);
                (seat, position, rotated, v[r * row..(r + 1) * row].to_vec())
            })
            .collect();
        let what = format!("{} {variant} seed {seed}", gpu.caps.adapter);
        assert_rewritten(&gpu, &pool, before, &rewrites, &what);
    }
}

/// The rope_store tests' attention shape (4 q heads, 2 kv heads of 64) and their rope, NeoX's
/// pairs or ggml's normal ones.
fn rope_shape(neox: bool) -> (AttentionParams, RopeParams) {
    let params = AttentionParams::standard(4, 2, 64);
    let rope = RopeParams {
        head_dim: params.head_dim,
        rope_dims: params.head_dim,
        freq_base: 10_000.0,
        freq_scale: 1.0,
        neox,
    };
    (params, rope)
}

/// A filled pool on each device and variant whose `rope_store` kernels read pages (a ninth
/// storage binding).
fn rope_store_pools(params: &AttentionParams, seed: u64) -> Vec<(Arc<Gpu>, Variant, Pool)> {
    let devices = device_variants().into_iter();
    let paged = devices.filter(|(gpu, _)| rope::rope_store_rows_supported(gpu));
    paged
        .map(|(gpu, variant)| {
            let pool = filled_pool(&gpu, variant, params, seed);
            (gpu, variant, pool)
        })
        .collect()
}

/// q, k and v of `tokens` new tokens of the `params` shape, random, on the host and uploaded.
struct NewRows {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    buffers: [wgpu::Buffer; 3],
}

impl NewRows {
    fn upload(gpu: &Gpu, params: &AttentionParams, tokens: usize, seed: u64) -> NewRows {
        let hd = params.head_dim as usize;
        let q = testing::random_f32(tokens * params.heads as usize * hd, seed ^ 5);
        let k = testing::random_f32(tokens * params.kv_heads as usize * hd, seed ^ 6);
        let v = testing::random_f32(tokens * params.kv_heads as usize * hd, seed ^ 7);
        let buffers = [("q", &q), ("k", &k), ("v", &v)].map(|(l, x)| gpu::upload_f32(gpu, l, x));
        NewRows { q, k, v, buffers }
    }

    /// Their `rope_store` target in `cache` at layer `LAYER`.
    fn target<'a>(&'a self, cache: &'a KvCache, params: &AttentionParams) -> StoreTarget<'a> {
        let [q, k, v] = &self.buffers;
        StoreTarget {
            q: Section::from(q),
            k: Section::from(k),
            v: Section::from(v),
            cache,
            cache_layer: LAYER,
            heads: params.heads,
            kv_heads: params.kv_heads,
        }
    }
}

/// The pool's layer `LAYER` as it is: keys, values.
fn layers(gpu: &Gpu, pool: &Pool) -> [Vec<f32>; 2] {
    let seat = &pool.seats[0];
    [
        read_layer(gpu, &seat.k, seat),
        read_layer(gpu, &seat.v, seat),
    ]
}

/// A seat's position rewritten: (seat, position, its rotated key row, its value row).
type Rewrite = (usize, u32, Vec<f32>, Vec<f32>);

/// The pool's layer `LAYER` is `before` (keys, values) with each rewrite's rows where its seat's
/// page says: poison (NaN) and untouched rows bit for bit, the rotated keys within rounding.
fn assert_rewritten(
    gpu: &Gpu,
    pool: &Pool,
    before: [Vec<f32>; 2],
    rewrites: &[Rewrite],
    what: &str,
) {
    let [mut want_k, mut want_v] = before;
    for (seat, position, k_row, v_row) in rewrites {
        let row = k_row.len();
        let page = pool.lists[*seat][(position / PAGE_TOKENS) as usize] as usize;
        let at = (page * PAGE_TOKENS as usize + (position % PAGE_TOKENS) as usize) * row;
        want_k[at..at + row].copy_from_slice(k_row);
        want_v[at..at + row].copy_from_slice(v_row);
    }
    let got_k = read_layer(gpu, &pool.seats[0].k, &pool.seats[0]);
    let got_v = read_layer(gpu, &pool.seats[0].v, &pool.seats[0]);
    let close = |(a, b): (&f32, &f32)| a.to_bits() == b.to_bits() || (a - b).abs() <= 1e-5;
    assert!(got_k.iter().zip(&want_k).all(close), "keys: {what}");
    let same_v = got_v
        .iter()
        .zip(&want_v)
        .all(|(a, b)| a.to_bits() == b.to_bits());
    assert!(same_v, "values: {what}");
}

/// `rope_store` over a seat's pages (a prompt chunk of the HTTP API): the last `TOKENS`
/// positions of seat 2, across a page's end, rewritten through its page table with their
/// rotated keys and their values, q rotated in place, nothing else in the pool changed.
#[test]
fn rope_store_writes_a_prompt_through_the_pages() {
    const TOKENS: u32 = 40;
    let seed = testing::fresh_seed();
    let (params, rope_params) = rope_shape(false);
    let (heads, kv_heads, head_dim) = (params.heads, params.kv_heads, params.head_dim);
    for (gpu, variant, pool) in rope_store_pools(&params, seed) {
        let before = layers(&gpu, &pool);
        let (seat, start) = (2, LENGTHS[2] - TOKENS);
        let row = (kv_heads * head_dim) as usize;
        let new = NewRows::upload(&gpu, &params, TOKENS as usize, seed);
        let (q, k, v) = (&new.q, &new.k, &new.v);
        let target = new.target(&pool.seats[seat], &params);
        let mut rec = Recorder::with_variant(&gpu, variant);
        rope::rope_store(&mut rec, &target, None, TOKENS, start, &rope_params);
        let read = rec.submit_and_read(&new.buffers[0], 0, (q.len() * 4) as u64);
        let got_q: Vec<f32> = bytemuck::pod_collect_to_vec(&pollster::block_on(read).unwrap());
        let mut want_q = q.clone();
        rope::rope_reference(&mut want_q, TOKENS, heads, start, &rope_params);
        let what = format!("{} {variant} seed {seed}", gpu.caps.adapter);
        testing::assert_close(&got_q, &want_q, 1e-5, &format!("q: {what}"));
        let mut rotated = k.clone();
        rope::rope_reference(&mut rotated, TOKENS, kv_heads, start, &rope_params);
        let rewrites: Vec<Rewrite> = (0..TOKENS as usize)
            .map(|t| {
                let rows = t * row..(t + 1) * row;
                (
                    seat,
                    start + t as u32,
                    rotated[rows.clone()].to_vec(),
                    v[rows].to_vec(),
                )
            })
            .collect();
        assert_rewritten(&gpu, &pool, before, &rewrites, &what);
    }
}

/// The fused one-token kernel on each seat (a serving sequence alone in its step) rewrites its
/// last position through its page and attends over its pages: the output as the reference's
/// over the sequence with that row replaced, the new row where its page says, and nothing else
/// in the pool changed.
#[test]
fn fused_one_token_attention_goes_through_the_pages() {
    use webshard::ops::attention::{rope_attention_decode, rope_attention_supported};
    let seed = testing::fresh_seed();
    // CPU adapters once more with the GPU work split, where the fused kernel runs.
    let devices = pollster::block_on(testing::device_variants_both_splits()).unwrap();
    for (gpu, variant) in devices {
        for (i, p) in shapes().iter().enumerate() {
            if !rope_attention_supported(&gpu, p, true) {
                continue;
            }
            let rope = RopeParams {
                head_dim: p.head_dim,
                rope_dims: p.head_dim,
                freq_base: 10_000.0,
                freq_scale: 1.0,
                neox: i == 0,
            };
            let pool = filled_pool(&gpu, variant, p, seed + i as u64);
            for (seat, &length) in LENGTHS.iter().enumerate() {
                let what = format!(
                    "{} {variant} head_dim {} seat {seat} seed {seed}",
                    gpu.caps.adapter, p.head_dim
                );
                let position = length - 1;
                let (q_len, row) = (
                    (p.heads * p.head_dim) as usize,
                    (p.kv_heads * p.head_dim) as usize,
                );
                let qkv = testing::random_f32(q_len + 2 * row, seed ^ (11 + seat as u64));
                let before_k = read_layer(&gpu, &pool.seats[0].k, &pool.seats[0]);
                let before_v = read_layer(&gpu, &pool.seats[0].v, &pool.seats[0]);
                let qkv_buffer = gpu::upload_f32(&gpu, "qkv", &qkv);
                let out = gpu::storage_buffer(&gpu, "out", q_len as u64 * 4);
                gpu::poison_f32(&gpu, &out);
                let target = StoreTarget::packed(&qkv_buffer, p.heads, &pool.seats[seat], LAYER);
                let mut rec = Recorder::with_variant(&gpu, variant);
                rope_attention_decode(&mut rec, &target, None, position, &rope, p, &out);
                let bytes = pollster::block_on(rec.submit_and_read(&out, 0, q_len as u64 * 4));
                let got: Vec<f32> = bytemuck::pod_collect_to_vec(&bytes.unwrap());

                let mut q = qkv[..q_len].to_vec();
                rope::rope_reference(&mut q, 1, p.heads, position, &rope);
                let mut k_row = qkv[q_len..q_len + row].to_vec();
                rope::rope_reference(&mut k_row, 1, p.kv_heads, position, &rope);
                let v_row = &qkv[q_len + row..];
                let (k, v) = &pool.seqs[seat];
                let last = position as usize * row;
                let keys: Vec<f32> = k[..last].iter().chain(&k_row).copied().collect();
                let values: Vec<f32> = v[..last].iter().chain(v_row).copied().collect();
                let want = attention_reference(&q, &keys, &values, position, 1, p);
                testing::assert_close(&got, &want, 2e-5, &format!("out {what}"));

                let page = pool.lists[seat][(position / PAGE_TOKENS) as usize] as usize;
                let at = (page * PAGE_TOKENS as usize + (position % PAGE_TOKENS) as usize) * row;
                let mut want_k = before_k;
                let mut want_v = before_v;
                want_k[at..at + row].copy_from_slice(&k_row);
                want_v[at..at + row].copy_from_slice(v_row);
                let got_k = read_layer(&gpu, &pool.seats[0].k, &pool.seats[0]);
                let got_v = read_layer(&gpu, &pool.seats[0].v, &pool.seats[0]);
                let close =
                    |(a, b): (&f32, &f32)| a.to_bits() == b.to_bits() || (a - b).abs() <= 4e-6;
                assert!(got_k.iter().zip(&want_k).all(close), "keys {what}");
                let same = |(a, b): (&f32, &f32)| a.to_bits() == b.to_bits();
                assert!(got_v.iter().zip(&want_v).all(same), "values {what}");
            }
        }
    }
}

#[test]
fn a_paged_pool_refuses_impossible_shapes_and_foreign_pages() {
    let gpu = &device_variants()[0].0;
    assert!(KvCache::paged(gpu, [1, 32, 1, 16], 0, 8, 4).is_err());
    assert!(KvCache::paged(gpu, [1, 32, 1, 16], 2, 1, 4).is_err());
    assert!(KvCache::paged(gpu, [1, 32, 1, 15], 2, 8, 4).is_err());
    let seats = KvCache::paged(gpu, [1, 32, 1, 16], 2, 8, 4).unwrap();
    assert_eq!(seats[0].pages().unwrap().entries, 2);
    let set = |pages: &[u32]| {
        let call = std::panic::AssertUnwindSafe(|| seats[1].set_pages(gpu, pages));
        std::panic::catch_unwind(call).is_ok()
    };
    assert!(set(&[3, 7]), "pages of the pool");
    assert!(!set(&[3, 8]), "page 8 is outside a pool of 8");
    assert!(!set(&[1, 2, 3]), "three pages for two entries");
}
