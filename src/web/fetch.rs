//! Ranged `fetch` for the browser: the file's identity (size, ETag) from one HEAD request,
//! then one Range request per read, cancellable with an `AbortSignal`, each response checked
//! against the identity so bytes of two versions of a file are never mixed.

use std::cell::Cell;

use js_sys::Uint8Array;
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;
use wasm_bindgen_futures::JsFuture;
use web_sys::{AbortSignal, Request, RequestCache, RequestInit, Response};

use super::error::{as_source_error, WebError};
use crate::gguf::source::range::{check_partial_response, parse_content_range, range_header};
use crate::gguf::source::{check_read, Counter};
use crate::gguf::{RangeSource, SourceError, SourceStats};

#[wasm_bindgen]
extern "C" {
    /// `globalThis.fetch`: the same function in a page and in a worker.
    #[wasm_bindgen(js_name = fetch)]
    fn global_fetch(request: &Request) -> js_sys::Promise;
}

/// What identifies one version of a remote file.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RemoteFile {
    pub url: String,
    pub size: u64,
    /// Strong or weak ETag as sent; `None` when the server sends none or hides it (CORS).
    pub etag: Option<String>,
    pub last_modified: Option<String>,
}

/// Sends `method` to `url` with optional headers; maps rejections to network/abort errors.
async fn send(
    url: &str,
    method: &str,
    range: Option<&str>,
    signal: Option<&AbortSignal>,
) -> Result<Response, WebError> {
    let init = RequestInit::new();
    init.set_method(method);
    // The OPFS cache is the cache: the HTTP cache would hide changed files from the HEAD
    // and keep a second copy of every range.
    init.set_cache(RequestCache::NoStore);
    if let Some(signal) = signal {
        init.set_signal(Some(signal));
    }
    let request =
        Request::new_with_str_and_init(url, &init).map_err(|e| WebError::from_js(url, &e))?;
    if let Some(range) = range {
        request
            .headers()
            .set("Range", range)
            .map_err(|e| WebError::from_js(url, &e))?;
    }
    let response = JsFuture::from(global_fetch(&request))
        .await
        .map_err(|e| WebError::from_js(url, &e))?;
    response
        .dyn_into::<Response>()
        .map_err(|e| WebError::from_js(url, &e))
}

fn header(response: &Response, name: &str) -> Option<String> {
    response.headers().get(name).ok().flatten()
}

/// Asks the server for the file's size and validators (HEAD; a one-byte Range request when
/// HEAD gives no length).
pub async fn probe(url: &str, signal: Option<&AbortSignal>) -> Result<RemoteFile, WebError> {
    let head = send(url, "HEAD", None, signal).await?;
    if !head.ok() {
        return Err(SourceError::HttpStatus {
            url: url.to_string(),
            status: head.status(),
            offset: 0,
            len: 0,
        }
        .into());
    }
    let mut size = header(&head, "content-length").and_then(|v| v.trim().parse::<u64>().ok());
    if size.is_none() {
        let first = send(url, "GET", Some(&range_header(0, 1)), signal).await?;
        let content_range = header(&first, "content-range");
        check_partial_response(url, first.status(), content_range.as_deref(), 0, 1)?;
        size = content_range
            .as_deref()
            .and_then(parse_content_range)
            .and_then(|cr| cr.total);
    }
    let size = size.ok_or_else(|| WebError::Network {
        url: url.to_string(),
        message: "the server tells neither Content-Length nor a Content-Range total".into(),
    })?;
    Ok(RemoteFile {
        url: url.to_string(),
        size,
        etag: header(&head, "etag"),
        last_modified: header(&head, "last-modified"),
    })
}

/// One version of a remote file, read with Range requests.
pub struct FetchRanges {
    file: RemoteFile,
    signal: Option<AbortSignal>,
    counter: Counter,
    /// Set once a response shows another version of the file; every later read fails.
    changed: Cell<bool>,
}

impl FetchRanges {
    pub fn new(file: RemoteFile, signal: Option<AbortSignal>) -> FetchRanges {
        FetchRanges {
            file,
            signal,
            counter: Counter::default(),
            changed: Cell::new(false),
        }
    }

    pub fn file(&self) -> &RemoteFile {
        &self.file
    }

    async fn fetch(&self, offset: u64, len: u64) -> Result<Vec<u8>, WebError> {
        let url = &self.file.url;
        let response = send(
            url,
            "GET",
            Some(&range_header(offset, len)),
            self.signal.as_ref(),
        )
        .await?;
        let content_range = header(&response, "content-range");
        check_partial_response(
            url,
            response.status(),
            content_range.as_deref(),
            offset,
            len,
        )?;
        self.check_version(&response)?;
        let body = JsFuture::from(
            response
                .array_buffer()
                .map_err(|e| WebError::from_js(url, &e))?,
        )
        .await
        .map_err(|e| WebError::from_js(url, &e))?;
        let body = Uint8Array::new(&body);
        let got = u64::from(body.length());
        if got != len {
            return Err(SourceError::ShortBody {
                location: url.clone(),
                offset,
                expected: len,
                got,
            }
            .into());
        }
        self.counter.record_bytes(got);
        Ok(body.to_vec())
    }

    /// A response from another version of the file (its ETag or total size differs) poisons
    /// this reader: mixing versions would corrupt the model silently.
    fn check_version(&self, response: &Response) -> Result<(), WebError> {
        let total = header(response, "content-range")
            .as_deref()
            .and_then(parse_content_range)
            .and_then(|cr| cr.total);
        let etag = header(response, "etag");
        let etag_differs = matches!((&self.file.etag, &etag), (Some(a), Some(b)) if a != b);
        let size_differs = total.is_some_and(|t| t != self.file.size);
        if etag_differs || size_differs || self.changed.get() {
            self.changed.set(true);
            return Err(WebError::Changed {
                url: self.file.url.clone(),
                before: self
                    .file
                    .etag
                    .clone()
                    .unwrap_or_else(|| format!("size {}", self.file.size)),
                after: etag.unwrap_or_else(|| format!("size {}", total.unwrap_or(0))),
            });
        }
        Ok(())
    }
}

#[async_trait::async_trait(?Send)]
impl RangeSource for FetchRanges {
    async fn read_range(&self, offset: u64, len: u64) -> Result<Vec<u8>, SourceError> {
        check_read(&self.file.url, offset, len, Some(self.file.size))?;
        if len == 0 {
            return Ok(Vec::new());
        }
        self.counter.record_request();
        self.fetch(offset, len)
            .await
            .map_err(|e| as_source_error(&self.file.url, e))
    }

    fn size(&self) -> Option<u64> {
        Some(self.file.size)
    }

    fn location(&self) -> &str {
        &self.file.url
    }

    fn stats(&self) -> SourceStats {
        self.counter.stats()
    }
}
