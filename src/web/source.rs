//! Where a browser load reads from: the OPFS cache in front of ranged fetches (or fetches
//! alone), opened offline from the cache when the server cannot be reached. A split GGUF
//! (`NAME-00001-of-0000N.gguf`) opens each part that way, as one `SplitSource`.

use std::rc::Rc;

use web_sys::AbortSignal;

use super::cache::{stored_identity, CacheStats, CachedSource};
use super::error::{WebError, ABORTED};
use super::fetch::{probe, FetchRanges};
use super::opfs::Dir;
use crate::gguf::{RangeSource, SourceError, SourceStats, SplitName, SplitSource};

pub enum ModelSource {
    Cached {
        source: CachedSource<FetchRanges>,
        offline: bool,
    },
    Direct(FetchRanges),
    /// The parts of a split GGUF, each opened as one file; `source` reads through `parts`.
    Split {
        source: SplitSource,
        parts: Vec<Rc<ModelSource>>,
    },
}

impl ModelSource {
    pub fn as_range_source(&self) -> &dyn RangeSource {
        match self {
            ModelSource::Cached { source, .. } => source,
            ModelSource::Direct(source) => source,
            ModelSource::Split { source, .. } => source,
        }
    }

    pub fn network_stats(&self) -> SourceStats {
        self.as_range_source().stats()
    }

    pub fn cache_stats(&self) -> Option<CacheStats> {
        match self {
            ModelSource::Cached { source, .. } => Some(source.stats()),
            ModelSource::Direct(_) => None,
            ModelSource::Split { parts, .. } => {
                parts.iter().try_fold(CacheStats::default(), |sum, part| {
                    Some(add_stats(sum, part.cache_stats()?))
                })
            }
        }
    }

    pub fn offline(&self) -> bool {
        match self {
            ModelSource::Cached { offline, .. } => *offline,
            ModelSource::Direct(_) => false,
            ModelSource::Split { parts, .. } => parts.iter().any(|part| part.offline()),
        }
    }
}

fn add_stats(a: CacheStats, b: CacheStats) -> CacheStats {
    CacheStats {
        hit_ranges: a.hit_ranges + b.hit_ranges,
        hit_bytes: a.hit_bytes + b.hit_bytes,
        fetched_ranges: a.fetched_ranges + b.fetched_ranges,
        fetched_bytes: a.fetched_bytes + b.fetched_bytes,
        corrupt_ranges: a.corrupt_ranges + b.corrupt_ranges,
        write_errors: a.write_errors + b.write_errors,
        invalidated: a.invalidated || b.invalidated,
    }
}

/// One part of a split model, shared between the `SplitSource` and the stats.
struct Part(Rc<ModelSource>);

#[async_trait::async_trait(?Send)]
impl RangeSource for Part {
    async fn read_range(&self, offset: u64, len: u64) -> Result<Vec<u8>, SourceError> {
        self.0.as_range_source().read_range(offset, len).await
    }

    fn size(&self) -> Option<u64> {
        self.0.as_range_source().size()
    }

    fn location(&self) -> &str {
        self.0.as_range_source().location()
    }

    fn stats(&self) -> SourceStats {
        self.0.as_range_source().stats()
    }
}

/// `url` resolved against the page or worker location, so the cache key of `/models/x.gguf`
/// and `http://host/models/x.gguf` is the same.
fn absolute(url: &str) -> Result<String, WebError> {
    let base = js_sys::Reflect::get(&js_sys::global(), &"location".into())
        .ok()
        .and_then(|l| js_sys::Reflect::get(&l, &"href".into()).ok())
        .and_then(|h| h.as_string());
    let resolved = match &base {
        Some(base) => web_sys::Url::new_with_base(url, base),
        None => web_sys::Url::new(url),
    };
    resolved
        .map(|u| u.href())
        .map_err(|_| WebError::Options(format!("`{url}` is not a valid URL")))
}

/// Opens `url` for a load: validated against the server (HEAD), cached in OPFS when `cache`
/// is set and OPFS is available; from the cache alone when the server is unreachable and a
/// copy of the file is cached. The first part of a split GGUF opens every part so.
pub async fn open_model_source(
    url: &str,
    cache: bool,
    signal: Option<AbortSignal>,
) -> Result<ModelSource, WebError> {
    let url = absolute(url)?;
    let name = SplitName::parse(&url).filter(|name| name.number == 1 && name.count > 1);
    let Some(name) = name else {
        return open_one(&url, cache, signal).await;
    };
    let mut parts = Vec::with_capacity(usize::from(name.count));
    for index in 0..name.count {
        parts.push(Rc::new(
            open_one(&name.part(index), cache, signal.clone()).await?,
        ));
    }
    let sources = parts
        .iter()
        .map(|part| Box::new(Part(part.clone())) as Box<dyn RangeSource>)
        .collect();
    Ok(ModelSource::Split {
        source: SplitSource::new(sources),
        parts,
    })
}

/// One file (or one part of a split model).
async fn open_one(
    url: &str,
    cache: bool,
    signal: Option<AbortSignal>,
) -> Result<ModelSource, WebError> {
    let url = url.to_string();
    let root = match cache {
        true => Dir::root()
            .await
            .inspect_err(|err| tracing::warn!(%err, "loading without the OPFS cache"))
            .ok(),
        false => None,
    };
    let probed = probe(&url, signal.as_ref()).await;
    let Some(root) = root else {
        return Ok(ModelSource::Direct(FetchRanges::new(probed?, signal)));
    };
    let (file, offline) = match probed {
        Ok(file) => (file, false),
        Err(err @ WebError::Network { .. }) => match stored_identity(&root, &url).await? {
            Some(file) => (file, true),
            None => return Err(err),
        },
        Err(err) => return Err(err),
    };
    let remote = FetchRanges::new(file.clone(), signal);
    let source = CachedSource::open(&root, file, remote).await?;
    Ok(ModelSource::Cached { source, offline })
}

/// Stops reads (cached ones too) once `signal` fires.
pub struct Abortable<'a> {
    inner: &'a dyn RangeSource,
    signal: Option<AbortSignal>,
}

impl<'a> Abortable<'a> {
    pub fn new(inner: &'a dyn RangeSource, signal: Option<AbortSignal>) -> Self {
        Abortable { inner, signal }
    }

    fn aborted(&self) -> bool {
        self.signal.as_ref().is_some_and(AbortSignal::aborted)
    }

    /// Turns whatever error a cancelled load ended with into `Aborted`.
    pub fn explain(&self, err: WebError) -> WebError {
        if self.aborted() {
            WebError::Aborted
        } else {
            err
        }
    }
}

#[async_trait::async_trait(?Send)]
impl RangeSource for Abortable<'_> {
    async fn read_range(&self, offset: u64, len: u64) -> Result<Vec<u8>, SourceError> {
        if self.aborted() {
            return Err(SourceError::Request {
                url: self.inner.location().to_string(),
                message: ABORTED.into(),
            });
        }
        self.inner.read_range(offset, len).await
    }

    fn size(&self) -> Option<u64> {
        self.inner.size()
    }

    fn location(&self) -> &str {
        self.inner.location()
    }

    fn stats(&self) -> SourceStats {
        self.inner.stats()
    }

    fn parts(&self) -> Option<&[Box<dyn RangeSource>]> {
        self.inner.parts()
    }
}
