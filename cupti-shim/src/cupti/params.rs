//! Reading a driver call's values out of CUPTI's `functionParams`: a struct of the call's
//! arguments in order, which CUPTI declares for every entry point (`generated_cuda_meta.h`:
//! `cuMemAlloc_v2_params { CUdeviceptr *dptr; size_t bytesize; }`). They are mirrored here with
//! the headers' names; entry points whose arguments begin alike share one `ArgLayout` and are
//! read through one struct (the tests check every entry point's struct against cudarc's
//! declarations of the headers). Enum arguments are plain numbers here: a Rust enum holding a
//! value it does not list would be UB. Outputs are read at the call's exit, and only when it
//! succeeded (a failed call leaves them unwritten).

// The names are the headers'.
#![allow(non_camel_case_types, non_snake_case)]

use std::ffi::{c_int, c_uint, c_ulonglong, c_void};

use gpuprof_model::driver_api::{ArgLayout, CallValues, HANDLE_LEN};

type CUdeviceptr = u64;
type CUdeviceptr_v1 = c_uint;
type CUdevice = c_int;
type CUcontext = *mut c_void;
type CUmemoryPool = *mut c_void;
type CUmemGenericAllocationHandle = u64;
/// An enum in the headers.
type CUmemAllocationHandleType = c_uint;

/// `CUmemAllocationHandleType` values whose handle is a struct, not the pointer value itself.
const HANDLE_TYPE_POSIX_FD: CUmemAllocationHandleType = 1;
const HANDLE_TYPE_FABRIC: CUmemAllocationHandleType = 8;

#[repr(C)]
#[derive(Clone, Copy)]
struct CUipcMemHandle {
    reserved: [u8; HANDLE_LEN],
}

/// `CUmemPoolPtrExportData` is, like `CUipcMemHandle`, 64 opaque bytes.
type CUmemPoolPtrExportData = CUipcMemHandle;

/// `cuMemCreate`'s properties, up to the device they name (the struct goes on).
#[repr(C)]
#[derive(Clone, Copy)]
struct CUmemAllocationProp {
    r#type: c_uint,
    requestedHandleTypes: CUmemAllocationHandleType,
    location: CUmemLocation,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct CUmemLocation {
    r#type: c_uint,
    id: c_int,
}

/// `OutPtrSize`: also cuMemAllocManaged, cuMemAllocHost_v2 and cuMemHostAlloc (`pp`), the
/// stream-ordered allocations, cuMemAddressReserve (`ptr`, `size`).
#[repr(C)]
#[derive(Clone, Copy)]
struct cuMemAlloc_v2_params {
    dptr: *mut CUdeviceptr,
    bytesize: usize,
}

/// `OutPtrSize32`.
#[repr(C)]
#[derive(Clone, Copy)]
struct cuMemAllocHost_params {
    pp: *mut *mut c_void,
    bytesize: c_uint,
}

/// `OutPtr32Size32`.
#[repr(C)]
#[derive(Clone, Copy)]
struct cuMemAlloc_params {
    dptr: *mut CUdeviceptr_v1,
    bytesize: c_uint,
}

/// `OutPitch`.
#[repr(C)]
#[derive(Clone, Copy)]
struct cuMemAllocPitch_v2_params {
    dptr: *mut CUdeviceptr,
    pPitch: *mut usize,
    WidthInBytes: usize,
    Height: usize,
    ElementSizeBytes: c_uint,
}

/// `OutPitch32`.
#[repr(C)]
#[derive(Clone, Copy)]
struct cuMemAllocPitch_params {
    dptr: *mut CUdeviceptr_v1,
    pPitch: *mut c_uint,
    WidthInBytes: c_uint,
    Height: c_uint,
    ElementSizeBytes: c_uint,
}

/// `Ptr`: also cuMemFreeHost and cuMemHostUnregister (`p`), cuMemFreeAsync, cuMemRelease
/// (`handle`), cuIpcCloseMemHandle, cuCtxDestroy (`ctx`).
#[repr(C)]
#[derive(Clone, Copy)]
struct cuMemFree_v2_params {
    dptr: CUdeviceptr,
}

/// `Ptr32`.
#[repr(C)]
#[derive(Clone, Copy)]
struct cuMemFree_params {
    dptr: CUdeviceptr_v1,
}

/// `PtrSize`: also cuMemUnmap, cuMemHostRegister (`p`, `bytesize`).
#[repr(C)]
#[derive(Clone, Copy)]
struct cuMemAddressFree_params {
    ptr: CUdeviceptr,
    size: usize,
}

/// `VmmCreate`.
#[repr(C)]
#[derive(Clone, Copy)]
struct cuMemCreate_params {
    handle: *mut CUmemGenericAllocationHandle,
    size: usize,
    prop: *const CUmemAllocationProp,
    flags: c_ulonglong,
}

/// `VmmMap`.
#[repr(C)]
#[derive(Clone, Copy)]
struct cuMemMap_params {
    ptr: CUdeviceptr,
    size: usize,
    offset: usize,
    handle: CUmemGenericAllocationHandle,
    flags: c_ulonglong,
}

/// `IpcGet`, and `PoolExport` (cuMemPoolExportPointer: `shareData_out`, `ptr`).
#[repr(C)]
#[derive(Clone, Copy)]
struct cuIpcGetMemHandle_params {
    pHandle: *mut CUipcMemHandle,
    dptr: CUdeviceptr,
}

/// `IpcOpen`: the handle is in the struct, by value.
#[repr(C)]
#[derive(Clone, Copy)]
struct cuIpcOpenMemHandle_v2_params {
    pdptr: *mut CUdeviceptr,
    handle: CUipcMemHandle,
    Flags: c_uint,
}

/// `PoolImport`.
#[repr(C)]
#[derive(Clone, Copy)]
struct cuMemPoolImportPointer_params {
    ptr_out: *mut CUdeviceptr,
    pool: CUmemoryPool,
    shareData: *mut CUmemPoolPtrExportData,
}

/// `ShareableExport`.
#[repr(C)]
#[derive(Clone, Copy)]
struct cuMemExportToShareableHandle_params {
    shareableHandle: *mut c_void,
    handle: CUmemGenericAllocationHandle,
    handleType: CUmemAllocationHandleType,
    flags: c_ulonglong,
}

/// `ShareableImport`.
#[repr(C)]
#[derive(Clone, Copy)]
struct cuMemImportFromShareableHandle_params {
    handle: *mut CUmemGenericAllocationHandle,
    osHandle: *mut c_void,
    shHandleType: CUmemAllocationHandleType,
}

/// `CtxRetain`.
#[repr(C)]
#[derive(Clone, Copy)]
struct cuDevicePrimaryCtxRetain_params {
    pctx: *mut CUcontext,
    dev: CUdevice,
}

/// `CtxCreate { device_arg: 2 }`: also cuCtxCreate.
#[repr(C)]
#[derive(Clone, Copy)]
struct cuCtxCreate_v2_params {
    pctx: *mut CUcontext,
    flags: c_uint,
    dev: CUdevice,
}

/// `CtxCreate { device_arg: 4 }`.
#[repr(C)]
#[derive(Clone, Copy)]
struct cuCtxCreate_v3_params {
    pctx: *mut CUcontext,
    paramsArray: *mut c_void,
    numParams: c_int,
    flags: c_uint,
    dev: CUdevice,
}

/// `CtxCreate { device_arg: 3 }`.
#[repr(C)]
#[derive(Clone, Copy)]
struct cuCtxCreate_v4_params {
    pctx: *mut CUcontext,
    ctxCreateParams: *mut c_void,
    flags: c_uint,
    dev: CUdevice,
}

/// `Device`: also cuDevicePrimaryCtxRelease.
#[repr(C)]
#[derive(Clone, Copy)]
struct cuDevicePrimaryCtxRelease_v2_params {
    dev: CUdevice,
}

/// `MemInfo`.
#[repr(C)]
#[derive(Clone, Copy)]
struct cuMemGetInfo_v2_params {
    free: *mut usize,
    total: *mut usize,
}

/// `MemInfo32`.
#[repr(C)]
#[derive(Clone, Copy)]
struct cuMemGetInfo_params {
    free: *mut c_uint,
    total: *mut c_uint,
}

/// The argument struct at `params`, as `T`. SAFETY: `params` is the struct of a call whose
/// arguments begin as `T`'s fields do, alive for the callback.
unsafe fn arguments<T: Copy>(params: *const c_void) -> T {
    // SAFETY: the caller vouches that `params` begins as `T` does; an unaligned read asks no more.
    unsafe { params.cast::<T>().read_unaligned() }
}

/// What an output argument points at; 0 when the caller passed none.
/// SAFETY: `output` is null or was written by the call (it succeeded).
unsafe fn written<T: Copy + Into<u64>>(output: *const T) -> u64 {
    if output.is_null() {
        0
    } else {
        // SAFETY: not null, so the caller vouches that the call wrote a `T` there.
        unsafe { output.read_unaligned() }.into()
    }
}

/// Up to HANDLE_LEN bytes at `address`; zeros when it is null.
/// SAFETY: a non-null `address` holds `len` readable bytes.
unsafe fn bytes_at(address: *const c_void, len: usize) -> [u8; HANDLE_LEN] {
    let mut bytes = [0u8; HANDLE_LEN];
    if !address.is_null() {
        // SAFETY: not null, so `len` bytes are readable there; at most HANDLE_LEN are copied, which
        // `bytes` holds, and a local array cannot overlap them.
        unsafe { std::ptr::copy_nonoverlapping(address.cast::<u8>(), bytes.as_mut_ptr(), len.min(HANDLE_LEN)) };
    }
    bytes
}

/// Bytes of a shareable handle of this type in the call's handle argument.
fn shareable_len(handle_type: CUmemAllocationHandleType) -> u8 {
    match handle_type {
        HANDLE_TYPE_FABRIC => HANDLE_LEN as u8,
        HANDLE_TYPE_POSIX_FD => 4,
        _ => 8,
    }
}

/// Fills `call` (result already set) from the argument struct at `params`.
/// SAFETY: `params` is the `functionParams` CUPTI passed for an entry point of layout `layout`,
/// read in its exit callback.
pub unsafe fn read(layout: ArgLayout, params: *const c_void, call: &mut CallValues) {
    let ok = call.result == 0;
    call.device = -1;
    // SAFETY: each family is handed only its own layouts; `params` is this layout's struct. The
    // families read outputs only when the call succeeded and wrote them, and inputs point at what
    // the caller gave the driver to read.
    unsafe {
        match layout {
            ArgLayout::OutPtrSize | ArgLayout::VmmCreate | ArgLayout::OutPtrSize32 | ArgLayout::OutPtr32Size32 => {
                read_allocation(layout, params, call, ok)
            }
            ArgLayout::OutPitch | ArgLayout::OutPitch32 => read_pitched_allocation(layout, params, call, ok),
            ArgLayout::Ptr | ArgLayout::Ptr32 | ArgLayout::PtrSize | ArgLayout::VmmMap => {
                read_given_address(layout, params, call)
            }
            ArgLayout::IpcGet | ArgLayout::PoolExport | ArgLayout::IpcOpen | ArgLayout::PoolImport => {
                read_ipc_handle(layout, params, call, ok)
            }
            ArgLayout::ShareableExport | ArgLayout::ShareableImport => read_shareable_handle(layout, params, call, ok),
            ArgLayout::CtxRetain | ArgLayout::CtxCreate { .. } | ArgLayout::Device => {
                read_context(layout, params, call, ok)
            }
            ArgLayout::MemInfo | ArgLayout::MemInfo32 => read_memory_info(layout, params, call, ok),
        }
    }
}

/// A layout handed to a family that does not read it: `read`'s dispatch is wrong.
fn not_in_family(layout: ArgLayout, family: &str) -> ! {
    unreachable!("{layout:?} is not read as {family}")
}

/// A new allocation (or VMM handle): its size, and what the call handed back.
/// SAFETY: as `read`'s, for one of this family's layouts.
unsafe fn read_allocation(layout: ArgLayout, params: *const c_void, call: &mut CallValues, ok: bool) {
    // SAFETY: `read` hands this family only its own layouts, so `params` is the struct read here
    // (the caller's contract); a non-null input points at what the application gave the driver to
    // read, and outputs are read only when `ok`, once the driver has written them.
    unsafe {
        match layout {
            ArgLayout::OutPtrSize => {
                let p: cuMemAlloc_v2_params = arguments(params);
                call.size = p.bytesize as u64;
                if ok {
                    call.addr = written(p.dptr);
                }
            }
            ArgLayout::VmmCreate => {
                let p: cuMemCreate_params = arguments(params);
                call.size = p.size as u64;
                if ok {
                    call.addr = written(p.handle);
                }
                if !p.prop.is_null() {
                    call.device = p.prop.read_unaligned().location.id;
                }
            }
            ArgLayout::OutPtrSize32 => {
                let p: cuMemAllocHost_params = arguments(params);
                call.size = u64::from(p.bytesize);
                if ok {
                    // The pointer written, as its address.
                    call.addr = written(p.pp.cast::<u64>());
                }
            }
            ArgLayout::OutPtr32Size32 => {
                let p: cuMemAlloc_params = arguments(params);
                call.size = u64::from(p.bytesize);
                if ok {
                    call.addr = written(p.dptr);
                }
            }
            _ => not_in_family(layout, "an allocation"),
        }
    }
}

/// A pitched allocation: its size is the pitch the driver chose times the rows, once it chose
/// one; the width asked for, before.
/// SAFETY: as `read`'s, for one of this family's layouts.
unsafe fn read_pitched_allocation(layout: ArgLayout, params: *const c_void, call: &mut CallValues, ok: bool) {
    // SAFETY: `read` hands this family only its own layouts, so `params` is the struct read here
    // (the caller's contract); outputs are read only when `ok`, once the driver has written them.
    unsafe {
        match layout {
            ArgLayout::OutPitch => {
                let p: cuMemAllocPitch_v2_params = arguments(params);
                if ok {
                    call.addr = written(p.dptr);
                    call.aux = written(p.pPitch.cast::<u64>());
                    call.size = call.aux * p.Height as u64;
                } else {
                    call.size = p.WidthInBytes as u64 * p.Height as u64;
                }
            }
            ArgLayout::OutPitch32 => {
                let p: cuMemAllocPitch_params = arguments(params);
                if ok {
                    call.addr = written(p.dptr);
                    call.aux = written(p.pPitch);
                    call.size = call.aux * u64::from(p.Height);
                } else {
                    call.size = u64::from(p.WidthInBytes) * u64::from(p.Height);
                }
            }
            _ => not_in_family(layout, "a pitched allocation"),
        }
    }
}

/// A call given an address (frees, releases, unmaps, maps, registrations): nothing written back.
/// SAFETY: as `read`'s, for one of this family's layouts.
unsafe fn read_given_address(layout: ArgLayout, params: *const c_void, call: &mut CallValues) {
    // SAFETY: `read` hands this family only its own layouts, so `params` is the struct read here
    // (the caller's contract); only the arguments themselves are read, no pointer they hold.
    unsafe {
        match layout {
            ArgLayout::Ptr => call.addr = arguments::<cuMemFree_v2_params>(params).dptr,
            ArgLayout::Ptr32 => call.addr = u64::from(arguments::<cuMemFree_params>(params).dptr),
            ArgLayout::PtrSize => {
                let p: cuMemAddressFree_params = arguments(params);
                call.addr = p.ptr;
                call.size = p.size as u64;
            }
            ArgLayout::VmmMap => {
                let p: cuMemMap_params = arguments(params);
                call.addr = p.ptr;
                call.size = p.size as u64;
                call.aux = p.handle;
            }
            _ => not_in_family(layout, "a given address"),
        }
    }
}

/// A legacy IPC handle or a pool pointer's export data: the 64 bytes another process opens.
/// SAFETY: as `read`'s, for one of this family's layouts.
unsafe fn read_ipc_handle(layout: ArgLayout, params: *const c_void, call: &mut CallValues, ok: bool) {
    // SAFETY: `read` hands this family only its own layouts, so `params` is the struct read here
    // (the caller's contract); a non-null input points at what the application gave the driver to
    // read, and outputs are read only when `ok`, once the driver has written them.
    unsafe {
        match layout {
            ArgLayout::IpcGet | ArgLayout::PoolExport => {
                let p: cuIpcGetMemHandle_params = arguments(params);
                call.addr = p.dptr;
                if ok {
                    call.handle = bytes_at(p.pHandle.cast(), HANDLE_LEN);
                    call.handle_len = HANDLE_LEN as u8;
                }
            }
            ArgLayout::IpcOpen => {
                let p: cuIpcOpenMemHandle_v2_params = arguments(params);
                call.handle = p.handle.reserved;
                call.handle_len = HANDLE_LEN as u8;
                call.aux = u64::from(p.Flags);
                if ok {
                    call.addr = written(p.pdptr);
                }
            }
            ArgLayout::PoolImport => {
                let p: cuMemPoolImportPointer_params = arguments(params);
                call.handle = bytes_at(p.shareData.cast(), HANDLE_LEN);
                call.handle_len = HANDLE_LEN as u8;
                call.aux = p.pool as u64;
                if ok {
                    call.addr = written(p.ptr_out);
                }
            }
            _ => not_in_family(layout, "an IPC handle"),
        }
    }
}

/// A VMM allocation's shareable handle, whose length depends on its type.
/// SAFETY: as `read`'s, for one of this family's layouts.
unsafe fn read_shareable_handle(layout: ArgLayout, params: *const c_void, call: &mut CallValues, ok: bool) {
    // SAFETY: `read` hands this family only its own layouts, so `params` is the struct read here
    // (the caller's contract); a non-null input points at what the application gave the driver to
    // read, and outputs are read only when `ok`, once the driver has written them.
    unsafe {
        match layout {
            ArgLayout::ShareableExport => {
                let p: cuMemExportToShareableHandle_params = arguments(params);
                call.addr = p.handle;
                call.handle_type = p.handleType as u8;
                if ok {
                    call.handle_len = shareable_len(p.handleType);
                    call.handle = bytes_at(p.shareableHandle, usize::from(call.handle_len));
                }
            }
            ArgLayout::ShareableImport => {
                let p: cuMemImportFromShareableHandle_params = arguments(params);
                call.handle_type = p.shHandleType as u8;
                call.handle_len = shareable_len(p.shHandleType);
                call.handle = if p.shHandleType == HANDLE_TYPE_FABRIC {
                    bytes_at(p.osHandle, HANDLE_LEN)
                } else {
                    // fd and win32 handles are passed as the pointer value itself.
                    let mut bytes = [0u8; HANDLE_LEN];
                    bytes[..8].copy_from_slice(&(p.osHandle as u64).to_le_bytes());
                    bytes
                };
                if ok {
                    call.addr = written(p.handle);
                }
            }
            _ => not_in_family(layout, "a shareable handle"),
        }
    }
}

/// A context made or retained on a device (its handle, when made), or a device's primary
/// context let go.
/// SAFETY: as `read`'s, for one of this family's layouts.
unsafe fn read_context(layout: ArgLayout, params: *const c_void, call: &mut CallValues, ok: bool) {
    // SAFETY: `read` hands this family only its own layouts, so `params` is the struct read here
    // (the caller's contract); outputs are read only when `ok`, once the driver has written them.
    unsafe {
        match layout {
            ArgLayout::CtxRetain => {
                let p: cuDevicePrimaryCtxRetain_params = arguments(params);
                call.device = p.dev;
                if ok {
                    call.addr = written(p.pctx.cast::<u64>());
                }
            }
            ArgLayout::CtxCreate { device_arg } => {
                let (pctx, dev) = match device_arg {
                    2 => {
                        let p: cuCtxCreate_v2_params = arguments(params);
                        (p.pctx, p.dev)
                    }
                    3 => {
                        let p: cuCtxCreate_v4_params = arguments(params);
                        (p.pctx, p.dev)
                    }
                    _ => {
                        let p: cuCtxCreate_v3_params = arguments(params);
                        (p.pctx, p.dev)
                    }
                };
                call.device = dev;
                if ok {
                    call.addr = written(pctx.cast::<u64>());
                }
            }
            ArgLayout::Device => call.device = arguments::<cuDevicePrimaryCtxRelease_v2_params>(params).dev,
            _ => not_in_family(layout, "a context"),
        }
    }
}

/// The device's free and total memory, as the driver wrote them.
/// SAFETY: as `read`'s, for one of this family's layouts.
unsafe fn read_memory_info(layout: ArgLayout, params: *const c_void, call: &mut CallValues, ok: bool) {
    if !ok {
        return;
    }
    // SAFETY: `read` hands this family only its own layouts, so `params` is the struct read here
    // (the caller's contract); the call succeeded, so the driver wrote both outputs it was given.
    unsafe {
        match layout {
            ArgLayout::MemInfo => {
                let p: cuMemGetInfo_v2_params = arguments(params);
                call.size = written(p.free.cast::<u64>());
                call.aux = written(p.total.cast::<u64>());
            }
            ArgLayout::MemInfo32 => {
                let p: cuMemGetInfo_params = arguments(params);
                call.size = written(p.free);
                call.aux = written(p.total);
            }
            _ => not_in_family(layout, "memory info"),
        }
    }
}

#[cfg(test)]
mod tests {
    //! Every entry point's argument struct, as cudarc declares CUPTI's headers, against the
    //! struct it is read through here: the same offset and size for every field read.
    use std::collections::HashMap;
    use std::mem::offset_of;

    use cudarc::cupti::sys as cupti;
    use gpuprof_model::driver_api::DRIVER_APIS;

    use super::*;

    /// The size of what a raw pointer points at, without reading it.
    fn size_of_pointee<T>(_: *const T) -> usize {
        std::mem::size_of::<T>()
    }

    /// (offset, size) of each named field of a struct.
    macro_rules! layout {
        ($type:ty { $($field:ident),* }) => {{
            let value = std::mem::MaybeUninit::<$type>::uninit();
            // SAFETY: only the fields' addresses are taken, nothing is read.
            vec![$((offset_of!($type, $field), size_of_pointee(unsafe { std::ptr::addr_of!((*value.as_ptr()).$field) }))),*]
        }};
    }

    /// The fields `read` takes from each layout's struct.
    fn ours(layout: ArgLayout) -> Vec<(usize, usize)> {
        match layout {
            ArgLayout::OutPtrSize => layout!(cuMemAlloc_v2_params { dptr, bytesize }),
            ArgLayout::VmmCreate => layout!(cuMemCreate_params { handle, size, prop }),
            ArgLayout::OutPtrSize32 => layout!(cuMemAllocHost_params { pp, bytesize }),
            ArgLayout::OutPtr32Size32 => layout!(cuMemAlloc_params { dptr, bytesize }),
            ArgLayout::OutPitch => layout!(cuMemAllocPitch_v2_params { dptr, pPitch, WidthInBytes, Height }),
            ArgLayout::OutPitch32 => layout!(cuMemAllocPitch_params { dptr, pPitch, WidthInBytes, Height }),
            ArgLayout::Ptr => layout!(cuMemFree_v2_params { dptr }),
            ArgLayout::Ptr32 => layout!(cuMemFree_params { dptr }),
            ArgLayout::PtrSize => layout!(cuMemAddressFree_params { ptr, size }),
            ArgLayout::VmmMap => layout!(cuMemMap_params { ptr, size, handle }),
            ArgLayout::IpcGet | ArgLayout::PoolExport => layout!(cuIpcGetMemHandle_params { pHandle, dptr }),
            ArgLayout::IpcOpen => layout!(cuIpcOpenMemHandle_v2_params { pdptr, handle, Flags }),
            ArgLayout::PoolImport => layout!(cuMemPoolImportPointer_params { ptr_out, pool, shareData }),
            ArgLayout::ShareableExport => {
                layout!(cuMemExportToShareableHandle_params { shareableHandle, handle, handleType })
            }
            ArgLayout::ShareableImport => {
                layout!(cuMemImportFromShareableHandle_params { handle, osHandle, shHandleType })
            }
            ArgLayout::CtxRetain => layout!(cuDevicePrimaryCtxRetain_params { pctx, dev }),
            ArgLayout::CtxCreate { device_arg: 2 } => layout!(cuCtxCreate_v2_params { pctx, dev }),
            ArgLayout::CtxCreate { device_arg: 3 } => layout!(cuCtxCreate_v4_params { pctx, dev }),
            ArgLayout::CtxCreate { .. } => layout!(cuCtxCreate_v3_params { pctx, dev }),
            ArgLayout::Device => layout!(cuDevicePrimaryCtxRelease_v2_params { dev }),
            ArgLayout::MemInfo => layout!(cuMemGetInfo_v2_params { free, total }),
            ArgLayout::MemInfo32 => layout!(cuMemGetInfo_params { free, total }),
        }
    }

    #[test]
    fn every_entry_point_is_read_through_a_struct_laid_out_as_cuptis() {
        use cupti::*;
        let headers: HashMap<&str, Vec<(usize, usize)>> = HashMap::from([
            ("cuMemAlloc_v2", layout!(cuMemAlloc_v2_params_st { dptr, bytesize })),
            ("cuMemAlloc", layout!(cuMemAlloc_params_st { dptr, bytesize })),
            ("cuMemAllocPitch_v2", layout!(cuMemAllocPitch_v2_params_st { dptr, pPitch, WidthInBytes, Height })),
            ("cuMemAllocPitch", layout!(cuMemAllocPitch_params_st { dptr, pPitch, WidthInBytes, Height })),
            ("cuMemFree_v2", layout!(cuMemFree_v2_params_st { dptr })),
            ("cuMemFree", layout!(cuMemFree_params_st { dptr })),
            ("cuMemAllocManaged", layout!(cuMemAllocManaged_params_st { dptr, bytesize })),
            ("cuMemAllocHost_v2", layout!(cuMemAllocHost_v2_params_st { pp, bytesize })),
            ("cuMemAllocHost", layout!(cuMemAllocHost_params_st { pp, bytesize })),
            ("cuMemHostAlloc", layout!(cuMemHostAlloc_params_st { pp, bytesize })),
            ("cuMemFreeHost", layout!(cuMemFreeHost_params_st { p })),
            ("cuMemHostRegister_v2", layout!(cuMemHostRegister_v2_params_st { p, bytesize })),
            ("cuMemHostRegister", layout!(cuMemHostRegister_params_st { p, bytesize })),
            ("cuMemHostUnregister", layout!(cuMemHostUnregister_params_st { p })),
            ("cuMemAllocAsync", layout!(cuMemAllocAsync_params_st { dptr, bytesize })),
            ("cuMemAllocAsync_ptsz", layout!(cuMemAllocAsync_ptsz_params_st { dptr, bytesize })),
            ("cuMemAllocFromPoolAsync", layout!(cuMemAllocFromPoolAsync_params_st { dptr, bytesize })),
            ("cuMemAllocFromPoolAsync_ptsz", layout!(cuMemAllocFromPoolAsync_ptsz_params_st { dptr, bytesize })),
            ("cuMemFreeAsync", layout!(cuMemFreeAsync_params_st { dptr })),
            ("cuMemFreeAsync_ptsz", layout!(cuMemFreeAsync_ptsz_params_st { dptr })),
            ("cuMemCreate", layout!(cuMemCreate_params_st { handle, size, prop })),
            ("cuMemRelease", layout!(cuMemRelease_params_st { handle })),
            ("cuMemAddressReserve", layout!(cuMemAddressReserve_params_st { ptr, size })),
            ("cuMemAddressFree", layout!(cuMemAddressFree_params_st { ptr, size })),
            ("cuMemMap", layout!(cuMemMap_params_st { ptr, size, handle })),
            ("cuMemUnmap", layout!(cuMemUnmap_params_st { ptr, size })),
            (
                "cuMemExportToShareableHandle",
                layout!(cuMemExportToShareableHandle_params_st { shareableHandle, handle, handleType }),
            ),
            (
                "cuMemImportFromShareableHandle",
                layout!(cuMemImportFromShareableHandle_params_st { handle, osHandle, shHandleType }),
            ),
            ("cuIpcGetMemHandle", layout!(cuIpcGetMemHandle_params_st { pHandle, dptr })),
            ("cuIpcOpenMemHandle_v2", layout!(cuIpcOpenMemHandle_v2_params_st { pdptr, handle, Flags })),
            ("cuIpcOpenMemHandle", layout!(cuIpcOpenMemHandle_params_st { pdptr, handle, Flags })),
            ("cuIpcCloseMemHandle", layout!(cuIpcCloseMemHandle_params_st { dptr })),
            ("cuMemPoolExportPointer", layout!(cuMemPoolExportPointer_params_st { shareData_out, ptr })),
            ("cuMemPoolImportPointer", layout!(cuMemPoolImportPointer_params_st { ptr_out, pool, shareData })),
            ("cuDevicePrimaryCtxRetain", layout!(cuDevicePrimaryCtxRetain_params_st { pctx, dev })),
            ("cuDevicePrimaryCtxRelease_v2", layout!(cuDevicePrimaryCtxRelease_v2_params_st { dev })),
            ("cuDevicePrimaryCtxRelease", layout!(cuDevicePrimaryCtxRelease_params_st { dev })),
            ("cuCtxCreate_v2", layout!(cuCtxCreate_v2_params_st { pctx, dev })),
            ("cuCtxCreate", layout!(cuCtxCreate_params_st { pctx, dev })),
            ("cuCtxCreate_v3", layout!(cuCtxCreate_v3_params_st { pctx, dev })),
            ("cuCtxCreate_v4", layout!(cuCtxCreate_v4_params_st { pctx, dev })),
            ("cuCtxDestroy_v2", layout!(cuCtxDestroy_v2_params_st { ctx })),
            ("cuCtxDestroy", layout!(cuCtxDestroy_params_st { ctx })),
            ("cuMemGetInfo_v2", layout!(cuMemGetInfo_v2_params_st { free, total })),
            ("cuMemGetInfo", layout!(cuMemGetInfo_params_st { free, total })),
        ]);
        assert_eq!(headers.len(), DRIVER_APIS.len());
        for api in DRIVER_APIS {
            let header = headers.get(api.name).unwrap_or_else(|| panic!("no header struct listed for {}", api.name));
            assert_eq!(&ours(api.args), header, "{} ({:?})", api.name, api.args);
        }
    }

    #[test]
    fn the_device_of_a_vmm_allocation_is_where_the_headers_put_it() {
        use cudarc::driver::sys::{
            CUipcMemHandle_st, CUmemAllocationProp_st, CUmemLocation_st, CUmemPoolPtrExportData_st,
        };
        assert_eq!(
            layout!(CUmemAllocationProp { r#type, requestedHandleTypes, location }),
            layout!(CUmemAllocationProp_st { type_, requestedHandleTypes, location })
        );
        assert_eq!(layout!(CUmemLocation { r#type, id }), layout!(CUmemLocation_st { type_, id }));
        assert_eq!(std::mem::size_of::<CUipcMemHandle>(), std::mem::size_of::<CUipcMemHandle_st>());
        assert_eq!(std::mem::size_of::<CUmemPoolPtrExportData>(), std::mem::size_of::<CUmemPoolPtrExportData_st>());
    }
}
