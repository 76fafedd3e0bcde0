//! Exported function symbols of a shared library and their file offsets (what a uprobe is
//! attached at), read once per library rather than once per probe.

use std::collections::HashMap;
use std::fs;
use std::path::Path;

use anyhow::{Context, Result};
use object::{Object, ObjectSegment, ObjectSymbol, SymbolKind};

/// name → file offset of every defined, exported function.
pub fn exported_functions(path: &Path) -> Result<HashMap<String, u64>> {
    let data = fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let file = object::File::parse(&*data)
        .with_context(|| format!("{} is not an ELF shared library", path.display()))?;
    let segments: Vec<(u64, u64, u64)> = file
        .segments()
        .map(|s| (s.address(), s.size(), s.file_range().0))
        .collect();
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
        let err = exported_functions(Path::new("/proc/self/status")).unwrap_err();
        assert_eq!(err.to_string(), "/proc/self/status is not an ELF shared library");
    }
}
