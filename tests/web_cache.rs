//! The OPFS range cache in the browser, in front of an in-memory "server": resume fetches only
//! what is missing, a changed ETag or size invalidates, corrupt and short cached ranges are
//! fetched again, and reads inside a cached range are served from it.
#![cfg(target_arch = "wasm32")]

use wasm_bindgen_test::{wasm_bindgen_test, wasm_bindgen_test_configure};
use webshard::gguf::{MemorySource, RangeSource};
use webshard::gpu::testing;
use webshard::web::cache::{key, parse_range_name, CachedSource, CACHE_DIR};
use webshard::web::fetch::RemoteFile;
use webshard::web::opfs::Dir;

wasm_bindgen_test_configure!(run_in_browser);

const SIZE: usize = 10_000;
const CHUNK: u64 = 1000;

fn identity(url: &str, etag: &str) -> RemoteFile {
    RemoteFile {
        url: url.to_string(),
        size: SIZE as u64,
        etag: Some(etag.to_string()),
        last_modified: None,
    }
}

/// A cache over a fresh in-memory server holding `bytes`.
async fn open(url: &str, etag: &str, bytes: &[u8]) -> CachedSource<MemorySource> {
    let root = Dir::root().await.expect("OPFS");
    let remote = MemorySource::new(bytes.to_vec(), url);
    CachedSource::open(&root, identity(url, etag), remote)
        .await
        .expect("open cache")
}

/// A unique URL per test run, so runs never see each other's cache.
fn fresh_url(name: &str) -> String {
    format!("http://cache.test/{name}-{}.gguf", testing::fresh_seed())
}

async fn read_chunks(
    source: &CachedSource<MemorySource>,
    chunks: std::ops::Range<u64>,
    want: &[u8],
) {
    for chunk in chunks {
        let got = source.read_range(chunk * CHUNK, CHUNK).await.expect("read");
        let start = (chunk * CHUNK) as usize;
        assert_eq!(got, &want[start..start + CHUNK as usize], "chunk {chunk}");
    }
}

async fn model_dir(url: &str) -> Dir {
    let root = Dir::root().await.unwrap();
    root.subdir(CACHE_DIR)
        .await
        .unwrap()
        .subdir(&key(url))
        .await
        .unwrap()
}

#[wasm_bindgen_test]
async fn resume_fetches_only_missing_ranges() {
    let url = fresh_url("resume");
    let bytes = testing::random_bytes(SIZE, 1);
    let first = open(&url, "\"v1\"", &bytes).await;
    read_chunks(&first, 0..4, &bytes).await;
    assert_eq!(first.remote().stats().requests, 4);
    drop(first); // the "tab" closes after 4 of 10 chunks

    let second = open(&url, "\"v1\"", &bytes).await;
    read_chunks(&second, 0..10, &bytes).await;
    assert_eq!(
        second.remote().stats().requests,
        6,
        "only the 6 missing chunks"
    );
    let stats = second.stats();
    assert_eq!((stats.hit_ranges, stats.fetched_ranges), (4, 6));
    assert!(!stats.invalidated);

    let third = open(&url, "\"v1\"", &bytes).await;
    read_chunks(&third, 0..10, &bytes).await;
    assert_eq!(
        third.remote().stats().requests,
        0,
        "a finished file needs no network"
    );
    // A read inside a cached range is served from it.
    let inner = third.read_range(2500, 300).await.unwrap();
    assert_eq!(inner, &bytes[2500..2800]);
    assert_eq!(third.remote().stats().requests, 0);
}

#[wasm_bindgen_test]
async fn a_changed_etag_or_size_invalidates() {
    let url = fresh_url("etag");
    let old = testing::random_bytes(SIZE, 2);
    let new = testing::random_bytes(SIZE, 3);
    read_chunks(&open(&url, "\"v1\"", &old).await, 0..10, &old).await;

    let changed = open(&url, "\"v2\"", &new).await;
    assert!(changed.stats().invalidated);
    assert_eq!(changed.cached_bytes(), 0);
    read_chunks(&changed, 0..10, &new).await;
    assert_eq!(changed.remote().stats().requests, 10);

    let root = Dir::root().await.unwrap();
    let mut resized = identity(&url, "\"v2\"");
    resized.size -= 1;
    let remote = MemorySource::new(new[..SIZE - 1].to_vec(), url.as_str());
    let resized = CachedSource::open(&root, resized, remote).await.unwrap();
    assert!(resized.stats().invalidated);
    assert_eq!(resized.cached_bytes(), 0);
}

#[wasm_bindgen_test]
async fn corrupt_and_short_ranges_are_fetched_again() {
    let url = fresh_url("corrupt");
    let bytes = testing::random_bytes(SIZE, 4);
    read_chunks(&open(&url, "\"v1\"", &bytes).await, 0..10, &bytes).await;

    let dir = model_dir(&url).await;
    let mut names: Vec<(u64, String)> = dir
        .names()
        .await
        .unwrap()
        .into_iter()
        .filter_map(|n| parse_range_name(&n).map(|(offset, _, _)| (offset, n)))
        .collect();
    names.sort();
    assert_eq!(names.len(), 10);
    let (flipped, short) = (&names[3].1, &names[7].1);
    let mut data = dir.read(flipped, CHUNK).await.unwrap().unwrap();
    data[17] ^= 1;
    dir.write(flipped, &data).await.unwrap();
    let data = dir.read(short, CHUNK).await.unwrap().unwrap();
    dir.write(short, &data[..data.len() - 1]).await.unwrap();

    let reopened = open(&url, "\"v1\"", &bytes).await;
    read_chunks(&reopened, 0..10, &bytes).await;
    let stats = reopened.stats();
    assert_eq!(stats.corrupt_ranges, 2);
    assert_eq!(stats.fetched_ranges, 2);
    assert_eq!(reopened.remote().stats().requests, 2);

    let healed = open(&url, "\"v1\"", &bytes).await;
    read_chunks(&healed, 0..10, &bytes).await;
    assert_eq!(healed.stats().corrupt_ranges, 0);
    assert_eq!(healed.remote().stats().requests, 0);
}

#[wasm_bindgen_test]
async fn stray_files_are_removed_swap_files_kept_and_names_round_trip() {
    let url = fresh_url("stray");
    let bytes = testing::random_bytes(SIZE, 5);
    read_chunks(&open(&url, "\"v1\"", &bytes).await, 0..1, &bytes).await;
    let dir = model_dir(&url).await;
    dir.write("not-a-range", b"x").await.unwrap();
    dir.write("9000-5000-00", b"past the end").await.unwrap();
    // Chromium's swap file of a write in progress in another tab (or one cut short): the
    // browser's, kept and never read as a range.
    let swap = "4096-4096-00000000000000ff.crswap";
    dir.write(swap, b"partial").await.unwrap();
    let reopened = open(&url, "\"v1\"", &bytes).await;
    assert_eq!(reopened.cached_bytes(), CHUNK);
    let mut names = dir.names().await.unwrap();
    names.sort();
    assert_eq!(names.len(), 3, "{names:?}");
    assert!(names.iter().any(|n| n == swap), "{names:?}");
    assert_eq!(
        parse_range_name(&names[0]).map(|(o, l, _)| (o, l)),
        Some((0, CHUNK))
    );
    assert_eq!(parse_range_name("1-2"), None);
    assert_eq!(parse_range_name("1-0-ff"), None);
    assert_eq!(parse_range_name("1-2-zz"), None);
}
