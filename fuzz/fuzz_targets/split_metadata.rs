//! Split GGUF metadata: any part names and any bytes as the parts' files. Reading them as one
//! model must return, never panic; a merged header must hold exactly `split.tensors.count`
//! tensors, unique by name, each at a source offset inside its own part; part names must
//! round-trip.
//!
//! Input: byte 0 picks the number of parts (1 to 4); then per part a u32 little-endian length
//! and that many bytes of the part's file; what is left is a location for `SplitName`.

#![no_main]

use std::collections::HashSet;

use libfuzzer_sys::fuzz_target;
use webshard::gguf::split::{locate, split_info, SplitName};
use webshard::gguf::{read_header, MemorySource, RangeSource, SplitSource};

fuzz_target!(|data: &[u8]| {
    let Some((&n, mut rest)) = data.split_first() else {
        return;
    };
    let mut parts: Vec<Box<dyn RangeSource>> = Vec::new();
    for index in 0..(n % 4 + 1) {
        let Some(len) = rest.get(..4) else { break };
        let len = u32::from_le_bytes(len.try_into().unwrap()) as usize;
        let bytes = &rest[4..][..len.min(rest.len() - 4)];
        rest = &rest[4 + bytes.len()..];
        let location = format!("m-{:05}-of-00004.gguf", index + 1);
        parts.push(Box::new(MemorySource::new(bytes.to_vec(), location)));
    }
    check_merged(parts);
    check_name(&String::from_utf8_lossy(rest));
});

fn check_merged(parts: Vec<Box<dyn RangeSource>>) {
    let n_parts = parts.len();
    let source = SplitSource::new(parts);
    let Ok(header) = pollster::block_on(read_header(&source)) else {
        return;
    };
    let info = split_info(&header.metadata, "first part")
        .expect("merged metadata was checked")
        .expect("a merged model is split");
    assert_eq!(usize::from(info.count), n_parts);
    assert_eq!(header.tensors.len() as u64, info.tensors);
    let mut names = HashSet::new();
    for tensor in &header.tensors {
        assert!(names.insert(tensor.name.as_str()), "duplicate {}", tensor.name);
        let (part, offset) = locate(tensor.offset);
        let size = source.parts().unwrap()[usize::from(part)].size().unwrap();
        assert!(offset + tensor.bytes <= size, "{} past its part", tensor.name);
    }
}

fn check_name(location: &str) {
    let Some(name) = SplitName::parse(location) else {
        return;
    };
    assert!(name.number >= 1 && name.number <= name.count);
    assert_eq!(name.part(name.number - 1), location);
    let last = SplitName::parse(&name.part(name.count - 1)).expect("a part's name parses");
    assert_eq!((last.number, last.count), (name.count, name.count));
}
