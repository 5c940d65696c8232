//! Native glue: sources may move between threads, and locations are paths or http(s) URLs.

use super::{FileSource, HttpSource, RangeSource, SourceError};

/// `Send + Sync` natively, so sources can be shared across tokio tasks.
pub trait MaybeSendSync: Send + Sync {}
impl<T: Send + Sync + ?Sized> MaybeSendSync for T {}

pub(super) fn open(path_or_url: &str) -> Result<Box<dyn RangeSource>, SourceError> {
    if is_http_url(path_or_url) {
        Ok(Box::new(HttpSource::new(path_or_url)?))
    } else {
        Ok(Box::new(FileSource::open(path_or_url)?))
    }
}

fn is_http_url(location: &str) -> bool {
    let lower = location.get(..8).unwrap_or(location).to_ascii_lowercase();
    lower.starts_with("http://") || lower.starts_with("https://")
}

#[cfg(test)]
mod tests {
    #[test]
    fn http_urls_are_told_from_paths() {
        assert!(super::is_http_url("http://127.0.0.1:80/m.gguf"));
        assert!(super::is_http_url("HTTPS://example.org/m.gguf"));
        assert!(!super::is_http_url("models/http.gguf"));
        assert!(!super::is_http_url("/tmp/x"));
    }
}
