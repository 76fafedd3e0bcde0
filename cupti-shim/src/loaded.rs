//! The objects the dynamic loader has loaded, walked in one place (`dl_iterate_phdr`): the parts
//! that look for a library by name (libc10, libtorch_cpu, libcupti) and the one that rebinds
//! imports (`got`) all walk through here.

use std::ffi::{c_int, c_void, CStr};

/// Calls `each` with every loaded object's description, in the loader's order, until it returns
/// something; that is returned (None when no object gave anything).
pub fn find_map<T>(mut each: impl FnMut(&libc::dl_phdr_info) -> Option<T>) -> Option<T> {
    struct Walk<'a, T> {
        each: &'a mut dyn FnMut(&libc::dl_phdr_info) -> Option<T>,
        found: Option<T>,
    }
    unsafe extern "C" fn visit<T>(info: *mut libc::dl_phdr_info, _size: usize, data: *mut c_void) -> c_int {
        // SAFETY: the loader passes a valid info; data is our Walk, alive for the whole iteration.
        let (info, walk) = unsafe { (&*info, &mut *(data as *mut Walk<T>)) };
        match (walk.each)(info) {
            Some(found) => {
                walk.found = Some(found);
                1
            }
            None => 0,
        }
    }
    let mut walk = Walk { each: &mut each, found: None };
    // SAFETY: the callback only hands the loader's descriptions to `each`, during the call.
    unsafe { libc::dl_iterate_phdr(Some(visit::<T>), &mut walk as *mut Walk<T> as *mut c_void) };
    walk.found
}

/// The object's path (None for the main program's empty name's null, as some loaders give it).
pub fn name(info: &libc::dl_phdr_info) -> Option<&CStr> {
    // SAFETY: a non-null dlpi_name is a NUL-terminated path owned by the loader while it iterates.
    (!info.dlpi_name.is_null()).then(|| unsafe { CStr::from_ptr(info.dlpi_name) })
}
