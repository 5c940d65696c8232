//! Streams the tensors a stage needs from a `RangeSource` into GPU buffers.
//!
//! Only the tensors asked for are read (a shard donor reads only its layers). Each tensor is read
//! in bounded chunks with a few reads in flight, and uploads are flushed to the device every few
//! chunks, so host memory stays at `chunk_bytes * in_flight` plus the driver's staging for one
//! flush window, whatever the model's size.

use std::ops::Range;
use std::sync::Arc;

use futures::{StreamExt, TryStreamExt};

use crate::gguf::{GgmlType, Header, RangeSource, TensorInfo};
use crate::gpu::{Gpu, WeightTensor};
use crate::ops::quant::{QuantMatrix, QuantType};

use super::ModelError;

/// Where a load has got to, for progress bars.
#[derive(Debug, Clone, Copy)]
pub struct LoadProgress<'a> {
    pub bytes_done: u64,
    pub bytes_total: u64,
    pub tensor: &'a str,
}

/// How a load reads: chunk size and reads in flight.
#[derive(Debug, Clone, Copy)]
pub struct LoadOptions {
    pub chunk_bytes: u64,
    pub in_flight: usize,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            chunk_bytes: 4 << 20,
            in_flight: 4,
        }
    }
}

/// Bytes queued to the device between flushes.
const FLUSH_BYTES: u64 = 32 << 20;

/// A matrix in GPU memory, stored as its GGUF bytes: rows `row_offset..` of a tensor that
/// may hold other matrices' rows before and after (see `Loader::matrices`).
#[derive(Debug)]
pub struct Matrix {
    pub weights: Arc<WeightTensor>,
    pub row_offset: u32,
    pub quant: QuantType,
    pub cols: u32,
    pub rows: u32,
}

impl Matrix {
    pub fn view(&self) -> QuantMatrix<'_> {
        QuantMatrix {
            weights: &self.weights,
            quant: self.quant,
            cols: self.cols,
            rows: self.rows,
            row_offset: self.row_offset,
        }
    }

    /// Whether `next`'s rows follow this matrix's in the same tensor.
    pub fn followed_by(&self, next: &Matrix) -> bool {
        Arc::ptr_eq(&self.weights, &next.weights) && next.row_offset == self.row_offset + self.rows
    }
}

/// A small f32 vector (norm weights, biases).
#[derive(Debug)]
pub struct Vector {
    pub buffer: wgpu::Buffer,
    pub len: u32,
}

/// Reads tensors named by a model's plan into GPU memory.
pub struct Loader<'a> {
    gpu: &'a Gpu,
    source: &'a dyn RangeSource,
    header: &'a Header,
    options: LoadOptions,
    bytes_total: u64,
    bytes_done: u64,
    unflushed: u64,
    progress: &'a mut dyn FnMut(LoadProgress<'_>),
}

impl<'a> Loader<'a> {
    /// `bytes_total` is the sum of the sizes of the tensors that will be loaded.
    pub fn new(
        gpu: &'a Gpu,
        source: &'a dyn RangeSource,
        header: &'a Header,
        options: LoadOptions,
        bytes_total: u64,
        progress: &'a mut dyn FnMut(LoadProgress<'_>),
    ) -> Self {
        Loader {
            gpu,
            source,
            header,
            options,
            bytes_total,
            bytes_done: 0,
            unflushed: 0,
            progress,
        }
    }

    pub fn bytes_done(&self) -> u64 {
        self.bytes_done
    }

    /// Loads `name`, which must be a `[cols, rows]` matrix of a computable type.
    pub async fn matrix(&mut self, name: &str, cols: u32, rows: u32) -> Result<Matrix, ModelError> {
        let mut matrices = self.matrices(&[(name, rows)], cols).await?;
        Ok(matrices.remove(0))
    }

    /// Loads matrices `(name, rows)` of `cols` columns, in order. Each run of neighbours of one
    /// type that fits one binding shares a tensor, its members' rows one after another, so a
    /// single dispatch can read them all.
    pub async fn matrices(
        &mut self,
        members: &[(&str, u32)],
        cols: u32,
    ) -> Result<Vec<Matrix>, ModelError> {
        let mut infos = Vec::with_capacity(members.len());
        for &(name, rows) in members {
            let info = self.info(name)?;
            expect_shape(info, &[u64::from(cols), u64::from(rows)])?;
            infos.push((info, quant_type(info)?, rows));
        }
        let mut matrices = Vec::with_capacity(members.len());
        let mut start = 0;
        while start < infos.len() {
            let (first, quant, _) = infos[start];
            let row_bytes = first.row_bytes();
            let fits = WeightTensor::rows_per_part(self.gpu, row_bytes);
            let (mut end, mut rows) = (start, 0u64);
            // Members start at 4-byte aligned offsets, for the uploads.
            while end < infos.len()
                && infos[end].1 == quant
                && rows + u64::from(infos[end].2) <= fits
                && (end == start || (rows * row_bytes) % 4 == 0)
            {
                rows += u64::from(infos[end].2);
                end += 1;
            }
            let end = end.max(start + 1);
            let names: Vec<&str> = infos[start..end]
                .iter()
                .map(|m| m.0.name.as_str())
                .collect();
            let total: u64 = infos[start..end].iter().map(|m| u64::from(m.2)).sum();
            let weights = WeightTensor::allocate(self.gpu, &names.join("+"), total, row_bytes)?;
            let mut row_offset = 0;
            for &(info, _, rows) in &infos[start..end] {
                let range = u64::from(row_offset)..u64::from(row_offset + rows);
                self.stream(info, &weights, range).await?;
                row_offset += rows;
            }
            let weights = Arc::new(weights);
            let mut row_offset = 0;
            for &(_, _, rows) in &infos[start..end] {
                matrices.push(Matrix {
                    weights: weights.clone(),
                    row_offset,
                    quant,
                    cols,
                    rows,
                });
                row_offset += rows;
            }
            start = end;
        }
        Ok(matrices)
    }

    /// Loads `name`, a `[cols, sum(rows)]` matrix holding several matrices' rows one after
    /// another (Phi-3's fused `attn_qkv`, its gate|up in `ffn_up`), as those matrices over one
    /// tensor: decode then computes them in one dispatch, as for neighbours `matrices` joins.
    pub async fn split_matrix(
        &mut self,
        name: &str,
        cols: u32,
        rows: &[u32],
    ) -> Result<Vec<Matrix>, ModelError> {
        let total = rows.iter().try_fold(0u32, |sum, &r| sum.checked_add(r));
        let total = total.ok_or_else(|| ModelError::Tensor {
            tensor: name.into(),
            message: "row count overflows".into(),
        })?;
        let whole = self.matrix(name, cols, total).await?;
        let mut row_offset = whole.row_offset;
        let mut parts = Vec::with_capacity(rows.len());
        for &part_rows in rows {
            parts.push(Matrix {
                weights: whole.weights.clone(),
                row_offset,
                quant: whole.quant,
                cols,
                rows: part_rows,
            });
            row_offset += part_rows;
        }
        Ok(parts)
    }

    /// Loads `name`, a vector of `len` elements stored as F32 or F16, as f32.
    pub async fn vector(&mut self, name: &str, len: u32) -> Result<Vector, ModelError> {
        let values = self.vector_values(name, len).await?;
        Ok(Vector {
            buffer: crate::gpu::upload_f32(self.gpu, name, &values),
            len,
        })
    }

    /// The values of vector `name` of `len` elements (F32 or F16), on the host.
    pub async fn vector_values(&mut self, name: &str, len: u32) -> Result<Vec<f32>, ModelError> {
        self.f32_values(name, &[u64::from(len)]).await
    }

    /// A small f32 or f16 table of `rows` rows of `cols` (LFM2's convolution taps), as one
    /// f32 vector in row order.
    pub async fn table(&mut self, name: &str, cols: u32, rows: u32) -> Result<Vector, ModelError> {
        let values = self
            .f32_values(name, &[u64::from(cols), u64::from(rows)])
            .await?;
        Ok(self.upload_vector(name, &values))
    }

    async fn f32_values(&mut self, name: &str, shape: &[u64]) -> Result<Vec<f32>, ModelError> {
        let info = self.info(name)?;
        expect_shape(info, shape)?;
        let bytes = self.source.read_range(info.offset, info.bytes).await?;
        let values: Vec<f32> = match info.ggml_type {
            GgmlType::F32 => bytemuck::pod_collect_to_vec(&bytes),
            GgmlType::F16 => bytes
                .chunks_exact(2)
                .map(|h| half::f16::from_le_bytes([h[0], h[1]]).to_f32())
                .collect(),
            other => return Err(ModelError::unsupported(name, other)),
        };
        if let Some(bad) = values.iter().position(|v| !v.is_finite()) {
            return Err(ModelError::Tensor {
                tensor: name.into(),
                message: format!("element {bad} is not finite"),
            });
        }
        self.advance(name, info.bytes);
        Ok(values)
    }

    /// Uploads `values` as a vector.
    pub fn upload_vector(&self, name: &str, values: &[f32]) -> Vector {
        Vector {
            buffer: crate::gpu::upload_f32(self.gpu, name, values),
            len: values.len() as u32,
        }
    }

    /// Whether the file has tensor `name` (optional tensors such as biases or `output.weight`).
    pub fn has(&self, name: &str) -> bool {
        self.header.tensor(name).is_some()
    }

    fn info(&self, name: &str) -> Result<&'a TensorInfo, ModelError> {
        self.header.tensor(name).ok_or_else(|| ModelError::Tensor {
            tensor: name.into(),
            message: "missing from the file".into(),
        })
    }

    /// Streams tensor `info` into rows `rows` of `weights`.
    async fn stream(
        &mut self,
        info: &TensorInfo,
        weights: &WeightTensor,
        rows: Range<u64>,
    ) -> Result<(), ModelError> {
        let source = self.source;
        let pieces = weights.upload_row_pieces(rows, self.options.chunk_bytes);
        let reads = futures::stream::iter(pieces)
            .map(|piece| async move {
                let bytes = source
                    .read_range(info.offset + piece.tensor_offset, piece.bytes)
                    .await?;
                Ok::<_, ModelError>((piece, bytes))
            })
            .buffered(self.options.in_flight.max(1));
        futures::pin_mut!(reads);
        while let Some((piece, bytes)) = reads.try_next().await? {
            weights.write_piece(self.gpu, &piece, &bytes);
            self.advance(&info.name, piece.bytes);
        }
        Ok(())
    }

    fn advance(&mut self, tensor: &str, bytes: u64) {
        self.bytes_done += bytes;
        self.unflushed += bytes;
        if self.unflushed >= FLUSH_BYTES {
            self.flush();
        }
        (self.progress)(LoadProgress {
            bytes_done: self.bytes_done,
            bytes_total: self.bytes_total,
            tensor,
        });
    }

    /// Hands queued uploads to the device and waits, so their staging memory is released.
    pub fn flush(&mut self) {
        self.gpu.queue.submit([]);
        let _ = self.gpu.device.poll(wgpu::PollType::wait_indefinitely());
        self.unflushed = 0;
    }
}

fn expect_shape(info: &TensorInfo, expected: &[u64]) -> Result<(), ModelError> {
    let mut got = info.shape.clone();
    while got.len() > expected.len() && got.last() == Some(&1) {
        got.pop();
    }
    if got != expected {
        return Err(ModelError::Tensor {
            tensor: info.name.clone(),
            message: format!("shape {:?}, expected {:?}", info.shape, expected),
        });
    }
    Ok(())
}

fn quant_type(info: &TensorInfo) -> Result<QuantType, ModelError> {
    QuantType::from_ggml_name(info.ggml_type.name())
        .ok_or_else(|| ModelError::unsupported(&info.name, info.ggml_type))
}
