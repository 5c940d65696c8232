//! Wire chunks: a frame goes out as messages of at most 16 KiB, the size every WebRTC data
//! channel implementation delivers whole, each with a 12-byte header:
//!
//! `tag (0xC1) | flags (0) | index: u16 LE | frame_id: u32 LE | frame_len: u32 LE | payload`
//!
//! Every chunk but the last carries `CHUNK_PAYLOAD` bytes. Chunks of one frame arrive in
//! order on a reliable ordered channel, but chunks of different frames may interleave.

use std::collections::HashMap;

use super::frame::MAX_FRAME_BYTES;

/// Largest wire message.
pub const MAX_CHUNK_BYTES: usize = 16 * 1024;
pub const CHUNK_HEADER_LEN: usize = 12;
/// Payload bytes in every chunk but a frame's last.
pub const CHUNK_PAYLOAD: usize = MAX_CHUNK_BYTES - CHUNK_HEADER_LEN;
/// First byte of every chunk; doubles as the chunk-format version.
pub const CHUNK_TAG: u8 = 0xC1;
/// Longest frame the u16 chunk index can address.
pub const MAX_SLICED_FRAME: usize = CHUNK_PAYLOAD * (u16::MAX as usize + 1);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChunkError {
    #[error("chunk of {len} bytes is shorter than its {CHUNK_HEADER_LEN}-byte header")]
    TooShort { len: usize },
    #[error("chunk of {len} bytes is over the {MAX_CHUNK_BYTES}-byte limit")]
    TooLong { len: usize },
    #[error("chunk tag {found:#04x}, expected {CHUNK_TAG:#04x}")]
    BadTag { found: u8 },
    #[error("chunk flags {flags:#04x} set reserved bits")]
    ReservedFlags { flags: u8 },
    #[error("frame {frame_id} is empty")]
    EmptyFrame { frame_id: u32 },
    #[error("frame {frame_id} of {len} bytes is over the limit of {max}")]
    FrameTooLarge {
        frame_id: u32,
        len: usize,
        max: usize,
    },
    #[error("frame {frame_id}: chunk {index} is out of range ({count} chunks)")]
    IndexOutOfRange {
        frame_id: u32,
        index: u16,
        count: usize,
    },
    #[error("frame {frame_id}: chunk {found} arrived, expected chunk {expected}")]
    OutOfOrder {
        frame_id: u32,
        expected: usize,
        found: u16,
    },
    #[error("frame {frame_id}: chunk {index} carries {found} payload bytes, expected {expected}")]
    PayloadLength {
        frame_id: u32,
        index: u16,
        expected: usize,
        found: usize,
    },
    #[error("frame {frame_id}: length changed from {first} to {now} between chunks")]
    FrameLengthChanged {
        frame_id: u32,
        first: usize,
        now: usize,
    },
    #[error("more than {max} frames partly received at once")]
    TooManyPartialFrames { max: usize },
    #[error("partial frames would hold {needed} bytes, over the limit of {max}")]
    BufferFull { needed: usize, max: usize },
    // Flow control (`flow`): credit messages share the channel with chunks.
    #[error("credit message of {len} bytes, expected {}", super::flow::CREDIT_LEN)]
    CreditLength { len: usize },
    #[error(
        "credit of {bytes} bytes is over the {}-byte window",
        super::flow::WINDOW_BYTES
    )]
    CreditTooLarge { bytes: u32 },
    #[error("peer has {unacknowledged} bytes unacknowledged, over the flow-control window of {window}; its further messages are dropped")]
    WindowExceeded { unacknowledged: u64, window: u32 },
}

/// Cuts a frame into wire chunks.
pub fn slice_frame(frame_id: u32, frame: &[u8]) -> Result<Vec<Vec<u8>>, ChunkError> {
    if frame.is_empty() {
        return Err(ChunkError::EmptyFrame { frame_id });
    }
    if frame.len() > MAX_SLICED_FRAME.min(u32::MAX as usize) {
        return Err(ChunkError::FrameTooLarge {
            frame_id,
            len: frame.len(),
            max: MAX_SLICED_FRAME,
        });
    }
    let chunks = frame
        .chunks(CHUNK_PAYLOAD)
        .enumerate()
        .map(|(index, payload)| {
            let mut chunk = Vec::with_capacity(CHUNK_HEADER_LEN + payload.len());
            chunk.push(CHUNK_TAG);
            chunk.push(0);
            chunk.extend_from_slice(&(index as u16).to_le_bytes());
            chunk.extend_from_slice(&frame_id.to_le_bytes());
            chunk.extend_from_slice(&(frame.len() as u32).to_le_bytes());
            chunk.extend_from_slice(payload);
            chunk
        })
        .collect();
    Ok(chunks)
}

/// Bounds on what a `Reassembler` holds for one peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReassemblyLimits {
    pub max_frame_bytes: usize,
    /// Frames begun but not finished.
    pub max_partial_frames: usize,
    /// Payload bytes held across all partial frames.
    pub max_buffered_bytes: usize,
}

impl Default for ReassemblyLimits {
    fn default() -> ReassemblyLimits {
        ReassemblyLimits {
            max_frame_bytes: MAX_FRAME_BYTES,
            max_partial_frames: 8,
            max_buffered_bytes: 2 * MAX_FRAME_BYTES,
        }
    }
}

#[derive(Debug)]
struct Partial {
    frame_len: usize,
    /// Grows as chunks arrive: memory follows what the peer actually sent.
    data: Vec<u8>,
    next_index: usize,
}

/// Parsed chunk header.
struct ChunkHeader {
    index: u16,
    frame_id: u32,
    frame_len: usize,
}

/// Rebuilds frames from one peer's chunks.
#[derive(Debug, Default)]
pub struct Reassembler {
    limits: ReassemblyLimits,
    partial: HashMap<u32, Partial>,
    buffered: usize,
}

impl Reassembler {
    pub fn new(limits: ReassemblyLimits) -> Reassembler {
        Reassembler {
            limits,
            partial: HashMap::new(),
            buffered: 0,
        }
    }

    /// Payload bytes held in unfinished frames.
    pub fn buffered_bytes(&self) -> usize {
        self.buffered
    }

    pub fn partial_frames(&self) -> usize {
        self.partial.len()
    }

    /// Takes one chunk; returns the frame it completes, if any. A chunk that breaks the rules
    /// is refused and the frame it claims to belong to is dropped.
    pub fn push(&mut self, chunk: &[u8]) -> Result<Option<Vec<u8>>, ChunkError> {
        let header = parse_header(chunk)?;
        let payload = &chunk[CHUNK_HEADER_LEN..];
        let result = self.accept(&header, payload);
        if result.is_err() {
            self.drop_frame(header.frame_id);
        }
        result
    }

    fn accept(
        &mut self,
        header: &ChunkHeader,
        payload: &[u8],
    ) -> Result<Option<Vec<u8>>, ChunkError> {
        let frame_id = header.frame_id;
        self.check_frame_len(header)?;
        let count = header.frame_len.div_ceil(CHUNK_PAYLOAD);
        let index = header.index as usize;
        if index >= count {
            return Err(ChunkError::IndexOutOfRange {
                frame_id,
                index: header.index,
                count,
            });
        }
        let expected_len = CHUNK_PAYLOAD.min(header.frame_len - index * CHUNK_PAYLOAD);
        if payload.len() != expected_len {
            return Err(ChunkError::PayloadLength {
                frame_id,
                index: header.index,
                expected: expected_len,
                found: payload.len(),
            });
        }
        if count == 1 {
            return Ok(Some(payload.to_vec()));
        }
        self.append(header, payload, count)
    }

    fn check_frame_len(&self, header: &ChunkHeader) -> Result<(), ChunkError> {
        let frame_id = header.frame_id;
        if header.frame_len == 0 {
            return Err(ChunkError::EmptyFrame { frame_id });
        }
        if header.frame_len > self.limits.max_frame_bytes {
            return Err(ChunkError::FrameTooLarge {
                frame_id,
                len: header.frame_len,
                max: self.limits.max_frame_bytes,
            });
        }
        match self.partial.get(&frame_id) {
            Some(partial) if partial.frame_len != header.frame_len => {
                Err(ChunkError::FrameLengthChanged {
                    frame_id,
                    first: partial.frame_len,
                    now: header.frame_len,
                })
            }
            _ => Ok(()),
        }
    }

    fn append(
        &mut self,
        header: &ChunkHeader,
        payload: &[u8],
        count: usize,
    ) -> Result<Option<Vec<u8>>, ChunkError> {
        let frame_id = header.frame_id;
        let expected = self.partial.get(&frame_id).map_or(0, |p| p.next_index);
        if header.index as usize != expected {
            return Err(ChunkError::OutOfOrder {
                frame_id,
                expected,
                found: header.index,
            });
        }
        if expected == 0 && self.partial.len() >= self.limits.max_partial_frames {
            return Err(ChunkError::TooManyPartialFrames {
                max: self.limits.max_partial_frames,
            });
        }
        let needed = self.buffered + payload.len();
        if needed > self.limits.max_buffered_bytes {
            return Err(ChunkError::BufferFull {
                needed,
                max: self.limits.max_buffered_bytes,
            });
        }
        let partial = self.partial.entry(frame_id).or_insert_with(|| Partial {
            frame_len: header.frame_len,
            data: Vec::new(),
            next_index: 0,
        });
        partial.data.extend_from_slice(payload);
        partial.next_index += 1;
        self.buffered += payload.len();
        if partial.next_index < count {
            return Ok(None);
        }
        let done = self.partial.remove(&frame_id).map(|p| p.data);
        self.buffered -= done.as_ref().map_or(0, Vec::len);
        Ok(done)
    }

    fn drop_frame(&mut self, frame_id: u32) {
        if let Some(partial) = self.partial.remove(&frame_id) {
            self.buffered -= partial.data.len();
        }
    }
}

fn parse_header(chunk: &[u8]) -> Result<ChunkHeader, ChunkError> {
    if chunk.len() > MAX_CHUNK_BYTES {
        return Err(ChunkError::TooLong { len: chunk.len() });
    }
    let Some(header) = chunk.first_chunk::<CHUNK_HEADER_LEN>() else {
        return Err(ChunkError::TooShort { len: chunk.len() });
    };
    if header[0] != CHUNK_TAG {
        return Err(ChunkError::BadTag { found: header[0] });
    }
    if header[1] != 0 {
        return Err(ChunkError::ReservedFlags { flags: header[1] });
    }
    Ok(ChunkHeader {
        index: u16::from_le_bytes([header[2], header[3]]),
        frame_id: u32::from_le_bytes([header[4], header[5], header[6], header[7]]),
        frame_len: u32::from_le_bytes([header[8], header[9], header[10], header[11]]) as usize,
    })
}
