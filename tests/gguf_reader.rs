//! Well-formed files of every value type, and the incremental reader over in-memory sources:
//! same result as a whole-file parse, bounded fetches, refusal of oversized headers.

use crate::gguf_writer;

use gguf_writer::*;
use webshard::gguf::{parse_file, read_header, GgmlType, GgufError, MemorySource};
use webshard::gguf::{RangeSource, SourceError, SourceStats, Value, MAX_HEADER_BYTES};

// --- Well-formed files ---

#[test]
fn every_value_type_round_trips() {
    let bytes = GgufBuilder::empty()
        .kv("u8", v_u8(200))
        .kv("i8", (T_I8, vec![0x80]))
        .kv("u16", (T_U16, 65535u16.to_le_bytes().to_vec()))
        .kv("i16", (T_I16, (-2i16).to_le_bytes().to_vec()))
        .kv("u32", v_u32(4_000_000_000))
        .kv("i32", (T_I32, (-5i32).to_le_bytes().to_vec()))
        .kv("u64", v_u64(u64::MAX))
        .kv("i64", (T_I64, i64::MIN.to_le_bytes().to_vec()))
        .kv("f32", (T_F32, 1.5f32.to_le_bytes().to_vec()))
        .kv("f64", (T_F64, (-0.25f64).to_le_bytes().to_vec()))
        .kv("true", v_bool_byte(1))
        .kv("false", v_bool_byte(0))
        .kv("string", v_str("héllo"))
        .kv("empty", v_str(""))
        .kv("no items", v_array_raw(T_STRING, 0, &[]))
        .kv(
            "nested",
            v_array(vec![v_array(vec![(T_I16, 7i16.to_le_bytes().to_vec())])]),
        )
        .kv("deepest", nested_arrays(8))
        .bytes();
    let m = parse_file(&bytes).unwrap().metadata;
    let expected = [
        ("u8", Value::U8(200)),
        ("i8", Value::I8(-128)),
        ("u16", Value::U16(65535)),
        ("i16", Value::I16(-2)),
        ("u32", Value::U32(4_000_000_000)),
        ("i32", Value::I32(-5)),
        ("u64", Value::U64(u64::MAX)),
        ("i64", Value::I64(i64::MIN)),
        ("f32", Value::F32(1.5)),
        ("f64", Value::F64(-0.25)),
        ("true", Value::Bool(true)),
        ("false", Value::Bool(false)),
        ("string", Value::String("héllo".into())),
        ("empty", Value::String(String::new())),
        ("no items", Value::Array(vec![])),
        (
            "nested",
            Value::Array(vec![Value::Array(vec![Value::I16(7)])]),
        ),
    ];
    for (key, value) in &expected {
        assert_eq!(m.get(key), Some(value), "{key}");
    }
    let mut deepest = m.get("deepest").unwrap();
    for _ in 0..7 {
        deepest = &deepest.as_array().unwrap()[0];
    }
    assert_eq!(deepest, &Value::Array(vec![Value::U8(1)]));
    assert_eq!(m.keys().count(), expected.len() + 1);
    assert_eq!(m.get_u32("u8").unwrap(), 200);
    assert_eq!(m.get_f32("f64").unwrap(), -0.25);
}

#[test]
fn version_2_and_custom_alignment() {
    let mut b = GgufBuilder::valid().kv("general.alignment", v_u32(64));
    b.version = 2;
    b.alignment = 64;
    b.tensors[1].offset = 64;
    let built = b.tensor("c", &[32, 3, 2], GgmlType::Q8_0.id(), 128).build();
    let header = parse_file(&built.bytes).unwrap();
    assert_eq!((header.version, header.alignment), (2, 64));
    assert_eq!(header.data_offset, built.data_offset as u64);
    assert_eq!(header.data_offset % 64, 0);
    let c = header.tensor("c").unwrap();
    assert_eq!(c.offset, header.data_offset + 128);
    assert_eq!(
        (c.n_elements(), c.rows(), c.row_bytes(), c.bytes),
        (192, 6, 34, 204)
    );
    assert_eq!(header.tensor("a").unwrap().shape, [8, 2]);
    assert_eq!(header.architecture().unwrap(), "test");
}

// --- The incremental reader on in-memory sources ---

/// A header with a vocabulary large enough to need several fetches.
fn big_vocab_file(n: usize) -> Built {
    let tokens: Vec<Raw> = (0..n).map(|i| v_str(&format!("token{i}"))).collect();
    let scores: Vec<Raw> = (0..n)
        .map(|i| (T_F32, (i as f32).to_le_bytes().to_vec()))
        .collect();
    GgufBuilder::valid()
        .kv("tokenizer.ggml.tokens", v_array(tokens))
        .kv("tokenizer.ggml.scores", v_array(scores))
        .build()
}

#[tokio::test]
async fn read_header_fetches_little_beyond_the_header() {
    let built = big_vocab_file(200_000);
    let source = MemorySource::new(built.bytes.clone(), "memory:vocab");
    let header = read_header(&source).await.unwrap();
    assert_eq!(header, parse_file(&built.bytes).unwrap());
    let stats = source.stats();
    let bound = header.data_offset + header.data_offset / 4 + 256 * 1024;
    assert!(
        stats.bytes_fetched <= bound,
        "{stats:?} for {}",
        header.data_offset
    );
    assert!(stats.requests <= 10, "{stats:?}");
    assert_eq!(
        header
            .metadata
            .get_str_array("tokenizer.ggml.tokens")
            .unwrap()[199_999],
        "token199999"
    );
}

#[tokio::test]
async fn read_header_of_a_file_smaller_than_the_first_read() {
    let bytes = GgufBuilder::valid().bytes();
    let source = MemorySource::new(bytes.clone(), "memory:small");
    assert_eq!(
        read_header(&source).await.unwrap(),
        parse_file(&bytes).unwrap()
    );
    assert_eq!(
        source.stats(),
        SourceStats {
            bytes_fetched: bytes.len() as u64,
            requests: 1
        }
    );
}

#[tokio::test]
async fn read_header_reports_defects_like_parse_file() {
    let mut b = GgufBuilder::valid();
    b.data_len = Some(10);
    let source = MemorySource::new(b.bytes(), "memory:short");
    let err = read_header(&source).await.unwrap_err();
    assert!(
        matches!(err, GgufError::TensorPastEnd { ref tensor, .. } if tensor == "a"),
        "{err:?}"
    );
}

/// A source of unknown size that never ends: the reader must refuse, not fetch gigabytes.
struct Endless {
    prefix: Vec<u8>,
    stats: std::sync::Mutex<SourceStats>,
}

#[async_trait::async_trait]
impl RangeSource for Endless {
    async fn read_range(&self, offset: u64, len: u64) -> Result<Vec<u8>, SourceError> {
        let mut stats = self.stats.lock().unwrap();
        stats.requests += 1;
        stats.bytes_fetched += len;
        Ok((offset..offset + len)
            .map(|i| self.prefix.get(i as usize).copied().unwrap_or(0))
            .collect())
    }
    fn size(&self) -> Option<u64> {
        None
    }
    fn location(&self) -> &str {
        "endless"
    }
    fn stats(&self) -> SourceStats {
        *self.stats.lock().unwrap()
    }
}

#[tokio::test]
async fn header_larger_than_the_limit_is_refused() {
    let count = MAX_HEADER_BYTES / 8 + 1;
    let prefix = GgufBuilder::empty()
        .kv("huge", v_array_raw(T_U64, count, &[]))
        .bytes();
    let source = Endless {
        prefix,
        stats: Default::default(),
    };
    let err = read_header(&source).await.unwrap_err();
    assert!(
        matches!(
            err,
            GgufError::HeaderTooLarge {
                limit: MAX_HEADER_BYTES,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(source.stats().requests, 1, "refused before fetching more");
}
