//! ByteVocab: the id → bytes table donors decode with, without shipping the tokenizer.
//!
//! The coordinator builds it from its `Tokenizer` (so BPE byte maps, SentencePiece `▁` and
//! `<0xNN>` byte tokens and special tokens are already resolved to raw bytes) and sends the
//! blob in `Assign`. The blob layout is documented in `docs/bytevocab.md`; every field of an
//! incoming blob is checked, since it comes from the network.

use crate::tokenizer::vocab::MAX_VOCAB;
use crate::tokenizer::{Tokenizer, Utf8Stream};

/// First bytes of every blob.
pub const MAGIC: [u8; 4] = *b"WSBV";
/// The blob version this code writes and reads.
pub const VERSION: u16 = 1;
/// Most tokens a blob may hold (the tokenizer's own vocabulary bound).
pub const MAX_TOKENS: usize = MAX_VOCAB;
/// Most bytes one token may stand for: lengths are stored as `u16`.
pub const MAX_TOKEN_BYTES: usize = u16::MAX as usize;
/// Most token bytes in all.
pub const MAX_TOTAL_BYTES: usize = 64 << 20;
/// Most end-of-generation ids.
pub const MAX_EOG: usize = 4096;

/// magic, version, flags, n_tokens, n_bytes, n_eog.
const HEADER_LEN: usize = 4 + 2 + 2 + 4 + 4 + 4;
const CHECKSUM_LEN: usize = 4;

/// What is wrong with a blob, or why a tokenizer cannot be turned into one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VocabError {
    #[error("ByteVocab blob truncated reading {what} at byte {offset}: needs {needed} bytes, blob has {len}")]
    Truncated {
        what: &'static str,
        offset: usize,
        needed: usize,
        len: usize,
    },
    #[error("not a ByteVocab blob: magic {found:?}, expected {MAGIC:?}")]
    BadMagic { found: [u8; 4] },
    #[error("ByteVocab version {found} is not supported (this build reads version {VERSION})")]
    UnsupportedVersion { found: u16 },
    #[error("ByteVocab flags {flags:#06x} set reserved bits")]
    ReservedFlags { flags: u16 },
    #[error("ByteVocab checksum mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    Checksum { stored: u32, computed: u32 },
    #[error("ByteVocab has no tokens")]
    Empty,
    #[error("ByteVocab has {count} tokens, more than the limit of {MAX_TOKENS}")]
    TooManyTokens { count: usize },
    #[error("ByteVocab has {count} token bytes, more than the limit of {MAX_TOTAL_BYTES}")]
    TooManyBytes { count: usize },
    #[error("ByteVocab has {count} end-of-generation ids, more than the limit of {MAX_EOG}")]
    TooManyEog { count: usize },
    #[error("end-of-generation id #{index} is {id}, outside the {n_tokens}-token vocabulary")]
    EogOutOfRange {
        index: usize,
        id: u32,
        n_tokens: usize,
    },
    #[error("end-of-generation id #{index} ({id}) does not follow {previous} in ascending order")]
    EogNotAscending {
        index: usize,
        id: u32,
        previous: u32,
    },
    #[error("token {id} stands for {len} bytes, more than the limit of {MAX_TOKEN_BYTES}")]
    TokenTooLong { id: u32, len: usize },
    #[error("token lengths add up to {sum} bytes but the header declares {declared}")]
    LengthSumMismatch { declared: usize, sum: u64 },
    #[error("ByteVocab blob has {extra} bytes more than its header describes, from byte {offset}")]
    TrailingBytes { offset: usize, extra: usize },
    #[error("token id {id} is outside the {n_tokens}-token vocabulary")]
    UnknownId { id: u32, n_tokens: usize },
}

/// Token id → the bytes it stands for, plus the end-of-generation set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ByteVocab {
    /// `offsets[id]..offsets[id + 1]` indexes `bytes`; `n_tokens + 1` entries.
    offsets: Vec<u32>,
    bytes: Vec<u8>,
    /// Ascending.
    eog: Vec<u32>,
}

impl ByteVocab {
    /// Resolves every id with `Tokenizer::token_bytes`, as llama.cpp's
    /// `token_to_piece(special = false)`: control tokens stand for no bytes.
    pub fn from_tokenizer(tokenizer: &Tokenizer) -> Result<ByteVocab, VocabError> {
        let n_tokens = tokenizer.vocab_size();
        check_counts(n_tokens, 0)?;
        let pieces = (0..n_tokens as u32).map(|id| tokenizer.token_bytes(id));
        ByteVocab::from_pieces(pieces, tokenizer.eog_ids())
    }

    /// Builds from each token's bytes, in id order, and the end-of-generation ids.
    pub fn from_pieces<P: AsRef<[u8]>>(
        pieces: impl IntoIterator<Item = P>,
        eog: impl IntoIterator<Item = u32>,
    ) -> Result<ByteVocab, VocabError> {
        let mut offsets = vec![0u32];
        let mut bytes = Vec::new();
        for (id, piece) in pieces.into_iter().enumerate() {
            let piece = piece.as_ref();
            if piece.len() > MAX_TOKEN_BYTES {
                return Err(VocabError::TokenTooLong {
                    id: id as u32,
                    len: piece.len(),
                });
            }
            bytes.extend_from_slice(piece);
            check_counts(offsets.len(), bytes.len())?;
            offsets.push(bytes.len() as u32);
        }
        let n_tokens = offsets.len() - 1;
        check_counts(n_tokens, bytes.len())?;
        let mut eog: Vec<u32> = eog.into_iter().collect();
        if eog.len() > MAX_EOG {
            return Err(VocabError::TooManyEog { count: eog.len() });
        }
        eog.sort_unstable();
        eog.dedup();
        if let Some(index) = eog.iter().position(|&id| id as usize >= n_tokens) {
            return Err(VocabError::EogOutOfRange {
                index,
                id: eog[index],
                n_tokens,
            });
        }
        Ok(ByteVocab {
            offsets,
            bytes,
            eog,
        })
    }

    pub fn len(&self) -> usize {
        self.offsets.len() - 1
    }

    /// Always false: a ByteVocab has at least one token.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The bytes of token `id`, or `None` outside the vocabulary.
    pub fn token_bytes(&self, id: u32) -> Option<&[u8]> {
        let id = id as usize;
        let start = *self.offsets.get(id)? as usize;
        let end = *self.offsets.get(id + 1)? as usize;
        Some(&self.bytes[start..end])
    }

    /// Whether generating `id` ends generation.
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.binary_search(&id).is_ok()
    }

    /// End-of-generation ids, ascending.
    pub fn eog_ids(&self) -> &[u32] {
        &self.eog
    }

    /// A decoder that turns ids into text as they arrive.
    pub fn stream(&self) -> StreamDecoder<'_> {
        StreamDecoder {
            vocab: self,
            utf8: Utf8Stream::new(),
        }
    }

    /// The blob (format in `docs/bytevocab.md`).
    pub fn to_bytes(&self) -> Vec<u8> {
        let n_tokens = self.len();
        let mut out = Vec::with_capacity(
            HEADER_LEN + 4 * self.eog.len() + 2 * n_tokens + self.bytes.len() + CHECKSUM_LEN,
        );
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&0u16.to_le_bytes());
        out.extend_from_slice(&(n_tokens as u32).to_le_bytes());
        out.extend_from_slice(&(self.bytes.len() as u32).to_le_bytes());
        out.extend_from_slice(&(self.eog.len() as u32).to_le_bytes());
        for id in &self.eog {
            out.extend_from_slice(&id.to_le_bytes());
        }
        for pair in self.offsets.windows(2) {
            // Bounded by MAX_TOKEN_BYTES at construction.
            out.extend_from_slice(&((pair[1] - pair[0]) as u16).to_le_bytes());
        }
        out.extend_from_slice(&self.bytes);
        let checksum = crc32fast::hash(&out);
        out.extend_from_slice(&checksum.to_le_bytes());
        out
    }

    /// Parses and checks a blob from an untrusted peer.
    pub fn from_bytes(blob: &[u8]) -> Result<ByteVocab, VocabError> {
        let mut reader = Reader { blob, offset: 0 };
        let magic = reader.array::<4>("magic")?;
        if magic != MAGIC {
            return Err(VocabError::BadMagic { found: magic });
        }
        let version = u16::from_le_bytes(reader.array("version")?);
        if version != VERSION {
            return Err(VocabError::UnsupportedVersion { found: version });
        }
        verify_checksum(blob)?;
        let flags = u16::from_le_bytes(reader.array("flags")?);
        if flags != 0 {
            return Err(VocabError::ReservedFlags { flags });
        }
        let n_tokens = reader.u32("token count")? as usize;
        let n_bytes = reader.u32("byte count")? as usize;
        let n_eog = reader.u32("end-of-generation count")? as usize;
        check_counts(n_tokens, n_bytes)?;
        if n_eog > MAX_EOG {
            return Err(VocabError::TooManyEog { count: n_eog });
        }
        let eog = read_eog(&mut reader, n_eog, n_tokens)?;
        let offsets = read_offsets(&mut reader, n_tokens, n_bytes)?;
        let bytes = reader.take("token bytes", n_bytes)?.to_vec();
        reader.take("checksum", CHECKSUM_LEN)?;
        if reader.offset != blob.len() {
            return Err(VocabError::TrailingBytes {
                offset: reader.offset,
                extra: blob.len() - reader.offset,
            });
        }
        Ok(ByteVocab {
            offsets,
            bytes,
            eog,
        })
    }
}

fn check_counts(n_tokens: usize, n_bytes: usize) -> Result<(), VocabError> {
    if n_tokens == 0 {
        return Err(VocabError::Empty);
    }
    if n_tokens > MAX_TOKENS {
        return Err(VocabError::TooManyTokens { count: n_tokens });
    }
    if n_bytes > MAX_TOTAL_BYTES {
        return Err(VocabError::TooManyBytes { count: n_bytes });
    }
    Ok(())
}

/// The checksum covers every byte before it; checked before the body is trusted.
fn verify_checksum(blob: &[u8]) -> Result<(), VocabError> {
    let min = HEADER_LEN + CHECKSUM_LEN;
    if blob.len() < min {
        return Err(VocabError::Truncated {
            what: "header and checksum",
            offset: 0,
            needed: min,
            len: blob.len(),
        });
    }
    let (body, tail) = blob.split_at(blob.len() - CHECKSUM_LEN);
    let stored = u32::from_le_bytes([tail[0], tail[1], tail[2], tail[3]]);
    let computed = crc32fast::hash(body);
    if stored != computed {
        return Err(VocabError::Checksum { stored, computed });
    }
    Ok(())
}

fn read_eog(
    reader: &mut Reader<'_>,
    n_eog: usize,
    n_tokens: usize,
) -> Result<Vec<u32>, VocabError> {
    let raw = reader.take("end-of-generation ids", 4 * n_eog)?;
    let mut eog = Vec::with_capacity(n_eog);
    for (index, chunk) in raw.chunks_exact(4).enumerate() {
        let id = u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
        if id as usize >= n_tokens {
            return Err(VocabError::EogOutOfRange {
                index,
                id,
                n_tokens,
            });
        }
        if let Some(&previous) = eog.last() {
            if id <= previous {
                return Err(VocabError::EogNotAscending {
                    index,
                    id,
                    previous,
                });
            }
        }
        eog.push(id);
    }
    Ok(eog)
}

fn read_offsets(
    reader: &mut Reader<'_>,
    n_tokens: usize,
    n_bytes: usize,
) -> Result<Vec<u32>, VocabError> {
    let raw = reader.take("token lengths", 2 * n_tokens)?;
    let mut offsets = Vec::with_capacity(n_tokens + 1);
    // u64: up to MAX_TOKENS * u16::MAX overflows a 32-bit usize on wasm32.
    let mut sum = 0u64;
    offsets.push(0);
    for chunk in raw.chunks_exact(2) {
        sum += u64::from(u16::from_le_bytes([chunk[0], chunk[1]]));
        offsets.push(sum.min(u64::from(u32::MAX)) as u32);
    }
    if sum != n_bytes as u64 {
        return Err(VocabError::LengthSumMismatch {
            declared: n_bytes,
            sum,
        });
    }
    Ok(offsets)
}

/// Bounds-checked reads from the blob, reporting the field and offset on truncation.
struct Reader<'a> {
    blob: &'a [u8],
    offset: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, what: &'static str, needed: usize) -> Result<&'a [u8], VocabError> {
        let truncated = || VocabError::Truncated {
            what,
            offset: self.offset,
            needed,
            len: self.blob.len(),
        };
        let end = self.offset.checked_add(needed).ok_or_else(truncated)?;
        let slice = self.blob.get(self.offset..end).ok_or_else(truncated)?;
        self.offset = end;
        Ok(slice)
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], VocabError> {
        let slice = self.take(what, N)?;
        let mut out = [0u8; N];
        out.copy_from_slice(slice);
        Ok(out)
    }

    fn u32(&mut self, what: &'static str) -> Result<u32, VocabError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }
}

/// Turns ids into text as they arrive, holding back UTF-8 characters split across tokens.
#[derive(Debug, Clone)]
pub struct StreamDecoder<'a> {
    vocab: &'a ByteVocab,
    utf8: Utf8Stream,
}

impl StreamDecoder<'_> {
    /// Adds one token; returns the text completed by it (possibly empty).
    pub fn push(&mut self, id: u32) -> Result<String, VocabError> {
        let bytes = self.vocab.token_bytes(id).ok_or(VocabError::UnknownId {
            id,
            n_tokens: self.vocab.len(),
        })?;
        Ok(self.utf8.push(bytes))
    }

    /// Flushes a held-back partial character (as U+FFFD) at the end of a stream.
    pub fn finish(&mut self) -> String {
        self.utf8.finish()
    }
}
