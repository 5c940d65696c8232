//! Malformed GGUF files, each with one defect, must fail with the specific error that names
//! what and where. Truncation at every byte is in `gguf_truncation.rs`.

use crate::gguf_writer;

use gguf_writer::*;
use webshard::gguf::{parse_file, GgmlType, GgufError};

fn assert_mentions(err: &GgufError, parts: &[&str]) {
    let message = err.to_string();
    for part in parts {
        assert!(
            message.contains(part),
            "{message:?} does not mention {part:?}"
        );
    }
}

/// Asserts the error variant (with an optional guard) and that the message names each part.
macro_rules! defect {
    ($name:ident, $bytes:expr, $pattern:pat $(if $guard:expr)?, [$($part:expr),* $(,)?]) => {
        #[test]
        fn $name() {
            let err = fail(&$bytes);
            assert!(matches!(err, $pattern $(if $guard)?), "unexpected error: {err:?}");
            assert_mentions(&err, &[$($part),*]);
        }
    };
}

fn with_magic(magic: [u8; 4]) -> Vec<u8> {
    let mut b = GgufBuilder::valid();
    b.magic = magic;
    b.bytes()
}

fn with_version(version: u32) -> Vec<u8> {
    let mut b = GgufBuilder::valid();
    b.version = version;
    b.bytes()
}

fn with_counts(n_tensors: Option<u64>, n_kv: Option<u64>) -> Vec<u8> {
    let mut b = GgufBuilder::valid();
    b.n_tensors = n_tensors;
    b.n_kv = n_kv;
    b.bytes()
}

/// Magic, version 3 and counts, then `rest` verbatim: for fields the builder always writes well.
fn preamble(n_tensors: u64, n_kv: u64, rest: &[u8]) -> Vec<u8> {
    let mut out = b"GGUF".to_vec();
    out.extend_from_slice(&3u32.to_le_bytes());
    out.extend_from_slice(&n_tensors.to_le_bytes());
    out.extend_from_slice(&n_kv.to_le_bytes());
    out.extend_from_slice(rest);
    out
}

/// One key `k` (value type at byte 33, value at byte 37) and nothing else.
fn single_kv(raw: Raw) -> Vec<u8> {
    GgufBuilder::empty().kv("k", raw).bytes()
}

fn with_alignment(raw: Raw) -> Vec<u8> {
    GgufBuilder::valid().kv("general.alignment", raw).bytes()
}

fn single_tensor(dims: &[u64], type_id: u32) -> Vec<u8> {
    GgufBuilder::empty().tensor("t", dims, type_id, 0).bytes()
}

// --- Preamble ---

defect!(bad_magic, with_magic(*b"GGUX"), GgufError::BadMagic { found } if found == *b"GGUX", ["magic", "byte 0"]);
defect!(
    lowercase_magic,
    with_magic(*b"gguf"),
    GgufError::BadMagic { .. },
    ["GGUF"]
);
defect!(
    version_1_unsupported,
    with_version(1),
    GgufError::UnsupportedVersion { version: 1 },
    ["unsupported GGUF version 1", "byte 4"]
);
defect!(
    version_0_unsupported,
    with_version(0),
    GgufError::UnsupportedVersion { version: 0 },
    ["version 0"]
);
defect!(
    version_4_unsupported,
    with_version(4),
    GgufError::UnsupportedVersion { version: 4 },
    ["version 4"]
);
defect!(
    big_endian_version,
    with_version(0x0300_0000),
    GgufError::UnsupportedVersion {
        version: 0x0300_0000
    },
    ["little-endian"]
);
defect!(empty_file, Vec::<u8>::new(), GgufError::Truncated { ref context, offset: 0, .. } if context == "magic", ["magic"]);

// --- Counts ---

defect!(
    kv_count_absurd,
    with_counts(None, Some(u64::MAX)),
    GgufError::CountTooLarge {
        count: u64::MAX,
        offset: 16,
        ..
    },
    ["metadata key count", "byte 16"]
);
defect!(
    kv_count_beyond_file,
    with_counts(None, Some(1_000_000)),
    GgufError::CountTooLarge {
        count: 1_000_000,
        ..
    },
    ["metadata key count"]
);
defect!(
    tensor_count_absurd,
    with_counts(Some(u64::MAX), None),
    GgufError::CountTooLarge {
        count: u64::MAX,
        offset: 8,
        ..
    },
    ["tensor count", "byte 8"]
);
defect!(
    tensor_count_beyond_infos,
    {
        let mut b = GgufBuilder::valid();
        b.n_tensors = Some(3);
        b.alignment = 1;
        b.data_len = Some(0);
        b.bytes()
    },
    GgufError::CountTooLarge {
        count: 3,
        offset: 8,
        ..
    },
    ["tensor count"]
);
defect!(
    kv_count_one_more_than_present,
    {
        let mut b = GgufBuilder::empty().kv("k", v_str(&"x".repeat(40)));
        b.n_kv = Some(2);
        b.alignment = 1;
        b.bytes()
    },
    GgufError::Truncated { offset: 85, .. },
    ["metadata entry #1", "byte 85"]
);

// --- Keys and values ---

defect!(
    key_length_absurd,
    preamble(
        0,
        1,
        &[u64::MAX.to_le_bytes().as_slice(), &[0; 16]].concat()
    ),
    GgufError::CountTooLarge {
        count: u64::MAX,
        offset: 24,
        ..
    },
    ["key of metadata entry #0", "byte 24"]
);
defect!(
    key_invalid_utf8,
    GgufBuilder::empty().kv_raw_key(b"ab\xff", v_u8(1)).bytes(),
    GgufError::InvalidUtf8 { offset: 32, .. },
    ["key of metadata entry #0", "UTF-8", "byte 32"]
);
defect!(
    string_value_invalid_utf8,
    single_kv((T_STRING, string_bytes(b"ok\xc3"))),
    GgufError::InvalidUtf8 { offset: 45, .. },
    ["`k`", "byte 45"]
);
defect!(
    string_value_length_past_end,
    single_kv((
        T_STRING,
        [1000u64.to_le_bytes().as_slice(), b"abc"].concat()
    )),
    GgufError::CountTooLarge {
        count: 1000,
        offset: 37,
        ..
    },
    ["`k`", "byte 37"]
);
defect!(unknown_value_type, single_kv((13, vec![0; 8])),
    GgufError::UnknownValueType { ref key, type_id: 13, offset: 33 } if key == "k", ["`k`", "type 13", "byte 33"]);
defect!(
    unknown_value_type_max,
    single_kv((u32::MAX, vec![0; 8])),
    GgufError::UnknownValueType {
        type_id: u32::MAX,
        ..
    },
    ["`k`"]
);
defect!(
    unknown_array_element_type,
    single_kv(v_array_raw(99, 1, &[vec![0; 8]])),
    GgufError::UnknownValueType {
        type_id: 99,
        offset: 37,
        ..
    },
    ["`k`", "type 99", "byte 37"]
);
defect!(
    array_count_absurd,
    single_kv(v_array_raw(T_U64, u64::MAX, &[])),
    GgufError::CountTooLarge {
        count: u64::MAX,
        offset: 41,
        ..
    },
    ["`k`", "byte 41"]
);
defect!(
    array_count_beyond_file,
    single_kv(v_array_raw(T_U32, 1000, &[vec![0; 4]])),
    GgufError::CountTooLarge { count: 1000, .. },
    ["`k`"]
);
defect!(
    string_array_bad_element,
    single_kv(v_array_raw(
        T_STRING,
        2,
        &[string_bytes(b"fine"), string_bytes(b"\xc0\x80")]
    )),
    GgufError::InvalidUtf8 { offset: 69, .. },
    ["`k`", "byte 69"]
);
defect!(nesting_nine_deep, single_kv(nested_arrays(9)),
    GgufError::NestingTooDeep { ref key, max: 8, .. } if key == "k", ["`k`", "8 levels"]);
defect!(
    nesting_ten_thousand_deep,
    single_kv((
        T_ARRAY,
        [T_ARRAY.to_le_bytes().as_slice(), &1u64.to_le_bytes()]
            .concat()
            .repeat(10_000)
    )),
    GgufError::NestingTooDeep { .. },
    ["`k`"]
);
defect!(
    bool_value_two,
    single_kv(v_bool_byte(2)),
    GgufError::InvalidBool {
        value: 2,
        offset: 37,
        ..
    },
    ["`k`", "byte 37"]
);
defect!(
    bool_array_element_seven,
    single_kv(v_array_raw(T_BOOL, 3, &[vec![1], vec![0], vec![7]])),
    GgufError::InvalidBool {
        value: 7,
        offset: 51,
        ..
    },
    ["`k`", "byte 51"]
);
defect!(
    duplicate_key,
    GgufBuilder::valid().kv("test.block_count", v_u32(3)).bytes(),
    GgufError::DuplicateKey { ref key, offset: 100 } if key == "test.block_count",
    ["`test.block_count`", "byte 100"]
);

// --- Alignment ---

defect!(
    alignment_zero,
    with_alignment(v_u32(0)),
    GgufError::BadAlignment { .. },
    ["general.alignment", "0 is not"]
);
defect!(
    alignment_three,
    with_alignment(v_u32(3)),
    GgufError::BadAlignment { .. },
    ["3 is not"]
);
defect!(
    alignment_forty_eight,
    with_alignment(v_u32(48)),
    GgufError::BadAlignment { .. },
    ["48"]
);
defect!(
    alignment_as_u64,
    with_alignment(v_u64(32)),
    GgufError::BadAlignment { .. },
    ["u64", "must be u32"]
);
defect!(
    alignment_as_string,
    with_alignment(v_str("32")),
    GgufError::BadAlignment { .. },
    ["string"]
);

// --- Tensor infos ---

defect!(
    tensor_name_invalid_utf8,
    GgufBuilder::empty()
        .tensor_raw_name(b"w\xff", &[4], 0, 0)
        .bytes(),
    GgufError::InvalidUtf8 { offset: 32, .. },
    ["name of tensor info #0", "byte 32"]
);
defect!(
    tensor_name_length_absurd,
    preamble(
        1,
        0,
        &[u64::MAX.to_le_bytes().as_slice(), &[0; 40]].concat()
    ),
    GgufError::CountTooLarge {
        count: u64::MAX,
        offset: 24,
        ..
    },
    ["name of tensor info #0"]
);
defect!(
    duplicate_tensor_name,
    GgufBuilder::valid().tensor("a", &[4], 0, 128).bytes(),
    GgufError::DuplicateTensor { ref name, offset: 182 } if name == "a",
    ["`a`", "byte 182"]
);
defect!(
    zero_dimensions,
    {
        let mut b = GgufBuilder::empty().tensor("t", &[], 0, 0);
        b.data_len = Some(64);
        b.bytes()
    },
    GgufError::BadDimCount {
        n_dims: 0,
        offset: 33,
        ..
    },
    ["`t`", "0 dimensions", "byte 33"]
);
defect!(
    five_dimensions,
    single_tensor(&[1, 1, 1, 1, 1], 0),
    GgufError::BadDimCount { n_dims: 5, .. },
    ["`t`", "5 dimensions"]
);
defect!(
    dimension_count_max,
    {
        let mut b = GgufBuilder::empty().tensor("t", &[4], 0, 0);
        b.tensors[0].n_dims = Some(u32::MAX);
        b.bytes()
    },
    GgufError::BadDimCount {
        n_dims: u32::MAX,
        ..
    },
    ["`t`"]
);
defect!(zero_length_dimension, single_tensor(&[4, 0], 0),
    GgufError::ZeroDim { ref tensor, index: 1, offset: 45 } if tensor == "t", ["`t`", "dimension 1", "byte 45"]);
defect!(
    element_count_overflow,
    single_tensor(&[1 << 32, 1 << 32], 0),
    GgufError::ShapeOverflow { .. },
    ["`t`", "overflows"]
);
defect!(
    byte_count_overflow,
    single_tensor(&[1 << 62], GgmlType::F32.id()),
    GgufError::ShapeOverflow { .. },
    ["`t`"]
);
defect!(
    removed_type_q4_2,
    single_tensor(&[32], 4),
    GgufError::UnknownTensorType {
        type_id: 4,
        offset: 45,
        ..
    },
    ["`t`", "type id 4", "byte 45"]
);
defect!(
    removed_type_q4_0_4_4,
    single_tensor(&[32], 31),
    GgufError::UnknownTensorType { type_id: 31, .. },
    ["`t`", "31"]
);
defect!(
    removed_type_iq4_nl_4_4,
    single_tensor(&[32], 36),
    GgufError::UnknownTensorType { type_id: 36, .. },
    ["`t`"]
);
defect!(
    unknown_type_1000,
    single_tensor(&[32], 1000),
    GgufError::UnknownTensorType { type_id: 1000, .. },
    ["`t`"]
);
defect!(
    q8_0_row_not_block_multiple,
    single_tensor(&[33, 1], GgmlType::Q8_0.id()),
    GgufError::RowNotBlockMultiple {
        row_len: 33,
        block_size: 32,
        ..
    },
    ["`t`", "Q8_0", "33"]
);
defect!(
    q4_k_row_not_block_multiple,
    single_tensor(&[128, 2], GgmlType::Q4_K.id()),
    GgufError::RowNotBlockMultiple {
        block_size: 256,
        ..
    },
    ["`t`", "Q4_K", "256"]
);
defect!(
    misaligned_offset,
    { let mut b = GgufBuilder::valid(); b.tensors[1].offset = 68; b.bytes() },
    GgufError::MisalignedTensor { ref tensor, offset: 68, alignment: 32 } if tensor == "b",
    ["`b`", "68", "32"]
);
defect!(
    misaligned_for_custom_alignment,
    {
        let mut b = GgufBuilder::valid().kv("general.alignment", v_u32(64));
        b.alignment = 64;
        b.tensors[1].offset = 96;
        b.bytes()
    },
    GgufError::MisalignedTensor {
        offset: 96,
        alignment: 64,
        ..
    },
    ["`b`", "64"]
);
defect!(
    tensors_at_same_offset,
    { let mut b = GgufBuilder::valid(); b.tensors[1].offset = 0; b.bytes() },
    GgufError::TensorOverlap { ref tensor, ref other, .. } if tensor == "b" && other == "a",
    ["`a`", "`b`", "overlaps"]
);
defect!(
    tensors_partially_overlapping,
    {
        let mut b = GgufBuilder::valid();
        b.tensors[1].offset = 32;
        b.bytes()
    },
    GgufError::TensorOverlap { .. },
    ["`a`", "`b`"]
);
defect!(
    tensor_past_end_of_file,
    { let mut b = GgufBuilder::valid(); b.data_len = Some(64 + 33); b.bytes() },
    GgufError::TensorPastEnd { ref tensor, .. } if tensor == "b",
    ["`b`", "past the end"]
);
defect!(
    tensor_offset_overflow,
    {
        let mut b = GgufBuilder::valid();
        b.tensors[1].offset = u64::MAX - 31;
        b.data_len = Some(64);
        b.bytes()
    },
    GgufError::TensorPastEnd { end: u64::MAX, .. },
    ["`b`"]
);

// --- Metadata the caller requires ---

#[test]
fn missing_architecture() {
    let header = parse_file(&GgufBuilder::empty().kv("x", v_u8(1)).bytes()).unwrap();
    let err = header.architecture().unwrap_err();
    assert!(matches!(err, GgufError::MissingKey { ref key } if key == "general.architecture"));
    assert_mentions(&err, &["`general.architecture`", "missing"]);
}

#[test]
fn architecture_of_wrong_type() {
    let bytes = GgufBuilder::empty()
        .kv("general.architecture", v_u32(7))
        .bytes();
    let err = parse_file(&bytes).unwrap().architecture().unwrap_err();
    assert!(matches!(err, GgufError::WrongType { found: "u32", .. }));
    assert_mentions(&err, &["`general.architecture`", "string", "u32"]);
}
