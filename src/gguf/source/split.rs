//! One source over the parts of a split GGUF: source offset `part << PART_BITS | offset` reads
//! byte `offset` of that part (see `gguf::split`), so a tensor is read by Range from whichever
//! part holds it.

use super::{RangeSource, SourceError, SourceStats};
use crate::gguf::split::{locate, SplitName};

pub struct SplitSource {
    parts: Vec<Box<dyn RangeSource>>,
    location: String,
}

impl SplitSource {
    /// Over `parts`, in order (at least one).
    pub fn new(parts: Vec<Box<dyn RangeSource>>) -> SplitSource {
        let location = parts
            .first()
            .map_or_else(String::new, |p| p.location().to_string());
        SplitSource { parts, location }
    }

    /// Opens every part named like `name` with `open`; a part that cannot be opened is named in
    /// the error.
    pub fn open(
        name: &SplitName,
        open: impl Fn(&str) -> Result<Box<dyn RangeSource>, SourceError>,
    ) -> Result<SplitSource, SourceError> {
        let parts = (0..name.count)
            .map(|index| {
                open(&name.part(index)).map_err(|source| SourceError::MissingPart {
                    number: u32::from(index) + 1,
                    count: name.count,
                    source: Box::new(source),
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(SplitSource::new(parts))
    }
}

#[cfg_attr(target_arch = "wasm32", async_trait::async_trait(?Send))]
#[cfg_attr(not(target_arch = "wasm32"), async_trait::async_trait)]
impl RangeSource for SplitSource {
    async fn read_range(&self, offset: u64, len: u64) -> Result<Vec<u8>, SourceError> {
        let (part, in_part) = locate(offset);
        let Some(source) = self.parts.get(usize::from(part)) else {
            return Err(SourceError::PastEnd {
                location: format!(
                    "{} (part {} of {})",
                    self.location,
                    u32::from(part) + 1,
                    self.parts.len()
                ),
                offset: in_part,
                len,
                size: 0,
            });
        };
        source.read_range(in_part, len).await
    }

    /// All parts' bytes together (not an offset bound: see the module's comment).
    fn size(&self) -> Option<u64> {
        self.parts
            .iter()
            .try_fold(0u64, |sum, part| Some(sum.saturating_add(part.size()?)))
    }

    fn location(&self) -> &str {
        &self.location
    }

    fn stats(&self) -> SourceStats {
        self.parts.iter().fold(SourceStats::default(), |sum, part| {
            let stats = part.stats();
            SourceStats {
                bytes_fetched: sum.bytes_fetched + stats.bytes_fetched,
                requests: sum.requests + stats.requests,
            }
        })
    }

    fn parts(&self) -> Option<&[Box<dyn RangeSource>]> {
        Some(&self.parts)
    }
}
