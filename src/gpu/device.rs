//! Device creation and capability probing.

use std::sync::Arc;

use super::pipeline::PipelineCache;

#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    #[error("no GPU adapter found for backend {backend:?} (on Linux without a GPU install mesa-vulkan-drivers for lavapipe; in a browser WebGPU must be enabled)")]
    NoAdapter { backend: BackendChoice },
    #[error("requesting a device from adapter {adapter}: {source}")]
    RequestDevice {
        adapter: String,
        source: wgpu::RequestDeviceError,
    },
    #[error("reading back a GPU buffer: {0}")]
    ReadBack(String),
    #[error("tensor {name} needs {needed} bytes in one binding, more than the limit {limit}")]
    BindingTooSmall {
        name: String,
        needed: u64,
        limit: u64,
    },
    #[error("kernel {kernel}: {message}")]
    Kernel { kernel: String, message: String },
}

/// Which wgpu backend to ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BackendChoice {
    /// Whatever the platform prefers (Vulkan/Metal/DX12 natively, WebGPU in browsers).
    #[default]
    Auto,
    Vulkan,
    Gl,
    Metal,
    Dx12,
    BrowserWebGpu,
}

impl BackendChoice {
    fn backends(self) -> wgpu::Backends {
        match self {
            Self::Auto => wgpu::Backends::PRIMARY,
            Self::Vulkan => wgpu::Backends::VULKAN,
            Self::Gl => wgpu::Backends::GL,
            Self::Metal => wgpu::Backends::METAL,
            Self::Dx12 => wgpu::Backends::DX12,
            Self::BrowserWebGpu => wgpu::Backends::BROWSER_WEBGPU,
        }
    }

    /// Parses `auto`, `vulkan`, `gl`, `metal`, `dx12`, `webgpu`.
    pub fn parse(name: &str) -> Option<Self> {
        Some(match name.to_ascii_lowercase().as_str() {
            "auto" => Self::Auto,
            "vulkan" | "vk" => Self::Vulkan,
            "gl" | "gles" | "opengl" => Self::Gl,
            "metal" => Self::Metal,
            "dx12" => Self::Dx12,
            "webgpu" => Self::BrowserWebGpu,
            _ => return None,
        })
    }
}

/// Which decode products run on 8-bit integers (`ops::quant::int8_products`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Int8Products {
    /// None: every product in f32.
    #[default]
    Off,
    /// Products of several tokens only (batched steps, drafts), for measuring them: a row's
    /// logits then differ from its single steps' by the quantization of x.
    Batched,
    /// Every decode product, one token's too (without the residual fold): a row's tokens are
    /// the same alone or among others, as the products' arithmetic per token is.
    Decode,
}

/// How to set up the device. Defaults use every capability the adapter has.
#[derive(Debug, Clone, Default)]
pub struct GpuOptions {
    pub backend: BackendChoice,
    /// Never use shader-f16 even where the adapter has it.
    pub disable_f16: bool,
    /// Never use subgroup operations even where the adapter has them.
    pub disable_subgroups: bool,
    /// Pretend bindings are at most this many bytes (tests of tensor splitting).
    pub max_binding_override: Option<u64>,
    /// Ask for at most this many storage bindings per kernel (tests of the kernels that fit
    /// WebGPU's default of 8, which a browser adapter may grant and no more).
    pub storage_bindings_limit: Option<u32>,
    /// Split kernel work as for a GPU even on a CPU adapter (tests cover both splits).
    pub gpu_work_split: bool,
    /// Matvec work split (lanes per workgroup, lanes per row, rows per lane) instead of the
    /// built-in one: for measuring splits on a device (`runner bench --matvec-split`).
    pub matvec_split: Option<[u32; 3]>,
    /// Matvec work split of products over several tokens (a batched step): `matvec_split`'s
    /// three numbers and tokens per workgroup, for measuring them (`--matvec-batch-split`).
    pub matvec_batch_split: Option<[u32; 4]>,
    /// Prefill tile `[rows, tokens, staged_cols, lane]` instead of the built-in one, for
    /// measuring tiles (`runner bench --matmul-tile`).
    pub matmul_tile: Option<[u32; 4]>,
    /// `[tokens, bytes]` from which a GPU's product of several tokens reads the weights once
    /// (the tiled or cooperative-matrix product) rather than once per token, instead of the
    /// built-in crossover (`ops::quant::STREAMED_*`), for measuring it
    /// (`--streamed-products`).
    pub streamed_products: Option<[u64; 2]>,
    /// Most workgroups along K of a cooperative-matrix product (1: never split) instead of the
    /// built-in rule (`ops::quant::matmul`), for measuring it (`--coop-k-splits`).
    pub coop_k_splits: Option<u32>,
    /// Most tokens a GPU multiplies one product per token (a batched step's rows) instead of
    /// the built-in crossover (`ops::quant::MATVEC_TOKENS_ON_GPU`), for measuring it
    /// (`--per-token-products`; 1: every product of several tokens reads the weights once).
    pub per_token_products: Option<u32>,
    /// Which decode products run on 8-bit integers instead of the built-in choice
    /// (`--int8-products`).
    pub int8_products: Option<Int8Products>,
    /// Their work split `[lanes, lanes per row, most tokens per workgroup]` instead of the
    /// built-in one, for measuring it (`--int8-split`).
    pub int8_split: Option<[u32; 3]>,
}

/// The shader capabilities a kernel variant is compiled for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Variant {
    pub f16: bool,
    pub subgroups: bool,
    /// Prefill products and prefill attention on cooperative matrices
    /// (`wgsl/matmul_coop.wgsl`, `wgsl/attention_prefill_coop.wgsl`: f16 operands, f32 sums)
    /// instead of the FP32 tiles. Only `best_variant` sets it: its f16 rounding needs its own
    /// tolerance, so `tests/ops_matmul_coop.rs` and `tests/ops_attention_coop.rs` test it
    /// rather than every kernel's variant loop.
    pub coop_matrix: bool,
}

impl std::fmt::Display for Variant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let precision = if self.f16 { "f16" } else { "f32" };
        let reduce = if self.subgroups {
            "subgroups"
        } else {
            "workgroup"
        };
        write!(f, "{precision}+{reduce}")?;
        if self.coop_matrix {
            f.write_str("+coop")?;
        }
        Ok(())
    }
}

/// What the device can do, probed once at start.
#[derive(Debug, Clone)]
pub struct Caps {
    pub adapter: String,
    pub backend: String,
    pub f16: bool,
    pub subgroups: bool,
    pub subgroup_min: u32,
    pub subgroup_max: u32,
    /// 16 x 16 x 16 cooperative matrices of f16 with f32 sums at subgroup scope, on 32-lane
    /// subgroups, with f16 and subgroups enabled: what `wgsl/matmul_coop.wgsl` needs
    /// (`coop_matrix_support`).
    pub coop_matrix: bool,
    pub timestamps: bool,
    /// Kernels split work for a CPU implementation (lavapipe, SwiftShader, llvmpipe): fewer,
    /// fatter threads, since every lane is a loop iteration there.
    pub cpu_work_split: bool,
    /// Largest storage binding kernels may use (possibly lowered by `max_binding_override`).
    pub max_binding: u64,
    pub max_buffer: u64,
    pub max_workgroups_per_dim: u32,
    pub min_uniform_alignment: u32,
    /// Bytes of workgroup memory a kernel may use.
    pub max_workgroup_storage: u32,
    /// Storage bindings one kernel may declare.
    pub max_storage_bindings: u32,
    /// Whether WGSL must say `enable subgroups;` (browsers) or must not (naga).
    pub wgsl_subgroups_directive: bool,
    /// `GpuOptions::matvec_split`.
    pub matvec_split: Option<[u32; 3]>,
    /// `GpuOptions::matvec_batch_split`.
    pub matvec_batch_split: Option<[u32; 4]>,
    /// `GpuOptions::matmul_tile`.
    pub matmul_tile: Option<[u32; 4]>,
    /// `GpuOptions::streamed_products`.
    pub streamed_products: Option<[u64; 2]>,
    /// `GpuOptions::coop_k_splits`.
    pub coop_k_splits: Option<u32>,
    /// `GpuOptions::per_token_products`.
    pub per_token_products: Option<u32>,
    /// Decode products on 8-bit integers (`GpuOptions::int8_products`; built in: off).
    pub int8_products: Int8Products,
    /// `GpuOptions::int8_split`.
    pub int8_split: Option<[u32; 3]>,
}

impl Caps {
    /// The fastest variant this device supports.
    pub fn best_variant(&self) -> Variant {
        Variant {
            f16: self.f16,
            subgroups: self.subgroups,
            coop_matrix: self.coop_matrix,
        }
    }

    /// Every variant this device can run, so tests cover each one (cooperative matrices
    /// aside: see `Variant::coop_matrix`).
    pub fn all_variants(&self) -> Vec<Variant> {
        let mut variants = vec![Variant::default()];
        if self.f16 {
            variants.push(Variant {
                f16: true,
                ..Variant::default()
            });
        }
        if self.subgroups {
            variants.push(Variant {
                subgroups: true,
                ..Variant::default()
            });
        }
        if self.f16 && self.subgroups {
            variants.push(Variant {
                f16: true,
                subgroups: true,
                ..Variant::default()
            });
        }
        variants
    }
}

/// One device and queue, with the capabilities kernels are specialised for.
pub struct Gpu {
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub caps: Caps,
    pub(super) pipelines: PipelineCache,
    pub(super) uniform_blocks: std::sync::Mutex<Vec<wgpu::Buffer>>,
    /// Unmapped read-back staging buffers, newest last, for the next read of the same size.
    read_buffers: std::sync::Mutex<Vec<wgpu::Buffer>>,
    /// Storage scratch kernels share across calls (`kept_storage`), by name.
    kept: std::sync::Mutex<Vec<(&'static str, wgpu::Buffer)>>,
    pub counters: super::profile::GpuCounters,
    placeholder: std::sync::OnceLock<wgpu::Buffer>,
    pub(super) profiler: super::profile::ProfilerSlot,
}

impl Gpu {
    pub async fn new(options: &GpuOptions) -> Result<Arc<Gpu>, GpuError> {
        let mut instance_desc = wgpu::InstanceDescriptor::new_without_display_handle();
        instance_desc.backends = options.backend.backends();
        let instance = wgpu::Instance::new(instance_desc);
        // In a browser, adapters must learn to ask for subgroups before wgpu requests one.
        super::browser::ask_for_subgroups();
        let adapter = instance
            .request_adapter(&wgpu::RequestAdapterOptions {
                power_preference: wgpu::PowerPreference::HighPerformance,
                ..Default::default()
            })
            .await
            .map_err(|_| GpuError::NoAdapter {
                backend: options.backend,
            })?;
        Self::from_adapter(adapter, options).await
    }

    async fn from_adapter(
        adapter: wgpu::Adapter,
        options: &GpuOptions,
    ) -> Result<Arc<Gpu>, GpuError> {
        let info = adapter.get_info();
        let available = adapter.features();
        let f16 = available.contains(wgpu::Features::SHADER_F16) && !options.disable_f16;
        let subgroups = available.contains(wgpu::Features::SUBGROUP) && !options.disable_subgroups;
        let coop_matrix = f16 && subgroups && coop_matrix_support(&adapter);
        let mut required_features = wgpu::Features::empty();
        for (wanted, feature) in [
            (f16, wgpu::Features::SHADER_F16),
            (subgroups, wgpu::Features::SUBGROUP),
            (coop_matrix, wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX),
            (
                available.contains(wgpu::Features::TIMESTAMP_QUERY),
                wgpu::Features::TIMESTAMP_QUERY,
            ),
        ] {
            if wanted {
                required_features |= feature;
            }
        }
        let mut limits = adapter.limits();
        if let Some(most) = options.storage_bindings_limit {
            limits.max_storage_buffers_per_shader_stage =
                limits.max_storage_buffers_per_shader_stage.min(most);
        }
        let (device, queue) = adapter
            .request_device(&wgpu::DeviceDescriptor {
                label: Some("webshard"),
                required_features,
                required_limits: limits.clone(),
                experimental_features: experimental_features(coop_matrix),
                ..Default::default()
            })
            .await
            .map_err(|source| GpuError::RequestDevice {
                adapter: info.name.clone(),
                source,
            })?;
        // Browsers: what the adapter was asked for beside wgpu (`browser`), with its sizes.
        let browser_subgroups = super::browser::granted_subgroups();
        let (subgroup_min, subgroup_max) =
            browser_subgroups.unwrap_or((info.subgroup_min_size, info.subgroup_max_size));
        let subgroups = subgroups || (browser_subgroups.is_some() && !options.disable_subgroups);
        let granted = device.limits();
        let hardware_binding = granted.max_storage_buffer_binding_size;
        let caps = Caps {
            adapter: info.name.clone(),
            backend: format!("{:?}", info.backend),
            f16,
            subgroups,
            subgroup_min,
            subgroup_max,
            coop_matrix,
            timestamps: required_features.contains(wgpu::Features::TIMESTAMP_QUERY),
            cpu_work_split: info.device_type == wgpu::DeviceType::Cpu && !options.gpu_work_split,
            max_binding: options
                .max_binding_override
                .map_or(hardware_binding, |cap| cap.min(hardware_binding)),
            max_buffer: granted.max_buffer_size,
            max_workgroups_per_dim: granted.max_compute_workgroups_per_dimension,
            min_uniform_alignment: granted.min_uniform_buffer_offset_alignment,
            max_workgroup_storage: granted.max_compute_workgroup_storage_size,
            max_storage_bindings: granted.max_storage_buffers_per_shader_stage,
            wgsl_subgroups_directive: info.backend == wgpu::Backend::BrowserWebGpu,
            matvec_split: options.matvec_split,
            matvec_batch_split: options.matvec_batch_split,
            matmul_tile: options.matmul_tile,
            streamed_products: options.streamed_products,
            coop_k_splits: options.coop_k_splits,
            per_token_products: options.per_token_products,
            int8_products: options.int8_products.unwrap_or_default(),
            int8_split: options.int8_split,
        };
        tracing::info!(
            adapter = %caps.adapter, backend = %caps.backend, f16 = caps.f16,
            subgroups = caps.subgroups, coop_matrix = caps.coop_matrix, subgroup_min = caps.subgroup_min,
            subgroup_max = caps.subgroup_max, max_binding = caps.max_binding,
            "gpu ready"
        );
        Ok(Arc::new(Gpu {
            device,
            queue,
            caps,
            pipelines: PipelineCache::default(),
            uniform_blocks: std::sync::Mutex::new(Vec::new()),
            read_buffers: std::sync::Mutex::new(Vec::new()),
            kept: std::sync::Mutex::new(Vec::new()),
            counters: Default::default(),
            placeholder: Default::default(),
            profiler: Default::default(),
        }))
    }

    /// A `MAP_READ` staging buffer of `size` bytes: a kept one of that size, or a new one.
    /// Decode steps read the same few bytes every step, so they reuse one rather than
    /// create and destroy a buffer per step.
    pub(super) fn take_read_buffer(&self, size: u64) -> wgpu::Buffer {
        let mut kept = self.read_buffers.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(index) = kept.iter().rposition(|b| b.size() == size) {
            return kept.remove(index);
        }
        drop(kept);
        self.counters.add_read_buffer();
        self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("result read-back"),
            size,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        })
    }

    /// Keeps an unmapped staging buffer for `take_read_buffer`; the oldest goes past
    /// `KEPT_READ_BUFFERS`, and large ones (logits of many rows) are not kept.
    pub(super) fn return_read_buffer(&self, buffer: wgpu::Buffer) {
        const KEPT_READ_BUFFERS: usize = 8;
        const LARGEST_KEPT: u64 = 1 << 20;
        if buffer.size() > LARGEST_KEPT {
            return;
        }
        let mut kept = self.read_buffers.lock().unwrap_or_else(|e| e.into_inner());
        kept.push(buffer);
        if kept.len() > KEPT_READ_BUFFERS {
            kept.remove(0);
        }
    }

    /// A storage buffer named `name` of at least `bytes` bytes, the same one call after call
    /// (replaced by a larger one when a call needs more), for scratch that lives within one
    /// submit: recordings that bind it find their bind groups again.
    pub fn kept_storage(&self, name: &'static str, bytes: u64) -> wgpu::Buffer {
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        let bytes = bytes.max(4).next_multiple_of(4);
        if let Some((_, buffer)) = kept.iter().find(|(n, b)| *n == name && b.size() >= bytes) {
            return buffer.clone();
        }
        kept.retain(|(n, _)| *n != name);
        let buffer = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(name),
            size: bytes,
            // COPY_SRC: tests read scratch back (the integer products' quantized x).
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        kept.push((name, buffer.clone()));
        buffer
    }

    /// A small storage buffer to bind where a kernel's variant leaves a binding unread.
    pub fn placeholder(&self) -> &wgpu::Buffer {
        self.placeholder
            .get_or_init(|| super::buffer::storage_buffer(self, "unused binding", 16))
    }

    /// The variant kernels use unless a caller asks for another.
    pub fn variant(&self) -> Variant {
        self.caps.best_variant()
    }
}

/// Whether the adapter runs the cooperative-matrix kernels (`wgsl/matmul_coop.wgsl`,
/// `wgsl/attention_prefill_coop.wgsl`): wgpu's experimental cooperative-matrix feature
/// (Vulkan's `VK_KHR_cooperative_matrix`, Metal's simdgroup matrices; never in browsers, where
/// wgpu 30 reports no configurations), a 16 x 16 x 16 configuration of f16 operands with f32
/// sums, and subgroups of exactly 32 lanes (the kernels' subgroups own 16 x 16 blocks).
fn coop_matrix_support(adapter: &wgpu::Adapter) -> bool {
    let info = adapter.get_info();
    let sizes = adapter.cooperative_matrix_properties();
    tracing::debug!(?sizes, "cooperative matrix configurations");
    adapter
        .features()
        .contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX)
        && info.subgroup_min_size == 32
        && info.subgroup_max_size == 32
        && sizes.iter().any(|p| {
            (p.m_size, p.n_size, p.k_size) == (16, 16, 16)
                && p.ab_type == wgpu::CooperativeScalarType::F16
                && p.cr_type == wgpu::CooperativeScalarType::F32
        })
}

/// wgpu refuses an experimental feature without this token.
fn experimental_features(coop_matrix: bool) -> wgpu::ExperimentalFeatures {
    if coop_matrix {
        // SAFETY: the token acknowledges that wgpu's experimental features may have bugs;
        // only the cooperative-matrix kernels use one, and their tests check them against the
        // CPU references on the devices that have it (tests/ops_matmul_coop.rs,
        // tests/ops_attention_coop.rs).
        unsafe { wgpu::ExperimentalFeatures::enabled() }
    } else {
        wgpu::ExperimentalFeatures::disabled()
    }
}
