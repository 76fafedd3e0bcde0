//! Backward attribution from inside the process: at each allocator report, what PyTorch's
//! autograd thread-locals say — the node being evaluated (its vtable, `sequence_nr_`,
//! `thread_id_`) or, outside the backward pass, the thread's sequence counter and
//! RecordFunction thread id. The same numbers the eBPF probe reads, found the same way
//! (`gpuprof_pystack::autograd_layout`: the TLS symbols of libtorch_cpu.so) but read here through
//! the dynamic linker's own `__tls_get_addr`, one call per report. The agent matches them to
//! forward lines (`gpuprof_model::forward_stacks::ForwardStacks`).
//!
//! The first report looks for libtorch_cpu.so itself (reading the library's symbol table once,
//! before PyTorch's first block is handed out); after that the sender looks again until it is
//! found or refused, and the calling threads only read what was set: reports made before
//! PyTorch is loaded simply carry none.

use std::collections::HashMap;
use std::ffi::c_void;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use gpuprof_model::shim::AUTOGRAD_VAR;
use gpuprof_pystack::autograd_layout::{node_class, AutogradLayout, LIBRARY, NODE_SEQUENCE_NR, NODE_THREAD_ID};
use gpuprof_pystack::RemoteMemory;

use crate::queue::AutogradState;

/// glibc's `tls_index`: the argument of `__tls_get_addr`.
#[repr(C)]
struct TlsIndex {
    module: u64,
    offset: u64,
}

type TlsGetAddr = unsafe extern "C" fn(*const TlsIndex) -> *mut u8;

struct Reader {
    tls_get_addr: TlsGetAddr,
    /// libtorch_cpu's TLS block, from its start.
    block: TlsIndex,
    layout: AutogradLayout,
}

static READER: OnceLock<Reader> = OnceLock::new();
/// Set once configuring ended without a reader (refused, or switched off): not tried again.
static GAVE_UP: AtomicBool = AtomicBool::new(false);

static CONFIGURING: Mutex<()> = Mutex::new(());
/// Set once the first report tried to configure.
static FIRST_TRY: AtomicBool = AtomicBool::new(false);

/// This thread's autograd state, once libtorch_cpu.so has been found.
pub fn state() -> Option<AutogradState> {
    let reader = match READER.get() {
        Some(reader) => reader,
        None if !FIRST_TRY.swap(true, Ordering::AcqRel) => {
            configure();
            READER.get()?
        }
        None => return None,
    };
    // SAFETY: the dynamic linker's accessor, given the module id it assigned libtorch_cpu.so
    // (loaded for good: PyTorch is never unloaded); it makes the thread's block if it has none.
    let block = unsafe { (reader.tls_get_addr)(&reader.block) } as u64;
    if block == 0 {
        return None;
    }
    let layout = &reader.layout;
    // SAFETY: offsets of this thread's own thread-locals in the block; the node they point to is
    // held by the autograd engine for as long as this thread evaluates it (this call included).
    unsafe {
        let node = read(block + u64::from(layout.current_node));
        if node != 0 {
            return Some(AutogradState {
                node_vtable: read(node),
                seq: read(node + u64::from(NODE_SEQUENCE_NR)),
                thread: read(node + u64::from(NODE_THREAD_ID)),
            });
        }
        Some(AutogradState {
            node_vtable: 0,
            seq: read(block + u64::from(layout.sequence_nr)),
            thread: read(block + u64::from(layout.thread_id)),
        })
    }
}

/// SAFETY: `addr` holds a readable, aligned u64.
unsafe fn read(addr: u64) -> u64 {
    // SAFETY: the caller vouches for `addr`, readable and aligned.
    unsafe { (addr as *const u64).read() }
}

/// Called at the first report, then by the sender while nothing is configured: looks for libtorch_cpu.so among the loaded
/// objects and, found, reads its layout (a refusal is said once, then never tried again).
pub fn configure() {
    // The first report and the sender may both try: one reads the library, the other goes on.
    let Ok(_one_at_a_time) = CONFIGURING.try_lock() else { return };
    if READER.get().is_some() || GAVE_UP.load(Ordering::Relaxed) {
        return;
    }
    if std::env::var(AUTOGRAD_VAR).is_ok_and(|v| v == "0" || v.eq_ignore_ascii_case("off")) {
        GAVE_UP.store(true, Ordering::Relaxed);
        return;
    }
    let Some((path, module)) = loaded_library() else { return };
    let tls_get_addr = {
        // SAFETY: dlsym with RTLD_DEFAULT and a NUL-terminated name.
        let address = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"__tls_get_addr".as_ptr()) };
        if address.is_null() {
            give_up(&format!(
                "the dynamic linker exports no __tls_get_addr: backward-pass blocks of {} get no forward line",
                path.display()
            ));
            return;
        }
        // SAFETY: glibc's `void *__tls_get_addr(tls_index *)`.
        unsafe { std::mem::transmute::<*mut c_void, TlsGetAddr>(address) }
    };
    match AutogradLayout::of_file(&path) {
        Ok(layout) => {
            let _ = READER.set(Reader { tls_get_addr, block: TlsIndex { module, offset: 0 }, layout });
        }
        Err(error) => give_up(&error.to_string()),
    }
}

fn give_up(why: &str) {
    GAVE_UP.store(true, Ordering::Relaxed);
    eprintln!("gpuprof shim: pid {}: {why}", std::process::id());
}

/// True while the sender should keep looking.
pub fn unconfigured() -> bool {
    READER.get().is_none() && !GAVE_UP.load(Ordering::Relaxed)
}

/// The loaded libtorch_cpu.so's path and TLS module id.
fn loaded_library() -> Option<(PathBuf, u64)> {
    crate::loaded::find_map(|info| {
        if info.dlpi_tls_modid == 0 {
            return None;
        }
        let path = PathBuf::from(std::ffi::OsStr::from_bytes(crate::loaded::name(info)?.to_bytes()));
        if path.file_name().is_some_and(|n| n == LIBRARY) {
            Some((path, info.dlpi_tls_modid as u64))
        } else {
            None
        }
    })
}

/// Node class names by vtable, read once each from the RTTI (by the sender, through
/// process_vm_readv on itself: a bad pointer is a missing name, not a crash).
#[derive(Default)]
pub struct NodeNames {
    names: HashMap<u64, Arc<str>>,
}

impl NodeNames {
    pub fn name_of(&mut self, vtable: u64) -> Arc<str> {
        self.names
            .entry(vtable)
            .or_insert_with(|| {
                let own = RemoteMemory { pid: std::process::id() };
                // Unnamed, still a backward block.
                Arc::from(node_class(&own, vtable).unwrap_or_else(|| "Node".to_string()))
            })
            .clone()
    }
}
