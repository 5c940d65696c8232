//! The browser's `fetch` with Range requests (gloo-net).

use std::cell::Cell;

use gloo_net::http::Request;

use super::range::{check_partial_response, parse_content_range, range_header};
use super::{check_read, Counter, RangeSource, SourceError, SourceStats};

/// A URL read with one ranged `fetch` per read, with the same checks as `HttpSource`.
/// Cross-origin servers must expose `Content-Range` (Access-Control-Expose-Headers).
pub struct FetchSource {
    url: String,
    size: Cell<Option<u64>>,
    counter: Counter,
}

impl FetchSource {
    pub fn new(url: &str) -> FetchSource {
        FetchSource {
            url: url.to_string(),
            size: Cell::new(None),
            counter: Counter::default(),
        }
    }

    fn request_error(&self, err: gloo_net::Error) -> SourceError {
        SourceError::Request {
            url: self.url.clone(),
            message: err.to_string(),
        }
    }
}

#[async_trait::async_trait(?Send)]
impl RangeSource for FetchSource {
    async fn read_range(&self, offset: u64, len: u64) -> Result<Vec<u8>, SourceError> {
        let capacity = check_read(&self.url, offset, len, self.size())?;
        if len == 0 {
            return Ok(Vec::new());
        }
        tracing::debug!(url = %self.url, offset, len, "fetch range request");
        self.counter.record_request();
        let response = Request::get(&self.url)
            .header("Range", &range_header(offset, len))
            .send()
            .await
            .map_err(|e| self.request_error(e))?;
        let content_range = response.headers().get("content-range");
        if let Some(total) = content_range
            .as_deref()
            .and_then(parse_content_range)
            .and_then(|cr| cr.total)
        {
            self.size.set(Some(total));
        }
        check_partial_response(
            &self.url,
            response.status(),
            content_range.as_deref(),
            offset,
            len,
        )?;
        let body = response
            .binary()
            .await
            .map_err(|e| SourceError::Interrupted {
                url: self.url.clone(),
                offset,
                expected: len,
                got: 0,
                message: e.to_string(),
            })?;
        self.counter.record_bytes(body.len() as u64);
        match body.len().cmp(&capacity) {
            std::cmp::Ordering::Equal => Ok(body),
            std::cmp::Ordering::Less => Err(SourceError::ShortBody {
                location: self.url.clone(),
                offset,
                expected: len,
                got: body.len() as u64,
            }),
            std::cmp::Ordering::Greater => Err(SourceError::LongBody {
                location: self.url.clone(),
                offset,
                expected: len,
            }),
        }
    }

    fn size(&self) -> Option<u64> {
        self.size.get()
    }

    fn location(&self) -> &str {
        &self.url
    }

    fn stats(&self) -> SourceStats {
        self.counter.stats()
    }
}
