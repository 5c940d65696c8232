//! A `RangeSource` that keeps every range it downloads in OPFS, so a reload after an interrupted
//! download fetches only what is missing and a finished model loads without the network.
//!
//! Layout: `webshard-cache/<xxh3 of the URL>/` holds `identity.json` (URL, size, ETag,
//! Last-Modified of the version cached) and one file per range named
//! `<offset>-<len>-<xxh3 of the bytes>`. A different identity wipes the directory. A cached
//! range is used only when its file has exactly `len` bytes hashing to the recorded value;
//! anything else is deleted and fetched again, so bad bytes never reach the GPU.

use std::cell::RefCell;
use std::collections::BTreeMap;

use xxhash_rust::xxh3::xxh3_64;

use super::error::{as_source_error, WebError};
use super::fetch::RemoteFile;
use super::opfs::Dir;
use crate::gguf::source::check_read;
use crate::gguf::{RangeSource, SourceError, SourceStats};

/// Top-level OPFS directory of the cache.
pub const CACHE_DIR: &str = "webshard-cache";
const IDENTITY: &str = "identity.json";
/// Longest identity file read back (a URL and two headers).
const MAX_IDENTITY_BYTES: u64 = 64 * 1024;

/// What the cache did so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CacheStats {
    pub hit_ranges: u64,
    pub hit_bytes: u64,
    pub fetched_ranges: u64,
    pub fetched_bytes: u64,
    /// Cached ranges whose size or hash was wrong (deleted and fetched again).
    pub corrupt_ranges: u64,
    /// Ranges that could not be stored (quota...): the load goes on without caching them.
    pub write_errors: u64,
    /// Whether an older version of the file was wiped when the cache was opened.
    pub invalidated: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    len: u64,
    hash: u64,
}

/// The directory name for `url`.
pub fn key(url: &str) -> String {
    format!("{:016x}", xxh3_64(url.as_bytes()))
}

/// Chromium writes a file through `<name>.crswap`, listed beside it until the write closes:
/// another tab's write in progress (removing it would fail, and fail this load), or one cut
/// short, which the browser reuses when that range is written again.
const SWAP_SUFFIX: &str = ".crswap";

fn range_name(offset: u64, entry: Entry) -> String {
    format!("{offset}-{}-{:016x}", entry.len, entry.hash)
}

/// `<offset>-<len>-<hash>` back into its parts; `None` for anything else.
pub fn parse_range_name(name: &str) -> Option<(u64, u64, u64)> {
    let mut parts = name.split('-');
    let offset = parts.next()?.parse().ok()?;
    let len = parts.next()?.parse().ok()?;
    let hash = u64::from_str_radix(parts.next()?, 16).ok()?;
    match parts.next() {
        None if len > 0 => Some((offset, len, hash)),
        _ => None,
    }
}

/// The identity cached for `url`, if any: what an offline load trusts.
pub async fn stored_identity(root: &Dir, url: &str) -> Result<Option<RemoteFile>, WebError> {
    let dir = root.subdir(CACHE_DIR).await?.subdir(&key(url)).await?;
    read_identity(&dir).await
}

async fn read_identity(dir: &Dir) -> Result<Option<RemoteFile>, WebError> {
    let Some(bytes) = dir.read(IDENTITY, MAX_IDENTITY_BYTES).await? else {
        return Ok(None);
    };
    Ok(serde_json::from_slice(&bytes).ok())
}

/// Ranges of one version of one file, cached in OPFS, with `remote` behind.
pub struct CachedSource<R> {
    remote: R,
    file: RemoteFile,
    dir: Dir,
    index: RefCell<BTreeMap<u64, Entry>>,
    stats: RefCell<CacheStats>,
}

impl<R: RangeSource> CachedSource<R> {
    /// Opens the cache of `file` under `root`, wiping ranges of any other version.
    pub async fn open(root: &Dir, file: RemoteFile, remote: R) -> Result<Self, WebError> {
        let dir = root
            .subdir(CACHE_DIR)
            .await?
            .subdir(&key(&file.url))
            .await?;
        let mut stats = CacheStats::default();
        let stored = read_identity(&dir).await?;
        if stored.as_ref() != Some(&file) {
            stats.invalidated = stored.is_some();
            for name in dir.names().await? {
                dir.remove(&name).await?;
            }
            let identity = serde_json::to_vec(&file).map_err(|e| WebError::Cache {
                operation: "write",
                name: dir.path(IDENTITY),
                message: e.to_string(),
            })?;
            dir.write(IDENTITY, &identity).await?;
        }
        let index = Self::scan(&dir, file.size).await?;
        Ok(CachedSource {
            remote,
            file,
            dir,
            index: RefCell::new(index),
            stats: RefCell::new(stats),
        })
    }

    /// Reads the directory listing into an index; stray names are deleted, except the
    /// browser's swap files (`SWAP_SUFFIX`).
    async fn scan(dir: &Dir, size: u64) -> Result<BTreeMap<u64, Entry>, WebError> {
        let mut index = BTreeMap::new();
        for name in dir.names().await? {
            if name == IDENTITY || name.ends_with(SWAP_SUFFIX) {
                continue;
            }
            match parse_range_name(&name) {
                Some((offset, len, hash)) if offset.checked_add(len).is_some_and(|e| e <= size) => {
                    index.insert(offset, Entry { len, hash });
                }
                _ => dir.remove(&name).await?,
            }
        }
        Ok(index)
    }

    pub fn stats(&self) -> CacheStats {
        *self.stats.borrow()
    }

    pub fn remote(&self) -> &R {
        &self.remote
    }

    /// Bytes of all cached ranges (overlaps counted twice; the loader's ranges do not overlap).
    pub fn cached_bytes(&self) -> u64 {
        self.index.borrow().values().map(|e| e.len).sum()
    }

    /// The cached range holding `offset..offset + len`, if any.
    fn covering(&self, offset: u64, len: u64) -> Option<(u64, Entry)> {
        let index = self.index.borrow();
        let (&start, &entry) = index.range(..=offset).next_back()?;
        (start + entry.len >= offset + len).then_some((start, entry))
    }

    /// The verified bytes of `offset..offset + len` from the cache, or `None` (missing or bad:
    /// a bad range is deleted).
    async fn from_cache(&self, offset: u64, len: u64) -> Result<Option<Vec<u8>>, WebError> {
        let Some((start, entry)) = self.covering(offset, len) else {
            return Ok(None);
        };
        let name = range_name(start, entry);
        // Unreadable counts as corrupt: the range is fetched again either way.
        let bytes = match self.dir.read(&name, entry.len).await {
            Ok(bytes) => bytes.unwrap_or_default(),
            Err(err) => {
                tracing::warn!(%err, "cached range unreadable");
                Vec::new()
            }
        };
        if bytes.len() as u64 != entry.len || xxh3_64(&bytes) != entry.hash {
            tracing::warn!(file = %self.dir.path(&name), got = bytes.len(), "corrupt cached range");
            self.index.borrow_mut().remove(&start);
            self.stats.borrow_mut().corrupt_ranges += 1;
            self.dir.remove(&name).await?;
            return Ok(None);
        }
        let mut stats = self.stats.borrow_mut();
        stats.hit_ranges += 1;
        stats.hit_bytes += len;
        if start == offset && entry.len == len {
            return Ok(Some(bytes));
        }
        let from = (offset - start) as usize;
        Ok(Some(bytes[from..from + len as usize].to_vec()))
    }

    /// Fetches a range and stores it; a failed store is counted, not fatal.
    async fn fetch_and_store(&self, offset: u64, len: u64) -> Result<Vec<u8>, SourceError> {
        let bytes = self.remote.read_range(offset, len).await?;
        {
            let mut stats = self.stats.borrow_mut();
            stats.fetched_ranges += 1;
            stats.fetched_bytes += len;
        }
        let entry = Entry {
            len,
            hash: xxh3_64(&bytes),
        };
        match self.dir.write(&range_name(offset, entry), &bytes).await {
            Ok(()) => {
                self.index.borrow_mut().insert(offset, entry);
            }
            Err(err) => {
                tracing::warn!(%err, "range not cached");
                self.stats.borrow_mut().write_errors += 1;
            }
        }
        Ok(bytes)
    }
}

#[async_trait::async_trait(?Send)]
impl<R: RangeSource> RangeSource for CachedSource<R> {
    async fn read_range(&self, offset: u64, len: u64) -> Result<Vec<u8>, SourceError> {
        check_read(&self.file.url, offset, len, Some(self.file.size))?;
        if len == 0 {
            return Ok(Vec::new());
        }
        let cached = self
            .from_cache(offset, len)
            .await
            .map_err(|e| as_source_error(&self.file.url, e))?;
        match cached {
            Some(bytes) => Ok(bytes),
            None => self.fetch_and_store(offset, len).await,
        }
    }

    fn size(&self) -> Option<u64> {
        Some(self.file.size)
    }

    fn location(&self) -> &str {
        &self.file.url
    }

    /// The network traffic (what came from the cache is in `CachedSource::stats`).
    fn stats(&self) -> SourceStats {
        self.remote.stats()
    }
}
