//! Weight tensors in GPU memory, split by rows across buffers where one binding is too small.
//!
//! Bytes are stored exactly as GGUF lays them out; kernels dequantize on the fly. A tensor is
//! split only at row boundaries, so a matrix-vector product runs one dispatch per part with a
//! row offset, and no kernel ever sees a block cut in two.

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
        let limit = gpu.caps.max_binding.min(gpu.caps.max_buffer);
        // Keep 4 bytes of slack: a part's size is rounded up to a multiple of 4.
        let rows_per_part = limit.saturating_sub(4) / row_bytes.max(1);
        if rows_per_part == 0 {
            return Err(GpuError::BindingTooSmall {
                name: name.to_string(),
                needed: row_bytes,
                limit,
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

    pub fn total_bytes(&self) -> u64 {
        self.rows * self.row_bytes
    }

    /// Splits the tensor's bytes into pieces of at most `chunk_bytes` (a multiple of 4), each
    /// within one part and starting at a 4-byte aligned buffer offset.
    pub fn upload_pieces(&self, chunk_bytes: u64) -> Vec<UploadPiece> {
        let chunk = chunk_bytes.max(4).next_multiple_of(4);
        let mut pieces = Vec::new();
        for (index, part) in self.parts.iter().enumerate() {
            let part_start = part.first_row * self.row_bytes;
            let part_bytes = part.rows * self.row_bytes;
            let mut done = 0;
            while done < part_bytes {
                let bytes = chunk.min(part_bytes - done);
                pieces.push(UploadPiece {
                    part: index,
                    tensor_offset: part_start + done,
                    buffer_offset: done,
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
        if data.len() % 4 == 0 {
            gpu.queue.write_buffer(buffer, piece.buffer_offset, data);
        } else {
            let mut padded = data.to_vec();
            padded.resize(data.len().next_multiple_of(4), 0);
            gpu.queue.write_buffer(buffer, piece.buffer_offset, &padded);
        }
    }
}
