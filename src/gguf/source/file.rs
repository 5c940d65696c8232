//! Local files.

use std::fs::File;
use std::io::{ErrorKind, Read, Seek, SeekFrom};
use std::path::Path;
use std::sync::Mutex;

use super::{check_read, Counter, RangeSource, SourceError, SourceStats};

/// A local file read with positioned reads.
///
/// Reads are plain blocking `std::fs` calls: they work under any executor (tokio, pollster),
/// and a local read is short enough not to need a blocking pool.
pub struct FileSource {
    file: Mutex<File>,
    size: u64,
    location: String,
    counter: Counter,
}

impl FileSource {
    pub fn open(path: impl AsRef<Path>) -> Result<FileSource, SourceError> {
        let location = path.as_ref().display().to_string();
        let open_error = |source| SourceError::Open {
            location: location.clone(),
            source,
        };
        let file = File::open(path.as_ref()).map_err(open_error)?;
        let size = file.metadata().map_err(open_error)?.len();
        Ok(FileSource {
            file: Mutex::new(file),
            size,
            location,
            counter: Counter::default(),
        })
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        // A poisoned lock only means another reader panicked; the file handle is still usable
        // because every read seeks first.
        let mut file = self.file.lock().unwrap_or_else(|p| p.into_inner());
        file.seek(SeekFrom::Start(offset))?;
        file.read_exact(buf)
    }

    fn current_len(&self) -> u64 {
        let file = self.file.lock().unwrap_or_else(|p| p.into_inner());
        file.metadata().map_or(0, |m| m.len())
    }
}

#[cfg_attr(target_arch = "wasm32", async_trait::async_trait(?Send))]
#[cfg_attr(not(target_arch = "wasm32"), async_trait::async_trait)]
impl RangeSource for FileSource {
    async fn read_range(&self, offset: u64, len: u64) -> Result<Vec<u8>, SourceError> {
        let len_usize = check_read(&self.location, offset, len, Some(self.size))?;
        tracing::debug!(location = %self.location, offset, len, "file range read");
        self.counter.record_request();
        let mut buf = vec![0u8; len_usize];
        match self.read_at(offset, &mut buf) {
            Ok(()) => {
                self.counter.record_bytes(len);
                Ok(buf)
            }
            // The file shrank since it was opened.
            Err(e) if e.kind() == ErrorKind::UnexpectedEof => Err(SourceError::ShortBody {
                location: self.location.clone(),
                offset,
                expected: len,
                got: self.current_len().saturating_sub(offset).min(len),
            }),
            Err(source) => Err(SourceError::Io {
                location: self.location.clone(),
                offset,
                len,
                source,
            }),
        }
    }

    fn size(&self) -> Option<u64> {
        Some(self.size)
    }

    fn location(&self) -> &str {
        &self.location
    }

    fn stats(&self) -> SourceStats {
        self.counter.stats()
    }
}
