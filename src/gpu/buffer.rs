//! Buffer creation, upload, poisoning and read-back.

use wgpu::util::DeviceExt;

use super::device::{Gpu, GpuError};

/// Bit pattern written into output buffers before a kernel runs in tests: a quiet NaN, so an
/// element the kernel forgot to write can never pass a comparison.
pub const POISON: u32 = 0x7fc0_dead;

/// A storage buffer of `bytes` bytes (rounded up to 4) that kernels read and write.
pub fn storage_buffer(gpu: &Gpu, label: &str, bytes: u64) -> wgpu::Buffer {
    gpu.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some(label),
        size: bytes.max(4).next_multiple_of(4),
        usage: wgpu::BufferUsages::STORAGE
            | wgpu::BufferUsages::COPY_DST
            | wgpu::BufferUsages::COPY_SRC,
        mapped_at_creation: false,
    })
}

pub fn upload_f32(gpu: &Gpu, label: &str, data: &[f32]) -> wgpu::Buffer {
    upload_bytes(gpu, label, bytemuck::cast_slice(data))
}

pub fn upload_u32(gpu: &Gpu, label: &str, data: &[u32]) -> wgpu::Buffer {
    upload_bytes(gpu, label, bytemuck::cast_slice(data))
}

fn upload_bytes(gpu: &Gpu, label: &str, bytes: &[u8]) -> wgpu::Buffer {
    let mut padded = bytes.to_vec();
    padded.resize(bytes.len().max(4).next_multiple_of(4), 0);
    gpu.device
        .create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some(label),
            contents: &padded,
            usage: wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_DST
                | wgpu::BufferUsages::COPY_SRC,
        })
}

/// Fills the whole buffer with `POISON`.
pub fn poison_f32(gpu: &Gpu, buffer: &wgpu::Buffer) {
    let words = (buffer.size() / 4) as usize;
    gpu.queue
        .write_buffer(buffer, 0, bytemuck::cast_slice(&vec![POISON; words]));
}

/// Copies `bytes` bytes from `offset` of `buffer` to the host. Works natively (blocking poll)
/// and in browsers (the map callback fires from the event loop).
pub async fn read_back(
    gpu: &Gpu,
    buffer: &wgpu::Buffer,
    offset: u64,
    bytes: u64,
) -> Result<Vec<u8>, GpuError> {
    let size = bytes.next_multiple_of(4);
    let staging = gpu.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("read-back"),
        size,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let mut encoder = gpu.device.create_command_encoder(&Default::default());
    encoder.copy_buffer_to_buffer(buffer, offset, &staging, 0, size);
    gpu.queue.submit([encoder.finish()]);
    let mut out = map_and_read(gpu, &staging).await?;
    out.truncate(bytes as usize);
    Ok(out)
}

/// Maps a `MAP_READ` buffer after the work that fills it was submitted, and copies it out.
pub(super) async fn map_and_read(gpu: &Gpu, staging: &wgpu::Buffer) -> Result<Vec<u8>, GpuError> {
    map_and_read_after(gpu, staging, None).await
}

/// `map_and_read`, blocking natively only until `submission` (default: the latest) is done.
pub(super) async fn map_and_read_after(
    gpu: &Gpu,
    staging: &wgpu::Buffer,
    submission: Option<wgpu::SubmissionIndex>,
) -> Result<Vec<u8>, GpuError> {
    let (sender, receiver) = futures::channel::oneshot::channel();
    staging.map_async(wgpu::MapMode::Read, .., move |result| {
        let _ = sender.send(result);
    });
    let started = web_time::Instant::now();
    gpu.device
        .poll(wgpu::PollType::Wait {
            submission_index: submission,
            timeout: None,
        })
        .map_err(|e| GpuError::ReadBack(e.to_string()))?;
    let result = receiver.await;
    gpu.counters
        .add_sync(started.elapsed().as_nanos().try_into().unwrap_or(u64::MAX));
    result
        .map_err(|_| GpuError::ReadBack("map callback dropped".into()))?
        .map_err(|e| GpuError::ReadBack(e.to_string()))?;
    let view = staging
        .get_mapped_range(..)
        .map_err(|e| GpuError::ReadBack(e.to_string()))?;
    let out = view.to_vec();
    drop(view);
    staging.unmap();
    Ok(out)
}

/// Reads `count` f32 values starting at element `first`.
pub async fn read_f32(
    gpu: &Gpu,
    buffer: &wgpu::Buffer,
    first: u64,
    count: u64,
) -> Result<Vec<f32>, GpuError> {
    let bytes = read_back(gpu, buffer, first * 4, count * 4).await?;
    Ok(bytemuck::pod_collect_to_vec(&bytes))
}
