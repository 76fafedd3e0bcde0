//! The shim library: its file name (the shim's contract, in the model) and where gpuprof finds
//! it — `--shim`, else next to gpuprof, else where the wheel installs it — for `run --via shim`
//! and a sidecar that shares it with its pod.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
pub use gpuprof_model::shim::LIBRARY_FILE;

/// The library to preload: `given`, else `libgpuprof_shim.so` next to gpuprof's own binary, else
/// in `../lib/gpuprof/` (the wheel's layout).
pub fn find(given: Option<&Path>) -> Result<PathBuf> {
    let path = match given {
        Some(path) => path.to_path_buf(),
        None => {
            let exe = std::env::current_exe().context("cannot find gpuprof's own path")?;
            let dir = exe.parent().unwrap_or(Path::new("/"));
            let (beside, installed) = (dir.join(LIBRARY_FILE), dir.join("../lib/gpuprof").join(LIBRARY_FILE));
            if beside.is_file() || !installed.is_file() {
                beside
            } else {
                installed
            }
        }
    };
    if !path.is_file() {
        bail!(
            "the shim library {} does not exist: build it with `cargo build -p gpuprof-shim` (it is installed next to gpuprof, or in ../lib/gpuprof/ by the wheel), or name it with --shim PATH",
            path.display()
        );
    }
    // The dynamic loader resolves a relative LD_PRELOAD against each process's own directory.
    path.canonicalize().with_context(|| format!("cannot resolve {}", path.display()))
}
