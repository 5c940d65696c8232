//! What the GPU path costs: counters every run keeps (dispatches, submits, host syncs, time
//! spent waiting on the GPU) and, when switched on, per-dispatch GPU timestamps grouped by
//! kernel family and grid (a family's grid tells its matrices apart). `runner bench --profile`
//! prints both per token.
//!
//! Timing puts each dispatch in its own compute pass with begin/end timestamps, which needs
//! only the core `TIMESTAMP_QUERY` feature (no timestamps inside passes). Splitting passes
//! changes what is measured a little (a pass boundary is also a barrier), so profiled runs
//! report kernel times, and unprofiled runs report the throughput.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use super::device::{Gpu, GpuError};

/// Most dispatches timed in one submit (wgpu allows 4096 queries per set); later ones in the
/// same submit run untimed.
const MAX_TIMED_DISPATCHES: u32 = 2048;

/// Monotonic counters since the device was created.
#[derive(Default)]
pub struct GpuCounters {
    dispatches: AtomicU64,
    submits: AtomicU64,
    syncs: AtomicU64,
    wait_ns: AtomicU64,
    submit_ns: AtomicU64,
    bind_groups: AtomicU64,
    read_buffers: AtomicU64,
}

/// A copy of the counters, to subtract one from another.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CounterSnapshot {
    pub dispatches: u64,
    pub submits: u64,
    /// Times the host blocked until the GPU finished (read-backs).
    pub syncs: u64,
    /// Nanoseconds the host spent blocked in those syncs.
    pub wait_ns: u64,
    /// Nanoseconds the host spent finishing command buffers and in `queue.submit`.
    pub submit_ns: u64,
    /// Bind groups created (a recording that reuses its graph creates none).
    pub bind_groups: u64,
    /// Read-back staging buffers created (a reused one is not counted).
    pub read_buffers: u64,
}

impl std::ops::Sub for CounterSnapshot {
    type Output = CounterSnapshot;
    fn sub(self, earlier: CounterSnapshot) -> CounterSnapshot {
        CounterSnapshot {
            dispatches: self.dispatches - earlier.dispatches,
            submits: self.submits - earlier.submits,
            syncs: self.syncs - earlier.syncs,
            wait_ns: self.wait_ns - earlier.wait_ns,
            submit_ns: self.submit_ns - earlier.submit_ns,
            bind_groups: self.bind_groups - earlier.bind_groups,
            read_buffers: self.read_buffers - earlier.read_buffers,
        }
    }
}

impl GpuCounters {
    pub(super) fn add_dispatches(&self, count: u64) {
        self.dispatches.fetch_add(count, Ordering::Relaxed);
    }

    pub(super) fn add_submit(&self) {
        self.submits.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn add_sync(&self, wait_ns: u64) {
        self.syncs.fetch_add(1, Ordering::Relaxed);
        self.wait_ns.fetch_add(wait_ns, Ordering::Relaxed);
    }

    pub(super) fn add_submit_time(&self, ns: u64) {
        self.submit_ns.fetch_add(ns, Ordering::Relaxed);
    }

    pub(super) fn add_bind_group(&self) {
        self.bind_groups.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn add_read_buffer(&self) {
        self.read_buffers.fetch_add(1, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> CounterSnapshot {
        CounterSnapshot {
            dispatches: self.dispatches.load(Ordering::Relaxed),
            submits: self.submits.load(Ordering::Relaxed),
            syncs: self.syncs.load(Ordering::Relaxed),
            wait_ns: self.wait_ns.load(Ordering::Relaxed),
            submit_ns: self.submit_ns.load(Ordering::Relaxed),
            bind_groups: self.bind_groups.load(Ordering::Relaxed),
            read_buffers: self.read_buffers.load(Ordering::Relaxed),
        }
    }
}

/// A timed dispatch's kernel family and workgroup grid.
pub type DispatchKey = (&'static str, [u32; 3]);

/// GPU nanoseconds and dispatch counts per kernel family and grid.
pub type KernelTimes = BTreeMap<DispatchKey, (f64, u64)>;

/// Timestamp queries of one device: a query set big enough for one submit, and the families
/// of the dispatches timed so far in the submit being recorded.
pub(super) struct Profiler {
    queries: wgpu::QuerySet,
    resolved: wgpu::Buffer,
    /// Family and grid of each timed dispatch of the submit being recorded, in query order.
    pending: Vec<DispatchKey>,
    /// Submitted, not yet collected: each submit's timestamps (copied out of the query set
    /// within that submit, so the next one may reuse it) and their families.
    submitted: Vec<(wgpu::Buffer, Vec<DispatchKey>)>,
    totals: KernelTimes,
}

impl Profiler {
    fn new(gpu: &Gpu) -> Profiler {
        let count = 2 * MAX_TIMED_DISPATCHES;
        let bytes = u64::from(count) * 8;
        Profiler {
            queries: gpu.device.create_query_set(&wgpu::QuerySetDescriptor {
                label: Some("profile timestamps"),
                ty: wgpu::QueryType::Timestamp,
                count,
            }),
            resolved: gpu.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("profile resolved"),
                size: bytes,
                usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
                mapped_at_creation: false,
            }),
            pending: Vec::new(),
            submitted: Vec::new(),
            totals: KernelTimes::new(),
        }
    }
}

/// Where a profiled dispatch writes its timestamps, handed to the recorder.
pub(super) struct TimedPass {
    pub queries: wgpu::QuerySet,
    pub begin: u32,
}

impl Gpu {
    /// Starts timing every dispatch by kernel family (needs the adapter's timestamp queries).
    pub fn start_profiling(&self) -> Result<(), GpuError> {
        if !self.caps.timestamps {
            return Err(GpuError::Kernel {
                kernel: "profile".into(),
                message: format!("adapter {} has no timestamp queries", self.caps.adapter),
            });
        }
        *self.profiler.lock().expect("profiler lock") = Some(Profiler::new(self));
        Ok(())
    }

    /// The next timestamp pair for a dispatch of `pipeline` over `grid`, if profiling and room
    /// is left. Unprofiled, this is one uncontended lock: the kernel family is looked up only
    /// here.
    pub(super) fn timed_pass(
        &self,
        pipeline: &wgpu::ComputePipeline,
        grid: [u32; 3],
    ) -> Option<TimedPass> {
        let mut guard = self.profiler.lock().expect("profiler lock");
        let profiler = guard.as_mut()?;
        let index = profiler.pending.len() as u32;
        if index >= MAX_TIMED_DISPATCHES {
            return None;
        }
        profiler
            .pending
            .push((self.pipeline_family(pipeline), grid));
        Some(TimedPass {
            queries: profiler.queries.clone(),
            begin: 2 * index,
        })
    }

    /// Appends the resolve of this submit's timestamps to `encoder`.
    pub(super) fn resolve_profile(&self, encoder: &mut wgpu::CommandEncoder) {
        let mut guard = self.profiler.lock().expect("profiler lock");
        let Some(profiler) = guard.as_mut() else {
            return;
        };
        let count = 2 * profiler.pending.len() as u32;
        if count == 0 {
            return;
        }
        let bytes = u64::from(count) * 8;
        let readback = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("profile read-back"),
            size: bytes,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        encoder.resolve_query_set(&profiler.queries, 0..count, &profiler.resolved, 0);
        encoder.copy_buffer_to_buffer(&profiler.resolved, 0, &readback, 0, bytes);
        let keys = std::mem::take(&mut profiler.pending);
        profiler.submitted.push((readback, keys));
    }

    /// Waits for the profiled submits so far and adds their dispatch times to the totals.
    pub async fn collect_profile(&self) -> Result<(), GpuError> {
        let submitted = match self.profiler.lock().expect("profiler lock").as_mut() {
            Some(profiler) => std::mem::take(&mut profiler.submitted),
            None => return Ok(()),
        };
        let period = f64::from(self.queue.get_timestamp_period());
        for (readback, keys) in submitted {
            let bytes = super::buffer::map_and_read(self, &readback).await?;
            let ticks: &[u64] = bytemuck::cast_slice(&bytes);
            let mut guard = self.profiler.lock().expect("profiler lock");
            let Some(profiler) = guard.as_mut() else {
                return Ok(());
            };
            for (key, pair) in keys.iter().zip(ticks.chunks_exact(2)) {
                let entry = profiler.totals.entry(*key).or_default();
                entry.0 += pair[1].saturating_sub(pair[0]) as f64 * period;
                entry.1 += 1;
            }
        }
        Ok(())
    }

    /// Stops profiling and returns the GPU time and dispatch count per kernel family and grid.
    pub fn finish_profiling(&self) -> KernelTimes {
        self.profiler
            .lock()
            .ok()
            .and_then(|mut p| p.take())
            .map(|p| p.totals)
            .unwrap_or_default()
    }
}

/// The lock type the device keeps its profiler in.
pub(super) type ProfilerSlot = Mutex<Option<Profiler>>;
