//! Weight tensors in GPU memory, split by rows across buffers where one binding is too small.
//!
//! Bytes are stored exactly as GGUF lays them out; kernels dequantize on the fly. A tensor is
//! split only at row boundaries, so a matrix-vector product runs one dispatch per part with a
//! row offset, and no kernel ever sees a block cut in two.

use std::ops::Range;

use super::buffer::storage_buffer;
use super::device::{Gpu, GpuError};

/// One buffer holding rows `first_row .. first_row + rows` of a tensor.
#[derive(Debug, Clone)]
pub struct WeightPart {
    pub buffer: wgpu::Buffer,
    pub first_row: u64,
    pub rows: u64,
}

/// A contiguous piece of a tensor's bytes that lands in one part, for streaming uploads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UploadPiece {
    pub part: usize,
    /// Byte offset of the piece inside the tensor's data.
    pub tensor_offset: u64,
    /// Byte offset inside the part's buffer.
    pub buffer_offset: u64,
    pub bytes: u64,
}

#[derive(Debug)]
pub struct WeightTensor {
    pub name: String,
    pub rows: u64,
    pub row_bytes: u64,
    pub parts: Vec<WeightPart>,
}

impl WeightTensor {
    /// Allocates buffers for `rows` rows of `row_bytes` bytes, each buffer within the device's
    /// binding limit.
    pub fn allocate(
        gpu: &Gpu,
        name: &str,
        rows: u64,
        row_bytes: u64,
    ) -> Result<WeightTensor, GpuError> {
        let rows_per_part = Self::rows_per_part(gpu, row_bytes);
        if rows_per_part == 0 {
            return Err(GpuError::BindingTooSmall {
                name: name.to_string(),
                needed: row_bytes,
                limit: gpu.caps.max_binding.min(gpu.caps.max_buffer),
            });
        }
        let mut parts = Vec::new();
        let mut first_row = 0;
        while first_row < rows {
            let part_rows = rows_per_part.min(rows - first_row);
            let label = format!("{name}[{first_row}..{}]", first_row + part_rows);
            parts.push(WeightPart {
                buffer: storage_buffer(gpu, &label, part_rows * row_bytes),
                first_row,
                rows: part_rows,
            });
            first_row += part_rows;
        }
        Ok(WeightTensor {
            name: name.to_string(),
            rows,
            row_bytes,
            parts,
        })
    }

    /// The most rows of `row_bytes` bytes one part (one binding) holds on this device.
    pub fn rows_per_part(gpu: &Gpu, row_bytes: u64) -> u64 {
        let limit = gpu.caps.max_binding.min(gpu.caps.max_buffer);
        // Keep 4 bytes of slack: a part's size is rounded up to a multiple of 4.
        limit.saturating_sub(4) / row_bytes.max(1)
    }

    pub fn total_bytes(&self) -> u64 {
        self.rows * self.row_bytes
    }

    /// Splits the tensor's bytes into pieces of at most `chunk_bytes` (a multiple of 4), each
    /// within one part and starting at a 4-byte aligned buffer offset.
    pub fn upload_pieces(&self, chunk_bytes: u64) -> Vec<UploadPiece> {
        self.upload_row_pieces(0..self.rows, chunk_bytes)
    }

    /// `upload_pieces` for rows `rows` only (one member of a tensor of several matrices'
    /// rows), their `tensor_offset`s counted from the first of them. Each piece starts at a
    /// 4-byte aligned buffer offset when the rows before the range take a multiple of 4 bytes.
    pub fn upload_row_pieces(&self, rows: Range<u64>, chunk_bytes: u64) -> Vec<UploadPiece> {
        let chunk = chunk_bytes.max(4).next_multiple_of(4);
        let mut pieces = Vec::new();
        for (index, part) in self.parts.iter().enumerate() {
            let first = rows.start.max(part.first_row);
            let end = rows.end.min(part.first_row + part.rows);
            if first >= end {
                continue;
            }
            let range_start = (first - rows.start) * self.row_bytes;
            let buffer_start = (first - part.first_row) * self.row_bytes;
            let range_bytes = (end - first) * self.row_bytes;
            let mut done = 0;
            while done < range_bytes {
                let bytes = chunk.min(range_bytes - done);
                pieces.push(UploadPiece {
                    part: index,
                    tensor_offset: range_start + done,
                    buffer_offset: buffer_start + done,
                    bytes,
                });
                done += bytes;
            }
        }
        pieces
    }

    /// Writes one piece's bytes (as read from the file) into its buffer.
    pub fn write_piece(&self, gpu: &Gpu, piece: &UploadPiece, data: &[u8]) {
        let buffer = &self.parts[piece.part].buffer;
        if data.len().is_multiple_of(4) {
            gpu.queue.write_buffer(buffer, piece.buffer_offset, data);
        } else {
            let mut padded = data.to_vec();
            padded.resize(data.len().next_multiple_of(4), 0);
            gpu.queue.write_buffer(buffer, piece.buffer_offset, &padded);
        }
    }
}
