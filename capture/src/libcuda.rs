//! Finding the libcuda a process uses: from its memory maps (attach), or the file the dynamic
//! loader would pick for `libcuda.so.1` (run). Files are identified by device and inode, since a
//! uprobe lands on an inode: the same library seen through two paths is attached once.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result};

use gpuprof_procfs::maps;

use gpuprof_procfs::process;

/// The soname applications (and the CUDA runtime) load.
pub const SONAME: &str = "libcuda.so.1";

/// A library file that probes can be attached to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LibraryFile {
    /// A path this process can open (through /proc/PID/root for another mount namespace).
    pub path: PathBuf,
    /// (st_dev, st_ino): the uprobe's real target.
    pub identity: (u64, u64),
}

impl LibraryFile {
    pub fn open(path: PathBuf) -> Result<Self> {
        let meta = fs::metadata(&path).with_context(|| format!("cannot open {}", path.display()))?;
        Ok(LibraryFile { identity: (meta.dev(), meta.ino()), path })
    }
}

/// True for libcuda's file names: libcuda.so, libcuda.so.1, libcuda.so.580.95.05.
pub(crate) fn is_libcuda(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    name == "libcuda.so" || name.starts_with("libcuda.so.")
}

/// True for PyTorch's core library, which holds the allocator report: libc10.so.
pub(crate) fn is_libc10(path: &str) -> bool {
    path.rsplit('/').next() == Some("libc10.so")
}

/// PyTorch's CUDA library, whose caching allocator makes its segments (`model::framework`).
pub(crate) fn is_libc10_cuda(path: &str) -> bool {
    path.rsplit('/').next().is_some_and(gpuprof_model::framework::is_pytorch_cuda_library)
}

/// Every process on the machine, but this one and those in `skip`, that maps libcuda or libc10:
/// the CUDA processes a node-wide view (`top`, the daemon, `gpuprof doctor`) has not picked up yet.
pub fn cuda_processes_on_node(skip: &std::collections::HashSet<u32>) -> Vec<u32> {
    let me = std::process::id();
    process::all_pids()
        .into_iter()
        .filter(|pid| *pid != me && !skip.contains(pid))
        .filter(|pid| {
            maps::read(*pid)
                .map(|mappings| maps::mapped_files(&mappings).iter().any(|f| is_libcuda(&f.path) || is_libc10(&f.path)))
                .unwrap_or(false)
        })
        .collect()
}

/// Every libcuda file mapped by a process, opened through its root so containers work.
pub fn mapped_by(pid: u32) -> Result<Vec<LibraryFile>> {
    mapped_matching(pid, is_libcuda)
}

/// Every file a process maps whose path passes `wanted`, opened through the process's root.
pub(crate) fn mapped_matching(pid: u32, wanted: fn(&str) -> bool) -> Result<Vec<LibraryFile>> {
    let files = maps::mapped_files(&maps::read(pid)?);
    let mut found: Vec<LibraryFile> = Vec::new();
    for file in files.iter().filter(|f| wanted(&f.path)) {
        let path = file.path.strip_suffix(" (deleted)").unwrap_or(&file.path);
        let Ok(library) = LibraryFile::open(maps::path_in_root(pid, path)) else { continue };
        if !found.iter().any(|f| f.identity == library.identity) {
            found.push(library);
        }
    }
    Ok(found)
}

/// The directories the loader searches when neither LD_LIBRARY_PATH nor its cache has the file.
const DEFAULT_DIRS: [&str; 6] =
    ["/lib64", "/usr/lib64", "/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib", "/usr/lib"];

/// The loader cache, as a place looked in, and as one that could not be (`ldconfig` lives in
/// /sbin, which a user's PATH may leave out).
const LOADER_CACHE: &str = "the loader cache (ldconfig -p)";
const NO_LOADER_CACHE: &str = "the loader cache (unread: no ldconfig on PATH)";

/// Where `libcuda.so.1` was looked for, in the loader's order, and the file found there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoaderLookup {
    pub found: Option<PathBuf>,
    /// Each place looked in up to the find (all of them when nothing was found), in words.
    pub looked_in: Vec<String>,
}

/// The file the dynamic loader would load for `libcuda.so.1` given this environment:
/// LD_LIBRARY_PATH, then the loader cache, then the default directories.
pub fn resolve_for_loader() -> Option<PathBuf> {
    look_up_for_loader().found
}

/// `resolve_for_loader`, saying where it looked (`gpuprof doctor` names the places when there
/// is no libcuda).
pub fn look_up_for_loader() -> LoaderLookup {
    let from_env = std::env::var("LD_LIBRARY_PATH").unwrap_or_default();
    let mut looked_in = Vec::new();
    for dir in from_env.split(':').filter(|d| !d.is_empty()) {
        looked_in.push(format!("{dir} (LD_LIBRARY_PATH)"));
        let path = Path::new(dir).join(SONAME);
        if path.is_file() {
            return LoaderLookup { found: Some(path), looked_in };
        }
    }
    let cached = from_loader_cache();
    looked_in.push(if cached.is_some() { LOADER_CACHE } else { NO_LOADER_CACHE }.to_string());
    if let Some(found) = cached.flatten() {
        return LoaderLookup { found: Some(found), looked_in };
    }
    for dir in DEFAULT_DIRS {
        looked_in.push(dir.to_string());
        let path = Path::new(dir).join(SONAME);
        if path.is_file() {
            return LoaderLookup { found: Some(path), looked_in };
        }
    }
    LoaderLookup { found: None, looked_in }
}

/// The driver's version from the name of the file `path` leads to: the driver installs
/// `libcuda.so.580.95.05` and links `libcuda.so.1` to it. None for a file named otherwise.
pub fn driver_version(path: &Path) -> Option<String> {
    let file = fs::canonicalize(path).ok()?;
    version_in_name(file.file_name()?.to_str()?).map(str::to_string)
}

fn version_in_name(name: &str) -> Option<&str> {
    let version = name.strip_prefix("libcuda.so.")?;
    let dotted =
        version.contains('.') && version.split('.').all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
    dotted.then_some(version)
}

/// The cache's libcuda; None when ldconfig cannot be run.
fn from_loader_cache() -> Option<Option<PathBuf>> {
    let output = Command::new("ldconfig").arg("-p").output().ok()?;
    Some(parse_ldconfig(&String::from_utf8_lossy(&output.stdout)))
}

/// Picks the x86-64 `libcuda.so.1` line of `ldconfig -p`.
fn parse_ldconfig(listing: &str) -> Option<PathBuf> {
    listing.lines().find_map(|line| {
        let line = line.trim();
        let (left, path) = line.split_once(" => ")?;
        let is_soname = left.split_whitespace().next() == Some(SONAME);
        (is_soname && left.contains("x86-64")).then(|| PathBuf::from(path.trim()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recognizes_libcuda_names() {
        assert!(is_libcuda("/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05"));
        assert!(is_libcuda("/usr/local/nvidia/lib64/libcuda.so.1"));
        assert!(is_libcuda("libcuda.so"));
        assert!(!is_libcuda("/usr/lib/libcudart.so.12"));
        assert!(!is_libcuda("/opt/libcuda.so.bak/x.so"));
    }

    #[test]
    fn picks_the_64_bit_soname_from_the_loader_cache() {
        let listing = "\
1234 libs found in cache `/etc/ld.so.cache'
\tlibcudart.so.12 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcudart.so.12
\tlibcuda.so.1 (libc6) => /usr/lib/i386-linux-gnu/libcuda.so.1
\tlibcuda.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcuda.so.1
";
        assert_eq!(parse_ldconfig(listing), Some(PathBuf::from("/usr/lib/x86_64-linux-gnu/libcuda.so.1")));
        assert_eq!(parse_ldconfig("0 libs found\n"), None);
    }

    #[test]
    fn the_driver_version_is_the_file_name_past_the_soname() {
        assert_eq!(version_in_name("libcuda.so.580.95.05"), Some("580.95.05"));
        assert_eq!(version_in_name("libcuda.so.1"), None);
        assert_eq!(version_in_name("libcuda.so.1.bak"), None);
        assert_eq!(version_in_name("libcudart.so.12.4"), None);
    }
}
