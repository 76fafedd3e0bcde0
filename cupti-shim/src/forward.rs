//! The real `c10::reportMemoryUsageToProfiler`, to forward every interposed call to (PyTorch's
//! profiler records memory through it). libc10.so is loaded by Python with `RTLD_LOCAL`, so
//! `dlsym(RTLD_NEXT)` does not see it: the loaded objects are searched for it by name instead.

use std::ffi::{c_char, c_void, CStr};
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};

/// `gpuprof_model::shim::ALLOCATOR_SYMBOL`, NUL-terminated for the loader.
pub const SYMBOL: &CStr = match CStr::from_bytes_with_nul(concat!(gpuprof_model::allocator_symbol!(), "\0").as_bytes())
{
    Ok(symbol) => symbol,
    Err(_) => panic!("a symbol name has no NUL inside"),
};

/// The real function's type: (ptr, alloc_size, total_allocated, total_reserved, device).
pub type ReportFn = unsafe extern "C" fn(*mut c_void, i64, usize, usize, u16);

static REAL: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
static SEARCHED: AtomicBool = AtomicBool::new(false);

/// The real function, looked up on the first call (libc10 is loaded by then: its caller needs it).
pub fn real(ours: *const c_void) -> Option<ReportFn> {
    let mut found = REAL.load(Ordering::Acquire);
    if found.is_null() && !SEARCHED.swap(true, Ordering::AcqRel) {
        found = search(ours);
        REAL.store(found, Ordering::Release);
    }
    // SAFETY: a non-null value is the address of a function of exactly this signature.
    (!found.is_null()).then(|| unsafe { std::mem::transmute::<*mut c_void, ReportFn>(found) })
}

fn search(ours: *const c_void) -> *mut c_void {
    crate::loaded::find_map(|info| {
        let name = crate::loaded::name(info)?;
        if !name.to_bytes().ends_with(b"/libc10.so") {
            return None;
        }
        // SAFETY: RTLD_NOLOAD only takes a handle to an object already loaded.
        let handle = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOLOAD | libc::RTLD_LAZY) };
        if handle.is_null() {
            return None;
        }
        // SAFETY: handle is valid; SYMBOL is NUL-terminated.
        let address = unsafe { libc::dlsym(handle, SYMBOL.as_ptr() as *const c_char) };
        (!address.is_null() && !std::ptr::eq(address, ours)).then_some(address)
    })
    .unwrap_or(std::ptr::null_mut())
}
