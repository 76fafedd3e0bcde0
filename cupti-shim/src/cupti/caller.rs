//! Which module called the driver, seen from inside a CUPTI callback: the first return address on
//! the calling thread's stack outside the shim, CUPTI and libcuda — what the eBPF probe takes from
//! the entry point's return address — and whether PyTorch's caching allocator made the call
//! (a frame of libc10_cuda.so further out: its segments, `gpuprof_model::framework`; the eBPF
//! probes tell the same from the allocator's segment functions). The stack is unwound with glibc's
//! `backtrace` (their `.eh_frame`s): a few microseconds, paid on driver memory calls only, which
//! are rare next to the allocator's reports. The address is named by the sender (`module_of`).

use std::ffi::{c_void, CStr};

use gpuprof_model::framework::is_pytorch_cuda_library;
use std::sync::Arc;

/// Return addresses looked at, from the callback outwards.
const DEPTH: usize = 48;

/// Who made the driver call a CUPTI callback sees.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Caller {
    /// The return address into the module that called the driver; 0 when the unwinder could not
    /// get past the driver's frames.
    pub return_address: u64,
    /// A frame of PyTorch's libc10_cuda.so lies further out: its caching allocator made the call.
    pub pytorch_allocator: bool,
}

/// The calling thread's stack, read outwards from this callback.
pub fn of_this_call() -> Caller {
    let mut frames = [std::ptr::null_mut::<c_void>(); DEPTH];
    // SAFETY: backtrace writes at most DEPTH addresses.
    let count = unsafe { libc::backtrace(frames.as_mut_ptr(), DEPTH as libc::c_int) }.max(0) as usize;
    let own = object_of(of_this_call as *const c_void).map(|(base, _)| base);
    let mut caller = Caller::default();
    let mut inside_driver = false;
    for &frame in &frames[..count] {
        let Some((base, name)) = object_of(frame) else {
            // Code outside every object (generated code): a caller only once the driver was passed.
            if inside_driver && caller.return_address == 0 {
                caller.return_address = frame as u64;
            }
            continue;
        };
        if Some(base) == own {
            continue;
        }
        if caller.return_address == 0 && is_driver_side(name) {
            inside_driver = true;
            continue;
        }
        if inside_driver && caller.return_address == 0 {
            caller.return_address = frame as u64;
        }
        if caller.return_address != 0 && file_name(name).is_some_and(is_pytorch_cuda_library) {
            caller.pytorch_allocator = true;
            break;
        }
    }
    caller
}

fn file_name(name: &CStr) -> Option<&str> {
    std::str::from_utf8(name.to_bytes().rsplit(|&b| b == b'/').next()?).ok()
}

/// libcuda and CUPTI: the frames between the shim's callback and the driver's caller.
fn is_driver_side(name: &CStr) -> bool {
    let base = name.to_bytes().rsplit(|&b| b == b'/').next().unwrap_or_default();
    base.starts_with(b"libcuda.so") || base.starts_with(b"libcupti")
}

/// The base and file name of the object holding `addr`.
fn object_of(addr: *const c_void) -> Option<(usize, &'static CStr)> {
    // SAFETY: Dl_info is pointers and integers, for which all zeros (null) is a value.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: dladdr fills `info` for an address of a loaded object and returns 0 otherwise.
    if unsafe { libc::dladdr(addr, &mut info) } == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: the loader's NUL-terminated name of a loaded object, kept while it stays loaded.
    Some((info.dli_fbase as usize, unsafe { CStr::from_ptr(info.dli_fname) }))
}

/// The file name of the module holding `addr` ("libnccl.so.2"); the main program's is read from
/// /proc (the loader names it "").
pub fn module_of(addr: u64) -> Option<Arc<str>> {
    if addr == 0 {
        return None;
    }
    let (_, name) = object_of(addr as *const c_void)?;
    let name = name.to_string_lossy();
    let file = match name.rsplit('/').next().filter(|n| !n.is_empty()) {
        Some(file) => file.to_string(),
        None => std::fs::read_link("/proc/self/exe").ok()?.file_name()?.to_string_lossy().into_owned(),
    };
    Some(Arc::from(file))
}
