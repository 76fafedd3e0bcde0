//! Which module called the driver: the return address of a driver call, named by the file mapped
//! there in the calling process (libnccl.so.2, libcublasLt.so.13, libcudart.so.13, a user's
//! extension). Each process's code mappings are read once, and again when an address falls
//! outside them (a library loaded since); an address still outside them then (code in anonymous
//! memory) is remembered and not looked up again. The maps are read while the process lives: a
//! process gone before its records are decoded has no caller modules.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use gpuprof_procfs::maps::{self, CodeMap};

#[derive(Default)]
pub(crate) struct CallerModules {
    processes: HashMap<u32, ProcessCode>,
}

struct ProcessCode {
    code: CodeMap,
    /// Addresses outside every file mapping at the last reading.
    outside: HashSet<u64>,
}

impl CallerModules {
    pub(crate) fn module_of(&mut self, pid: u32, addr: u64) -> Option<Arc<str>> {
        if addr == 0 {
            return None;
        }
        let known = self.processes.get(&pid);
        if let Some(module) = known.and_then(|p| p.code.module_at(addr)) {
            return Some(module);
        }
        if known.is_some_and(|p| p.outside.contains(&addr)) {
            return None;
        }
        let code = CodeMap::new(&maps::read(pid).unwrap_or_default(), known.map(|p| &p.code));
        let found = code.module_at(addr);
        let mut process = ProcessCode { code, outside: HashSet::new() };
        if found.is_none() {
            process.outside.insert(addr);
        }
        self.processes.insert(pid, process);
        found
    }

    /// The process ended or runs another program.
    pub(crate) fn forget(&mut self, pid: u32) {
        self.processes.remove(&pid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_this_process_own_code_and_nothing_outside_it() {
        let mut callers = CallerModules::default();
        let me = std::process::id();
        let here = names_this_process_own_code_and_nothing_outside_it as fn() as usize as u64;
        let exe = std::env::current_exe().unwrap();
        let name = exe.file_name().unwrap().to_str().unwrap();
        assert_eq!(callers.module_of(me, here).as_deref(), Some(name));
        assert_eq!(callers.module_of(me, 0), None);
        assert_eq!(callers.module_of(me, 8), None);
        let libc = libc_address();
        assert!(callers.module_of(me, libc).unwrap().starts_with("libc.so"));
    }

    fn libc_address() -> u64 {
        extern "C" {
            fn getpid() -> i32;
        }
        getpid as unsafe extern "C" fn() -> i32 as usize as u64
    }
}
