//! HTTP(S) with Range requests (reqwest, rustls).

use std::sync::OnceLock;
use std::time::Duration;

use reqwest::header::{CONTENT_RANGE, RANGE};

use super::range::{check_partial_response, parse_content_range, range_header};
use super::{check_read, Counter, RangeSource, SourceError, SourceStats};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// A server that stops sending mid-body must not hang the loader forever.
const READ_TIMEOUT: Duration = Duration::from_secs(60);

/// A URL read with one `Range` request per read. Only a 206 whose `Content-Range` matches the
/// request is accepted; the total size comes from `Content-Range`. Reads need a tokio runtime
/// (reqwest's transport).
pub struct HttpSource {
    url: String,
    client: reqwest::Client,
    size: OnceLock<u64>,
    counter: Counter,
}

impl HttpSource {
    pub fn new(url: &str) -> Result<HttpSource, SourceError> {
        let client = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .read_timeout(READ_TIMEOUT)
            .build()
            .map_err(|e| SourceError::Request {
                url: url.to_string(),
                message: error_chain(&e),
            })?;
        Ok(HttpSource {
            url: url.to_string(),
            client,
            size: OnceLock::new(),
            counter: Counter::default(),
        })
    }

    fn learn_size(&self, content_range: Option<&str>) {
        if let Some(total) = content_range
            .and_then(parse_content_range)
            .and_then(|cr| cr.total)
        {
            let _ = self.size.set(total);
        }
    }

    async fn read_body(
        &self,
        mut response: reqwest::Response,
        offset: u64,
        len: u64,
        capacity: usize,
    ) -> Result<Vec<u8>, SourceError> {
        let mut body = Vec::with_capacity(capacity);
        loop {
            let chunk = response
                .chunk()
                .await
                .map_err(|e| SourceError::Interrupted {
                    url: self.url.clone(),
                    offset,
                    expected: len,
                    got: body.len() as u64,
                    message: error_chain(&e),
                })?;
            let Some(chunk) = chunk else { break };
            self.counter.record_bytes(chunk.len() as u64);
            if body.len() + chunk.len() > capacity {
                return Err(SourceError::LongBody {
                    location: self.url.clone(),
                    offset,
                    expected: len,
                });
            }
            body.extend_from_slice(&chunk);
        }
        if body.len() < capacity {
            return Err(SourceError::ShortBody {
                location: self.url.clone(),
                offset,
                expected: len,
                got: body.len() as u64,
            });
        }
        Ok(body)
    }
}

#[async_trait::async_trait]
impl RangeSource for HttpSource {
    async fn read_range(&self, offset: u64, len: u64) -> Result<Vec<u8>, SourceError> {
        let capacity = check_read(&self.url, offset, len, self.size())?;
        if len == 0 {
            return Ok(Vec::new());
        }
        tracing::debug!(url = %self.url, offset, len, "http range request");
        self.counter.record_request();
        let response = self
            .client
            .get(&self.url)
            .header(RANGE, range_header(offset, len))
            .send()
            .await
            .map_err(|e| SourceError::Request {
                url: self.url.clone(),
                message: error_chain(&e),
            })?;
        let content_range = response
            .headers()
            .get(CONTENT_RANGE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        self.learn_size(content_range.as_deref());
        check_partial_response(
            &self.url,
            response.status().as_u16(),
            content_range.as_deref(),
            offset,
            len,
        )?;
        self.read_body(response, offset, len, capacity).await
    }

    fn size(&self) -> Option<u64> {
        self.size.get().copied()
    }

    fn location(&self) -> &str {
        &self.url
    }

    fn stats(&self) -> SourceStats {
        self.counter.stats()
    }
}

/// reqwest's top-level message is terse ("error sending request"); the causes say why.
fn error_chain(err: &dyn std::error::Error) -> String {
    let mut message = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    message
}
