//! GGUF files cut at every byte: the error names the section (or the tensor past the end), and
//! a cut prefix asks for more bytes than it holds but no more than the header needs.

use crate::gguf_writer;

use gguf_writer::*;
use webshard::gguf::{parse_file, parse_header, GgmlType, GgufError};

// --- Truncation at every byte ---

/// A file with every section kind: several kvs (including a nested array) and tensors.
fn rich() -> Built {
    GgufBuilder::valid()
        .kv(
            "tokenizer.tokens",
            v_array(vec![v_str("<s>"), v_str("hello"), v_str("")]),
        )
        .kv(
            "nested",
            v_array(vec![
                v_array(vec![v_u32(1), v_u32(2)]),
                v_array(vec![v_u32(3)]),
            ]),
        )
        .kv("flag", v_bool_byte(1))
        .tensor("c", &[256, 2], GgmlType::Q4_K.id(), 128)
        .build()
}

#[test]
fn truncation_inside_header_names_the_section() {
    let built = rich();
    for cut in 0..built.header_end {
        let (section, words) = built.section_at(cut);
        let err = fail(&built.bytes[..cut]);
        let message = err.to_string();
        assert!(
            matches!(
                err,
                GgufError::Truncated { .. } | GgufError::CountTooLarge { .. }
            ),
            "cut {cut}: {err:?}"
        );
        let named = words.iter().any(|w| message.contains(w.as_str()))
            || (matches!(err, GgufError::CountTooLarge { .. }) && message.contains("count"));
        assert!(named, "cut {cut} in {}: {message}", section.name);
    }
}

#[test]
fn truncation_in_padding_or_data_reports_tensor_past_end() {
    let built = rich();
    assert!(built.data_offset > built.header_end, "test needs padding");
    for cut in built.header_end..built.bytes.len() {
        let err = fail(&built.bytes[..cut]);
        assert!(
            matches!(err, GgufError::TensorPastEnd { .. }),
            "cut {cut}: {err:?}"
        );
    }
    assert!(parse_file(&built.bytes).is_ok());
}

/// The incremental reader relies on this: a prefix that ends early reports a `needed` length
/// beyond the prefix but never beyond the header's end.
#[test]
fn prefix_truncation_gives_a_tight_lower_bound() {
    let built = rich();
    for cut in 0..built.header_end {
        match parse_header(&built.bytes[..cut]) {
            Err(GgufError::Truncated {
                needed, available, ..
            }) => {
                assert!(
                    needed > cut as u64 && needed <= built.header_end as u64,
                    "cut {cut}: {needed}"
                );
                assert_eq!(available, cut as u64);
            }
            other => panic!("cut {cut}: {other:?}"),
        }
    }
    let header = parse_header(&built.bytes[..built.header_end]).unwrap();
    assert_eq!(header.data_offset, built.data_offset as u64);
}
