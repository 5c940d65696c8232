//! Reusing a dispatch sequence's bind groups from one recording to the next.
//!
//! Every decode step records the same dispatches on the same buffers; only parameters such as
//! the position change. Creating a bind group per dispatch per token is the largest host cost
//! of a step, so a `DispatchGraph` keeps, for dispatch `i` of a sequence, the bind group made
//! the last time together with what it bound. Parameters live in one uniform buffer with a
//! fixed slot per dispatch, rewritten with a single queue write per recording; a bind group is
//! remade only when dispatch `i` now binds another pipeline or other buffers.

use std::num::NonZeroU64;

use super::device::Gpu;

/// A new graph's parameter slots, made before its first recording so that the second
/// recording already finds its bind groups (a speculative step of a new draft length, a
/// serving step of a new row count, comes back a few times only). 512 slots hold a step of
/// the models here (SmolLM2's 335 dispatches for a few tokens); a longer one sizes the buffer
/// by its first recording and finds its bind groups from its third, as every graph did before.
/// 256 bytes hold every kernel's parameters (NVIDIA's uniform alignment is 256 already).
const FIRST_SLOTS: usize = 512;
const FIRST_SLOT_BYTES: usize = 256;

/// What one cached bind group was made for.
struct GraphEntry {
    pipeline: wgpu::ComputePipeline,
    storage: Vec<(wgpu::Buffer, u64, Option<NonZeroU64>)>,
    bind_group: wgpu::BindGroup,
}

/// The bind groups and parameter slots of one recurring dispatch sequence.
#[derive(Default)]
pub struct DispatchGraph {
    /// One `slot`-sized parameter slot per dispatch; sized from the previous recording.
    uniform: Option<wgpu::Buffer>,
    slots: usize,
    /// Bytes per slot: the device's uniform offset alignment, or a multiple of it that holds
    /// the largest parameters recorded (a CPU adapter aligns to 16 bytes, and most kernels'
    /// parameters are longer: with 16-byte slots no dispatch would find its bind group).
    slot: usize,
    /// The slot size this recording's parameters asked for.
    wanted_slot: usize,
    entries: Vec<GraphEntry>,
    /// This recording's parameters, slot by slot, and how many bytes of them are written.
    bytes: Vec<u8>,
    written: usize,
    recorded: usize,
}

/// How a graph dispatch gets its bind group.
pub(super) enum GraphBinding {
    Bound(wgpu::BindGroup),
    /// No slot left (first recording, or a longer sequence than last time): the recorder
    /// binds this dispatch the uncached way.
    NoSlot,
}

impl DispatchGraph {
    pub(super) fn begin(&mut self) {
        self.bytes.clear();
        self.written = 0;
        self.recorded = 0;
    }

    fn alignment(gpu: &Gpu) -> usize {
        (gpu.caps.min_uniform_alignment as usize).max(16)
    }

    /// The bind group for the next dispatch, its parameters stored in its slot.
    pub(super) fn bind(
        &mut self,
        gpu: &Gpu,
        pipeline: &wgpu::ComputePipeline,
        params: &[u8],
        storage: &[wgpu::BindingResource<'_>],
    ) -> GraphBinding {
        let index = self.recorded;
        self.recorded += 1;
        let fitting = params.len().next_multiple_of(Self::alignment(gpu));
        self.wanted_slot = self.wanted_slot.max(fitting);
        if self.uniform.is_none() {
            let slot = FIRST_SLOT_BYTES.next_multiple_of(Self::alignment(gpu));
            self.allocate(gpu, FIRST_SLOTS, slot);
        }
        let slot = self.slot;
        let (Some(uniform), true) = (self.uniform.clone(), index < self.slots) else {
            return GraphBinding::NoSlot;
        };
        if params.len() > slot {
            return GraphBinding::NoSlot;
        }
        self.bytes.resize(index * slot, 0);
        self.bytes.extend_from_slice(params);
        if let Some(entry) = self.entries.get(index) {
            if entry.pipeline == *pipeline && same_storage(&entry.storage, storage) {
                return GraphBinding::Bound(entry.bind_group.clone());
            }
        }
        let Some(buffers) = buffer_bindings(storage) else {
            return GraphBinding::NoSlot;
        };
        let bind_group =
            make_bind_group(gpu, pipeline, &uniform, index * slot, params.len(), storage);
        let entry = GraphEntry {
            pipeline: pipeline.clone(),
            storage: buffers,
            bind_group: bind_group.clone(),
        };
        // Only this dispatch changed (a swapped KV cache changes the attention dispatches
        // alone): the entries after it stay valid.
        match index.cmp(&self.entries.len()) {
            std::cmp::Ordering::Less => self.entries[index] = entry,
            std::cmp::Ordering::Equal => self.entries.push(entry),
            std::cmp::Ordering::Greater => {}
        }
        GraphBinding::Bound(bind_group)
    }

    /// Writes the parameters recorded since the last write (a part submitted early, or the
    /// whole recording).
    pub(super) fn write_params(&mut self, gpu: &Gpu) {
        if let Some(uniform) = &self.uniform {
            if self.bytes.len() > self.written {
                let offset = self.written as u64;
                gpu.queue
                    .write_buffer(uniform, offset, &self.bytes[self.written..]);
                self.written = self.bytes.len();
            }
        }
    }

    /// Sizes the slots for the next recording when this one ran out of them (after its
    /// parameters are written: `write_params`, which `Recorder::finish` calls next).
    pub(super) fn finish(&mut self, gpu: &Gpu) {
        if self.recorded > self.slots || self.wanted_slot > self.slot {
            let slots = self.slots.max(self.recorded);
            let slot = self.slot.max(self.wanted_slot);
            self.allocate(gpu, slots, slot);
        }
        self.wanted_slot = 0;
    }

    /// A parameter buffer of `slots` slots of `slot` bytes; the bind groups made on the old
    /// one go with it.
    fn allocate(&mut self, gpu: &Gpu, slots: usize, slot: usize) {
        self.slots = slots;
        self.slot = slot;
        self.entries.clear();
        self.uniform = Some(gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("dispatch graph params"),
            size: (slots * slot) as u64,
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        }));
    }
}

/// Whether `storage` binds exactly the buffer ranges `kept` holds (checked per dispatch per
/// step, so it allocates nothing).
fn same_storage(
    kept: &[(wgpu::Buffer, u64, Option<NonZeroU64>)],
    storage: &[wgpu::BindingResource<'_>],
) -> bool {
    kept.len() == storage.len()
        && kept
            .iter()
            .zip(storage)
            .all(|((buffer, offset, size), resource)| {
                matches!(resource, wgpu::BindingResource::Buffer(b)
                if b.buffer == buffer && b.offset == *offset && b.size == *size)
            })
}

/// The (buffer, offset, size) of every storage binding, or None if one is not a buffer.
fn buffer_bindings(
    storage: &[wgpu::BindingResource<'_>],
) -> Option<Vec<(wgpu::Buffer, u64, Option<NonZeroU64>)>> {
    storage
        .iter()
        .map(|resource| match resource {
            wgpu::BindingResource::Buffer(b) => Some((b.buffer.clone(), b.offset, b.size)),
            _ => None,
        })
        .collect()
}

/// A bind group with the uniform `params` at binding 0 and `storage[i]` at `i + 1`.
pub(super) fn make_bind_group(
    gpu: &Gpu,
    pipeline: &wgpu::ComputePipeline,
    uniform: &wgpu::Buffer,
    offset: usize,
    size: usize,
    storage: &[wgpu::BindingResource<'_>],
) -> wgpu::BindGroup {
    let mut entries = vec![wgpu::BindGroupEntry {
        binding: 0,
        resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
            buffer: uniform,
            offset: offset as u64,
            size: NonZeroU64::new(size as u64),
        }),
    }];
    entries.extend(
        storage
            .iter()
            .enumerate()
            .map(|(i, resource)| wgpu::BindGroupEntry {
                binding: i as u32 + 1,
                resource: resource.clone(),
            }),
    );
    gpu.counters.add_bind_group();
    gpu.device.create_bind_group(&wgpu::BindGroupDescriptor {
        label: None,
        layout: &pipeline.get_bind_group_layout(0),
        entries: &entries,
    })
}
