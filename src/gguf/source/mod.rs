//! Where GGUF bytes come from: ranged reads from a file, an HTTP server, or the browser's fetch.

use std::sync::atomic::{AtomicU64, Ordering};

pub use super::error::SourceError;
use super::split::SplitName;

mod memory;
pub(crate) mod range;
mod split;

#[cfg(target_arch = "wasm32")]
mod fetch;
#[cfg(not(target_arch = "wasm32"))]
mod file;
#[cfg(not(target_arch = "wasm32"))]
mod http;
#[cfg(not(target_arch = "wasm32"))]
mod native;
#[cfg(target_arch = "wasm32")]
mod web;

#[cfg(target_arch = "wasm32")]
pub use fetch::FetchSource;
#[cfg(not(target_arch = "wasm32"))]
pub use file::FileSource;
#[cfg(not(target_arch = "wasm32"))]
pub use http::HttpSource;
pub use memory::MemorySource;
#[cfg(not(target_arch = "wasm32"))]
use native::open as open_platform;
#[cfg(not(target_arch = "wasm32"))]
pub use native::MaybeSendSync;
pub use split::SplitSource;
#[cfg(target_arch = "wasm32")]
use web::open as open_platform;
#[cfg(target_arch = "wasm32")]
pub use web::MaybeSendSync;

/// Traffic a source has caused so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct SourceStats {
    pub bytes_fetched: u64,
    pub requests: u64,
}

/// Async ranged reads. `Send + Sync` natively; browser sources are single-threaded.
#[cfg_attr(target_arch = "wasm32", async_trait::async_trait(?Send))]
#[cfg_attr(not(target_arch = "wasm32"), async_trait::async_trait)]
pub trait RangeSource: MaybeSendSync {
    /// Reads exactly `len` bytes at `offset`, or errors (short body, past end, HTTP status...).
    async fn read_range(&self, offset: u64, len: u64) -> Result<Vec<u8>, SourceError>;
    /// Total size in bytes if known (after the first read for HTTP).
    fn size(&self) -> Option<u64>;
    /// Human-readable location (path or URL) for error messages.
    fn location(&self) -> &str;
    /// Bytes fetched so far and number of range requests made.
    fn stats(&self) -> SourceStats;
    /// The parts, in order, when this source is a split GGUF (`SplitSource`); `read_header`
    /// reads each part's header. Wrappers forward it.
    fn parts(&self) -> Option<&[Box<dyn RangeSource>]> {
        None
    }
}

/// Opens a path or URL: `http(s)://` goes to HTTP, anything else to the file system (natively);
/// in the browser every location is fetched. The first part of a split GGUF
/// (`NAME-00001-of-0000N.gguf`) opens all N parts as one `SplitSource`.
pub async fn open_source(path_or_url: &str) -> Result<Box<dyn RangeSource>, SourceError> {
    match SplitName::parse(path_or_url) {
        Some(name) if name.number == 1 && name.count > 1 => {
            Ok(Box::new(SplitSource::open(&name, open_platform)?))
        }
        _ => open_platform(path_or_url),
    }
}

/// Thread-safe request and byte counters shared by the sources.
#[derive(Debug, Default)]
pub(crate) struct Counter {
    bytes: AtomicU64,
    requests: AtomicU64,
}

impl Counter {
    pub(crate) fn record_request(&self) {
        self.requests.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn record_bytes(&self, n: u64) {
        self.bytes.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn stats(&self) -> SourceStats {
        SourceStats {
            bytes_fetched: self.bytes.load(Ordering::Relaxed),
            requests: self.requests.load(Ordering::Relaxed),
        }
    }
}

/// Rejects reads past a known end and reads too large for memory, before any I/O.
pub(crate) fn check_read(
    location: &str,
    offset: u64,
    len: u64,
    size: Option<u64>,
) -> Result<usize, SourceError> {
    let end = offset.checked_add(len);
    if let Some(size) = size {
        if end.is_none_or(|end| end > size) {
            return Err(SourceError::PastEnd {
                location: location.to_string(),
                offset,
                len,
                size,
            });
        }
    }
    usize::try_from(len).map_err(|_| SourceError::TooLarge {
        location: location.to_string(),
        len,
    })
}
