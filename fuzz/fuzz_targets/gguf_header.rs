//! Any bytes, as a prefix and as a whole file: the parser must return, never panic, and a
//! prefix that ends early must name a length it needs beyond the bytes it has.

#![no_main]

use libfuzzer_sys::fuzz_target;
use webshard::gguf::{parse_file, parse_header, GgufError};

fuzz_target!(|data: &[u8]| {
    match parse_header(data) {
        Err(GgufError::Truncated { needed, .. }) => assert!(needed > data.len() as u64),
        Ok(header) => {
            assert!(header.data_offset % header.alignment == 0);
            for t in &header.tensors {
                assert!(t.offset >= header.data_offset);
                assert_eq!(Some(t.bytes), t.ggml_type.bytes_for(t.n_elements()));
            }
        }
        Err(_) => {}
    }
    if let Ok(header) = parse_file(data) {
        assert!(header.tensors.iter().all(|t| t.offset + t.bytes <= data.len() as u64));
    }
});
