//! ByteVocab against the real tokenizers and the llama.cpp goldens, and corrupt blobs.

use std::path::PathBuf;

use rand::{Rng, SeedableRng};
use webshard::gguf::{read_header, FileSource};
use webshard::shard::vocab::{MAX_EOG, MAX_TOKENS, MAX_TOKEN_BYTES, MAX_TOTAL_BYTES};
use webshard::shard::{ByteVocab, VocabError};
use webshard::tokenizer::Tokenizer;

/// (golden name, model file) of the three real models.
const MODELS: [(&str, &str); 3] = [
    (
        "smollm2-135m-instruct-q4_1",
        "SmolLM2-135M-Instruct.Q4_1.gguf",
    ),
    (
        "qwen2.5-coder-0.5b-instruct-q4_k_m",
        "qwen2.5-coder-0.5b-instruct-awq.Q4_K_M.gguf",
    ),
    ("gemma-3-270m-q4_k_m", "gemma-3-270m-q4_k_m.gguf"),
];

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn load_tokenizer(file: &str) -> Tokenizer {
    let dir = std::env::var("WEBSHARD_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|_| repo_root().join("models"));
    let path = dir.join(file);
    assert!(path.is_file(), "model {} is missing", path.display());
    let source = FileSource::open(&path).expect("open model");
    let header = pollster::block_on(read_header(&source)).expect("read header");
    Tokenizer::from_metadata(&header.metadata).expect("tokenizer")
}

fn read_goldens(model: &str) -> serde_json::Value {
    let dir = std::env::var("WEBSHARD_GOLDENS")
        .map(PathBuf::from)
        .unwrap_or_else(|_| repo_root().join("../shared/goldens"));
    let path = dir.join(format!("{model}.generate.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).expect("goldens are JSON")
}

#[test]
fn every_id_of_every_model_survives_a_blob_round_trip() {
    for (_, file) in MODELS {
        let tokenizer = load_tokenizer(file);
        let blob = ByteVocab::from_tokenizer(&tokenizer).unwrap().to_bytes();
        let vocab = ByteVocab::from_bytes(&blob).unwrap();
        assert_eq!(vocab.len(), tokenizer.vocab_size(), "{file}");
        for id in 0..tokenizer.vocab_size() as u32 {
            assert_eq!(
                vocab.token_bytes(id).unwrap(),
                tokenizer.token_bytes(id).as_slice(),
                "{file}: token {id} ({:?})",
                tokenizer.token_text(id)
            );
            assert_eq!(vocab.is_eog(id), tokenizer.is_eog(id), "{file}: token {id}");
        }
        assert_eq!(vocab.token_bytes(tokenizer.vocab_size() as u32), None);
        println!("{file}: {} tokens, blob {} bytes", vocab.len(), blob.len());
    }
}

/// Golden `text` is llama.cpp's detokenization of the step ids; an end-of-generation step
/// is a control token and stands for no text.
#[test]
fn golden_continuations_stream_to_their_text() {
    for (model, file) in MODELS {
        let vocab = ByteVocab::from_bytes(
            &ByteVocab::from_tokenizer(&load_tokenizer(file))
                .unwrap()
                .to_bytes(),
        )
        .unwrap();
        let goldens = read_goldens(model);
        let records = goldens["records"].as_array().expect("records");
        assert!(!records.is_empty());
        for (index, record) in records.iter().enumerate() {
            let ids: Vec<u32> = record["steps"]
                .as_array()
                .expect("steps")
                .iter()
                .map(|step| step["id"].as_u64().expect("id") as u32)
                .collect();
            let mut decoder = vocab.stream();
            let mut text = String::new();
            for &id in &ids {
                text += &decoder.push(id).unwrap();
            }
            text += &decoder.finish();
            assert_eq!(
                text,
                record["text"].as_str().unwrap(),
                "{model} record {index}"
            );
            let stops_early = ids[..ids.len() - 1].iter().any(|&id| vocab.is_eog(id));
            assert!(!stops_early, "{model} record {index}: EOG before the end");
        }
    }
}

/// Characters a tokenizer splits over several tokens are held back until complete.
#[test]
fn split_utf8_sequences_are_buffered_until_complete() {
    let text = "Crab 🦀, snow ☃, 𝔘𝔫𝔦𝔠𝔬𝔡𝔢, 日本語のテキスト, ᚠᛇᚻ.";
    for (_, file) in MODELS {
        let tokenizer = load_tokenizer(file);
        let vocab = ByteVocab::from_tokenizer(&tokenizer).unwrap();
        let ids = tokenizer.encode(text, false, false);
        let mut decoder = vocab.stream();
        let mut out = String::new();
        let mut held_back = 0;
        for &id in &ids {
            let bytes = vocab.token_bytes(id).unwrap();
            if std::str::from_utf8(bytes).is_err() {
                held_back += 1;
            }
            out += &decoder.push(id).unwrap();
        }
        out += &decoder.finish();
        assert_eq!(out.trim_start(), text, "{file}");
        assert!(held_back > 0, "{file}: no token split a character");
    }
}

#[test]
fn unknown_ids_are_refused_by_the_decoder() {
    let vocab = ByteVocab::from_pieces([b"a".as_slice(), b"b"], [1]).unwrap();
    let mut decoder = vocab.stream();
    assert_eq!(decoder.push(0).unwrap(), "a");
    assert_eq!(
        decoder.push(2),
        Err(VocabError::UnknownId { id: 2, n_tokens: 2 })
    );
}

// Blob layout offsets (docs/bytevocab.md).
const N_TOKENS_AT: usize = 8;
const N_BYTES_AT: usize = 12;
const N_EOG_AT: usize = 16;
const EOG_AT: usize = 20;

/// Three tokens ("he", "", "llo\u{e9}"), EOG = [1].
fn small_blob() -> Vec<u8> {
    ByteVocab::from_pieces([b"he".as_slice(), b"", "llo\u{e9}".as_bytes()], [1])
        .unwrap()
        .to_bytes()
}

/// Recomputes the trailing CRC-32 after an edit, to reach the checks behind it.
fn reseal(mut blob: Vec<u8>) -> Vec<u8> {
    let body_len = blob.len() - 4;
    let crc = crc32fast::hash(&blob[..body_len]);
    blob[body_len..].copy_from_slice(&crc.to_le_bytes());
    blob
}

fn put_u32(blob: &mut [u8], at: usize, value: u32) {
    blob[at..at + 4].copy_from_slice(&value.to_le_bytes());
}

fn edited(edit: impl FnOnce(&mut Vec<u8>)) -> Result<ByteVocab, VocabError> {
    let mut blob = small_blob();
    edit(&mut blob);
    ByteVocab::from_bytes(&reseal(blob))
}

#[test]
fn small_blob_layout_matches_the_documented_format() {
    let blob = small_blob();
    // header 20 + 1 eog id + 3 u16 lengths + 7 token bytes + crc 4
    assert_eq!(blob.len(), 20 + 4 + 6 + 7 + 4);
    assert_eq!(&blob[..4], b"WSBV");
    assert_eq!(&blob[4..8], &[1, 0, 0, 0]);
    assert_eq!(&blob[N_TOKENS_AT..N_TOKENS_AT + 4], &3u32.to_le_bytes());
    assert_eq!(&blob[N_BYTES_AT..N_BYTES_AT + 4], &7u32.to_le_bytes());
    assert_eq!(&blob[EOG_AT + 4..EOG_AT + 10], &[2, 0, 0, 0, 5, 0]);
    let vocab = ByteVocab::from_bytes(&blob).unwrap();
    assert_eq!(vocab.token_bytes(2).unwrap(), "llo\u{e9}".as_bytes());
    assert_eq!(vocab.eog_ids(), &[1]);
}

#[test]
fn envelope_errors_are_specific() {
    let blob = small_blob();
    assert!(matches!(
        ByteVocab::from_bytes(&blob[..3]),
        Err(VocabError::Truncated { what: "magic", .. })
    ));
    let mut bad_magic = blob.clone();
    bad_magic[0] = b'X';
    assert_eq!(
        ByteVocab::from_bytes(&bad_magic),
        Err(VocabError::BadMagic { found: *b"XSBV" })
    );
    let mut future = blob.clone();
    future[4] = 2;
    assert_eq!(
        ByteVocab::from_bytes(&future),
        Err(VocabError::UnsupportedVersion { found: 2 })
    );
    let mut flipped = blob.clone();
    let last_token_byte = blob.len() - 5;
    flipped[last_token_byte] ^= 0x40;
    assert!(matches!(
        ByteVocab::from_bytes(&flipped),
        Err(VocabError::Checksum { .. })
    ));
    assert!(matches!(
        ByteVocab::from_bytes(&blob[..20]),
        Err(VocabError::Truncated {
            what: "header and checksum",
            ..
        })
    ));
}

#[test]
fn structural_errors_are_specific() {
    assert_eq!(
        edited(|b| b[6] = 1),
        Err(VocabError::ReservedFlags { flags: 1 })
    );
    assert_eq!(
        edited(|b| put_u32(b, N_TOKENS_AT, 0)),
        Err(VocabError::Empty)
    );
    assert_eq!(
        edited(|b| put_u32(b, N_TOKENS_AT, MAX_TOKENS as u32 + 1)),
        Err(VocabError::TooManyTokens {
            count: MAX_TOKENS + 1
        })
    );
    assert_eq!(
        edited(|b| put_u32(b, N_BYTES_AT, MAX_TOTAL_BYTES as u32 + 1)),
        Err(VocabError::TooManyBytes {
            count: MAX_TOTAL_BYTES + 1
        })
    );
    assert_eq!(
        edited(|b| put_u32(b, N_EOG_AT, MAX_EOG as u32 + 1)),
        Err(VocabError::TooManyEog { count: MAX_EOG + 1 })
    );
    assert_eq!(
        edited(|b| put_u32(b, EOG_AT, 3)),
        Err(VocabError::EogOutOfRange {
            index: 0,
            id: 3,
            n_tokens: 3
        })
    );
    assert_eq!(
        edited(|b| b[EOG_AT + 4] = 3),
        Err(VocabError::LengthSumMismatch {
            declared: 7,
            sum: 8
        })
    );
    assert_eq!(
        edited(|b| put_u32(b, N_BYTES_AT, 6)),
        Err(VocabError::LengthSumMismatch {
            declared: 6,
            sum: 7
        })
    );
    assert!(matches!(
        edited(|b| put_u32(b, N_TOKENS_AT, 1000)),
        Err(VocabError::Truncated {
            what: "token lengths",
            ..
        })
    ));
}

#[test]
fn eog_order_and_trailing_bytes_are_checked() {
    let two_eog = ByteVocab::from_pieces([b"a".as_slice(), b"b", b"c"], [2, 1]).unwrap();
    assert_eq!(two_eog.eog_ids(), &[1, 2]);
    let mut blob = two_eog.to_bytes();
    blob.swap(EOG_AT, EOG_AT + 4);
    assert_eq!(
        ByteVocab::from_bytes(&reseal(blob)),
        Err(VocabError::EogNotAscending {
            index: 1,
            id: 1,
            previous: 2
        })
    );
    let mut long = small_blob();
    let crc_at = long.len() - 4;
    long.splice(crc_at..crc_at, [0u8; 3]);
    assert_eq!(
        ByteVocab::from_bytes(&reseal(long)),
        Err(VocabError::TrailingBytes {
            offset: 20 + 4 + 6 + 7 + 4,
            extra: 3
        })
    );
}

#[test]
fn building_refuses_what_the_format_cannot_hold() {
    let long = vec![b'x'; MAX_TOKEN_BYTES + 1];
    assert_eq!(
        ByteVocab::from_pieces([b"a".to_vec(), long], []),
        Err(VocabError::TokenTooLong {
            id: 1,
            len: MAX_TOKEN_BYTES + 1
        })
    );
    assert_eq!(
        ByteVocab::from_pieces(Vec::<Vec<u8>>::new(), []),
        Err(VocabError::Empty)
    );
    assert_eq!(
        ByteVocab::from_pieces([b"a"], [1]),
        Err(VocabError::EogOutOfRange {
            index: 0,
            id: 1,
            n_tokens: 1
        })
    );
}

/// Every truncation, and random edits with and without a valid checksum, give an error or a
/// vocabulary whose own blob parses again; never a panic.
#[test]
fn random_corruption_never_panics() {
    let blob = small_blob();
    for len in 0..blob.len() {
        assert!(ByteVocab::from_bytes(&blob[..len]).is_err(), "prefix {len}");
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x5eed_b10b);
    for round in 0..20_000 {
        let mut mutated = blob.clone();
        for _ in 0..rng.random_range(1..4) {
            let at = rng.random_range(0..mutated.len());
            mutated[at] = rng.random();
        }
        if round % 2 == 0 {
            mutated = reseal(mutated);
        }
        if let Ok(vocab) = ByteVocab::from_bytes(&mutated) {
            assert_eq!(ByteVocab::from_bytes(&vocab.to_bytes()), Ok(vocab));
        }
        let garbage: Vec<u8> = (0..rng.random_range(0..64)).map(|_| rng.random()).collect();
        let _ = ByteVocab::from_bytes(&garbage);
    }
}
