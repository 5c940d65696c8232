//! Kernel sources, their specialisation, and the pipeline cache.
//!
//! A kernel is a WGSL file from `wgsl/` specialised by a short, explicit header: the `enable`
//! directives its variant needs, the `half_t` alias (f16 where the device has shader-f16, else
//! f32), and `const NAME: u32 = V;` lines for its sizes. No template language: the header is the
//! whole of the specialisation, and it is printed in the label of every pipeline.
//!
//! Kernels never read workgroup memory they have not written in the same dispatch, so native
//! pipelines skip WGSL's zero-fill of it. For GL, naga writes that fill as one store per element
//! and a barrier, and llvmpipe's barrier lowering (LLVM's coroutine frame) then spends tens of
//! CPU-seconds on a matmul tile: most of a cold CI run's shader compiles (docs/ci.md). Browsers
//! still zero-fill (WebGPU requires it), so a kernel that broke the rule would differ there.
//!
//! Every loop in `wgsl/` ends: its stride is a positive constant (asserted with `const_assert`
//! where the header sets it) or the subgroup's size, and its bound is a validated size. So native
//! pipelines also skip naga's loop bounding (`runtime_checks`), a counter of its own that every
//! loop iteration updates and tests: on an H100 it cost 7-12% of decode, batched steps and
//! prefill on all three models (docs/perf.md, session 31). Bounds checks stay, but for kernels
//! marked `Lib::IndicesInRange` on Vulkan: naga clamps every workgroup-memory index, and in the
//! cooperative-matrix kernels, which stage every operand through workgroup memory, that cost
//! 10-14% of prefill. Browsers apply their own checks whatever this says.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::device::{Gpu, Variant};

/// naga's runtime checks for `kernel` on `backend` (`Caps::backend`): all but the loop bounding,
/// and no bounds checks either for a kernel whose indices are in range where the driver bounds
/// storage accesses (see the module's comment): Vulkan, whose specification requires every
/// device to offer robust buffer access, and wgpu enables it.
pub fn runtime_checks(kernel: &Kernel, backend: &str) -> wgpu::ShaderRuntimeChecks {
    let in_range = kernel.libs.contains(&Lib::IndicesInRange) && backend == "Vulkan";
    wgpu::ShaderRuntimeChecks {
        force_loop_bounding: false,
        bounds_checks: !in_range,
        ..wgpu::ShaderRuntimeChecks::checked()
    }
}

/// Library snippets a kernel can ask to be prepended, resolved per variant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Lib {
    /// `reduce_sum`/`reduce_max` over a workgroup: subgroup operations where the variant has
    /// them, a shared-memory tree otherwise. Needs the kernel to define `const WG: u32`.
    Reduce,
    /// Named constants a library reads, as `const NAME: u32 = V;` lines: the quant type codes
    /// (`QUANT_Q4_K`) that `Dequant` switches on come from the ops' type table this way.
    Constants(&'static [(&'static str, u32)]),
    /// Per-type GGUF block dequantization (`wgsl/dequant.wgsl`), selected by `const QUANT`
    /// against the `QUANT_<NAME>` codes of a `Constants` library.
    Dequant,
    /// `silu` and `gelu_tanh` (`wgsl/activation.wgsl`).
    Activation,
    /// Rotary angles and pair layouts (`wgsl/rotary.wgsl`).
    Rotary,
    /// The parameters of the attention kernels that take `ops::attention::KernelParams`, at
    /// binding 0 (`wgsl/attention_params.wgsl`).
    AttentionParams,
    /// The sliding window, soft-capping and no-key score of attention
    /// (`wgsl/attention_mask.wgsl`).
    AttentionMask,
    /// What both prefill attention kernels share: bindings, visible keys and cache rows
    /// (`wgsl/attention_prefill_common.wgsl`; after `AttentionParams` and `AttentionMask`).
    AttentionPrefill,
    /// No source: the kernel uses cooperative matrices, so the header says
    /// `enable wgpu_cooperative_matrix;` (a directive must precede every declaration).
    CooperativeMatrix,
    /// No source: every workgroup-memory index of the kernel is in range by construction (its
    /// header says why), so on Vulkan, where the driver's robust buffer access already bounds
    /// every storage access, the pipeline drops naga's bounds checks too (see `runtime_checks`).
    IndicesInRange,
}

impl Lib {
    fn push_source(self, variant: Variant, text: &mut String) {
        match self {
            Lib::Constants(consts) => push_consts(text, consts),
            _ => text.push_str(self.source(variant)),
        }
    }

    fn source(self, variant: Variant) -> &'static str {
        match (self, variant.subgroups) {
            (Lib::Constants(_) | Lib::CooperativeMatrix | Lib::IndicesInRange, _) => "",
            (Lib::Reduce, true) => include_str!("../../wgsl/reduce_subgroup.wgsl"),
            (Lib::Reduce, false) => include_str!("../../wgsl/reduce_workgroup.wgsl"),
            (Lib::Dequant, _) => include_str!("../../wgsl/dequant.wgsl"),
            (Lib::Activation, _) => include_str!("../../wgsl/activation.wgsl"),
            (Lib::Rotary, _) => include_str!("../../wgsl/rotary.wgsl"),
            (Lib::AttentionParams, _) => include_str!("../../wgsl/attention_params.wgsl"),
            (Lib::AttentionMask, _) => include_str!("../../wgsl/attention_mask.wgsl"),
            (Lib::AttentionPrefill, _) => include_str!("../../wgsl/attention_prefill_common.wgsl"),
        }
    }
}

/// A compute entry point in one of the `wgsl/` files.
#[derive(Debug)]
pub struct Kernel {
    /// Short family name, used in labels and profiles (`matvec_q4_k`).
    pub name: &'static str,
    pub source: &'static str,
    pub entry: &'static str,
    pub libs: &'static [Lib],
}

/// Everything that makes one compiled pipeline different from another.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PipelineKey {
    pub kernel: &'static str,
    pub entry: &'static str,
    pub variant: Variant,
    pub consts: Vec<(&'static str, u32)>,
}

#[derive(Default)]
pub(super) struct PipelineCache {
    compiled: Mutex<HashMap<PipelineKey, Arc<wgpu::ComputePipeline>>>,
    /// The kernel family of each compiled pipeline, for profiles.
    families: Mutex<HashMap<wgpu::ComputePipeline, &'static str>>,
}

/// The exact WGSL text compiled for `kernel` in `variant` with `consts`.
///
/// Browsers require `enable subgroups;` before subgroup builtins, while naga (native wgpu 30)
/// rejects the directive and enables them from the device feature alone.
pub fn specialised_source(
    kernel: &Kernel,
    variant: Variant,
    consts: &[(&str, u32)],
    subgroups_directive: bool,
) -> String {
    let mut text = String::new();
    if variant.f16 {
        text.push_str("enable f16;\n");
    }
    if variant.subgroups && subgroups_directive {
        text.push_str("enable subgroups;\n");
    }
    if kernel.libs.contains(&Lib::CooperativeMatrix) {
        text.push_str("enable wgpu_cooperative_matrix;\n");
    }
    let half = if variant.f16 { "f16" } else { "f32" };
    text.push_str(&format!(
        "alias half_t = {half};\nalias half4_t = vec4<{half}>;\n"
    ));
    push_consts(&mut text, consts);
    for lib in kernel.libs {
        lib.push_source(variant, &mut text);
        text.push('\n');
    }
    text.push_str(kernel.source);
    text
}

fn push_consts(text: &mut String, consts: &[(&str, u32)]) {
    for (name, value) in consts {
        text.push_str(&format!("const {name}: u32 = {value}u;\n"));
    }
}

impl Gpu {
    /// The compiled pipeline for `kernel` in `variant` with `consts`, compiled on first use.
    pub fn pipeline(
        &self,
        kernel: &Kernel,
        variant: Variant,
        consts: &[(&'static str, u32)],
    ) -> Arc<wgpu::ComputePipeline> {
        let key = PipelineKey {
            kernel: kernel.name,
            entry: kernel.entry,
            variant,
            consts: consts.to_vec(),
        };
        let mut compiled = self.pipelines.compiled.lock().expect("pipeline cache lock");
        if let Some(pipeline) = compiled.get(&key) {
            return pipeline.clone();
        }
        let pipeline = Arc::new(self.compile(kernel, &key));
        compiled.insert(key, pipeline.clone());
        if let Ok(mut families) = self.pipelines.families.lock() {
            families.insert((*pipeline).clone(), kernel.name);
        }
        pipeline
    }

    /// The kernel family `pipeline` was compiled from.
    pub fn pipeline_family(&self, pipeline: &wgpu::ComputePipeline) -> &'static str {
        self.pipelines
            .families
            .lock()
            .ok()
            .and_then(|families| families.get(pipeline).copied())
            .unwrap_or("unknown")
    }

    fn compile(&self, kernel: &Kernel, key: &PipelineKey) -> wgpu::ComputePipeline {
        let label = format!(
            "{}:{} {} {:?}",
            kernel.name, kernel.entry, key.variant, key.consts
        );
        let started = web_time::Instant::now();
        let source = specialised_source(
            kernel,
            key.variant,
            &key.consts,
            self.caps.wgsl_subgroups_directive,
        );
        let descriptor = wgpu::ShaderModuleDescriptor {
            label: Some(&label),
            source: wgpu::ShaderSource::Wgsl(source.into()),
        };
        let checks = runtime_checks(kernel, &self.caps.backend);
        // SAFETY: every loop in wgsl/ ends, and a kernel without bounds checks keeps its
        // workgroup-memory indices in range (`runtime_checks`).
        let module = unsafe { self.device.create_shader_module_trusted(descriptor, checks) };
        let pipeline = self
            .device
            .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(&label),
                layout: None,
                module: &module,
                entry_point: Some(kernel.entry),
                compilation_options: wgpu::PipelineCompilationOptions {
                    zero_initialize_workgroup_memory: false,
                    ..Default::default()
                },
                cache: None,
            });
        // naga and the driver's front end run in these two calls; llvmpipe and lavapipe leave
        // code generation to the first dispatch, which this time does not include (docs/ci.md).
        let ms = started.elapsed().as_secs_f64() * 1e3;
        tracing::debug!(%label, ms = format!("{ms:.1}"), "compiled pipeline");
        pipeline
    }

    /// Number of pipelines compiled so far.
    pub fn pipeline_count(&self) -> usize {
        self.pipelines.compiled.lock().map_or(0, |c| c.len())
    }
}
