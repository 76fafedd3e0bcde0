//! The symbols of an ELF file a process maps: a library's exported functions at their file
//! offsets (what a uprobe is attached at), named symbols from the dynamic and static tables,
//! thread-locals and the slot of the file's TLS module id. A file is mapped, parsed and read in
//! one [`read`], whatever is asked of it.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

use object::{Object, ObjectSegment, ObjectSymbol, RelocationFlags, RelocationTarget, SymbolIndex, SymbolKind};
use thiserror::Error;

/// Pages are 4 KiB on x86-64: a segment's first page is where its mapping starts.
const PAGE_MASK: u64 = !0xfff;

#[derive(Debug, Error)]
pub enum ElfError {
    #[error("cannot read {}: {error}", path.display())]
    Open { path: PathBuf, error: io::Error },
    #[error("cannot map {}: {error}", path.display())]
    Map { path: PathBuf, error: io::Error },
    #[error("{} is not an ELF shared library", path.display())]
    NotElf {
        path: PathBuf,
        #[source]
        source: object::Error,
    },
}

/// Maps the file at `path` and hands it, parsed, to `reading`.
pub fn read<T>(path: &Path, reading: impl FnOnce(&Elf<'_>) -> T) -> Result<T, ElfError> {
    let file = File::open(path).map_err(|error| ElfError::Open { path: path.to_path_buf(), error })?;
    // Mapped, not read: libcuda is hundreds of MiB and libtorch_cpu's static symbol table alone
    // is large, while only headers and symbol tables are needed (attach latency).
    // SAFETY: the mapping is read-only and dropped before returning; a library being replaced
    // under us is written to a new inode by every installer.
    let data =
        unsafe { memmap2::Mmap::map(&file) }.map_err(|error| ElfError::Map { path: path.to_path_buf(), error })?;
    let object = object::File::parse(&*data).map_err(|source| ElfError::NotElf { path: path.to_path_buf(), source })?;
    Ok(reading(&Elf { object, data: &data }))
}

/// A parsed ELF file, for the length of a [`read`].
pub struct Elf<'data> {
    object: object::File<'data>,
    data: &'data [u8],
}

/// A symbol of the static table: its value is an address, or an offset in the TLS block for a
/// thread-local.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Symbol<'data> {
    pub name: &'data str,
    pub address: u64,
    pub size: u64,
}

impl<'data> Elf<'data> {
    /// Up to `length` bytes of the file from `offset` (fewer at its end; none past it): the first
    /// instructions of a function, at the file offset `exported_functions` gives.
    pub fn bytes_at(&self, offset: u64, length: usize) -> &'data [u8] {
        let start = usize::try_from(offset).unwrap_or(usize::MAX).min(self.data.len());
        &self.data[start..(start.saturating_add(length)).min(self.data.len())]
    }

    /// name → file offset of every defined, exported function.
    pub fn exported_functions(&self) -> HashMap<String, u64> {
        let segments: Vec<(u64, u64, u64)> =
            self.object.segments().map(|s| (s.address(), s.size(), s.file_range().0)).collect();
        let mut functions = HashMap::new();
        for symbol in self.object.dynamic_symbols() {
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
        functions
    }

    /// (name, file offset) of the functions of the static symbol table whose (mangled) names
    /// contain one of `parts`, local ones included: a library's internals that it does not export
    /// (PyTorch's caching allocator in libc10_cuda.so). Compiler-split fragments (`.cold`) are
    /// left out: they are not entered by a call.
    pub fn static_functions_containing(&self, parts: &[&str]) -> Vec<(String, u64)> {
        let segments: Vec<(u64, u64, u64)> =
            self.object.segments().map(|s| (s.address(), s.size(), s.file_range().0)).collect();
        let mut functions: Vec<(String, u64)> = Vec::new();
        for symbol in self.object.symbols() {
            if symbol.kind() != SymbolKind::Text || symbol.is_undefined() || symbol.address() == 0 {
                continue;
            }
            let Ok(name) = symbol.name() else { continue };
            if name.contains(".cold") || !parts.iter().any(|part| name.contains(part)) {
                continue;
            }
            let address = symbol.address();
            let Some(&(vaddr, _, file_offset)) =
                segments.iter().find(|(vaddr, size, _)| (*vaddr..vaddr + size).contains(&address))
            else {
                continue;
            };
            let offset = address - vaddr + file_offset;
            if !functions.iter().any(|(_, known)| *known == offset) {
                functions.push((name.to_string(), offset));
            }
        }
        functions.sort_by_key(|(_, offset)| *offset);
        functions
    }

    /// The address of each of `names`, from the dynamic symbol table, else the static one: the
    /// first definition found (a non-zero value).
    pub fn symbol_addresses<const N: usize>(&self, names: [&str; N]) -> [Option<u64>; N] {
        let mut found = [None; N];
        for symbol in self.object.dynamic_symbols().chain(self.object.symbols()) {
            let (Ok(name), address) = (symbol.name(), symbol.address()) else { continue };
            if address == 0 {
                continue;
            }
            if let Some(at) = names.iter().position(|n| *n == name) {
                found[at] = found[at].or(Some(address));
            }
        }
        found
    }

    /// The page the lowest loadable segment starts in: the address, in the file's own address
    /// space, of its mapping from file offset 0. A process's load base minus this is the bias
    /// of every symbol address.
    pub fn first_load_page(&self) -> u64 {
        self.object.segments().map(|s| s.address()).min().unwrap_or(0) & PAGE_MASK
    }

    /// The thread-locals of the static symbol table.
    pub fn thread_locals(&self) -> impl Iterator<Item = Symbol<'data>> + '_ {
        self.object
            .symbols()
            .filter(|s| s.kind() == SymbolKind::Tls)
            .filter_map(|s| Some(Symbol { name: s.name().ok()?, address: s.address(), size: s.size() }))
    }

    /// The GOT slot (an address in the file) the dynamic linker fills with the file's own TLS
    /// module id: what its local-dynamic TLS accesses use, a module-id relocation against no
    /// symbol.
    pub fn tls_module_slot(&self) -> Option<u64> {
        self.object
            .dynamic_relocations()
            .into_iter()
            .flatten()
            .find(|(_, relocation)| {
                relocation.flags() == (RelocationFlags::Elf { r_type: object::elf::R_X86_64_DTPMOD64 })
                    && matches!(
                        relocation.target(),
                        RelocationTarget::Absolute | RelocationTarget::Symbol(SymbolIndex(0))
                    )
            })
            .map(|(offset, _)| offset)
    }
}

#[cfg(test)]
mod tests {
    use std::fs;

    use super::*;

    fn libc() -> &'static Path {
        ["/lib/x86_64-linux-gnu/libc.so.6", "/usr/lib/x86_64-linux-gnu/libc.so.6"]
            .iter()
            .map(Path::new)
            .find(|p| p.exists())
            .expect("libc.so.6 is on every test machine")
    }

    #[test]
    fn finds_libc_functions() {
        let functions = read(libc(), |elf| elf.exported_functions()).unwrap();
        assert!(functions["malloc"] > 0);
        assert_ne!(functions["malloc"], functions["free"]);
    }

    #[test]
    fn a_non_elf_file_is_a_clear_error() {
        let path = std::env::temp_dir().join(format!("gpuprof-not-elf-{}", std::process::id()));
        fs::write(&path, "not an ELF file").unwrap();
        let err = read(&path, |elf| elf.exported_functions()).unwrap_err();
        fs::remove_file(&path).unwrap();
        assert_eq!(err.to_string(), format!("{} is not an ELF shared library", path.display()));
    }

    #[test]
    fn a_missing_file_is_named() {
        let err = read(Path::new("/nonexistent/libcuda.so.1"), |elf| elf.exported_functions()).unwrap_err();
        assert_eq!(err.to_string(), "cannot read /nonexistent/libcuda.so.1: No such file or directory (os error 2)");
    }

    #[test]
    fn named_symbols_are_their_first_definition() {
        let (functions, [malloc, errno, missing]) = read(libc(), |elf| {
            (elf.exported_functions(), elf.symbol_addresses(["malloc", "errno", "no_such_symbol_anywhere"]))
        })
        .unwrap();
        // libc's code is linked where it lies in the file: an address is a file offset.
        assert_eq!(malloc, Some(functions["malloc"]));
        // A thread-local's value is an offset in libc's TLS block.
        assert!(errno.is_some_and(|offset| offset < 0x1000), "{errno:?}");
        assert_eq!(missing, None);
    }

    /// Exported by nothing: an executable's symbols are in its static table alone.
    #[no_mangle]
    static GPUPROF_ELF_TEST_MARK: u64 = 0x5eed;

    #[test]
    fn a_symbol_of_the_static_table_lies_at_its_address_plus_the_load_bias() {
        let exe = std::env::current_exe().unwrap();
        let ([mark], first_page) =
            read(&exe, |elf| (elf.symbol_addresses(["GPUPROF_ELF_TEST_MARK"]), elf.first_load_page())).unwrap();
        let bases = crate::maps::load_bases(&crate::maps::read(std::process::id()).unwrap());
        let name = exe.file_name().unwrap().to_str().unwrap();
        let (base, _) = bases.iter().find(|(_, n)| n == name).unwrap();
        let bias = base - first_page;
        assert_eq!(mark.map(|address| address + bias), Some(std::ptr::addr_of!(GPUPROF_ELF_TEST_MARK) as u64));
    }

    /// A function of this test's executable that nothing exports (a local symbol).
    #[inline(never)]
    fn gpuprof_elf_local_function_mark(x: u64) -> u64 {
        std::hint::black_box(x).wrapping_mul(0x9e37_79b9_7f4a_7c15)
    }

    #[test]
    fn local_functions_are_found_by_a_part_of_their_mangled_name() {
        assert_eq!(gpuprof_elf_local_function_mark(1), 0x9e37_79b9_7f4a_7c15);
        let exe = std::env::current_exe().unwrap();
        let (found, first_page) = read(&exe, |elf| {
            (elf.static_functions_containing(&["gpuprof_elf_local_function_mark"]), elf.first_load_page())
        })
        .unwrap();
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].0.contains("gpuprof_elf_local_function_mark"));
        // A test executable's text lies in the file where it is linked: its offset, plus the load
        // base, is where the function runs.
        let bases = crate::maps::load_bases(&crate::maps::read(std::process::id()).unwrap());
        let name = exe.file_name().unwrap().to_str().unwrap();
        let (base, _) = bases.iter().find(|(_, n)| n == name).unwrap();
        let text = read(&exe, |elf| {
            elf.object
                .segments()
                .find(|s| s.file_range().0 <= found[0].1 && found[0].1 < s.file_range().0 + s.file_range().1)
                .map(|s| s.address() - s.file_range().0)
        })
        .unwrap()
        .unwrap();
        assert_eq!(base - first_page + found[0].1 + text, gpuprof_elf_local_function_mark as *const () as u64);
        let none = read(&exe, |elf| elf.static_functions_containing(&["no_function_is_called_this"])).unwrap();
        assert_eq!(none, Vec::new());
    }
}
