//! Paged KV caches: every layer of a pool is a run of pages of `PAGE_TOKENS` positions, and a
//! sequence's cache (a "seat") is a view whose positions map to pages through its own row of
//! a page table on the GPU. Sequences then hold only the pages they need, and a prompt prefix
//! another sequence has computed is shared by pointing at its pages, not copied
//! (`native-runner`'s `api::pool` keeps the accounting).
//!
//! The table buffer begins with the row words of a batched step (position and page-table
//! start of each row: `attention::row_table`), then one row of entries per seat, each at an
//! offset a storage binding may start at, so that single-sequence kernels (`kv_write`,
//! prefill attention) bind their seat's entries alone. Page 0 is the pool's sink: entries no
//! sequence has claimed point there, so a position written or read past what the pool gave
//! its seat can only touch the sink, never another sequence's keys.

use super::kv_cache::{cache_buffer, KvCache};
use crate::gpu::{Gpu, GpuError};

/// Positions per page.
pub const PAGE_TOKENS: u32 = 16;

/// A seat's place in its pool's page table.
#[derive(Debug, Clone)]
pub struct Pages {
    /// The pool's table: the row words, then every seat's entries.
    pub table: wgpu::Buffer,
    /// Word of `table` where this seat's entries begin.
    pub first: u32,
    /// Entries of this seat: one per `PAGE_TOKENS` positions of its `max_ctx`.
    pub entries: u32,
    /// Pages in the pool, the sink (page 0) included.
    pub pool_pages: u32,
    /// Row words the table holds in front of the seats' entries (two per row).
    pub row_words: u32,
}

impl KvCache {
    /// `seats` caches of `max_ctx` positions each over one pool of `pages` pages (page 0 the
    /// sink), whose table holds the row words of batched steps of up to `max_rows` rows.
    /// Fails like `pooled` when a pooled layer or the table exceeds a binding.
    pub fn paged(
        gpu: &Gpu,
        shape: [u32; 4],
        seats: u32,
        pages: u32,
        max_rows: u32,
    ) -> Result<Vec<KvCache>, GpuError> {
        let [layers, max_ctx, kv_heads, head_dim] = shape;
        if seats == 0 || pages < 2 || max_rows == 0 {
            return Err(GpuError::Kernel {
                kernel: "kv_cache".into(),
                message: format!(
                    "a paged pool of {seats} seats, {pages} pages (the sink included) and \
                     {max_rows} rows a step: each must be positive and pages at least 2"
                ),
            });
        }
        let positions = pages
            .checked_mul(PAGE_TOKENS)
            .ok_or_else(|| GpuError::Kernel {
                kernel: "kv_cache".into(),
                message: format!("{pages} pages of {PAGE_TOKENS} positions overflow"),
            })?;
        let whole = Self::pooled(gpu, layers, positions, kv_heads, head_dim, 1)?.remove(0);
        let entries = max_ctx.div_ceil(PAGE_TOKENS);
        let align = gpu.device.limits().min_storage_buffer_offset_alignment / 4;
        let row_words = (2 * max_rows).next_multiple_of(align.max(1));
        let stride = entries.next_multiple_of(align.max(1));
        let words = u64::from(row_words) + u64::from(seats) * u64::from(stride);
        if words * 4 > gpu.caps.max_binding || words > u64::from(u32::MAX) {
            return Err(GpuError::BindingTooSmall {
                name: format!("page table of {seats} seats"),
                needed: words * 4,
                limit: gpu.caps.max_binding,
            });
        }
        let table = cache_buffer(gpu, "kv_cache.pages", words * 4);
        let seat = |index: u32| {
            let pages = Pages {
                table: table.clone(),
                first: row_words + index * stride,
                entries,
                pool_pages: pages,
                row_words,
            };
            whole.view(max_ctx, pages)
        };
        Ok((0..seats).map(seat).collect())
    }

    /// Where this cache's positions live, when it is a seat of a paged pool.
    pub fn pages(&self) -> Option<&Pages> {
        self.pages.as_ref()
    }

    /// Points this seat's positions at `pages` in order (page i holds positions
    /// `i * PAGE_TOKENS..`); its other entries at the sink. Queued before any later step.
    /// Panics when the cache is not paged, or a page is outside the pool or there are more
    /// pages than entries: the pool's accounting hands out only its own pages.
    pub fn set_pages(&self, gpu: &Gpu, pages: &[u32]) {
        let seat = self
            .pages
            .as_ref()
            .expect("set_pages on a cache that is not paged");
        assert!(
            pages.len() <= seat.entries as usize,
            "{} pages for a seat of {} entries",
            pages.len(),
            seat.entries
        );
        assert!(
            pages.iter().all(|&page| page < seat.pool_pages),
            "a page outside the pool of {} pages",
            seat.pool_pages
        );
        let mut words = pages.to_vec();
        words.resize(seat.entries as usize, 0);
        let offset = u64::from(seat.first) * 4;
        gpu.queue
            .write_buffer(&seat.table, offset, bytemuck::cast_slice(&words));
    }

    /// The binding of this seat's entries (kernels that attend or write one sequence).
    pub(crate) fn page_binding(&self) -> Option<wgpu::BindingResource<'_>> {
        let seat = self.pages.as_ref()?;
        Some(wgpu::BindingResource::Buffer(wgpu::BufferBinding {
            buffer: &seat.table,
            offset: u64::from(seat.first) * 4,
            size: std::num::NonZeroU64::new(u64::from(seat.entries) * 4),
        }))
    }

    /// Whether this is a seat of a paged pool (its rows found through its page table).
    pub fn is_paged(&self) -> bool {
        self.pages.is_some()
    }

    /// The `PAGED` specialisation constant of kernels that read this cache.
    pub(super) fn paged_constant(&self) -> u32 {
        u32::from(self.is_paged())
    }
}
