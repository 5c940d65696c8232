//! Command recording: many dispatches into one command buffer, one submit.
//!
//! Kernel parameters go into 64 KiB uniform blocks written once at submit; blocks return to a
//! pool on the `Gpu` once submitted. Reusing a block in the next submit is safe because queue
//! writes and submits execute in queue order. A recorder given a `DispatchGraph` instead reuses the
//! bind groups of the graph's previous recording (see `graph.rs`).
//!
//! A step the host waits on with nothing else in flight (a speculative verification, a
//! pipeline's first step, a prompt) can be submitted in parts (`submit_in_parts`): recording
//! costs the host ~3-5 µs a dispatch, so a 300-dispatch step recorded whole left the GPU idle
//! for ~1 ms first (docs/perf.md, session 35); in parts, the GPU starts on the first while the
//! host records the rest.

use super::device::{Gpu, Variant};
use super::graph::{make_bind_group, DispatchGraph, GraphBinding};
use super::pipeline::Kernel;

const UNIFORM_BLOCK_BYTES: u64 = 64 * 1024;

/// Dispatches per part of a recording submitted in parts: recording one costs the host about
/// half what running one costs an H100 (~6 µs for a step's dispatch), so equal parts keep the
/// GPU fed after the first, and 64 make that first wait ~0.2 ms.
const PART_DISPATCHES: u32 = 64;

struct UniformBlock {
    buffer: wgpu::Buffer,
    bytes: Vec<u8>,
    /// Bytes already written to the buffer (by an earlier part's submit).
    written: usize,
}

/// Records dispatches for one submit.
pub struct Recorder<'g> {
    gpu: &'g Gpu,
    variant: Variant,
    encoder: Option<wgpu::CommandEncoder>,
    pass: Option<wgpu::ComputePass<'static>>,
    blocks: Vec<UniformBlock>,
    graph: Option<&'g mut DispatchGraph>,
    dispatches: u32,
    /// Dispatches per early submit (`submit_in_parts`), and the count at the last one.
    part: Option<u32>,
    submitted: u32,
}

impl<'g> Recorder<'g> {
    /// A recorder whose kernels use the device's best variant.
    pub fn new(gpu: &'g Gpu) -> Self {
        Self::with_variant(gpu, gpu.variant())
    }

    /// A recorder whose kernels use `variant` (tests cover every variant this way).
    pub fn with_variant(gpu: &'g Gpu, variant: Variant) -> Self {
        Recorder {
            gpu,
            variant,
            encoder: Some(gpu.device.create_command_encoder(&Default::default())),
            pass: None,
            blocks: Vec::new(),
            graph: None,
            dispatches: 0,
            part: None,
            submitted: 0,
        }
    }

    /// Submits what is recorded every `PART_DISPATCHES` dispatches from now on, so that an
    /// idle GPU starts while the host records the rest (for steps the host then waits on).
    pub fn submit_in_parts(&mut self) {
        self.part = Some(PART_DISPATCHES);
    }

    /// A recorder for a sequence recorded again and again (a decode step), reusing the bind
    /// groups `graph` kept from the last recording.
    pub fn with_graph(gpu: &'g Gpu, graph: &'g mut DispatchGraph) -> Self {
        graph.begin();
        let mut recorder = Self::new(gpu);
        recorder.graph = Some(graph);
        recorder
    }

    pub fn gpu(&self) -> &'g Gpu {
        self.gpu
    }

    pub fn variant(&self) -> Variant {
        self.variant
    }

    /// The pipeline for `kernel` in this recorder's variant.
    pub fn pipeline(
        &self,
        kernel: &Kernel,
        consts: &[(&'static str, u32)],
    ) -> std::sync::Arc<wgpu::ComputePipeline> {
        self.gpu.pipeline(kernel, self.variant, consts)
    }

    /// Records one dispatch. Binding 0 of group 0 is the uniform `params`; `storage[i]` is
    /// bound at `i + 1`.
    pub fn dispatch<P: bytemuck::Pod>(
        &mut self,
        pipeline: &wgpu::ComputePipeline,
        params: &P,
        storage: &[wgpu::BindingResource<'_>],
        workgroups: [u32; 3],
    ) {
        self.dispatch_bytes(pipeline, bytemuck::bytes_of(params), storage, workgroups);
    }

    /// `dispatch` with parameters given as bytes: a struct followed by an array whose length
    /// the kernel's constants give.
    pub fn dispatch_bytes(
        &mut self,
        pipeline: &wgpu::ComputePipeline,
        params: &[u8],
        storage: &[wgpu::BindingResource<'_>],
        workgroups: [u32; 3],
    ) {
        let mut bytes = params.to_vec();
        bytes.resize(bytes.len().next_multiple_of(16), 0);
        let bound = match self.graph.as_deref_mut() {
            Some(graph) => graph.bind(self.gpu, pipeline, &bytes, storage),
            None => GraphBinding::NoSlot,
        };
        let bind_group = match bound {
            GraphBinding::Bound(bind_group) => bind_group,
            GraphBinding::NoSlot => {
                let (uniform, offset) = self.push_uniform(&bytes);
                make_bind_group(self.gpu, pipeline, &uniform, offset, bytes.len(), storage)
            }
        };
        let timed = self.gpu.timed_pass(pipeline, workgroups);
        if timed.is_some() {
            self.pass = None;
        }
        let pass = match &timed {
            Some(timed) => self.timed_pass(timed),
            None => self.pass(),
        };
        pass.set_pipeline(pipeline);
        pass.set_bind_group(0, &bind_group, &[]);
        pass.dispatch_workgroups(workgroups[0], workgroups[1], workgroups[2]);
        if timed.is_some() {
            self.pass = None;
        }
        self.dispatches += 1;
        if self
            .part
            .is_some_and(|part| self.dispatches - self.submitted >= part)
        {
            self.submit_part();
        }
    }

    /// Submits the dispatches recorded so far and goes on in a new command buffer.
    fn submit_part(&mut self) {
        let started = web_time::Instant::now();
        let commands = self.finish_part();
        self.gpu.counters.add_submit();
        self.gpu.queue.submit([commands]);
        let spent = started.elapsed().as_nanos().try_into().unwrap_or(u64::MAX);
        self.gpu.counters.add_submit_time(spent);
        let encoder = self.gpu.device.create_command_encoder(&Default::default());
        self.encoder = Some(encoder);
        self.submitted = self.dispatches;
    }

    /// Copies bytes between buffers in stream order with the dispatches around it.
    pub fn copy(
        &mut self,
        source: &wgpu::Buffer,
        source_offset: u64,
        destination: &wgpu::Buffer,
        destination_offset: u64,
        bytes: u64,
    ) {
        self.pass = None;
        self.encoder().copy_buffer_to_buffer(
            source,
            source_offset,
            destination,
            destination_offset,
            bytes,
        );
    }

    pub fn dispatch_count(&self) -> u32 {
        self.dispatches
    }

    /// Writes the parameters and submits everything recorded.
    pub fn submit(mut self) -> wgpu::SubmissionIndex {
        let started = web_time::Instant::now();
        let commands = self.finish();
        self.gpu.counters.add_submit();
        let submission = self.gpu.queue.submit([commands]);
        let spent = started.elapsed().as_nanos().try_into().unwrap_or(u64::MAX);
        self.gpu.counters.add_submit_time(spent);
        // Only now may another thread's recorder (two stages sharing one `Gpu`) take the
        // blocks: its parameters, written before our submit, would have become ours.
        let mut pool = self.gpu.uniform_blocks.lock().expect("uniform pool lock");
        pool.extend(self.blocks.drain(..).map(|block| block.buffer));
        submission
    }

    /// Submits, then reads `bytes` bytes at `offset` of `buffer` in the same submit.
    pub async fn submit_and_read(
        self,
        buffer: &wgpu::Buffer,
        offset: u64,
        bytes: u64,
    ) -> Result<Vec<u8>, super::GpuError> {
        let gpu = self.gpu;
        self.submit_with_read(buffer, offset, bytes).wait(gpu).await
    }

    /// Submits with a copy of `bytes` bytes at `offset` of `buffer` appended, without waiting:
    /// the host can record and submit more work before it collects the bytes.
    pub fn submit_with_read(
        mut self,
        buffer: &wgpu::Buffer,
        offset: u64,
        bytes: u64,
    ) -> PendingRead {
        let size = bytes.next_multiple_of(4);
        let staging = self.gpu.take_read_buffer(size);
        self.copy(buffer, offset, &staging, 0, size);
        let submission = self.submit();
        PendingRead {
            staging,
            bytes,
            submission,
        }
    }

    fn finish(&mut self) -> wgpu::CommandBuffer {
        let commands = self.finish_part();
        if let Some(graph) = self.graph.as_deref_mut() {
            graph.finish(self.gpu);
        }
        commands
    }

    /// The command buffer of the dispatches since the last part, with their parameters
    /// written (a part's are written before its submit, in queue order, as a whole one's).
    fn finish_part(&mut self) -> wgpu::CommandBuffer {
        self.pass = None;
        let new = self.dispatches - self.submitted;
        self.gpu.counters.add_dispatches(u64::from(new));
        if let Some(graph) = self.graph.as_deref_mut() {
            graph.write_params(self.gpu);
        }
        let gpu = self.gpu;
        gpu.resolve_profile(self.encoder());
        for block in &mut self.blocks {
            if block.bytes.len() > block.written {
                let (offset, bytes) = (block.written as u64, &block.bytes[block.written..]);
                self.gpu.queue.write_buffer(&block.buffer, offset, bytes);
                block.written = block.bytes.len();
            }
        }
        self.encoder
            .take()
            .expect("a recorder is finished once")
            .finish()
    }

    fn encoder(&mut self) -> &mut wgpu::CommandEncoder {
        self.encoder
            .as_mut()
            .expect("the encoder lives until the recorder is submitted")
    }

    fn pass(&mut self) -> &mut wgpu::ComputePass<'static> {
        if self.pass.is_none() {
            let pass = self
                .encoder()
                .begin_compute_pass(&Default::default())
                .forget_lifetime();
            self.pass = Some(pass);
        }
        self.pass.as_mut().expect("pass was just created")
    }

    /// A pass of its own for one profiled dispatch, timestamped at both ends.
    fn timed_pass(&mut self, timed: &super::profile::TimedPass) -> &mut wgpu::ComputePass<'static> {
        let pass = self
            .encoder()
            .begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: None,
                timestamp_writes: Some(wgpu::ComputePassTimestampWrites {
                    query_set: &timed.queries,
                    beginning_of_pass_write_index: Some(timed.begin),
                    end_of_pass_write_index: Some(timed.begin + 1),
                }),
            })
            .forget_lifetime();
        self.pass.insert(pass)
    }

    /// Appends `data` (a multiple of 16 bytes) to the current uniform block: (block, offset).
    fn push_uniform(&mut self, data: &[u8]) -> (wgpu::Buffer, usize) {
        let align = u64::from(self.gpu.caps.min_uniform_alignment).max(16) as usize;
        let needed = data.len();
        let fits = self
            .blocks
            .last()
            .is_some_and(|b| b.bytes.len().next_multiple_of(align) + needed <= b.bytes.capacity());
        if !fits {
            self.blocks.push(self.take_block());
        }
        let block = self.blocks.last_mut().expect("a block was just pushed");
        let offset = block.bytes.len().next_multiple_of(align);
        block.bytes.resize(offset, 0);
        block.bytes.extend_from_slice(data);
        (block.buffer.clone(), offset)
    }

    fn take_block(&self) -> UniformBlock {
        let pooled = self
            .gpu
            .uniform_blocks
            .lock()
            .expect("uniform pool lock")
            .pop();
        let buffer = pooled.unwrap_or_else(|| {
            self.gpu.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("kernel params"),
                size: UNIFORM_BLOCK_BYTES,
                usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            })
        });
        UniformBlock {
            buffer,
            bytes: Vec::with_capacity(UNIFORM_BLOCK_BYTES as usize),
            written: 0,
        }
    }
}

/// Bytes a submit will copy back, collected with `wait`.
pub struct PendingRead {
    staging: wgpu::Buffer,
    bytes: u64,
    submission: wgpu::SubmissionIndex,
}

impl PendingRead {
    /// Waits for the submit that fills the bytes (not for later ones) and returns them.
    pub async fn wait(self, gpu: &Gpu) -> Result<Vec<u8>, super::GpuError> {
        let mut out =
            super::buffer::map_and_read_after(gpu, &self.staging, Some(self.submission)).await?;
        gpu.return_read_buffer(self.staging);
        out.truncate(self.bytes as usize);
        Ok(out)
    }
}
