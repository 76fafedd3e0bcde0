//! The device of a driver call that names none (an allocation, an IPC open, a free): that of the
//! context CUPTI reports the call under — the driver context current to the calling thread —
//! as `cuCtxGetDevice` tells it. eBPF capture learns the same from the context's creation, so a
//! sidecar's events carry their device as the daemon's do.

use std::ffi::c_int;
use std::sync::OnceLock;

type CtxGetDevice = unsafe extern "C" fn(*mut c_int) -> c_int;

/// `cuCtxGetDevice` of the libcuda already loaded (CUPTI's callbacks come from it).
fn entry() -> Option<CtxGetDevice> {
    static ENTRY: OnceLock<Option<CtxGetDevice>> = OnceLock::new();
    *ENTRY.get_or_init(|| {
        // SAFETY: RTLD_NOLOAD only takes a handle to an object already loaded.
        let handle = unsafe { libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOLOAD | libc::RTLD_LAZY) };
        if handle.is_null() {
            return None;
        }
        // SAFETY: a live handle and a NUL-terminated name.
        let address = unsafe { libc::dlsym(handle, c"cuCtxGetDevice".as_ptr()) };
        // SAFETY: `CUresult cuCtxGetDevice(CUdevice *device)` in every CUDA (cuda.h).
        (!address.is_null()).then(|| unsafe { std::mem::transmute::<*mut libc::c_void, CtxGetDevice>(address) })
    })
}

/// The device of the calling thread's current context; `None` without one.
pub fn current() -> Option<i32> {
    let get = entry()?;
    let mut device: c_int = -1;
    // SAFETY: a valid out-pointer; the driver is not re-entered through CUPTI (only the memory
    // entry points are subscribed).
    (unsafe { get(&mut device) } == 0 && device >= 0).then_some(device)
}
