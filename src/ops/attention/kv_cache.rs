//! The KV cache in GPU memory and `kv_write`, which fills it in place.
//!
//! Layout: [layer][pos][kv_head][head_dim] f32. Layers sit at `layer_stride` byte steps, the
//! layer size rounded up to the storage offset alignment, so a kernel binds exactly one layer
//! (buffer + offset) and never needs the whole cache in one binding. When the whole cache is
//! larger than one binding allows, layers are spread over several buffers. A cache may also
//! be a view of a pool: a slot (a region of each pooled layer, `pooled`) or a seat whose
//! positions live in pages (`paged`).

use std::sync::Mutex;

use crate::gpu::{Gpu, GpuError, Kernel, Recorder};
use crate::ops::short_conv::ShortConvState;

use super::paged::{Pages, PAGE_TOKENS};

const KV_WRITE: Kernel = Kernel {
    name: "kv_write",
    source: include_str!("../../../wgsl/kv_cache.wgsl"),
    entry: "main",
    libs: &[],
};

const KV_WRITE_WG: u32 = 256;

/// Keys and values of every layer for up to `max_ctx` positions.
#[derive(Debug)]
pub struct KvCache {
    /// Key buffers; buffer `i` holds layers `i * layers_per_buffer ..`.
    pub k: Vec<wgpu::Buffer>,
    /// Value buffers, laid out like `k`.
    pub v: Vec<wgpu::Buffer>,
    pub layers: u32,
    pub max_ctx: u32,
    pub kv_heads: u32,
    pub head_dim: u32,
    /// Layers stored in each buffer (the last buffer may hold fewer).
    pub layers_per_buffer: u32,
    /// Bytes from one layer to the next inside a buffer.
    pub layer_stride: u64,
    /// Bytes from the start of a layer to this cache's region (its slot in a pool; 0 alone).
    pub slot_offset: u64,
    /// Bytes of a layer's whole pool (`layer_bytes` alone): what a batched step binds.
    pub pooled_bytes: u64,
    /// Where the positions live when this cache is a seat of a paged pool.
    pub(super) pages: Option<Pages>,
    /// Partial results of split decode attention, reused by every call (grown on demand).
    pub(super) scratch: Mutex<Option<DecodeScratch>>,
    /// The sequence's short-convolution state where the model has such blocks (LFM2): kept
    /// with the keys and values so that whoever holds a sequence's cache holds all of it.
    pub short_conv: Option<ShortConvState>,
    /// Tells caches apart (a stage keeps the bind groups of each cache it runs with).
    id: u64,
}

/// The next `KvCache::id`.
static NEXT_CACHE_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Partial (max, sum) statistics and weighted value sums of split decode attention.
#[derive(Debug)]
pub(super) struct DecodeScratch {
    pub acc: wgpu::Buffer,
    pub stats: wgpu::Buffer,
    /// Number of (token, head, split) slots both buffers hold.
    pub slots: u64,
}

impl KvCache {
    /// Allocates the cache. Fails when one layer does not fit in a binding or the shape is one
    /// the kernels cannot address (head_dim must be a positive multiple of 16).
    pub fn new(
        gpu: &Gpu,
        layers: u32,
        max_ctx: u32,
        kv_heads: u32,
        head_dim: u32,
    ) -> Result<Self, GpuError> {
        let mut caches = Self::pooled(gpu, layers, max_ctx, kv_heads, head_dim, 1)?;
        Ok(caches.remove(0))
    }

    /// `slots` caches of `max_ctx` positions each, views of shared buffers in which every
    /// layer holds the slots' regions side by side. Fails like `new`, and when one pooled
    /// layer does not fit in a binding.
    pub fn pooled(
        gpu: &Gpu,
        layers: u32,
        max_ctx: u32,
        kv_heads: u32,
        head_dim: u32,
        slots: u32,
    ) -> Result<Vec<Self>, GpuError> {
        let sizes = [layers, max_ctx, kv_heads, head_dim, slots];
        if sizes.contains(&0) || !head_dim.is_multiple_of(16) {
            return Err(shape_error(format!(
                "layers {layers}, max_ctx {max_ctx}, kv_heads {kv_heads}, head_dim {head_dim}, \
                 slots {slots}: every size must be positive and head_dim a multiple of 16"
            )));
        }
        let layer_bytes = u64::from(max_ctx) * u64::from(kv_heads) * u64::from(head_dim) * 4;
        let alignment = u64::from(gpu.device.limits().min_storage_buffer_offset_alignment);
        // Each slot's region starts at an aligned offset, so it binds on its own.
        let region = layer_bytes.next_multiple_of(alignment);
        let pooled_bytes = u64::from(slots - 1) * region + layer_bytes;
        let layer_stride = pooled_bytes.next_multiple_of(alignment);
        let limit = gpu.caps.max_binding.min(gpu.caps.max_buffer);
        // Offsets inside the kernels are u32 vec4 indices.
        if pooled_bytes > limit || pooled_bytes > u64::from(u32::MAX) {
            return Err(GpuError::BindingTooSmall {
                name: format!("kv_cache layer of {slots} slots"),
                needed: pooled_bytes,
                limit,
            });
        }
        // A buffer of n layers needs (n - 1) strides plus one layer.
        let layers_per_buffer = ((limit - pooled_bytes) / layer_stride + 1).min(u64::from(layers));
        let layers_per_buffer = layers_per_buffer as u32;
        let buffers = layers.div_ceil(layers_per_buffer);
        let mut k = Vec::with_capacity(buffers as usize);
        let mut v = Vec::with_capacity(buffers as usize);
        for index in 0..buffers {
            let held = layers_per_buffer.min(layers - index * layers_per_buffer);
            let bytes = u64::from(held - 1) * layer_stride + pooled_bytes;
            k.push(cache_buffer(gpu, &format!("kv_cache.k[{index}]"), bytes));
            v.push(cache_buffer(gpu, &format!("kv_cache.v[{index}]"), bytes));
        }
        let slot = |index: u32| KvCache {
            k: k.clone(),
            v: v.clone(),
            layers,
            max_ctx,
            kv_heads,
            head_dim,
            layers_per_buffer,
            layer_stride,
            slot_offset: u64::from(index) * region,
            pooled_bytes,
            pages: None,
            scratch: Mutex::new(None),
            short_conv: None,
            id: NEXT_CACHE_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        };
        Ok((0..slots).map(slot).collect())
    }

    /// A seat of `max_ctx` positions over this cache's buffers, which hold the whole pool of
    /// pages (`paged`).
    pub(super) fn view(&self, max_ctx: u32, pages: Pages) -> KvCache {
        KvCache {
            k: self.k.clone(),
            v: self.v.clone(),
            max_ctx,
            pages: Some(pages),
            scratch: Mutex::new(None),
            short_conv: None,
            id: NEXT_CACHE_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            ..*self
        }
    }

    /// This cache's identity, unique in the process: slots of one pool differ.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Whether `other` is a slot of the same pool (so one binding reaches both).
    pub fn same_pool(&self, other: &KvCache) -> bool {
        self.k[0] == other.k[0] && self.layer_stride == other.layer_stride
    }

    /// The region word of this cache's rows in a batched step's row table: where its slot
    /// begins inside a pooled layer binding, in vec4s, or for a seat of a paged pool, the
    /// word of the page table where its entries begin.
    pub fn row_region(&self) -> u32 {
        match &self.pages {
            Some(pages) => pages.first,
            None => (self.slot_offset / 16) as u32,
        }
    }

    /// The binding of `layer`'s keys of every slot of the pool.
    pub fn pooled_k_layer(&self, layer: u32) -> wgpu::BindingResource<'_> {
        self.pooled_binding(&self.k, layer)
    }

    /// The binding of `layer`'s values of every slot of the pool.
    pub fn pooled_v_layer(&self, layer: u32) -> wgpu::BindingResource<'_> {
        self.pooled_binding(&self.v, layer)
    }

    fn pooled_binding<'a>(
        &self,
        buffers: &'a [wgpu::Buffer],
        layer: u32,
    ) -> wgpu::BindingResource<'a> {
        let (index, offset) = self.layer_location(layer);
        wgpu::BindingResource::Buffer(wgpu::BufferBinding {
            buffer: &buffers[index],
            offset: offset - self.slot_offset,
            size: std::num::NonZeroU64::new(self.pooled_bytes),
        })
    }

    /// Bytes of one layer's keys (or values).
    pub fn layer_bytes(&self) -> u64 {
        u64::from(self.max_ctx) * u64::from(self.kv_heads) * u64::from(self.head_dim) * 4
    }

    /// Which buffer holds `layer`, and the byte offset of the layer inside it.
    pub fn layer_location(&self, layer: u32) -> (usize, u64) {
        assert!(
            layer < self.layers,
            "layer {layer} out of range: the cache has {} layers",
            self.layers
        );
        let index = layer / self.layers_per_buffer;
        let offset =
            u64::from(layer % self.layers_per_buffer) * self.layer_stride + self.slot_offset;
        (index as usize, offset)
    }

    /// The binding of `layer`'s keys: exactly that layer's slice (for a seat of a paged pool,
    /// the pool's whole layer, which its pages index).
    pub fn k_layer(&self, layer: u32) -> wgpu::BindingResource<'_> {
        self.layer_binding(&self.k, layer)
    }

    /// The binding of `layer`'s values.
    pub fn v_layer(&self, layer: u32) -> wgpu::BindingResource<'_> {
        self.layer_binding(&self.v, layer)
    }

    fn layer_binding<'a>(
        &self,
        buffers: &'a [wgpu::Buffer],
        layer: u32,
    ) -> wgpu::BindingResource<'a> {
        let (index, offset) = self.layer_location(layer);
        wgpu::BindingResource::Buffer(wgpu::BufferBinding {
            buffer: &buffers[index],
            offset,
            size: std::num::NonZeroU64::new(match self.pages {
                Some(_) => self.pooled_bytes,
                None => self.layer_bytes(),
            }),
        })
    }

    /// Scratch buffers with room for `slots` (token, head, split) partial results.
    pub(super) fn decode_scratch(&self, gpu: &Gpu, slots: u64) -> (wgpu::Buffer, wgpu::Buffer) {
        let mut scratch = self.scratch.lock().expect("kv cache scratch lock");
        if scratch.as_ref().is_none_or(|s| s.slots < slots) {
            let acc_bytes = slots * u64::from(self.head_dim) * 4;
            *scratch = Some(DecodeScratch {
                acc: crate::gpu::storage_buffer(gpu, "attention.partial_acc", acc_bytes),
                stats: crate::gpu::storage_buffer(gpu, "attention.partial_stats", slots * 8),
                slots,
            });
        }
        let held = scratch.as_ref().expect("scratch was just allocated");
        (held.acc.clone(), held.stats.clone())
    }
}

pub(super) fn cache_buffer(gpu: &Gpu, label: &str, bytes: u64) -> wgpu::Buffer {
    gpu.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some(label),
        size: bytes,
        usage: wgpu::BufferUsages::STORAGE
            | wgpu::BufferUsages::COPY_DST
            | wgpu::BufferUsages::COPY_SRC,
        mapped_at_creation: false,
    })
}

fn shape_error(message: String) -> GpuError {
    GpuError::Kernel {
        kernel: "kv_cache".into(),
        message,
    }
}

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct KvWriteParams {
    count: u32,
    dst_offset: u32,
    groups_x: u32,
    row_vec4s: u32,
}

/// Copies `tokens` rows of `k` and `v` (each [tokens, kv_heads * head_dim] f32) into `layer`
/// at positions `start_pos .. start_pos + tokens` (through its pages when the cache is a seat
/// of a paged pool).
///
/// Panics when the layer or positions are outside the cache: the model code bounds them.
pub fn kv_write(
    rec: &mut Recorder,
    cache: &KvCache,
    layer: u32,
    k: &wgpu::Buffer,
    v: &wgpu::Buffer,
    start_pos: u32,
    tokens: u32,
) {
    assert!(
        u64::from(start_pos) + u64::from(tokens) <= u64::from(cache.max_ctx),
        "kv_write of positions {start_pos}..{} beyond the cache's {} positions",
        u64::from(start_pos) + u64::from(tokens),
        cache.max_ctx
    );
    if tokens == 0 {
        return;
    }
    let row_vec4s = cache.kv_heads * cache.head_dim / 4;
    let count = tokens * row_vec4s;
    let needed = u64::from(count) * 16;
    assert!(
        k.size() >= needed && v.size() >= needed,
        "kv_write of {tokens} tokens needs {needed}-byte k and v buffers, got {} and {}",
        k.size(),
        v.size()
    );
    let groups = count.div_ceil(KV_WRITE_WG);
    let [groups_x, groups_y] = grid_2d(groups, rec.gpu().caps.max_workgroups_per_dim);
    let params = KvWriteParams {
        count,
        dst_offset: start_pos * row_vec4s,
        groups_x,
        row_vec4s,
    };
    let constants = [
        ("WG", KV_WRITE_WG),
        ("PAGED", cache.paged_constant()),
        ("PAGE", PAGE_TOKENS),
    ];
    let pipeline = rec.pipeline(&KV_WRITE, &constants);
    let placeholder = rec.gpu().placeholder().as_entire_binding();
    rec.dispatch(
        &pipeline,
        &params,
        &[
            k.as_entire_binding(),
            v.as_entire_binding(),
            cache.k_layer(layer),
            cache.v_layer(layer),
            cache.page_binding().unwrap_or(placeholder),
        ],
        [groups_x, groups_y, 1],
    );
}

/// Spreads `groups` workgroups over x and y when x alone would exceed `max_per_dim`.
pub(super) fn grid_2d(groups: u32, max_per_dim: u32) -> [u32; 2] {
    let x = groups.clamp(1, max_per_dim.max(1));
    [x, groups.div_ceil(x).max(1)]
}
