//! The shim library: its file name (the shim's contract, in the model) and where gpuprof finds
//! it — `--shim`, else next to gpuprof, else where the wheel installs it — for `run --via shim`
//! and a sidecar that shares it with its pod.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
pub use gpuprof_model::shim::LIBRARY_FILE;

/// How to get a shim library when there is none where gpuprof looks.
pub const MISSING_FIX: &str = "build it with `cargo build -p gpuprof-shim` (it is installed next to gpuprof, or in ../lib/gpuprof/ by the wheel), or name it with --shim PATH";

/// The library to preload: `given`, else `libgpuprof_shim.so` next to gpuprof's own binary, else
/// in `../lib/gpuprof/` (the wheel's layout).
pub fn find(given: Option<&Path>) -> Result<PathBuf> {
    let path = match given {
        Some(path) => path.to_path_buf(),
        None => default_path()?,
    };
    if !path.is_file() {
        bail!("the shim library {} does not exist: {MISSING_FIX}", path.display());
    }
    // The dynamic loader resolves a relative LD_PRELOAD against each process's own directory.
    path.canonicalize().with_context(|| format!("cannot resolve {}", path.display()))
}

/// Where gpuprof looks when not told: next to itself when the file is there or the wheel's place
/// has none, else the wheel's place.
pub fn default_path() -> Result<PathBuf> {
    let exe = std::env::current_exe().context("cannot find gpuprof's own path")?;
    let dir = exe.parent().unwrap_or(Path::new("/"));
    let (beside, installed) = (dir.join(LIBRARY_FILE), dir.join("../lib/gpuprof").join(LIBRARY_FILE));
    Ok(if beside.is_file() || !installed.is_file() { beside } else { installed })
}
