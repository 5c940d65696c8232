//! Parsing a GGUF header from bytes: magic, version, metadata, tensor infos, then validation of
//! the tensor layout against the alignment and (when known) the file size.

use std::collections::HashSet;

use super::cursor::Cursor;
use super::error::GgufError;
use super::header::{Header, TensorInfo};
use super::metadata::{Metadata, Value};
use super::types::GgmlType;

pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// `GGML_MAX_DIMS`.
pub const MAX_DIMS: u32 = 4;
/// Deepest array-of-array nesting accepted; real files use at most one level.
pub const MAX_NESTING: usize = 8;

/// Smallest metadata entry: empty key (u64 length), value type (u32), one-byte value.
const MIN_KV_BYTES: u64 = 8 + 4 + 1;
/// Smallest tensor info: empty name, n_dims, one dim, type, offset.
const MIN_TENSOR_INFO_BYTES: u64 = 8 + 4 + 8 + 4 + 8;

/// Parses a header from a prefix of a file whose length is unknown. If the prefix ends too
/// early the error is `GgufError::Truncated`, whose `needed` says how long a prefix must at
/// least be. Tensors are not checked against the file end.
pub fn parse_header(bytes: &[u8]) -> Result<Header, GgufError> {
    parse_prefix(bytes, None)
}

/// Parses a header from a whole file in memory, also checking that tensor data lies inside it.
pub fn parse_file(bytes: &[u8]) -> Result<Header, GgufError> {
    parse_prefix(bytes, Some(bytes.len() as u64))
}

/// Parses from a prefix of a file of `file_size` bytes (if known).
pub(crate) fn parse_prefix(bytes: &[u8], file_size: Option<u64>) -> Result<Header, GgufError> {
    let mut cur = Cursor::new(bytes, file_size);
    let version = read_preamble(&mut cur)?;
    let (n_tensors, n_kv) = read_counts(&mut cur)?;
    let metadata = read_metadata(&mut cur, n_kv)?;
    let alignment = alignment(&metadata)?;
    let raw = read_tensor_infos(&mut cur, n_tensors)?;
    let data_offset = align_up(cur.offset(), alignment).ok_or_else(|| GgufError::BadAlignment {
        reason: format!("data section start overflows with alignment {alignment}"),
    })?;
    let tensors = layout_tensors(raw, alignment, data_offset, file_size)?;
    Ok(Header {
        version,
        metadata,
        tensors,
        alignment,
        data_offset,
    })
}

fn read_preamble(cur: &mut Cursor) -> Result<u32, GgufError> {
    let magic = cur.bytes4().map_err(|e| e.within(|| "magic".into()))?;
    if magic != GGUF_MAGIC {
        return Err(GgufError::BadMagic { found: magic });
    }
    let version = cur.u32().map_err(|e| e.within(|| "version".into()))?;
    match version {
        2 | 3 => Ok(version),
        _ => Err(GgufError::UnsupportedVersion { version }),
    }
}

fn read_counts(cur: &mut Cursor) -> Result<(u64, u64), GgufError> {
    let counts_offset = cur.offset();
    let n_tensors = cur.u64().map_err(|e| e.within(|| "tensor count".into()))?;
    let n_kv = cur
        .u64()
        .map_err(|e| e.within(|| "metadata key count".into()))?;
    cur.check_count(n_kv, MIN_KV_BYTES, counts_offset + 8)
        .map_err(|e| e.within(|| "metadata key count".into()))?;
    Ok((n_tensors, n_kv))
}

fn read_metadata(cur: &mut Cursor, n_kv: u64) -> Result<Metadata, GgufError> {
    let mut metadata = Metadata::new();
    for index in 0..n_kv {
        let key_offset = cur.offset();
        let key = cur
            .string()
            .map_err(|e| e.within(|| format!("key of metadata entry #{index}")))?;
        if metadata.contains_key(&key) {
            return Err(GgufError::DuplicateKey {
                key,
                offset: key_offset,
            });
        }
        let value = read_typed_value(cur, &key, 0)
            .map_err(|e| e.within(|| format!("value of key `{key}`")))?;
        metadata.insert(key, value)?;
    }
    Ok(metadata)
}

/// Smallest encoding of one value of a type id; `None` for unknown ids.
fn min_value_bytes(type_id: u32) -> Option<u64> {
    Some(match type_id {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        8 | 10..=12 => 8,
        9 => 4 + 8,
        _ => return None,
    })
}

fn read_typed_value(cur: &mut Cursor, key: &str, depth: usize) -> Result<Value, GgufError> {
    let type_offset = cur.offset();
    let type_id = cur.u32()?;
    check_value_type(key, type_id, type_offset)?;
    read_value(cur, key, type_id, depth)
}

fn check_value_type(key: &str, type_id: u32, offset: u64) -> Result<u64, GgufError> {
    min_value_bytes(type_id).ok_or_else(|| GgufError::UnknownValueType {
        key: key.to_string(),
        type_id,
        offset,
    })
}

fn read_value(cur: &mut Cursor, key: &str, type_id: u32, depth: usize) -> Result<Value, GgufError> {
    Ok(match type_id {
        0 => Value::U8(cur.u8()?),
        1 => Value::I8(cur.i8()?),
        2 => Value::U16(cur.u16()?),
        3 => Value::I16(cur.i16()?),
        4 => Value::U32(cur.u32()?),
        5 => Value::I32(cur.i32()?),
        6 => Value::F32(cur.f32()?),
        7 => read_bool(cur, key)?,
        8 => Value::String(cur.string()?),
        9 => read_array(cur, key, depth)?,
        10 => Value::U64(cur.u64()?),
        11 => Value::I64(cur.i64()?),
        12 => Value::F64(cur.f64()?),
        _ => unreachable_type(key, type_id, cur.offset())?,
    })
}

/// Callers validate type ids first; this keeps the match total without a panic path.
fn unreachable_type(key: &str, type_id: u32, offset: u64) -> Result<Value, GgufError> {
    Err(GgufError::UnknownValueType {
        key: key.to_string(),
        type_id,
        offset,
    })
}

fn read_bool(cur: &mut Cursor, key: &str) -> Result<Value, GgufError> {
    let offset = cur.offset();
    match cur.u8()? {
        0 => Ok(Value::Bool(false)),
        1 => Ok(Value::Bool(true)),
        value => Err(GgufError::InvalidBool {
            key: key.to_string(),
            value,
            offset,
        }),
    }
}

fn read_array(cur: &mut Cursor, key: &str, depth: usize) -> Result<Value, GgufError> {
    let type_offset = cur.offset();
    if depth >= MAX_NESTING {
        return Err(GgufError::NestingTooDeep {
            key: key.to_string(),
            max: MAX_NESTING,
            offset: type_offset,
        });
    }
    let element_type = cur.u32()?;
    let min_bytes = check_value_type(key, element_type, type_offset)?;
    let count_offset = cur.offset();
    let count = cur.u64()?;
    let capacity = cur.check_count(count, min_bytes, count_offset)?;
    let mut items = Vec::with_capacity(capacity);
    for _ in 0..count {
        items.push(read_value(cur, key, element_type, depth + 1)?);
    }
    Ok(Value::Array(items))
}

fn alignment(metadata: &Metadata) -> Result<u64, GgufError> {
    let bad = |reason: String| GgufError::BadAlignment { reason };
    match metadata.get("general.alignment") {
        None => Ok(DEFAULT_ALIGNMENT),
        Some(&Value::U32(a)) if a.is_power_of_two() => Ok(a.into()),
        Some(&Value::U32(a)) => Err(bad(format!("{a} is not a nonzero power of two"))),
        Some(other) => Err(bad(format!("type {} (must be u32)", other.type_name()))),
    }
}

fn align_up(offset: u64, alignment: u64) -> Option<u64> {
    Some(offset.checked_add(alignment - 1)? / alignment * alignment)
}

/// A tensor info as stored: data offset relative to the data section.
struct RawTensor {
    name: String,
    shape: Vec<u64>,
    ggml_type: GgmlType,
    relative_offset: u64,
}

fn read_tensor_infos(cur: &mut Cursor, n_tensors: u64) -> Result<Vec<RawTensor>, GgufError> {
    let capacity = cur
        .check_count(n_tensors, MIN_TENSOR_INFO_BYTES, 8)
        .map_err(|e| e.within(|| "tensor count".into()))?;
    let mut tensors = Vec::with_capacity(capacity);
    let mut names = HashSet::with_capacity(capacity);
    for index in 0..n_tensors {
        let name_offset = cur.offset();
        let name = cur
            .string()
            .map_err(|e| e.within(|| format!("name of tensor info #{index}")))?;
        if !names.insert(name.clone()) {
            return Err(GgufError::DuplicateTensor {
                name,
                offset: name_offset,
            });
        }
        let tensor = read_tensor_info(cur, name)?;
        tensors.push(tensor);
    }
    Ok(tensors)
}

fn read_tensor_info(cur: &mut Cursor, name: String) -> Result<RawTensor, GgufError> {
    let within = |e: GgufError| e.within(|| format!("tensor info of `{name}`"));
    let dims_offset = cur.offset();
    let n_dims = cur.u32().map_err(within)?;
    if n_dims == 0 || n_dims > MAX_DIMS {
        return Err(GgufError::BadDimCount {
            tensor: name,
            n_dims,
            offset: dims_offset,
        });
    }
    let mut shape = Vec::with_capacity(n_dims as usize);
    for index in 0..n_dims as usize {
        let dim_offset = cur.offset();
        let dim = cur.u64().map_err(within)?;
        if dim == 0 {
            return Err(GgufError::ZeroDim {
                tensor: name,
                index,
                offset: dim_offset,
            });
        }
        shape.push(dim);
    }
    let type_offset = cur.offset();
    let type_id = cur.u32().map_err(within)?;
    let Some(ggml_type) = GgmlType::from_id(type_id) else {
        return Err(GgufError::UnknownTensorType {
            tensor: name,
            type_id,
            offset: type_offset,
        });
    };
    let relative_offset = cur.u64().map_err(within)?;
    Ok(RawTensor {
        name,
        shape,
        ggml_type,
        relative_offset,
    })
}

fn layout_tensors(
    raw: Vec<RawTensor>,
    alignment: u64,
    data_offset: u64,
    file_size: Option<u64>,
) -> Result<Vec<TensorInfo>, GgufError> {
    let tensors = raw
        .into_iter()
        .map(|t| place_tensor(t, alignment, data_offset, file_size))
        .collect::<Result<Vec<_>, _>>()?;
    check_no_overlap(&tensors)?;
    Ok(tensors)
}

fn place_tensor(
    raw: RawTensor,
    alignment: u64,
    data_offset: u64,
    file_size: Option<u64>,
) -> Result<TensorInfo, GgufError> {
    let overflow = || GgufError::ShapeOverflow {
        tensor: raw.name.clone(),
        shape: raw.shape.clone(),
    };
    let n_elements = raw
        .shape
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .ok_or_else(overflow)?;
    let block_size = raw.ggml_type.block_size();
    if !raw.shape[0].is_multiple_of(block_size) {
        return Err(GgufError::RowNotBlockMultiple {
            tensor: raw.name,
            row_len: raw.shape[0],
            ggml_type: raw.ggml_type,
            block_size,
        });
    }
    let bytes = raw.ggml_type.bytes_for(n_elements).ok_or_else(overflow)?;
    if !raw.relative_offset.is_multiple_of(alignment) {
        return Err(GgufError::MisalignedTensor {
            tensor: raw.name,
            offset: raw.relative_offset,
            alignment,
        });
    }
    let past_end = |end: u64| GgufError::TensorPastEnd {
        tensor: raw.name.clone(),
        end,
        file_size: file_size.unwrap_or(u64::MAX),
    };
    let offset = data_offset
        .checked_add(raw.relative_offset)
        .ok_or_else(|| past_end(u64::MAX))?;
    let end = offset
        .checked_add(bytes)
        .ok_or_else(|| past_end(u64::MAX))?;
    if file_size.is_some_and(|size| end > size) {
        return Err(past_end(end));
    }
    Ok(TensorInfo {
        name: raw.name,
        ggml_type: raw.ggml_type,
        shape: raw.shape,
        offset,
        bytes,
    })
}

fn check_no_overlap(tensors: &[TensorInfo]) -> Result<(), GgufError> {
    let mut order: Vec<&TensorInfo> = tensors.iter().collect();
    order.sort_by_key(|t| t.offset);
    for pair in order.windows(2) {
        let (first, second) = (pair[0], pair[1]);
        let first_end = first.offset + first.bytes;
        if second.offset < first_end {
            return Err(GgufError::TensorOverlap {
                tensor: second.name.clone(),
                start: second.offset,
                end: second.offset + second.bytes,
                other: first.name.clone(),
                other_start: first.offset,
                other_end: first_end,
            });
        }
    }
    Ok(())
}
