//! Bytes already in memory: for tests, fuzzing and files the browser already holds.

use super::{check_read, Counter, RangeSource, SourceError, SourceStats};

pub struct MemorySource {
    bytes: Vec<u8>,
    location: String,
    counter: Counter,
}

impl MemorySource {
    pub fn new(bytes: Vec<u8>, location: impl Into<String>) -> MemorySource {
        MemorySource {
            bytes,
            location: location.into(),
            counter: Counter::default(),
        }
    }
}

#[cfg_attr(target_arch = "wasm32", async_trait::async_trait(?Send))]
#[cfg_attr(not(target_arch = "wasm32"), async_trait::async_trait)]
impl RangeSource for MemorySource {
    async fn read_range(&self, offset: u64, len: u64) -> Result<Vec<u8>, SourceError> {
        let len_usize = check_read(&self.location, offset, len, self.size())?;
        tracing::debug!(location = %self.location, offset, len, "memory range read");
        self.counter.record_request();
        self.counter.record_bytes(len);
        let start = offset as usize;
        Ok(self.bytes[start..start + len_usize].to_vec())
    }

    fn size(&self) -> Option<u64> {
        Some(self.bytes.len() as u64)
    }

    fn location(&self) -> &str {
        &self.location
    }

    fn stats(&self) -> SourceStats {
        self.counter.stats()
    }
}
