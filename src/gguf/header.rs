//! The parsed header and the incremental reader that fetches just enough of a source to parse it.

use super::error::{GgufError, SourceError};
use super::metadata::Metadata;
use super::parse::parse_prefix;
use super::source::RangeSource;
use super::split;
use super::types::GgmlType;

/// First fetch: enough for the whole header of small models.
pub const INITIAL_READ_BYTES: u64 = 64 * 1024;
/// Refuse headers larger than this (real ones are a few MiB, mostly vocabulary).
pub const MAX_HEADER_BYTES: u64 = 1 << 30;

/// Everything before the tensor data.
#[derive(Debug, Clone, PartialEq)]
pub struct Header {
    pub version: u32,
    pub metadata: Metadata,
    /// In file order.
    pub tensors: Vec<TensorInfo>,
    pub alignment: u64,
    /// Absolute file offset where the (aligned) data section starts.
    pub data_offset: u64,
}

impl Header {
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// `general.architecture`, e.g. `llama`, `qwen2`, `gemma3`.
    pub fn architecture(&self) -> Result<&str, GgufError> {
        self.metadata.get_str("general.architecture")
    }
}

/// One tensor's type, shape and where its bytes are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    pub ggml_type: GgmlType,
    /// GGUF `ne` order: `shape[0]` is the contiguous row length.
    pub shape: Vec<u64>,
    /// Absolute file offset of the first byte.
    pub offset: u64,
    pub bytes: u64,
}

impl TensorInfo {
    pub fn n_elements(&self) -> u64 {
        self.shape
            .iter()
            .fold(1u64, |acc, &d| acc.saturating_mul(d))
    }

    /// Number of rows: all dimensions but the first, multiplied.
    pub fn rows(&self) -> u64 {
        self.n_elements() / self.row_len()
    }

    /// Bytes of one row of `shape[0]` elements.
    pub fn row_bytes(&self) -> u64 {
        self.row_len() / self.ggml_type.block_size() * self.ggml_type.type_size()
    }

    fn row_len(&self) -> u64 {
        self.shape.first().copied().unwrap_or(1).max(1)
    }
}

/// Reads and parses the header, fetching a small prefix first and growing it only as far as the
/// parser says it must. Bytes already fetched are never fetched again.
///
/// A split model's source (`SplitSource`) gives one header for the whole model: each part's
/// header is read the same way, checked against the others and merged (see `split`). A lone
/// part of a split model is refused with the name of the file to open instead.
pub async fn read_header(src: &dyn RangeSource) -> Result<Header, GgufError> {
    let Some(parts) = src.parts() else {
        let header = read_one(src).await?;
        split::check_whole(&header, src.location())?;
        return Ok(header);
    };
    let mut headers = Vec::with_capacity(parts.len());
    for part in parts {
        headers.push((part.location().to_string(), read_one(part.as_ref()).await?));
    }
    split::merge(headers)
}

/// The header of one file.
async fn read_one(src: &dyn RangeSource) -> Result<Header, GgufError> {
    let mut buf = fetch_first(src).await?;
    loop {
        match parse_prefix(&buf, src.size()) {
            Err(GgufError::Truncated { needed, .. }) if can_grow(&buf, needed, src.size()) => {
                let target = next_prefix_len(buf.len() as u64, needed, src.size())?;
                append(src, &mut buf, target).await?;
            }
            result => return result,
        }
    }
}

async fn fetch_first(src: &dyn RangeSource) -> Result<Vec<u8>, GgufError> {
    let len = src
        .size()
        .map_or(INITIAL_READ_BYTES, |size| size.min(INITIAL_READ_BYTES));
    tracing::debug!(location = src.location(), len, "gguf: first header read");
    match src.read_range(0, len).await {
        Ok(bytes) => Ok(bytes),
        // An HTTP source learns the size from its first answer; a file shorter than the first
        // read is legal, so read it whole.
        Err(err) => match src.size() {
            Some(size) if size < len => Ok(src.read_range(0, size).await?),
            _ => Err(err.into()),
        },
    }
}

fn can_grow(buf: &[u8], needed: u64, size: Option<u64>) -> bool {
    let have = buf.len() as u64;
    needed > have && size.is_none_or(|size| needed <= size && have < size)
}

/// Grows by at least a quarter: `needed` is a lower bound, and both it and the current length
/// are below the header's end, so the final fetch overshoots that end by at most 25%.
fn next_prefix_len(have: u64, needed: u64, size: Option<u64>) -> Result<u64, GgufError> {
    let target = needed.max(have).saturating_add(needed.max(have) / 4);
    if needed > MAX_HEADER_BYTES {
        return Err(GgufError::HeaderTooLarge {
            needed,
            limit: MAX_HEADER_BYTES,
        });
    }
    let target = target.min(MAX_HEADER_BYTES);
    Ok(size.map_or(target, |size| target.min(size)))
}

async fn append(src: &dyn RangeSource, buf: &mut Vec<u8>, target: u64) -> Result<(), GgufError> {
    let have = buf.len() as u64;
    tracing::debug!(
        location = src.location(),
        offset = have,
        len = target - have,
        "gguf: header needs more bytes"
    );
    let more = src.read_range(have, target - have).await?;
    // Sources promise exact lengths; a source that breaks that must not stall this loop.
    if more.len() as u64 != target - have {
        return Err(SourceError::ShortBody {
            location: src.location().to_string(),
            offset: have,
            expected: target - have,
            got: more.len() as u64,
        }
        .into());
    }
    buf.extend_from_slice(&more);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn growth_stays_within_a_quarter_of_the_bound() {
        assert_eq!(next_prefix_len(1000, 1100, None).unwrap(), 1375);
        assert_eq!(next_prefix_len(1000, 8000, Some(9000)).unwrap(), 9000);
        assert!(matches!(
            next_prefix_len(10, MAX_HEADER_BYTES + 1, None),
            Err(GgufError::HeaderTooLarge { .. })
        ));
        assert!(!can_grow(&[0; 10], 20, Some(10)));
        assert!(!can_grow(&[0; 10], 30, Some(20)));
        assert!(can_grow(&[0; 10], 20, Some(20)));
    }
}
