//! Helpers shared by the benchmarks.

use std::path::PathBuf;

/// torchrun from `$DRUN_TORCH_PYTHON`'s directory or `~/.cache/drun/venv/bin/torchrun`.
pub fn torchrun() -> Option<PathBuf> {
    std::env::var_os("DRUN_TORCH_PYTHON")
        .map(|p| PathBuf::from(p).with_file_name("torchrun"))
        .or_else(|| {
            std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/drun/venv/bin/torchrun"))
        })
        .filter(|p| p.is_file())
}
