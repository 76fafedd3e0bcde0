//! Every libcuda entry point gpuprof captures, what it means (operation, memory kind) and how it
//! passes its arguments. Capture back ends (eBPF probes, CUPTI callbacks) index this one table.

use std::borrow::Cow;

use crate::event::{Event, Kind, Op};

/// How an entry point passes the values an event needs (x86-64 SysV; `out` = written by the
/// call, read after it returns). Legacy (pre-`_v2`) entry points use 32-bit pointers and sizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArgLayout {
    /// `(CUdeviceptr* out, size_t bytes, …)`
    OutPtrSize,
    /// `(void** out, unsigned int bytes)`
    OutPtrSize32,
    /// `(CUdeviceptr_v1* out, unsigned int bytes)`
    OutPtr32Size32,
    /// `(CUdeviceptr* out, size_t* pitch_out, size_t width, size_t height, unsigned elem)`
    OutPitch,
    /// `(CUdeviceptr_v1* out, unsigned* pitch_out, unsigned width, unsigned height, unsigned elem)`
    OutPitch32,
    /// `(CUdeviceptr ptr, …)`
    Ptr,
    /// `(CUdeviceptr_v1 ptr)`
    Ptr32,
    /// `(ptr, size_t size, …)`
    PtrSize,
    /// `(CUmemGenericAllocationHandle* out, size_t size, const CUmemAllocationProp* prop, flags)`
    VmmCreate,
    /// `(CUdeviceptr va, size_t size, size_t offset, CUmemGenericAllocationHandle h, flags)`
    VmmMap,
    /// `(CUipcMemHandle* out, CUdeviceptr ptr)`
    IpcGet,
    /// `(CUdeviceptr* out, CUipcMemHandle handle /* 64 bytes by value, on the stack */, unsigned flags)`
    IpcOpen,
    /// `(void* out_os_handle, CUmemGenericAllocationHandle h, CUmemAllocationHandleType type, flags)`
    ShareableExport,
    /// `(CUmemGenericAllocationHandle* out, void* os_handle, CUmemAllocationHandleType type)`
    ShareableImport,
    /// `(CUmemPoolPtrExportData* out, CUdeviceptr ptr)`
    PoolExport,
    /// `(CUdeviceptr* out, CUmemoryPool pool, CUmemPoolPtrExportData* data)`
    PoolImport,
    /// `(CUcontext* out, CUdevice dev)`
    CtxRetain,
    /// `(CUcontext* out, …, CUdevice dev)` with the device at this argument index.
    CtxCreate { device_arg: u8 },
    /// `(CUdevice dev)`
    Device,
    /// `(size_t* free_out, size_t* total_out)`
    MemInfo,
    /// `(unsigned* free_out, unsigned* total_out)`
    MemInfo32,
}

/// One captured entry point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DriverApi {
    /// The symbol exported by libcuda.so.1.
    pub name: &'static str,
    pub op: Op,
    /// The memory kind of the event; `None` for context and info calls.
    pub kind: Option<Kind>,
    pub args: ArgLayout,
}

const fn api(name: &'static str, op: Op, kind: Option<Kind>, args: ArgLayout) -> DriverApi {
    DriverApi { name, op, kind, args }
}

use ArgLayout as A;
use Kind as K;

/// The memory entry points of `docs/events.md` (captured entry points). The `_v2` and legacy names are distinct
/// bodies in libcuda; both are captured and neither calls the other.
pub const DRIVER_APIS: &[DriverApi] = &[
    // device
    api("cuMemAlloc_v2", Op::Alloc, Some(K::Device), A::OutPtrSize),
    api("cuMemAlloc", Op::Alloc, Some(K::Device), A::OutPtr32Size32),
    api("cuMemAllocPitch_v2", Op::Alloc, Some(K::Device), A::OutPitch),
    api("cuMemAllocPitch", Op::Alloc, Some(K::Device), A::OutPitch32),
    api("cuMemFree_v2", Op::Free, Some(K::Device), A::Ptr),
    api("cuMemFree", Op::Free, Some(K::Device), A::Ptr32),
    // managed
    api("cuMemAllocManaged", Op::Alloc, Some(K::Managed), A::OutPtrSize),
    // pinned host
    api("cuMemAllocHost_v2", Op::Alloc, Some(K::HostPinned), A::OutPtrSize),
    api("cuMemAllocHost", Op::Alloc, Some(K::HostPinned), A::OutPtrSize32),
    api("cuMemHostAlloc", Op::Alloc, Some(K::HostPinned), A::OutPtrSize),
    api("cuMemFreeHost", Op::Free, Some(K::HostPinned), A::Ptr),
    api("cuMemHostRegister_v2", Op::Map, Some(K::HostPinned), A::PtrSize),
    api("cuMemHostRegister", Op::Map, Some(K::HostPinned), A::PtrSize),
    api("cuMemHostUnregister", Op::Unmap, Some(K::HostPinned), A::Ptr),
    // stream-ordered pools
    api("cuMemAllocAsync", Op::Alloc, Some(K::Pool), A::OutPtrSize),
    api("cuMemAllocAsync_ptsz", Op::Alloc, Some(K::Pool), A::OutPtrSize),
    api("cuMemAllocFromPoolAsync", Op::Alloc, Some(K::Pool), A::OutPtrSize),
    api("cuMemAllocFromPoolAsync_ptsz", Op::Alloc, Some(K::Pool), A::OutPtrSize),
    api("cuMemFreeAsync", Op::Free, Some(K::Pool), A::Ptr),
    api("cuMemFreeAsync_ptsz", Op::Free, Some(K::Pool), A::Ptr),
    // virtual memory management
    api("cuMemCreate", Op::Alloc, Some(K::Vmm), A::VmmCreate),
    api("cuMemRelease", Op::Free, Some(K::Vmm), A::Ptr),
    api("cuMemAddressReserve", Op::Reserve, Some(K::Vmm), A::OutPtrSize),
    api("cuMemAddressFree", Op::Unreserve, Some(K::Vmm), A::PtrSize),
    api("cuMemMap", Op::Map, Some(K::Vmm), A::VmmMap),
    api("cuMemUnmap", Op::Unmap, Some(K::Vmm), A::PtrSize),
    api("cuMemExportToShareableHandle", Op::IpcExport, Some(K::Vmm), A::ShareableExport),
    api("cuMemImportFromShareableHandle", Op::IpcOpen, Some(K::Vmm), A::ShareableImport),
    // legacy IPC
    api("cuIpcGetMemHandle", Op::IpcExport, Some(K::Device), A::IpcGet),
    api("cuIpcOpenMemHandle_v2", Op::IpcOpen, Some(K::Device), A::IpcOpen),
    api("cuIpcOpenMemHandle", Op::IpcOpen, Some(K::Device), A::IpcOpen),
    api("cuIpcCloseMemHandle", Op::IpcClose, Some(K::Device), A::Ptr),
    // pool IPC
    api("cuMemPoolExportPointer", Op::IpcExport, Some(K::Pool), A::PoolExport),
    api("cuMemPoolImportPointer", Op::IpcOpen, Some(K::Pool), A::PoolImport),
    // contexts
    api("cuDevicePrimaryCtxRetain", Op::CtxCreate, None, A::CtxRetain),
    api("cuDevicePrimaryCtxRelease_v2", Op::CtxDestroy, None, A::Device),
    api("cuDevicePrimaryCtxRelease", Op::CtxDestroy, None, A::Device),
    api("cuCtxCreate_v2", Op::CtxCreate, None, A::CtxCreate { device_arg: 2 }),
    api("cuCtxCreate", Op::CtxCreate, None, A::CtxCreate { device_arg: 2 }),
    api("cuCtxCreate_v3", Op::CtxCreate, None, A::CtxCreate { device_arg: 4 }),
    api("cuCtxCreate_v4", Op::CtxCreate, None, A::CtxCreate { device_arg: 3 }),
    api("cuCtxDestroy_v2", Op::CtxDestroy, None, A::Ptr),
    api("cuCtxDestroy", Op::CtxDestroy, None, A::Ptr),
    // device totals
    api("cuMemGetInfo_v2", Op::MemInfo, None, A::MemInfo),
    api("cuMemGetInfo", Op::MemInfo, None, A::MemInfo32),
];

/// Entry points that make a context the calling thread's current one: probed, never recorded. A
/// driver call names no device; the thread's current context does, so each record gets the
/// device of the context last made current on its thread (`pop`: the one a push replaced).
pub const CONTEXT_SWITCHES: &[(&str, ContextSwitch)] = &[
    ("cuCtxSetCurrent", ContextSwitch::Set),
    ("cuCtxPushCurrent_v2", ContextSwitch::Set),
    ("cuCtxPushCurrent", ContextSwitch::Set),
    ("cuCtxPopCurrent_v2", ContextSwitch::Pop),
    ("cuCtxPopCurrent", ContextSwitch::Pop),
];

/// What a context switch does to the thread's current context.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContextSwitch {
    /// Its first argument becomes current.
    Set,
    /// The context before the last push becomes current again.
    Pop,
}

/// The table entry with this index (the id carried in capture records).
pub fn by_id(id: u16) -> Option<&'static DriverApi> {
    DRIVER_APIS.get(usize::from(id))
}

/// The id and entry of an exported name.
pub fn by_name(name: &str) -> Option<(u16, &'static DriverApi)> {
    DRIVER_APIS.iter().position(|api| api.name == name).map(|index| (index as u16, &DRIVER_APIS[index]))
}

/// Bytes of the longest handle a call carries (IPC handle, pool export data, fabric handle). The
/// BPF records take it too (`GP_HANDLE_LEN`, passed to the BPF C by ebpf/build.rs): one length for
/// both captures.
pub const HANDLE_LEN: usize = 64;

/// The values a capture reads from one driver call, the same whichever back end read them (the
/// eBPF record, the CUPTI callback): what `aux` holds depends on the entry point's [`ArgLayout`].
/// Fixed-size, so a capture can keep it in a preallocated record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallValues {
    pub result: i32,
    pub addr: u64,
    pub size: u64,
    /// Pitch (`OutPitch*`), the mapped VMM handle (`VmmMap`), total memory (`MemInfo*`), the
    /// kernel object of a POSIX-fd shareable handle (`Shareable*`, 0 when unknown).
    pub aux: u64,
    /// -1 when the call names no device.
    pub device: i32,
    pub duration_ns: u64,
    /// `CUmemAllocationHandleType` of shareable-handle calls.
    pub handle_type: u8,
    /// Bytes of `handle` that are the call's IPC / shareable handle (0: none).
    pub handle_len: u8,
    pub handle: [u8; HANDLE_LEN],
}

impl CallValues {
    /// A call that named no device and carried no handle, values still to be read.
    pub const EMPTY: CallValues = CallValues {
        result: 0,
        addr: 0,
        size: 0,
        aux: 0,
        device: -1,
        duration_ns: 0,
        handle_type: 0,
        handle_len: 0,
        handle: [0; HANDLE_LEN],
    };

    /// The call's handle bytes, if it carried one.
    pub(crate) fn handle(&self) -> Option<&[u8]> {
        let len = usize::from(self.handle_len).min(HANDLE_LEN);
        (len > 0).then(|| &self.handle[..len])
    }

    /// Keeps `bytes` (at most HANDLE_LEN of them) as the call's handle.
    pub fn set_handle(&mut self, bytes: &[u8]) {
        let len = bytes.len().min(HANDLE_LEN);
        self.handle[..len].copy_from_slice(&bytes[..len]);
        self.handle_len = len as u8;
    }
}

impl DriverApi {
    /// Fills the driver-layer fields of `event` from what was read of the call.
    pub fn fill_event(&self, event: &mut Event, call: &CallValues) {
        event.kind = self.kind;
        event.result = call.result;
        event.addr = Some(call.addr);
        event.size = call.size;
        event.device = (call.device >= 0).then_some(call.device);
        event.duration_ns = Some(call.duration_ns);
        event.handle = call.handle().map(<[u8]>::to_vec);
        match self.args {
            ArgLayout::OutPitch | ArgLayout::OutPitch32 if event.succeeded() => event.pitch = Some(call.aux),
            ArgLayout::VmmMap => event.vmm_handle = Some(call.aux),
            ArgLayout::MemInfo | ArgLayout::MemInfo32 if event.succeeded() => event.total = Some(call.aux),
            ArgLayout::ShareableExport | ArgLayout::ShareableImport => {
                event.handle_type = handle_type_name(call.handle_type).map(Cow::Borrowed);
                event.handle_object = (call.aux != 0).then_some(call.aux);
            }
            _ => {}
        }
    }
}

/// Name of a `CUmemAllocationHandleType` value.
pub fn handle_type_name(handle_type: u8) -> Option<&'static str> {
    match handle_type {
        1 => Some("posix_fd"),
        2 => Some("win32"),
        4 => Some("win32_kmt"),
        8 => Some("fabric"),
        _ => None,
    }
}

/// The `CUresult` name of a result code (`CUDA_ERROR_` left off), for people reading tables.
pub fn result_name(code: i32) -> &'static str {
    match code {
        0 => "SUCCESS",
        1 => "INVALID_VALUE",
        2 => "OUT_OF_MEMORY",
        3 => "NOT_INITIALIZED",
        4 => "DEINITIALIZED",
        100 => "NO_DEVICE",
        101 => "INVALID_DEVICE",
        201 => "INVALID_CONTEXT",
        208 => "ALREADY_MAPPED",
        400 => "INVALID_HANDLE",
        500 => "NOT_FOUND",
        700 => "ILLEGAL_ADDRESS",
        712 => "HOST_MEMORY_ALREADY_REGISTERED",
        713 => "HOST_MEMORY_NOT_REGISTERED",
        800 => "NOT_PERMITTED",
        801 => "NOT_SUPPORTED",
        _ => "UNKNOWN",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_ids_round_trip() {
        for (index, api) in DRIVER_APIS.iter().enumerate() {
            let (id, found) = by_name(api.name).unwrap();
            assert_eq!(usize::from(id), index, "{} listed twice", api.name);
            assert_eq!(by_id(id), Some(found));
        }
        assert_eq!(by_name("cuMemAlloc_v2").unwrap().1.op, Op::Alloc);
        assert_eq!(by_name("cuLaunchKernel"), None);
    }

    #[test]
    fn every_kind_has_an_alloc_and_a_release() {
        // Managed memory is released by cuMemFree like device memory.
        for kind in Kind::ALL.into_iter().filter(|kind| *kind != Kind::Managed) {
            let ops: Vec<Op> = DRIVER_APIS.iter().filter(|a| a.kind == Some(kind)).map(|a| a.op).collect();
            assert!(ops.contains(&Op::Alloc), "{kind:?} has no alloc");
            assert!(ops.contains(&Op::Free), "{kind:?} has no free");
        }
    }
}
