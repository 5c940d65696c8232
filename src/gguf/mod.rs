//! GGUF format: header, metadata, tensor infos, and the ranged sources bytes come from.
//!
//! `read_header` fetches only the header (a small first read, grown as the parser asks), so a
//! model behind a URL can be inspected and planned before any tensor bytes move.

mod cursor;
pub mod error;
pub mod header;
pub mod metadata;
pub mod parse;
pub mod source;
pub mod split;
pub mod types;

pub use error::{GgufError, SourceError};
pub use header::{read_header, Header, TensorInfo, INITIAL_READ_BYTES, MAX_HEADER_BYTES};
pub use metadata::{Metadata, Value};
pub use parse::{parse_file, parse_header, DEFAULT_ALIGNMENT, MAX_DIMS, MAX_NESTING};
pub use source::{open_source, MemorySource, RangeSource, SourceStats, SplitSource};
pub use split::SplitName;
pub use types::GgmlType;

#[cfg(target_arch = "wasm32")]
pub use source::FetchSource;
#[cfg(not(target_arch = "wasm32"))]
pub use source::{FileSource, HttpSource};
