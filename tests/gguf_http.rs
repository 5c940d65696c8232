//! HttpSource against tiny raw-HTTP servers on loopback that answer correctly or misbehave in
//! one specific way each.

use crate::gguf_writer;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use gguf_writer::*;
use webshard::gguf::{open_source, parse_file, read_header, HttpSource, RangeSource, SourceError};

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Correct,
    IgnoreRange,
    NotFound,
    CutMidBody,
    ShortBody,
    LongBody,
    WrongContentRange,
    NoContentRange,
}

struct Server {
    url: String,
    requests: Arc<AtomicUsize>,
}

async fn serve(body: Vec<u8>, mode: Mode) -> Server {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/model.gguf", listener.local_addr().unwrap());
    let requests = Arc::new(AtomicUsize::new(0));
    let (body, counter) = (Arc::new(body), requests.clone());
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            counter.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(answer(stream, body.clone(), mode));
        }
    });
    Server { url, requests }
}

/// Reads the request head (bounded) and returns the requested inclusive byte range.
async fn read_range_request(stream: &mut TcpStream) -> Option<(usize, usize)> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") && head.len() < 16 * 1024 {
        if stream.read(&mut byte).await.ok()? == 0 {
            return None;
        }
        head.push(byte[0]);
    }
    let head = String::from_utf8(head).ok()?;
    let range = head.lines().find_map(|l| {
        l.to_ascii_lowercase()
            .strip_prefix("range: bytes=")
            .map(str::to_string)
    })?;
    let (first, last) = range.trim().split_once('-')?;
    Some((first.parse().ok()?, last.parse().ok()?))
}

async fn answer(mut stream: TcpStream, body: Arc<Vec<u8>>, mode: Mode) {
    let Some((first, last)) = read_range_request(&mut stream).await else {
        return;
    };
    let total = body.len();
    let last = last.min(total - 1);
    let part = &body[first..=last];
    let content_range = format!("bytes {first}-{last}/{total}");
    let (status, headers, payload): (&str, String, Vec<u8>) = match mode {
        Mode::Correct => (
            "206 Partial Content",
            format!("Content-Range: {content_range}\r\n"),
            part.to_vec(),
        ),
        Mode::IgnoreRange => ("200 OK", String::new(), body.to_vec()),
        Mode::NotFound => ("404 Not Found", String::new(), b"no such model".to_vec()),
        Mode::ShortBody => (
            "206 Partial Content",
            format!("Content-Range: {content_range}\r\n"),
            part[..part.len() - 10].to_vec(),
        ),
        Mode::LongBody => (
            "206 Partial Content",
            format!("Content-Range: {content_range}\r\n"),
            [part, b"extra"].concat(),
        ),
        Mode::WrongContentRange => (
            "206 Partial Content",
            format!(
                "Content-Range: bytes {}-{}/{total}\r\n",
                first + 1,
                last + 1
            ),
            part.to_vec(),
        ),
        Mode::NoContentRange => ("206 Partial Content", String::new(), part.to_vec()),
        Mode::CutMidBody => {
            let head = format!(
                "HTTP/1.1 206 Partial Content\r\nContent-Range: {content_range}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                part.len()
            );
            let _ = stream.write_all(head.as_bytes()).await;
            let _ = stream.write_all(&part[..part.len() / 2]).await;
            return; // dropping the stream cuts the connection mid-body
        }
    };
    let head = format!(
        "HTTP/1.1 {status}\r\n{headers}Content-Length: {}\r\nConnection: close\r\n\r\n",
        payload.len()
    );
    let _ = stream.write_all(head.as_bytes()).await;
    let _ = stream.write_all(&payload).await;
    let _ = stream.shutdown().await;
}

fn model_bytes() -> Vec<u8> {
    let tokens: Vec<Raw> = (0..30_000).map(|i| v_str(&format!("tok{i}"))).collect();
    GgufBuilder::valid()
        .kv("tokenizer.ggml.tokens", v_array(tokens))
        .bytes()
}

async fn read_error(mode: Mode, offset: u64, len: u64) -> (SourceError, String) {
    let server = serve(model_bytes(), mode).await;
    let source = HttpSource::new(&server.url).unwrap();
    let err = source.read_range(offset, len).await.unwrap_err();
    let message = err.to_string();
    assert!(message.contains(&server.url), "{message:?} lacks the URL");
    (err, message)
}

#[tokio::test]
async fn correct_server_serves_ranges_and_the_header() {
    let bytes = model_bytes();
    let server = serve(bytes.clone(), Mode::Correct).await;
    let source = open_source(&server.url).await.unwrap();
    assert_eq!(source.size(), None, "size unknown before the first read");
    let header = read_header(source.as_ref()).await.unwrap();
    assert_eq!(header, parse_file(&bytes).unwrap());
    assert_eq!(source.size(), Some(bytes.len() as u64));
    assert_eq!(source.read_range(100, 7).await.unwrap(), bytes[100..107]);
    let stats = source.stats();
    assert_eq!(
        stats.requests as usize,
        server.requests.load(Ordering::SeqCst)
    );
    assert!(stats.bytes_fetched <= header.data_offset * 5 / 4 + 256 * 1024 + 7);
}

#[tokio::test]
async fn header_of_a_file_smaller_than_the_first_read() {
    let bytes = GgufBuilder::valid().bytes();
    let server = serve(bytes.clone(), Mode::Correct).await;
    let source = HttpSource::new(&server.url).unwrap();
    // The first 64 KiB request is answered with the whole (shorter) file, a range mismatch the
    // reader recovers from once it knows the size.
    assert_eq!(
        read_header(&source).await.unwrap(),
        parse_file(&bytes).unwrap()
    );
}

#[tokio::test]
async fn server_ignoring_range_is_an_error() {
    let (err, message) = read_error(Mode::IgnoreRange, 0, 100).await;
    assert!(matches!(err, SourceError::RangeIgnored { .. }), "{err:?}");
    assert!(message.contains("ignored the Range header"));
}

#[tokio::test]
async fn not_found_names_url_and_status() {
    let (err, message) = read_error(Mode::NotFound, 0, 100).await;
    assert!(
        matches!(err, SourceError::HttpStatus { status: 404, .. }),
        "{err:?}"
    );
    assert!(message.contains("404"));
}

#[tokio::test]
async fn connection_cut_mid_body() {
    let (err, _) = read_error(Mode::CutMidBody, 0, 4000).await;
    assert!(
        matches!(err, SourceError::Interrupted { expected: 4000, .. }),
        "{err:?}"
    );
}

#[tokio::test]
async fn body_shorter_than_asked() {
    let (err, _) = read_error(Mode::ShortBody, 10, 500).await;
    assert!(
        matches!(
            err,
            SourceError::ShortBody {
                expected: 500,
                got: 490,
                ..
            }
        ),
        "{err:?}"
    );
}

#[tokio::test]
async fn body_longer_than_asked() {
    let (err, _) = read_error(Mode::LongBody, 10, 500).await;
    assert!(
        matches!(err, SourceError::LongBody { expected: 500, .. }),
        "{err:?}"
    );
}

#[tokio::test]
async fn wrong_content_range() {
    let (err, message) = read_error(Mode::WrongContentRange, 10, 500).await;
    assert!(
        matches!(err, SourceError::BadContentRange { found: Some(_), .. }),
        "{err:?}"
    );
    assert!(message.contains("bytes 10-509"), "{message}");
}

#[tokio::test]
async fn missing_content_range() {
    let (err, _) = read_error(Mode::NoContentRange, 10, 500).await;
    assert!(
        matches!(err, SourceError::BadContentRange { found: None, .. }),
        "{err:?}"
    );
}

#[tokio::test]
async fn read_past_known_end_is_refused_without_a_request() {
    let bytes = model_bytes();
    let server = serve(bytes.clone(), Mode::Correct).await;
    let source = HttpSource::new(&server.url).unwrap();
    source.read_range(0, 16).await.unwrap();
    let err = source
        .read_range(bytes.len() as u64 - 4, 8)
        .await
        .unwrap_err();
    assert!(matches!(err, SourceError::PastEnd { .. }), "{err:?}");
    assert_eq!(server.requests.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn header_read_through_a_broken_server_fails_cleanly() {
    let server = serve(model_bytes(), Mode::IgnoreRange).await;
    let source = HttpSource::new(&server.url).unwrap();
    let err = read_header(&source).await.unwrap_err();
    assert!(
        err.to_string().contains("ignored the Range header"),
        "{err}"
    );
}
