//! Split GGUF (`gguf-split` layout) read as one model: the merged header, tensors read by Range
//! from the part that holds them, and a clear error naming the part for every inconsistency.

use crate::gguf_writer;

use std::path::{Path, PathBuf};

use gguf_writer::*;
use webshard::gguf::split::{locate, KEY_COUNT, KEY_NO, KEY_TENSORS_COUNT};
use webshard::gguf::{open_source, read_header, GgmlType, GgufError, MemorySource};
use webshard::gguf::{RangeSource, SourceError, SplitSource};

fn u16_kv(v: u16) -> Raw {
    (T_U16, v.to_le_bytes().to_vec())
}

fn i32_kv(v: i32) -> Raw {
    (T_I32, v.to_le_bytes().to_vec())
}

/// Part `no` of `count` holding tensors `names` (each 32 Q8_0 values); the first part holds the
/// model's metadata, as `gguf-split` writes it.
fn part(no: u16, count: u16, total: i32, names: &[&str]) -> GgufBuilder {
    let mut b = GgufBuilder::empty();
    if no == 0 {
        b = b.kv("general.architecture", v_str("test"));
    }
    b = b
        .kv(KEY_NO, u16_kv(no))
        .kv(KEY_COUNT, u16_kv(count))
        .kv(KEY_TENSORS_COUNT, i32_kv(total));
    for (i, name) in names.iter().enumerate() {
        b = b.tensor(name, &[32, 1], GgmlType::Q8_0.id(), 64 * i as u64);
    }
    b
}

/// Three parts: `a` in the first, `b` `c` in the second, `d` in the third.
fn three_parts() -> Vec<GgufBuilder> {
    vec![
        part(0, 3, 4, &["a"]),
        part(1, 3, 4, &["b", "c"]),
        part(2, 3, 4, &["d"]),
    ]
}

fn memory_split(parts: &[GgufBuilder]) -> SplitSource {
    let sources = parts
        .iter()
        .enumerate()
        .map(|(i, b)| {
            let location = format!("m-{:05}-of-{:05}.gguf", i + 1, parts.len());
            Box::new(MemorySource::new(b.bytes(), location)) as Box<dyn RangeSource>
        })
        .collect();
    SplitSource::new(sources)
}

async fn split_error(parts: &[GgufBuilder]) -> (String, String) {
    match read_header(&memory_split(parts)).await {
        Err(GgufError::Split { part, reason }) => (part, reason),
        other => panic!("expected a split error, got {other:?}"),
    }
}

#[tokio::test]
async fn parts_read_as_one_model_with_tensors_from_their_part() {
    let parts = three_parts();
    let source = memory_split(&parts);
    let header = read_header(&source).await.unwrap();
    assert_eq!(header.architecture().unwrap(), "test");
    let names: Vec<&str> = header.tensors.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["a", "b", "c", "d"]);
    for (name, part) in [("a", 0), ("b", 1), ("c", 1), ("d", 2)] {
        let tensor = header.tensor(name).unwrap();
        let (index, in_part) = locate(tensor.offset);
        assert_eq!(index, part, "{name}");
        let file = parts[part as usize].bytes();
        let expected = &file[in_part as usize..(in_part + tensor.bytes) as usize];
        let got = source
            .read_range(tensor.offset, tensor.bytes)
            .await
            .unwrap();
        assert_eq!(got, expected, "{name}");
    }
    let total: usize = parts.iter().map(|p| p.bytes().len()).sum();
    assert_eq!(source.size(), Some(total as u64));
}

#[tokio::test]
async fn a_part_that_disagrees_is_named() {
    let mut parts = three_parts();
    parts[2] = part(1, 3, 4, &["d"]);
    let (part_name, reason) = split_error(&parts).await;
    assert_eq!(part_name, "m-00003-of-00003.gguf");
    assert!(
        reason.contains("`split.no` is 1") && reason.contains("part 3 of 3"),
        "{reason}"
    );

    let mut parts = three_parts();
    parts[1] = part(1, 4, 4, &["b", "c"]);
    let (part_name, reason) = split_error(&parts).await;
    assert_eq!(part_name, "m-00002-of-00003.gguf");
    assert!(reason.contains("`split.count` is 4"), "{reason}");

    let mut parts = three_parts();
    parts[1] = part(1, 3, 5, &["b", "c"]);
    let (part_name, reason) = split_error(&parts).await;
    assert_eq!(part_name, "m-00002-of-00003.gguf");
    assert!(reason.contains("`split.tensors.count` is 5"), "{reason}");

    let mut parts = three_parts();
    parts[2] = GgufBuilder::empty().tensor("d", &[32, 1], GgmlType::Q8_0.id(), 0);
    let (part_name, reason) = split_error(&parts).await;
    assert_eq!(part_name, "m-00003-of-00003.gguf");
    assert!(reason.contains("no `split.count`"), "{reason}");
}

#[tokio::test]
async fn counts_that_do_not_add_up_are_refused() {
    let parts: Vec<GgufBuilder> = (0..3)
        .map(|i| part(i, 3, 5, &[["a", "b", "c"][i as usize]]))
        .collect();
    let (part_name, reason) = split_error(&parts).await;
    assert_eq!(part_name, "m-00001-of-00003.gguf");
    assert!(
        reason.contains("`split.tensors.count` is 5, but the 3 parts hold 3"),
        "{reason}"
    );

    let parts = vec![part(0, 3, 2, &["a"]), part(1, 3, 2, &["b"])];
    let (_, reason) = split_error(&parts).await;
    assert!(
        reason.contains("`split.count` is 3, but the file name says 2 parts"),
        "{reason}"
    );

    let parts = vec![part(0, 2, 2, &["a"]), part(1, 2, 2, &["a"])];
    let (part_name, reason) = split_error(&parts).await;
    assert_eq!(part_name, "m-00002-of-00002.gguf");
    assert!(
        reason.contains("tensor `a` is also in an earlier part"),
        "{reason}"
    );

    for (key, raw, words) in [
        (KEY_COUNT, u16_kv(0), "`split.count` is 0"),
        (KEY_COUNT, v_u32(70_000), "`split.count` is 70000"),
        (KEY_COUNT, v_str("3"), "expected"),
        (KEY_NO, u16_kv(7), "`split.no` is 7, but there are 2 parts"),
        (KEY_TENSORS_COUNT, i32_kv(-1), "split.tensors.count"),
    ] {
        let mut first = part(0, 2, 2, &["a"]);
        first.kvs.retain(|kv| kv.key != key.as_bytes());
        let parts = vec![first.kv(key, raw), part(1, 2, 2, &["b"])];
        let (_, reason) = split_error(&parts).await;
        assert!(reason.contains(words), "{key}: {reason}");
    }
}

fn write_parts(dir: &Path, parts: &[GgufBuilder]) -> Vec<PathBuf> {
    std::fs::create_dir_all(dir).unwrap();
    parts
        .iter()
        .enumerate()
        .map(|(i, b)| {
            let path = dir.join(format!("model-{:05}-of-{:05}.gguf", i + 1, parts.len()));
            std::fs::write(&path, b.bytes()).unwrap();
            path
        })
        .collect()
}

fn scratch_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("webshard-split-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

#[tokio::test]
async fn open_source_reads_every_part_from_the_first_name() {
    let dir = scratch_dir("files");
    let paths = write_parts(&dir, &three_parts());
    let source = open_source(paths[0].to_str().unwrap()).await.unwrap();
    let header = read_header(source.as_ref()).await.unwrap();
    assert_eq!(header.tensors.len(), 4);
    let d = header.tensor("d").unwrap();
    let bytes = source.read_range(d.offset, d.bytes).await.unwrap();
    let file = std::fs::read(&paths[2]).unwrap();
    let (_, in_part) = locate(d.offset);
    assert_eq!(bytes, file[in_part as usize..][..d.bytes as usize]);

    // A later part opened alone says which file to open.
    let lone = open_source(paths[1].to_str().unwrap()).await.unwrap();
    let err = read_header(lone.as_ref()).await.unwrap_err().to_string();
    assert!(
        err.contains("part 2 of 3") && err.contains("model-00001-of-00003.gguf"),
        "{err}"
    );

    // The first part renamed is refused too: the other tensors would be missing.
    let renamed = dir.join("renamed.gguf");
    std::fs::copy(&paths[0], &renamed).unwrap();
    let lone = open_source(renamed.to_str().unwrap()).await.unwrap();
    let err = read_header(lone.as_ref()).await.unwrap_err().to_string();
    assert!(
        err.contains("part 1 of 3") && err.contains("renamed.gguf"),
        "{err}"
    );

    std::fs::remove_file(&paths[1]).unwrap();
    let err = match open_source(paths[0].to_str().unwrap()).await {
        Err(err @ SourceError::MissingPart { .. }) => err.to_string(),
        Err(other) => panic!("expected a missing part, got {other}"),
        Ok(_) => panic!("opened a split model with a part missing"),
    };
    assert!(
        err.contains("part 2 of 3") && err.contains("model-00002-of-00003.gguf"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn a_read_outside_every_part_is_refused() {
    let source = memory_split(&three_parts());
    let err = source.read_range(7 << 48, 4).await.unwrap_err().to_string();
    assert!(err.contains("part 8 of 3"), "{err}");
    assert!(source.read_range((1 << 48) + (1 << 20), 4).await.is_err());
}

// --- Offsets past 2^32 (wasm32's usize) ---

/// A sparse file with a tensor at 5 GiB: the header, the reader and ranged reads all keep
/// 64-bit offsets, one file alone and as the second part of a split model.
#[tokio::test]
async fn a_tensor_past_4_gib_is_found_and_read_in_a_sparse_file() {
    let dir = scratch_dir("sparse");
    std::fs::create_dir_all(&dir).unwrap();
    let at = 5u64 << 30;
    let builder = part(1, 2, 2, &[]).tensor("far", &[32, 2], GgmlType::Q8_0.id(), at);
    let mut header_only = builder.clone();
    header_only.data_len = Some(0);
    let built = header_only.build();
    let path = dir.join("sparse-00002-of-00002.gguf");
    let payload: Vec<u8> = (0..68u8).map(|i| i.wrapping_mul(37)).collect();
    {
        use std::io::{Seek, SeekFrom, Write};
        let mut file = std::fs::File::create(&path).unwrap();
        file.write_all(&built.bytes).unwrap();
        file.set_len(built.data_offset as u64 + at + payload.len() as u64)
            .unwrap();
        file.seek(SeekFrom::Start(built.data_offset as u64 + at))
            .unwrap();
        file.write_all(&payload).unwrap();
    }
    std::fs::write(
        dir.join("sparse-00001-of-00002.gguf"),
        part(0, 2, 2, &["near"]).bytes(),
    )
    .unwrap();

    let first = dir.join("sparse-00001-of-00002.gguf");
    let source = open_source(first.to_str().unwrap()).await.unwrap();
    let header = read_header(source.as_ref()).await.unwrap();
    let far = header.tensor("far").unwrap();
    assert_eq!(locate(far.offset), (1, built.data_offset as u64 + at));
    assert!(locate(far.offset).1 > u64::from(u32::MAX));
    assert_eq!(
        source.read_range(far.offset, far.bytes).await.unwrap(),
        payload
    );
    let err = source
        .read_range(far.offset + 4, far.bytes)
        .await
        .unwrap_err();
    assert!(matches!(err, SourceError::PastEnd { .. }), "{err}");
    assert!(source.size().unwrap() > 5 << 30);

    let alone = webshard::gguf::FileSource::open(&path).unwrap();
    let (_, in_part) = locate(far.offset);
    assert_eq!(alone.read_range(in_part, far.bytes).await.unwrap(), payload);
    std::fs::remove_dir_all(&dir).unwrap();
}
