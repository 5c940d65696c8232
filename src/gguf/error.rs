//! Errors of the GGUF reader and of the byte sources under it.

use super::types::GgmlType;

/// A failure to get bytes from a path or URL.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("{location}: I/O error reading {len} bytes at offset {offset}: {source}")]
    Io {
        location: String,
        offset: u64,
        len: u64,
        source: std::io::Error,
    },
    #[error("{location}: cannot open: {source}")]
    Open {
        location: String,
        source: std::io::Error,
    },
    #[error("{location}: read of {len} bytes at offset {offset} is past the end ({size} bytes)")]
    PastEnd {
        location: String,
        offset: u64,
        len: u64,
        size: u64,
    },
    #[error("{url}: HTTP status {status} for bytes {offset}..{end}", end = offset + len)]
    HttpStatus {
        url: String,
        status: u16,
        offset: u64,
        len: u64,
    },
    #[error(
        "{url}: server ignored the Range header (answered 200 with the whole body instead of 206)"
    )]
    RangeIgnored { url: String },
    #[error("{url}: Content-Range {found:?} does not match the requested range {expected}")]
    BadContentRange {
        url: String,
        expected: String,
        found: Option<String>,
    },
    #[error("{location}: short body: got {got} of {expected} bytes at offset {offset}")]
    ShortBody {
        location: String,
        offset: u64,
        expected: u64,
        got: u64,
    },
    #[error("{location}: body longer than the {expected} bytes asked for at offset {offset}")]
    LongBody {
        location: String,
        offset: u64,
        expected: u64,
    },
    #[error(
        "{url}: transfer failed after {got} of {expected} bytes at offset {offset}: {message}"
    )]
    Interrupted {
        url: String,
        offset: u64,
        expected: u64,
        got: u64,
        message: String,
    },
    #[error("{url}: request failed: {message}")]
    Request { url: String, message: String },
    #[error("{location}: a read of {len} bytes does not fit in memory")]
    TooLarge { location: String, len: u64 },
    #[error("part {number} of {count} of a split GGUF: {source}")]
    MissingPart {
        number: u32,
        count: u16,
        source: Box<SourceError>,
    },
}

/// A failure to read a GGUF header. Each variant names what was wrong and where.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error(transparent)]
    Source(#[from] SourceError),
    /// The bytes end before the header does. From a prefix this means "read more".
    #[error("truncated GGUF: {context} at byte {offset} needs bytes up to {needed}, only {available} available")]
    Truncated {
        context: String,
        offset: u64,
        needed: u64,
        available: u64,
    },
    #[error("not a GGUF file: magic {found:02x?} at byte 0, expected \"GGUF\"")]
    BadMagic { found: [u8; 4] },
    #[error("unsupported GGUF version {version} at byte 4 (supported: 2 and 3, little-endian)")]
    UnsupportedVersion { version: u32 },
    #[error("{context}: count {count} at byte {offset} cannot fit in the {bytes_left} bytes left")]
    CountTooLarge {
        context: String,
        count: u64,
        offset: u64,
        bytes_left: u64,
    },
    #[error("{context}: invalid UTF-8 in string at byte {offset}")]
    InvalidUtf8 { context: String, offset: u64 },
    #[error("key `{key}`: unknown metadata value type {type_id} at byte {offset}")]
    UnknownValueType {
        key: String,
        type_id: u32,
        offset: u64,
    },
    #[error("key `{key}`: arrays nested deeper than {max} levels at byte {offset}")]
    NestingTooDeep {
        key: String,
        max: usize,
        offset: u64,
    },
    #[error("key `{key}`: bool byte {value} at byte {offset} is neither 0 nor 1")]
    InvalidBool { key: String, value: u8, offset: u64 },
    #[error("duplicate metadata key `{key}` at byte {offset}")]
    DuplicateKey { key: String, offset: u64 },
    #[error("duplicate tensor name `{name}` at byte {offset}")]
    DuplicateTensor { name: String, offset: u64 },
    #[error("tensor `{tensor}`: {n_dims} dimensions at byte {offset}, must be 1 to 4")]
    BadDimCount {
        tensor: String,
        n_dims: u32,
        offset: u64,
    },
    #[error("tensor `{tensor}`: dimension {index} is zero at byte {offset}")]
    ZeroDim {
        tensor: String,
        index: usize,
        offset: u64,
    },
    #[error("tensor `{tensor}`: shape {shape:?} overflows 64-bit element or byte counts")]
    ShapeOverflow { tensor: String, shape: Vec<u64> },
    #[error("tensor `{tensor}`: unknown ggml type id {type_id} at byte {offset}")]
    UnknownTensorType {
        tensor: String,
        type_id: u32,
        offset: u64,
    },
    #[error("tensor `{tensor}`: row length {row_len} is not a multiple of {ggml_type}'s block size {block_size}")]
    RowNotBlockMultiple {
        tensor: String,
        row_len: u64,
        ggml_type: GgmlType,
        block_size: u64,
    },
    #[error(
        "tensor `{tensor}`: data offset {offset} is not a multiple of the alignment {alignment}"
    )]
    MisalignedTensor {
        tensor: String,
        offset: u64,
        alignment: u64,
    },
    #[error("tensor `{tensor}` (bytes {start}..{end}) overlaps tensor `{other}` (bytes {other_start}..{other_end})")]
    TensorOverlap {
        tensor: String,
        start: u64,
        end: u64,
        other: String,
        other_start: u64,
        other_end: u64,
    },
    #[error(
        "tensor `{tensor}`: data ends at byte {end}, past the end of the file ({file_size} bytes)"
    )]
    TensorPastEnd {
        tensor: String,
        end: u64,
        file_size: u64,
    },
    #[error("bad `general.alignment`: {reason}")]
    BadAlignment { reason: String },
    #[error("metadata key `{key}` is missing")]
    MissingKey { key: String },
    #[error("metadata key `{key}`: expected {expected}, found {found}")]
    WrongType {
        key: String,
        expected: &'static str,
        found: &'static str,
    },
    #[error("metadata key `{key}`: value {value} does not fit in {target}")]
    OutOfRange {
        key: String,
        value: String,
        target: &'static str,
    },
    #[error("GGUF header needs at least {needed} bytes, more than the {limit}-byte limit")]
    HeaderTooLarge { needed: u64, limit: u64 },
    /// A split model (`gguf-split`) whose parts do not make one model; `part` names the file.
    #[error("{part}: split GGUF: {reason}")]
    Split { part: String, reason: String },
}

impl GgufError {
    /// Prefixes the context of position-only errors raised deep in the byte reader.
    pub(crate) fn within(self, outer: impl FnOnce() -> String) -> GgufError {
        match self {
            GgufError::Truncated {
                context,
                offset,
                needed,
                available,
            } => GgufError::Truncated {
                context: join_context(outer(), context),
                offset,
                needed,
                available,
            },
            GgufError::CountTooLarge {
                context,
                count,
                offset,
                bytes_left,
            } => GgufError::CountTooLarge {
                context: join_context(outer(), context),
                count,
                offset,
                bytes_left,
            },
            GgufError::InvalidUtf8 { context, offset } => GgufError::InvalidUtf8 {
                context: join_context(outer(), context),
                offset,
            },
            other => other,
        }
    }
}

fn join_context(outer: String, inner: String) -> String {
    if inner.is_empty() {
        outer
    } else {
        format!("{outer}: {inner}")
    }
}
