//! The GPU: device and capabilities, buffers, pipeline cache, command recording.
//!
//! Everything here is the same on native wgpu backends and on WebGPU in the browser; the only
//! platform difference (blocking `poll` natively, event-loop callbacks on the web) is hidden in
//! `buffer::read_back`.

mod browser;
mod buffer;
mod device;
mod graph;
mod pipeline;
mod profile;
mod record;
pub mod testing;
mod weights;

pub use buffer::{poison_f32, read_back, read_f32, storage_buffer, upload_f32, upload_u32, POISON};
pub use device::{BackendChoice, Caps, Gpu, GpuError, GpuOptions, Int8Products, Variant};
pub use graph::DispatchGraph;
pub use pipeline::{runtime_checks, specialised_source, Kernel, Lib, PipelineKey};
pub use profile::{CounterSnapshot, DispatchKey, GpuCounters, KernelTimes};
pub use record::{PendingRead, Recorder};
pub use weights::{WeightPart, WeightTensor};
