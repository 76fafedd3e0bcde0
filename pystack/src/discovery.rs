//! Finding the interpreter in a process: the module (libpython3.X.so, or a python executable
//! with libpython linked in) whose symbols hold `_PyRuntime`, its load address, and its version.

use std::path::Path;

use gpuprof_procfs::elf;
use gpuprof_procfs::maps::{self, Mapping, MapsError};
use thiserror::Error;

use crate::debug_offsets::{self, DebugOffsets313};
use crate::memory::{Memory, RemoteMemory};
use crate::offsets::{self, Layout, Version};

/// A CPython interpreter in a process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interpreter {
    pub pid: u32,
    /// The module with `_PyRuntime`, as the process sees it.
    pub module: String,
    /// Address of `_PyRuntime` in the process.
    pub runtime: u64,
    pub layout: Layout,
}

#[derive(Debug, Error)]
pub enum DiscoveryError {
    #[error(transparent)]
    Maps(#[from] MapsError),
    #[error("CPython {version} in pid {pid} ({module}) is not a version gpuprof reads (3.8 to 3.13)")]
    Unsupported { pid: u32, module: String, version: Version },
    #[error("cannot read _Py_DebugOffsets of pid {pid}: {reason}")]
    DebugOffsets { pid: u32, reason: String },
}

/// The interpreter of a process, or None when it runs no CPython (yet: a process that has just
/// exec'd may not have mapped libpython).
pub fn find_interpreter(pid: u32) -> Result<Option<Interpreter>, DiscoveryError> {
    let mappings = maps::read(pid)?;
    for (path, base) in candidate_modules(&mappings) {
        let file = maps::path_in_root(pid, &path);
        let Some((runtime_vaddr, version_vaddr, lowest_vaddr)) = runtime_symbol(&file) else { continue };
        let bias = base.wrapping_sub(lowest_vaddr);
        let memory = RemoteMemory { pid };
        let version = version_vaddr
            .and_then(|v| memory.read_u32(v.wrapping_add(bias)).ok())
            .map(Version::from_hex)
            .or_else(|| version_from_name(&path));
        let Some(version) = version else { continue };
        let Some(mut layout) = offsets::layout_for(version) else {
            return Err(DiscoveryError::Unsupported { pid, module: path, version });
        };
        let runtime = runtime_vaddr.wrapping_add(bias);
        if version.minor >= 13 {
            let bytes = memory
                .read_vec(runtime, debug_offsets::DEBUG_OFFSETS_LEN)
                .map_err(|e| DiscoveryError::DebugOffsets { pid, reason: e.to_string() })?;
            layout.offsets = DebugOffsets313::parse(&bytes)
                .and_then(|debug| debug.offsets(&layout.offsets))
                .map_err(|e| DiscoveryError::DebugOffsets { pid, reason: e.to_string() })?;
        }
        return Ok(Some(Interpreter { pid, module: path, runtime, layout }));
    }
    Ok(None)
}

/// File-backed modules that may hold the interpreter, libpython first, each with the address
/// its first page is mapped at.
fn candidate_modules(mappings: &[Mapping]) -> Vec<(String, u64)> {
    let mut found: Vec<(String, u64)> = Vec::new();
    for mapping in mappings.iter().filter(|m| m.offset == 0) {
        let (Some(path), Some(name)) = (mapping.file_path(), mapping.file_name()) else { continue };
        let is_python = name.starts_with("libpython3") || name.starts_with("python");
        if is_python && !found.iter().any(|(p, _)| p == path) {
            found.push((path.to_string(), mapping.range.start));
        }
    }
    found.sort_by_key(|(path, _)| !path.rsplit('/').next().unwrap_or("").starts_with("libpython"));
    found
}

/// (`_PyRuntime`, `Py_Version` if any, the address of the first page) from the module's symbols.
fn runtime_symbol(path: &Path) -> Option<(u64, Option<u64>, u64)> {
    elf::read(path, |elf| {
        let [runtime, version] = elf.symbol_addresses(["_PyRuntime", "Py_Version"]);
        Some((runtime?, version, elf.first_load_page()))
    })
    .ok()
    .flatten()
}

/// 3.X from "libpython3.X.so…" or "python3.X".
fn version_from_name(path: &str) -> Option<Version> {
    let name = path.rsplit('/').next()?;
    let rest = name.strip_prefix("libpython3.").or_else(|| name.strip_prefix("python3."))?;
    let minor: u8 = rest.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()?;
    Some(Version { major: 3, minor })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libpython_comes_before_the_executable() {
        let maps = "\
555555554000-555555555000 r--p 00000000 fd:01 11 /usr/bin/python3.12
555555555000-555555556000 r-xp 00001000 fd:01 11 /usr/bin/python3.12
7f0000000000-7f0000001000 r--p 00000000 fd:01 22 /opt/py/lib/libpython3.11.so.1.0
7f0000001000-7f0000002000 r-xp 00001000 fd:01 22 /opt/py/lib/libpython3.11.so.1.0
7f0000003000-7f0000004000 r--p 00000000 fd:01 33 /usr/lib/libc.so.6
";
        assert_eq!(
            candidate_modules(&maps::parse(maps)),
            vec![
                ("/opt/py/lib/libpython3.11.so.1.0".to_string(), 0x7f00_0000_0000),
                ("/usr/bin/python3.12".to_string(), 0x5555_5555_4000)
            ]
        );
    }

    #[test]
    fn versions_from_file_names() {
        assert_eq!(version_from_name("/x/libpython3.9.so.1.0"), Some(Version { major: 3, minor: 9 }));
        assert_eq!(version_from_name("/usr/bin/python3.12"), Some(Version { major: 3, minor: 12 }));
        assert_eq!(version_from_name("/usr/bin/python3"), None);
    }

    #[test]
    fn versions_from_py_version_hex() {
        assert_eq!(Version::from_hex(0x030d_00f0), Version { major: 3, minor: 13 });
        assert_eq!(Version::from_hex(0x0308_12f0), Version { major: 3, minor: 8 });
    }
}
