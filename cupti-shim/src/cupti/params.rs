//! Reading a driver call's values out of CUPTI's `functionParams`: a struct of the call's
//! arguments in order (`cuMemAlloc_v2_params { CUdeviceptr *dptr; size_t bytesize; }`), so each
//! argument's offset follows from the entry point's argument layout. Outputs are read at the
//! call's exit, and only when it succeeded (a failed call leaves them unwritten).

use gpuprof_model::driver_api::{ArgLayout, CallValues, HANDLE_LEN};

/// `CUmemAllocationHandleType` values whose handle is a struct, not the pointer value itself.
const HANDLE_TYPE_POSIX_FD: u64 = 1;
const HANDLE_TYPE_FABRIC: u64 = 8;
/// `CUmemAllocationProp.location.id`: the device of a `cuMemCreate`.
const PROP_LOCATION_ID: usize = 12;

/// The argument struct of one call. SAFETY of every read: CUPTI hands the struct of the call
/// whose layout `ArgLayout` describes, alive for the callback.
struct Params(*const u8);

impl Params {
    fn u64_at(&self, offset: usize) -> u64 {
        unsafe { (self.0.add(offset) as *const u64).read_unaligned() }
    }
    fn u32_at(&self, offset: usize) -> u64 {
        u64::from(unsafe { (self.0.add(offset) as *const u32).read_unaligned() })
    }
    fn i32_at(&self, offset: usize) -> i32 {
        unsafe { (self.0.add(offset) as *const i32).read_unaligned() }
    }
    fn bytes_at(&self, offset: usize) -> [u8; HANDLE_LEN] {
        unsafe { (self.0.add(offset) as *const [u8; HANDLE_LEN]).read_unaligned() }
    }
}

/// What a pointer argument points at. SAFETY: a non-null output the driver wrote, or an input
/// the caller passed for the driver to read.
unsafe fn pointee_u64(address: u64) -> u64 {
    if address == 0 {
        0
    } else {
        unsafe { (address as *const u64).read_unaligned() }
    }
}
unsafe fn pointee_u32(address: u64) -> u64 {
    if address == 0 {
        0
    } else {
        u64::from(unsafe { (address as *const u32).read_unaligned() })
    }
}
unsafe fn pointee_i32(address: u64) -> i32 {
    if address == 0 {
        -1
    } else {
        unsafe { (address as *const i32).read_unaligned() }
    }
}
unsafe fn pointee_bytes(address: u64, len: usize) -> [u8; HANDLE_LEN] {
    let mut bytes = [0u8; HANDLE_LEN];
    if address != 0 {
        unsafe { std::ptr::copy_nonoverlapping(address as *const u8, bytes.as_mut_ptr(), len.min(HANDLE_LEN)) };
    }
    bytes
}

/// Offset of the device argument of a `cuCtxCreate*` whose device is argument `index`:
/// `(CUcontext*, unsigned, CUdevice)`, `(…, CUctxCreateParams*, unsigned, CUdevice)`,
/// `(…, CUexecAffinityParam*, int, unsigned, CUdevice)`.
fn ctx_device_offset(index: u8) -> usize {
    match index {
        2 => 12,
        3 => 20,
        _ => 24,
    }
}

/// Bytes of a shareable handle of this type in the call's handle field.
fn shareable_len(handle_type: u64) -> u8 {
    match handle_type {
        HANDLE_TYPE_FABRIC => HANDLE_LEN as u8,
        HANDLE_TYPE_POSIX_FD => 4,
        _ => 8,
    }
}

/// Fills `call` (result already set) from the argument struct at `params`.
/// SAFETY: `params` is the `functionParams` CUPTI passed for an entry point of layout `layout`,
/// read in its exit callback.
pub unsafe fn read(layout: ArgLayout, params: *const u8, call: &mut CallValues) {
    let p = Params(params);
    let ok = call.result == 0;
    call.device = -1;
    // SAFETY (pointee reads): outputs are read only when the call succeeded and wrote them.
    unsafe {
        match layout {
            ArgLayout::OutPtrSize | ArgLayout::VmmCreate => {
                call.size = p.u64_at(8);
                if ok {
                    call.addr = pointee_u64(p.u64_at(0));
                }
                if layout == ArgLayout::VmmCreate {
                    let prop = p.u64_at(16);
                    call.device = if prop == 0 { -1 } else { pointee_i32(prop + PROP_LOCATION_ID as u64) };
                }
            }
            ArgLayout::OutPtrSize32 | ArgLayout::OutPtr32Size32 => {
                call.size = p.u32_at(8);
                if ok {
                    call.addr = if layout == ArgLayout::OutPtrSize32 {
                        pointee_u64(p.u64_at(0))
                    } else {
                        pointee_u32(p.u64_at(0))
                    };
                }
            }
            ArgLayout::OutPitch => {
                if ok {
                    call.addr = pointee_u64(p.u64_at(0));
                    call.aux = pointee_u64(p.u64_at(8));
                    call.size = call.aux * p.u64_at(24);
                } else {
                    call.size = p.u64_at(16) * p.u64_at(24);
                }
            }
            ArgLayout::OutPitch32 => {
                if ok {
                    call.addr = pointee_u32(p.u64_at(0));
                    call.aux = pointee_u32(p.u64_at(8));
                    call.size = call.aux * p.u32_at(20);
                } else {
                    call.size = p.u32_at(16) * p.u32_at(20);
                }
            }
            ArgLayout::Ptr => call.addr = p.u64_at(0),
            ArgLayout::Ptr32 => call.addr = p.u32_at(0),
            ArgLayout::PtrSize => {
                call.addr = p.u64_at(0);
                call.size = p.u64_at(8);
            }
            ArgLayout::VmmMap => {
                call.addr = p.u64_at(0);
                call.size = p.u64_at(8);
                call.aux = p.u64_at(24);
            }
            ArgLayout::IpcGet | ArgLayout::PoolExport => {
                call.addr = p.u64_at(8);
                if ok {
                    call.handle = pointee_bytes(p.u64_at(0), HANDLE_LEN);
                    call.handle_len = HANDLE_LEN as u8;
                }
            }
            ArgLayout::IpcOpen => {
                call.handle = p.bytes_at(8);
                call.handle_len = HANDLE_LEN as u8;
                call.aux = p.u32_at(8 + HANDLE_LEN);
                if ok {
                    call.addr = pointee_u64(p.u64_at(0));
                }
            }
            ArgLayout::PoolImport => {
                call.handle = pointee_bytes(p.u64_at(16), HANDLE_LEN);
                call.handle_len = HANDLE_LEN as u8;
                call.aux = p.u64_at(8);
                if ok {
                    call.addr = pointee_u64(p.u64_at(0));
                }
            }
            ArgLayout::ShareableExport => {
                let handle_type = p.u32_at(16);
                call.addr = p.u64_at(8);
                call.handle_type = handle_type as u8;
                if ok {
                    call.handle_len = shareable_len(handle_type);
                    call.handle = pointee_bytes(p.u64_at(0), usize::from(call.handle_len));
                }
            }
            ArgLayout::ShareableImport => {
                let handle_type = p.u32_at(16);
                call.handle_type = handle_type as u8;
                call.handle_len = shareable_len(handle_type);
                call.handle = if handle_type == HANDLE_TYPE_FABRIC {
                    pointee_bytes(p.u64_at(8), HANDLE_LEN)
                } else {
                    // fd and win32 handles are passed as the pointer value itself.
                    let mut bytes = [0u8; HANDLE_LEN];
                    bytes[..8].copy_from_slice(&p.u64_at(8).to_le_bytes());
                    bytes
                };
                if ok {
                    call.addr = pointee_u64(p.u64_at(0));
                }
            }
            ArgLayout::CtxRetain => {
                call.device = p.i32_at(8);
                if ok {
                    call.addr = pointee_u64(p.u64_at(0));
                }
            }
            ArgLayout::CtxCreate { device_arg } => {
                call.device = p.i32_at(ctx_device_offset(device_arg));
                if ok {
                    call.addr = pointee_u64(p.u64_at(0));
                }
            }
            ArgLayout::Device => call.device = p.i32_at(0),
            ArgLayout::MemInfo => {
                if ok {
                    call.size = pointee_u64(p.u64_at(0));
                    call.aux = pointee_u64(p.u64_at(8));
                }
            }
            ArgLayout::MemInfo32 => {
                if ok {
                    call.size = pointee_u32(p.u64_at(0));
                    call.aux = pointee_u32(p.u64_at(8));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    //! The offsets above against cudarc's declarations of CUPTI's parameter structs.
    use std::mem::offset_of;

    use cudarc::cupti::sys as cupti;

    use super::*;

    #[test]
    fn offsets_match_cuptis_parameter_structs() {
        assert_eq!(
            (offset_of!(cupti::cuMemAlloc_v2_params_st, dptr), offset_of!(cupti::cuMemAlloc_v2_params_st, bytesize)),
            (0, 8)
        );
        assert_eq!(offset_of!(cupti::cuMemAlloc_params_st, bytesize), 8);
        assert_eq!(offset_of!(cupti::cuMemAllocPitch_v2_params_st, pPitch), 8);
        assert_eq!(offset_of!(cupti::cuMemAllocPitch_v2_params_st, WidthInBytes), 16);
        assert_eq!(offset_of!(cupti::cuMemAllocPitch_v2_params_st, Height), 24);
        assert_eq!(offset_of!(cupti::cuMemAllocPitch_params_st, WidthInBytes), 16);
        assert_eq!(offset_of!(cupti::cuMemAllocPitch_params_st, Height), 20);
        assert_eq!(offset_of!(cupti::cuMemAllocHost_params_st, bytesize), 8);
        assert_eq!(offset_of!(cupti::cuMemCreate_params_st, size), 8);
        assert_eq!(offset_of!(cupti::cuMemCreate_params_st, prop), 16);
        assert_eq!(
            offset_of!(cudarc::driver::sys::CUmemAllocationProp_st, location)
                + offset_of!(cudarc::driver::sys::CUmemLocation_st, id),
            PROP_LOCATION_ID
        );
        assert_eq!(offset_of!(cupti::cuMemMap_params_st, handle), 24);
        assert_eq!(offset_of!(cupti::cuMemHostRegister_v2_params_st, bytesize), 8);
        assert_eq!(offset_of!(cupti::cuIpcGetMemHandle_params_st, dptr), 8);
        assert_eq!(offset_of!(cupti::cuIpcOpenMemHandle_v2_params_st, handle), 8);
        assert_eq!(offset_of!(cupti::cuIpcOpenMemHandle_v2_params_st, Flags), 8 + HANDLE_LEN);
        assert_eq!(offset_of!(cupti::cuMemPoolExportPointer_params_st, ptr), 8);
        assert_eq!(
            (
                offset_of!(cupti::cuMemPoolImportPointer_params_st, pool),
                offset_of!(cupti::cuMemPoolImportPointer_params_st, shareData)
            ),
            (8, 16)
        );
        assert_eq!(offset_of!(cupti::cuMemExportToShareableHandle_params_st, handle), 8);
        assert_eq!(offset_of!(cupti::cuMemExportToShareableHandle_params_st, handleType), 16);
        assert_eq!(offset_of!(cupti::cuMemImportFromShareableHandle_params_st, osHandle), 8);
        assert_eq!(offset_of!(cupti::cuMemImportFromShareableHandle_params_st, shHandleType), 16);
        assert_eq!(offset_of!(cupti::cuDevicePrimaryCtxRetain_params_st, dev), 8);
        assert_eq!(offset_of!(cupti::cuCtxCreate_v2_params_st, dev), ctx_device_offset(2));
        assert_eq!(offset_of!(cupti::cuCtxCreate_params_st, dev), ctx_device_offset(2));
        assert_eq!(offset_of!(cupti::cuCtxCreate_v4_params_st, dev), ctx_device_offset(3));
        assert_eq!(offset_of!(cupti::cuCtxCreate_v3_params_st, dev), ctx_device_offset(4));
        assert_eq!(offset_of!(cupti::cuMemGetInfo_v2_params_st, total), 8);
        assert_eq!(offset_of!(cupti::cuMemAddressFree_params_st, size), 8);
    }
}
