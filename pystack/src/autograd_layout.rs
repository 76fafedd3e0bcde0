//! Where PyTorch's autograd keeps what links a backward-pass allocation to its forward line, found
//! in `libtorch_cpu.so` itself rather than tabulated per release:
//!
//! - three thread-locals of libtorch_cpu's TLS block, by their symbol-table names (PyTorch's
//!   wheels keep `.symtab`): the thread's sequence counter (`at::sequence_number`, the number the
//!   next autograd node made on that thread takes), its id as `at::RecordFunction` numbers threads,
//!   and the `std::shared_ptr<Node>` of the node the autograd engine is evaluating;
//! - the library's TLS module id, from the GOT slot its local-dynamic TLS accesses use (an
//!   `R_X86_64_DTPMOD64` relocation against no symbol), read in the running process;
//! - a `torch::autograd::Node`'s `sequence_nr_` and `thread_id_`, at offsets from `NodeHead`, a
//!   mirror of the node's head, and its class name through the vtable's RTTI. Run on PyTorch
//!   2.11; a libtorch_cpu.so without these symbols gets a one-line warning and no attribution.

use std::mem::offset_of;
use std::path::Path;

use gpuprof_procfs::elf::{self, ElfError};
use thiserror::Error;

use crate::memory::Memory;

/// The library whose thread-locals hold autograd's state.
pub const LIBRARY: &str = "libtorch_cpu.so";

/// `at::sequence_number`'s per-thread counter.
const SEQUENCE_NR: &str = "_ZN2at15sequence_number12_GLOBAL__N_112sequence_nr_E";
/// `at::RecordFunction::currentThreadId()`'s per-thread id.
const CURRENT_THREAD_ID: &str = "_ZN2at12_GLOBAL__N_118current_thread_id_E";
/// The thread-local behind `torch::autograd::get_current_node()`: a `C10_DEFINE_TLS_static`
/// (a lambda's `static thread_local std::shared_ptr<Node> var`, 16 bytes, the node first). A
/// PyTorch that holds it in a `c10::intrusive_ptr` lays its nodes out differently: not matched.
const CURRENT_NODE_MARK: &str = "tls_current_evaluating_node";

/// The head of a `torch::autograd::Node` (torch/csrc/autograd/function.h, `struct Node :
/// std::enable_shared_from_this<Node>`), up to the last field read: Node has virtual functions, so
/// the vtable pointer comes first, then its base's `std::weak_ptr<Node>` (the object and the
/// control block), then its own fields in declaration order. Only the offsets are used: nodes
/// live in the other process, read a field at a time.
#[repr(C)]
struct NodeHead {
    vtable: u64,
    weak_this: [u64; 2],
    /// `const uint64_t sequence_nr_`: the number the forward op's thread counter gave the node.
    sequence_nr: u64,
    /// `uint64_t topological_nr_`.
    topological_nr: u64,
    /// `mutable bool has_parent_`.
    has_parent: bool,
    /// `uint64_t thread_id_`: the thread that made the node, as `at::RecordFunction` numbers them.
    thread_id: u64,
}

/// Where a node's `sequence_nr_` and `thread_id_` are.
pub const NODE_SEQUENCE_NR: u16 = offset_of!(NodeHead, sequence_nr) as u16;
pub const NODE_THREAD_ID: u16 = offset_of!(NodeHead, thread_id) as u16;

/// Where one libtorch_cpu.so file keeps autograd's thread-locals.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AutogradLayout {
    /// The GOT slot (an address in the file) the dynamic linker fills with the module id.
    pub module_slot: u64,
    /// Offsets in the library's TLS block.
    pub sequence_nr: u32,
    pub thread_id: u32,
    pub current_node: u32,
}

#[derive(Debug, Error)]
pub enum AutogradError {
    #[error(transparent)]
    Unreadable(#[from] ElfError),
    #[error("{path} has no {what} in its symbol table (a build without one, or a PyTorch that keeps it differently): backward-pass blocks get no forward line")]
    Missing { path: String, what: &'static str },
}

impl AutogradLayout {
    /// Reads the layout from a libtorch_cpu.so file.
    pub fn of_file(path: &Path) -> Result<AutogradLayout, AutogradError> {
        let missing = |what| AutogradError::Missing { path: path.display().to_string(), what };
        let (module_slot, sequence_nr, thread_id, current_node) = elf::read(path, |elf| {
            let (mut sequence_nr, mut thread_id, mut current_node) = (None, None, None);
            for symbol in elf.thread_locals() {
                let offset = u32::try_from(symbol.address).ok();
                if symbol.name == SEQUENCE_NR {
                    sequence_nr = offset;
                } else if symbol.name == CURRENT_THREAD_ID {
                    thread_id = offset;
                } else if symbol.name.contains(CURRENT_NODE_MARK) && symbol.size == 16 {
                    current_node = offset;
                }
            }
            (elf.tls_module_slot(), sequence_nr, thread_id, current_node)
        })?;
        Ok(AutogradLayout {
            module_slot: module_slot.ok_or_else(|| missing("module-local TLS relocation"))?,
            sequence_nr: sequence_nr.ok_or_else(|| missing("at::sequence_number thread-local"))?,
            thread_id: thread_id.ok_or_else(|| missing("at::RecordFunction thread id"))?,
            current_node: current_node.ok_or_else(|| missing("current autograd node thread-local"))?,
        })
    }

    /// The module id the dynamic linker gave the library in a process where it is loaded at
    /// `base` (the address of its file offset 0).
    pub fn module_id(&self, memory: &impl Memory, base: u64) -> Option<u64> {
        memory.read_u64(base + self.module_slot).ok().filter(|&id| id > 0 && id < 1 << 20)
    }
}

/// A node's class name ("AddmmBackward0") from its vtable: the RTTI object sits just before the
/// first virtual function, and its second word is the mangled name
/// (`N5torch8autograd9generated14AddmmBackward0E`).
pub fn node_class(memory: &impl Memory, vtable: u64) -> Option<String> {
    let type_info = memory.read_u64(vtable.checked_sub(8)?).ok()?;
    let name = memory.read_u64(type_info.checked_add(8)?).ok()?;
    let raw = read_c_string(memory, name, 256)?;
    last_name_component(std::str::from_utf8(&raw).ok()?)
}

/// A NUL-terminated string of at most `max` bytes, read a page at a time (the string may end just
/// before an unmapped page).
fn read_c_string(memory: &impl Memory, addr: u64, max: usize) -> Option<Vec<u8>> {
    const PAGE: u64 = 4096;
    let mut out = Vec::new();
    let mut at = addr;
    while out.len() < max {
        let len = ((PAGE - at % PAGE) as usize).min(max - out.len());
        let chunk = memory.read_vec(at, len).ok()?;
        if let Some(end) = chunk.iter().position(|&b| b == 0) {
            out.extend_from_slice(&chunk[..end]);
            return Some(out);
        }
        out.extend_from_slice(&chunk);
        at += len as u64;
    }
    None
}

/// The innermost name of an Itanium-mangled type name: `AddmmBackward0` of
/// `N5torch8autograd9generated14AddmmBackward0E`, `PyNode` of `N5torch8autograd6PyNodeE`.
fn last_name_component(mangled: &str) -> Option<String> {
    let mut rest = mangled.strip_prefix('N').map_or(mangled, |r| r.strip_suffix('E').unwrap_or(r));
    let mut last = None;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        let len: usize = rest[..digits].parse().ok()?;
        let name = rest.get(digits..digits + len)?;
        last = Some(name);
        rest = &rest[digits + len..];
    }
    last.map(str::to_string)
}

#[cfg(test)]
mod tests {
    //! Class names from mangled names, and the node head against the libtorch stand-in's
    //! (testkit/fixtures/libtorch_cpu_standin.h, compiled by cc): the backward-attribution tests
    //! run against that stand-in, so a change on either side fails here, not as a wrong node there.

    use gpuprof_testkit::standin_values;

    use super::*;

    #[test]
    fn the_node_head_is_laid_out_as_pytorch_and_the_libtorch_standin_lay_it_out() {
        let ours = [
            offset_of!(NodeHead, vtable),
            offset_of!(NodeHead, weak_this),
            offset_of!(NodeHead, sequence_nr),
            offset_of!(NodeHead, topological_nr),
            offset_of!(NodeHead, has_parent),
            offset_of!(NodeHead, thread_id),
        ];
        // function.h's, on x86-64: 8-byte pointers, the bool padded to the next u64.
        assert_eq!(ours, [0, 8, 24, 32, 40, 48]);
        assert_eq!((NODE_SEQUENCE_NR, NODE_THREAD_ID), (24, 48));
        let standin = standin_values(
            "libtorch_cpu_standin.h",
            &[
                "offsetof(struct node, vtable)",
                "offsetof(struct node, weak_this)",
                "offsetof(struct node, sequence_nr)",
                "offsetof(struct node, topological_nr)",
                "offsetof(struct node, has_parent)",
                "offsetof(struct node, thread_id)",
            ],
        );
        assert_eq!(standin, ours);
    }

    #[test]
    fn class_names_from_mangled_type_names() {
        assert_eq!(
            last_name_component("N5torch8autograd9generated14AddmmBackward0E").as_deref(),
            Some("AddmmBackward0")
        );
        assert_eq!(last_name_component("N5torch8autograd6PyNodeE").as_deref(), Some("PyNode"));
        assert_eq!(last_name_component("14AccumulateGrad").as_deref(), Some("AccumulateGrad"));
        assert_eq!(last_name_component("N5torch8autograd99tooshortE"), None);
    }
}
