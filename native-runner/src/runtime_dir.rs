//! A private `XDG_RUNTIME_DIR` when the environment lacks a usable one.
//!
//! Mesa's Vulkan device-select layer (loaded implicitly with lavapipe and Mesa's GPU drivers)
//! tries to reach a Wayland compositor while adapters are enumerated, and libwayland prints
//! "error: XDG_RUNTIME_DIR is invalid or not set in the environment." when the variable is
//! missing: an "error" on a run that works. With a private directory there it looks for a
//! socket, finds none and stays quiet; EGL (wgpu's GL backend) wants the same directory.
//! `.ci/env.sh` makes the same directory for scripts.

/// Points `XDG_RUNTIME_DIR` at `$TMPDIR/webshard-runtime-UID` (mode 700) unless it already
/// names a directory. Call before any thread starts: it sets an environment variable.
pub fn ensure_runtime_dir() {
    #[cfg(target_os = "linux")]
    linux::ensure();
}

#[cfg(target_os = "linux")]
mod linux {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    use std::path::Path;

    pub fn ensure() {
        let current = std::env::var_os("XDG_RUNTIME_DIR");
        if current.is_some_and(|dir| Path::new(&dir).is_dir()) {
            return;
        }
        let Ok(uid) = std::fs::metadata("/proc/self").map(|m| m.uid()) else {
            return;
        };
        let dir = std::env::temp_dir().join(format!("webshard-runtime-{uid}"));
        let _ = std::fs::DirBuilder::new().mode(0o700).create(&dir);
        // Someone else's directory, or one others can enter, is not a runtime dir.
        let private = std::fs::metadata(&dir)
            .is_ok_and(|m| m.is_dir() && m.uid() == uid && m.permissions().mode() & 0o777 == 0o700);
        if private {
            std::env::set_var("XDG_RUNTIME_DIR", &dir);
        }
    }
}
