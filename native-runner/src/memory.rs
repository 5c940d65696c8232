//! Peak host heap of the runner, measured by the allocator (peak_alloc), and the process's
//! resident peak from the kernel. On CPU adapters (lavapipe) GPU buffers live in host memory
//! too, so the resident peak includes them while the heap peak does not.

use peak_alloc::PeakAlloc;

#[global_allocator]
static ALLOCATOR: PeakAlloc = PeakAlloc;

pub fn reset_peak() {
    ALLOCATOR.reset_peak_usage();
}

/// Peak bytes allocated on the Rust heap since the last reset.
pub fn peak() -> u64 {
    ALLOCATOR.peak_usage() as u64
}

/// The process's resident-set high-water mark (`VmHWM`), where the OS reports it.
pub fn resident_peak() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}
