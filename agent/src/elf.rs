//! Exported function symbols of a shared library and their file offsets (what a uprobe is
//! attached at), read once per library rather than once per probe.

use std::collections::HashMap;
use std::fs;
use std::path::Path;

use anyhow::{Context, Result};
use object::{Object, ObjectSegment, ObjectSymbol, SymbolKind};

/// name → file offset of every defined, exported function.
pub fn exported_functions(path: &Path) -> Result<HashMap<String, u64>> {
    let file = fs::File::open(path).with_context(|| format!("cannot read {}", path.display()))?;
    // Mapped, not read: libcuda is hundreds of MiB and only its headers and dynamic symbol
    // table are needed (attach latency).
    // SAFETY: the mapping is read-only and dropped before returning; a library being replaced
    // under us is written to a new inode by every installer.
    let data = unsafe { memmap2::Mmap::map(&file) }.with_context(|| format!("cannot map {}", path.display()))?;
    let file =
        object::File::parse(&*data).with_context(|| format!("{} is not an ELF shared library", path.display()))?;
    let segments: Vec<(u64, u64, u64)> = file.segments().map(|s| (s.address(), s.size(), s.file_range().0)).collect();
    let mut functions = HashMap::new();
    for symbol in file.dynamic_symbols() {
        if symbol.kind() != SymbolKind::Text || symbol.is_undefined() || symbol.address() == 0 {
            continue;
        }
        let Ok(name) = symbol.name() else { continue };
        let address = symbol.address();
        let Some(&(vaddr, _, file_offset)) =
            segments.iter().find(|(vaddr, size, _)| (*vaddr..vaddr + size).contains(&address))
        else {
            continue;
        };
        functions.insert(name.to_string(), address - vaddr + file_offset);
    }
    Ok(functions)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_libc_functions() {
        let libc = ["/lib/x86_64-linux-gnu/libc.so.6", "/usr/lib/x86_64-linux-gnu/libc.so.6"]
            .iter()
            .map(Path::new)
            .find(|p| p.exists())
            .expect("libc.so.6 is on every test machine");
        let functions = exported_functions(libc).unwrap();
        assert!(functions["malloc"] > 0);
        assert_ne!(functions["malloc"], functions["free"]);
    }

    #[test]
    fn a_non_elf_file_is_a_clear_error() {
        let path = std::env::temp_dir().join(format!("gpuprof-not-elf-{}", std::process::id()));
        fs::write(&path, "not an ELF file").unwrap();
        let err = exported_functions(&path).unwrap_err();
        fs::remove_file(&path).unwrap();
        assert_eq!(err.to_string(), format!("{} is not an ELF shared library", path.display()));
    }
}
