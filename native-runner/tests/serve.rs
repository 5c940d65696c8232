//! `runner serve` over real HTTP: ranges, validators, CORS and cross-origin isolation headers.

use crate::common;

use std::fs;
use std::io::{Seek, SeekFrom, Write};
use std::path::Path;

use native_runner::serve::ServeOptions;
use reqwest::header::{HeaderMap, CONTENT_LENGTH, CONTENT_RANGE};
use reqwest::{Client, StatusCode};

const PAGE: &str = "<!doctype html><title>t</title>";

/// A root with web/index.html, pkg/demo.js and models/ holding `files` (name, contents).
fn fixture_root(files: &[(&str, &[u8])]) -> tempfile::TempDir {
    let root = tempfile::tempdir().unwrap();
    for dir in ["web", "pkg", "models"] {
        fs::create_dir(root.path().join(dir)).unwrap();
    }
    fs::write(root.path().join("web/index.html"), PAGE).unwrap();
    fs::write(root.path().join("pkg/demo.js"), "export {};").unwrap();
    for (name, bytes) in files {
        fs::write(root.path().join("models").join(name), bytes).unwrap();
    }
    root
}

async fn serve_root(root: &Path) -> String {
    common::start_server(ServeOptions::new(root)).await
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> &'a str {
    headers
        .get(name)
        .unwrap_or_else(|| panic!("header {name} missing in {headers:?}"))
        .to_str()
        .unwrap()
}

async fn get_range(client: &Client, url: &str, range: &str) -> reqwest::Response {
    client.get(url).header("range", range).send().await.unwrap()
}

/// A served root whose models/d.bin holds 100 bytes of ASCII digits.
struct Digits {
    root: tempfile::TempDir,
    base: String,
    url: String,
    data: Vec<u8>,
    client: Client,
}

/// 100 bytes of ASCII digits, so every range is easy to check by eye.
fn digits() -> Vec<u8> {
    (0..100u8).map(|i| b'0' + i % 10).collect()
}

impl Digits {
    async fn serve() -> Digits {
        let data = digits();
        let root = fixture_root(&[("d.bin", &data)]);
        let base = serve_root(root.path()).await;
        let url = format!("{base}models/d.bin");
        Digits {
            root,
            base,
            url,
            data,
            client: Client::new(),
        }
    }

    /// GET d.bin with the given request headers.
    async fn get(&self, headers: &[(&str, &str)]) -> reqwest::Response {
        let mut request = self.client.get(&self.url);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        request.send().await.unwrap()
    }

    async fn validator(&self, name: &str) -> String {
        let resp = self.client.head(&self.url).send().await.unwrap();
        header(resp.headers(), name).to_string()
    }

    fn replace_file(&self, bytes: &[u8]) {
        fs::write(self.root.path().join("models/d.bin"), bytes).unwrap();
    }
}

#[tokio::test]
async fn single_range_gives_206_with_content_range() {
    let d = Digits::serve().await;
    let resp = d.get(&[("range", "bytes=10-19")]).await;
    assert_eq!(resp.status(), StatusCode::PARTIAL_CONTENT);
    assert_eq!(header(resp.headers(), "content-range"), "bytes 10-19/100");
    assert_eq!(header(resp.headers(), "accept-ranges"), "bytes");
    assert_eq!(header(resp.headers(), "content-length"), "10");
    assert_eq!(resp.bytes().await.unwrap(), &d.data[10..20]);
}

#[tokio::test]
async fn suffix_and_open_ranges() {
    let d = Digits::serve().await;
    let suffix = d.get(&[("range", "bytes=-5")]).await;
    assert_eq!(header(suffix.headers(), "content-range"), "bytes 95-99/100");
    assert_eq!(suffix.bytes().await.unwrap(), &d.data[95..]);
    let open = d.get(&[("range", "bytes=90-")]).await;
    assert_eq!(header(open.headers(), "content-range"), "bytes 90-99/100");
    assert_eq!(open.bytes().await.unwrap(), &d.data[90..]);
}

#[tokio::test]
async fn unsatisfiable_range_gives_416() {
    let d = Digits::serve().await;
    let resp = d.get(&[("range", "bytes=100-200")]).await;
    assert_eq!(resp.status(), StatusCode::RANGE_NOT_SATISFIABLE);
    assert_eq!(header(resp.headers(), "content-range"), "bytes */100");
}

#[tokio::test]
async fn multi_range_falls_back_to_the_full_file() {
    let d = Digits::serve().await;
    let resp = d.get(&[("range", "bytes=0-1,5-6")]).await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert!(resp.headers().get(CONTENT_RANGE).is_none());
    assert_eq!(resp.bytes().await.unwrap(), d.data);
}

#[tokio::test]
async fn head_reports_length_without_body() {
    let d = Digits::serve().await;
    let resp = d.client.head(&d.url).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(header(resp.headers(), "content-length"), "100");
    assert_eq!(header(resp.headers(), "accept-ranges"), "bytes");
    assert!(resp.headers().contains_key("etag"));
    assert!(resp.bytes().await.unwrap().is_empty());
}

#[tokio::test]
async fn etag_is_stable_and_changes_with_the_file() {
    let d = Digits::serve().await;
    let etag = d.validator("etag").await;
    let full = d.get(&[]).await;
    assert_eq!(header(full.headers(), "etag"), etag);
    d.replace_file(b"changed");
    assert_ne!(d.validator("etag").await, etag);
}

#[tokio::test]
async fn if_range_with_current_validators_gives_206() {
    let d = Digits::serve().await;
    for validator in [
        d.validator("etag").await,
        d.validator("last-modified").await,
    ] {
        let resp = d
            .get(&[("range", "bytes=3-4"), ("if-range", &validator)])
            .await;
        assert_eq!(
            resp.status(),
            StatusCode::PARTIAL_CONTENT,
            "If-Range {validator}"
        );
        assert_eq!(resp.bytes().await.unwrap(), &d.data[3..5]);
    }
}

#[tokio::test]
async fn if_range_with_stale_validators_gives_the_full_new_file() {
    let d = Digits::serve().await;
    let old_etag = d.validator("etag").await;
    let new_data = b"a different, longer file body";
    d.replace_file(new_data);
    let weak_current = format!("W/{}", d.validator("etag").await);
    let stale = [
        old_etag,
        weak_current,
        "Thu, 01 Jan 1970 00:00:00 GMT".to_string(),
    ];
    for validator in stale {
        let resp = d
            .get(&[("range", "bytes=0-3"), ("if-range", &validator)])
            .await;
        assert_eq!(resp.status(), StatusCode::OK, "If-Range {validator}");
        assert_eq!(resp.bytes().await.unwrap(), new_data.as_slice());
    }
}

#[tokio::test]
async fn cors_and_isolation_headers_on_every_tree() {
    let d = Digits::serve().await;
    for path in ["", "index.html", "pkg/demo.js", "models/d.bin"] {
        let resp = d
            .client
            .get(format!("{}{path}", d.base))
            .header("origin", "http://elsewhere.example")
            .header("range", "bytes=0-3")
            .send()
            .await
            .unwrap();
        assert!(resp.status().is_success(), "{path}: {}", resp.status());
        let headers = resp.headers();
        assert_eq!(header(headers, "access-control-allow-origin"), "*");
        let exposed = header(headers, "access-control-expose-headers").to_ascii_lowercase();
        for name in ["content-range", "content-length", "etag", "accept-ranges"] {
            assert!(exposed.contains(name), "{path}: {name} not in {exposed}");
        }
        assert_eq!(header(headers, "cross-origin-opener-policy"), "same-origin");
        assert_eq!(
            header(headers, "cross-origin-embedder-policy"),
            "require-corp"
        );
        assert_eq!(
            header(headers, "cross-origin-resource-policy"),
            "cross-origin"
        );
    }
    let index = d.client.get(&d.base).send().await.unwrap();
    assert_eq!(index.text().await.unwrap(), PAGE);
}

#[tokio::test]
async fn cors_preflight_allows_range_requests() {
    let d = Digits::serve().await;
    let resp = d
        .client
        .request(reqwest::Method::OPTIONS, &d.url)
        .header("origin", "http://elsewhere.example")
        .header("access-control-request-method", "GET")
        .header("access-control-request-headers", "range,if-range")
        .send()
        .await
        .unwrap();
    assert!(resp.status().is_success());
    assert_eq!(header(resp.headers(), "access-control-allow-origin"), "*");
    assert!(header(resp.headers(), "access-control-allow-methods").contains("GET"));
    // The requested headers are mirrored rather than answered with `*`, which the Fetch
    // standard does not let cover `Authorization` (the API key of `runner serve -m`).
    let allowed = header(resp.headers(), "access-control-allow-headers").to_lowercase();
    assert!(
        allowed.contains("range") && allowed.contains("if-range"),
        "{allowed}"
    );
}

#[tokio::test]
async fn missing_file_is_404() {
    let root = fixture_root(&[]);
    let base = serve_root(root.path()).await;
    let resp = Client::new()
        .get(format!("{base}models/nope.gguf"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
}

/// Offsets past 4 GiB must survive every layer (no 32-bit truncation anywhere).
#[tokio::test]
async fn ranges_past_4_gib_in_a_sparse_file() {
    const SIZE: u64 = 5 << 30;
    const MARK_AT: u64 = (4 << 30) + 12_345;
    let root = fixture_root(&[]);
    let mut file = fs::File::create(root.path().join("models/big.bin")).unwrap();
    file.set_len(SIZE).unwrap();
    file.seek(SeekFrom::Start(MARK_AT)).unwrap();
    file.write_all(b"past-4GiB").unwrap();
    drop(file);
    let base = serve_root(root.path()).await;
    let url = format!("{base}models/big.bin");
    let client = Client::new();

    let range = format!("bytes={}-{}", MARK_AT - 1, MARK_AT + 9);
    let resp = get_range(&client, &url, &range).await;
    assert_eq!(resp.status(), StatusCode::PARTIAL_CONTENT);
    let expected_range = format!("bytes {}-{}/{SIZE}", MARK_AT - 1, MARK_AT + 9);
    assert_eq!(header(resp.headers(), "content-range"), expected_range);
    assert_eq!(resp.bytes().await.unwrap().as_ref(), b"\0past-4GiB\0");

    let tail = get_range(&client, &url, "bytes=-4").await;
    let expected_tail = format!("bytes {}-{}/{SIZE}", SIZE - 4, SIZE - 1);
    assert_eq!(header(tail.headers(), "content-range"), expected_tail);

    let head = client.head(&url).send().await.unwrap();
    assert_eq!(
        header(head.headers(), CONTENT_LENGTH.as_str()),
        SIZE.to_string()
    );
}

#[tokio::test]
async fn serves_a_real_model_file() {
    let path = common::model_path(common::SMOLLM2);
    let mut opts = ServeOptions::new(common::repo_root());
    opts.models_dir = Some(common::models_dir());
    let base = common::start_server(opts).await;
    let url = format!("{base}models/{}", common::SMOLLM2);
    let resp = get_range(&Client::new(), &url, "bytes=0-3").await;
    assert_eq!(resp.status(), StatusCode::PARTIAL_CONTENT);
    let size = fs::metadata(&path).unwrap().len();
    assert_eq!(
        header(resp.headers(), "content-range"),
        format!("bytes 0-3/{size}")
    );
    assert_eq!(resp.bytes().await.unwrap().as_ref(), b"GGUF");
}

/// The engine's HTTP source through this server must see exactly what the file source sees.
#[tokio::test]
async fn gguf_reader_over_http_matches_the_file() {
    use webshard::gguf::{open_source, read_header};
    let path = common::model_path(common::SMOLLM2);
    let mut opts = ServeOptions::new(common::repo_root());
    opts.models_dir = Some(common::models_dir());
    let base = common::start_server(opts).await;

    let file = open_source(path.to_str().unwrap()).await.unwrap();
    let from_file = read_header(file.as_ref()).await.unwrap();
    let http = open_source(&format!("{base}models/{}", common::SMOLLM2))
        .await
        .unwrap();
    let from_http = read_header(http.as_ref()).await.unwrap();

    assert_eq!(from_http, from_file);
    assert_eq!(http.size(), Some(fs::metadata(&path).unwrap().len()));
    assert!(http.stats().requests >= 1);
}

/// `--request-log` records every request, ranged or not, with its status, one JSON line each.
#[tokio::test]
async fn request_log_records_each_request() {
    let data = digits();
    let root = fixture_root(&[("d.bin", &data)]);
    let log_path = root.path().join("requests.jsonl");
    let mut opts = ServeOptions::new(root.path());
    opts.request_log = Some(log_path.clone());
    let base = common::start_server(opts).await;
    let client = Client::new();
    let url = format!("{base}models/d.bin");
    get_range(&client, &url, "bytes=10-19")
        .await
        .bytes()
        .await
        .unwrap();
    client.head(&url).send().await.unwrap();
    let missing = client
        .get(format!("{base}models/none.gguf"))
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), StatusCode::NOT_FOUND);

    let lines: Vec<serde_json::Value> = fs::read_to_string(&log_path)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    let expected = [
        (
            "GET",
            "/models/d.bin",
            serde_json::json!("bytes=10-19"),
            206,
        ),
        ("HEAD", "/models/d.bin", serde_json::Value::Null, 200),
        ("GET", "/models/none.gguf", serde_json::Value::Null, 404),
    ];
    assert_eq!(lines.len(), expected.len(), "{lines:?}");
    for (line, (method, path, range, status)) in lines.iter().zip(expected) {
        assert_eq!(line["method"], method, "{line}");
        assert_eq!(line["path"], path, "{line}");
        assert_eq!(line["range"], range, "{line}");
        assert_eq!(line["status"], status, "{line}");
    }
}

/// `/models/index.json` lists the real models with what their headers say, and a file that
/// is not a GGUF with an error instead of failing the whole index.
#[tokio::test]
async fn model_index_lists_the_real_models() {
    let mut opts = ServeOptions::new(common::repo_root());
    opts.models_dir = Some(common::models_dir());
    let base = common::start_server(opts).await;
    let body = Client::new()
        .get(format!("{base}models/index.json"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let index: serde_json::Value = serde_json::from_str(&body).unwrap();
    let models = index["models"].as_array().unwrap();
    for (file, arch, quant) in [
        (common::SMOLLM2, "llama", "Q4_1"),
        (common::QWEN, "qwen2", "Q4_K_M"),
        (common::GEMMA, "gemma3", "Q4_K_M"),
    ] {
        let entry = models
            .iter()
            .find(|m| m["file"] == file)
            .unwrap_or_else(|| panic!("{file} missing from {body}"));
        let size = fs::metadata(common::model_path(file)).unwrap().len();
        assert_eq!(entry["architecture"], arch, "{entry}");
        assert_eq!(entry["quant"], quant, "{entry}");
        assert_eq!(entry["size_bytes"], size, "{entry}");
        assert_eq!(entry["url"], format!("/models/{file}"));
        assert!(entry["context_length"].as_u64().unwrap() >= 2048, "{entry}");
        let memory = entry["memory_bytes"].as_u64().unwrap();
        assert!(memory > size / 2 && entry["parameters"].as_u64().unwrap() > 100_000_000);
        assert!(entry["largest_tensor_bytes"].as_u64().unwrap() < size);
    }
}

#[tokio::test]
async fn model_index_reports_a_bad_file_without_failing() {
    let root = fixture_root(&[("broken.gguf", b"not a gguf at all")]);
    let base = serve_root(root.path()).await;
    let body = Client::new()
        .get(format!("{base}models/index.json"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let index: serde_json::Value = serde_json::from_str(&body).unwrap();
    let entry = &index["models"][0];
    assert_eq!(entry["file"], "broken.gguf");
    assert_eq!(entry["size_bytes"], 17);
    assert!(
        entry["error"].as_str().unwrap().contains("magic"),
        "{entry}"
    );
    assert!(entry.get("architecture").is_none());
}
