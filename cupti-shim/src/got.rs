//! Redirecting imports of `c10::reportMemoryUsageToProfiler` already bound in loaded libraries.
//! Loaded as an injection library (`CUDA_INJECTION64_PATH`: the driver dlopens it at `cuInit`,
//! after PyTorch's libraries), the shim is not in the global symbol scope, so no import resolves
//! to it: each loaded object that imports the symbol gets its GOT slot pointed at the shim's
//! definition instead (made writable for the write when RELRO protects it).

use std::ffi::{c_void, CStr};

/// x86-64 relocation types that bind an imported function's address into a GOT slot.
const R_X86_64_GLOB_DAT: u32 = 6;
const R_X86_64_JUMP_SLOT: u32 = 7;
const DT_NULL: i64 = 0;
const DT_PLTRELSZ: i64 = 2;
const DT_STRTAB: i64 = 5;
const DT_SYMTAB: i64 = 6;
const DT_RELA: i64 = 7;
const DT_RELASZ: i64 = 8;
const DT_JMPREL: i64 = 23;

#[repr(C)]
struct Rela {
    offset: u64,
    info: u64,
    addend: i64,
}

#[repr(C)]
struct Sym {
    name: u32,
    info: u8,
    other: u8,
    shndx: u16,
    value: u64,
    size: u64,
}

/// Points every loaded import of `symbol` at `target`; returns how many slots were changed.
pub fn redirect(symbol: &CStr, target: *const c_void) -> usize {
    let mut changed = 0;
    crate::loaded::find_map(|info| {
        // SAFETY: the object is loaded and its dynamic section mapped while the loader iterates.
        changed += unsafe { redirect_in(info, symbol, target) };
        None::<()>
    });
    changed
}

/// SAFETY: `info` describes a loaded object.
unsafe fn redirect_in(info: &libc::dl_phdr_info, symbol: &CStr, target: *const c_void) -> usize {
    let base = info.dlpi_addr;
    // SAFETY: dlpi_phdr has dlpi_phnum entries.
    let headers = unsafe { std::slice::from_raw_parts(info.dlpi_phdr, usize::from(info.dlpi_phnum)) };
    let Some(dynamic) = headers.iter().find(|h| h.p_type == libc::PT_DYNAMIC) else { return 0 };
    let mut entry = (base + dynamic.p_vaddr) as *const [i64; 2];
    let (mut strtab, mut symtab, mut rela, mut rela_size, mut jmprel, mut jmprel_size) =
        (0u64, 0u64, 0u64, 0u64, 0u64, 0u64);
    loop {
        // SAFETY: the dynamic section is a DT_NULL-terminated array of (tag, value).
        let [tag, value] = unsafe { *entry };
        match tag {
            DT_NULL => break,
            DT_STRTAB => strtab = value as u64,
            DT_SYMTAB => symtab = value as u64,
            DT_RELA => rela = value as u64,
            DT_RELASZ => rela_size = value as u64,
            DT_JMPREL => jmprel = value as u64,
            DT_PLTRELSZ => jmprel_size = value as u64,
            _ => {}
        }
        // SAFETY: still inside the array until DT_NULL.
        entry = unsafe { entry.add(1) };
    }
    if strtab == 0 || symtab == 0 {
        return 0;
    }
    // The loader rewrites these to addresses in most objects; in others they stay offsets.
    let absolute = |value: u64| if value < base { value + base } else { value };
    let (strtab, symtab) = (absolute(strtab), absolute(symtab));
    let mut changed = 0;
    for (table, size) in [(rela, rela_size), (jmprel, jmprel_size)] {
        if table == 0 || size == 0 {
            continue;
        }
        let count = size as usize / std::mem::size_of::<Rela>();
        // SAFETY: the table holds `count` relocations.
        let relocations = unsafe { std::slice::from_raw_parts(absolute(table) as *const Rela, count) };
        for relocation in relocations {
            let kind = (relocation.info & 0xffff_ffff) as u32;
            if kind != R_X86_64_JUMP_SLOT && kind != R_X86_64_GLOB_DAT {
                continue;
            }
            let index = (relocation.info >> 32) as usize;
            // SAFETY: the relocation names a symbol of this object's table, whose name is in strtab.
            let name = unsafe {
                let sym = &*((symtab as *const Sym).add(index));
                CStr::from_ptr((strtab + u64::from(sym.name)) as *const libc::c_char)
            };
            if name != symbol {
                continue;
            }
            let slot = (base + relocation.offset) as *mut *const c_void;
            let in_relro = headers.iter().any(|h| {
                h.p_type == libc::PT_GNU_RELRO
                    && (base + h.p_vaddr..base + h.p_vaddr + h.p_memsz).contains(&(slot as u64))
            });
            // SAFETY: the slot is this object's GOT entry for the symbol.
            if unsafe { write_slot(slot, target, in_relro) } {
                changed += 1;
            }
        }
    }
    changed
}

/// Writes a GOT slot, lifting RELRO's read-only protection for the write and putting it back.
/// SAFETY: `slot` is a mapped, aligned GOT entry.
unsafe fn write_slot(slot: *mut *const c_void, target: *const c_void, in_relro: bool) -> bool {
    // SAFETY: reading the slot's current value.
    if unsafe { slot.read_volatile() } == target {
        return false;
    }
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
    let start = (slot as usize) & !(page - 1);
    // SAFETY: changing the protection of the page holding the slot, then writing one pointer.
    unsafe {
        if libc::mprotect(start as *mut c_void, page, libc::PROT_READ | libc::PROT_WRITE) != 0 {
            return false;
        }
        slot.write_volatile(target);
        if in_relro {
            libc::mprotect(start as *mut c_void, page, libc::PROT_READ);
        }
    }
    true
}
