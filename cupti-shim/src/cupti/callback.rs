//! The CUPTI callback: enabled for the driver's memory entry points only (a launch never comes
//! here), it stamps the time at a call's entry and records the call at its exit — result,
//! outputs, the calling thread's Python stack — into the shim's ring, like an allocator report.

use std::ffi::c_void;

use cudarc::cupti::sys::{CUpti_CallbackData, CUpti_CallbackDomain, CUpti_CallbackId};
use gpuprof_model::driver_api::{CallValues, DRIVER_APIS};
use gpuprof_model::event::wall_clock_ns;

use super::tally::{counted_as, Tally};

use gpuprof_model::level::Level;

use crate::queue::{self, Call};
use crate::{level, recorder};

/// `CUPTI_CB_DOMAIN_DRIVER_API`.
pub const DOMAIN_DRIVER_API: u32 = 1;
/// `CUPTI_API_ENTER`.
const SITE_ENTER: u32 = 0;

/// CUPTI's callback id (`CUPTI_DRIVER_TRACE_CBID_<name>`, `cupti_driver_cbid.h`) of every entry
/// point of gpuprof's driver table, in the table's order. Ids are never reused across CUDA
/// releases.
pub const CALLBACK_IDS: [(&str, u32); 45] = [
    ("cuMemAlloc_v2", 243),
    ("cuMemAlloc", 29),
    ("cuMemAllocPitch_v2", 244),
    ("cuMemAllocPitch", 31),
    ("cuMemFree_v2", 245),
    ("cuMemFree", 33),
    ("cuMemAllocManaged", 371),
    ("cuMemAllocHost_v2", 294),
    ("cuMemAllocHost", 37),
    ("cuMemHostAlloc", 39),
    ("cuMemFreeHost", 38),
    ("cuMemHostRegister_v2", 379),
    ("cuMemHostRegister", 301),
    ("cuMemHostUnregister", 302),
    ("cuMemAllocAsync", 598),
    ("cuMemAllocAsync_ptsz", 599),
    ("cuMemAllocFromPoolAsync", 611),
    ("cuMemAllocFromPoolAsync_ptsz", 612),
    ("cuMemFreeAsync", 600),
    ("cuMemFreeAsync_ptsz", 601),
    ("cuMemCreate", 549),
    ("cuMemRelease", 550),
    ("cuMemAddressReserve", 547),
    ("cuMemAddressFree", 548),
    ("cuMemMap", 551),
    ("cuMemUnmap", 552),
    ("cuMemExportToShareableHandle", 554),
    ("cuMemImportFromShareableHandle", 555),
    ("cuIpcGetMemHandle", 328),
    ("cuIpcOpenMemHandle_v2", 567),
    ("cuIpcOpenMemHandle", 329),
    ("cuIpcCloseMemHandle", 330),
    ("cuMemPoolExportPointer", 615),
    ("cuMemPoolImportPointer", 616),
    ("cuDevicePrimaryCtxRetain", 386),
    ("cuDevicePrimaryCtxRelease_v2", 544),
    ("cuDevicePrimaryCtxRelease", 387),
    ("cuCtxCreate_v2", 235),
    ("cuCtxCreate", 10),
    ("cuCtxCreate_v3", 645),
    ("cuCtxCreate_v4", 757),
    ("cuCtxDestroy_v2", 322),
    ("cuCtxDestroy", 11),
    ("cuMemGetInfo_v2", 242),
    ("cuMemGetInfo", 27),
];

/// Callback ids below this index straight into `API_OF`.
const MAX_CALLBACK_ID: usize = 1024;

/// Driver-table index + 1 of each callback id (0: not one of ours).
static API_OF: [u8; MAX_CALLBACK_ID] = {
    let mut table = [0u8; MAX_CALLBACK_ID];
    let mut i = 0;
    while i < CALLBACK_IDS.len() {
        table[CALLBACK_IDS[i].1 as usize] = i as u8 + 1;
        i += 1;
    }
    table
};

/// Successful allocations and releases the callbacks saw, by the memory kind CUPTI's activity
/// records would name: the cross-check's one side.
pub static SEEN: Tally = Tally::new();

/// CUPTI's `CUpti_CallbackFunc`.
pub unsafe extern "C" fn on_callback(
    _userdata: *mut c_void,
    domain: CUpti_CallbackDomain,
    cbid: CUpti_CallbackId,
    data: *const c_void,
) {
    // Never unwind into the driver: a panic here ends as a missing event, not a dead process.
    let _ = std::panic::catch_unwind(|| {
        // SAFETY: CUPTI passes a CUpti_CallbackData for the driver domain.
        unsafe { handle(domain as u32, cbid, data as *const CUpti_CallbackData) }
    });
}

unsafe fn handle(domain: u32, cbid: u32, data: *const CUpti_CallbackData) {
    if domain != DOMAIN_DRIVER_API || data.is_null() {
        return;
    }
    let Some(&entry) = API_OF.get(cbid as usize) else { return };
    if entry == 0 {
        return;
    }
    // SAFETY: valid for the callback, per CUPTI.
    let data = unsafe { &*data };
    // The site is read as a plain number: an enum holding a value it does not list would be UB.
    // SAFETY: callbackSite is the struct's first field, a 32-bit enum.
    let site = unsafe { *(data as *const CUpti_CallbackData as *const u32) };
    if site == SITE_ENTER {
        if !data.correlationData.is_null() {
            // SAFETY: CUPTI's per-call slot, shared by the call's enter and exit callbacks.
            unsafe { *data.correlationData = wall_clock_ns() };
        }
        return;
    }
    let api = u16::from(entry - 1);
    let entry = &DRIVER_APIS[usize::from(api)];
    let now = wall_clock_ns();
    // SAFETY: as above.
    let started = if data.correlationData.is_null() { now } else { unsafe { *data.correlationData } };
    let started = if started == 0 || started > now { now } else { started };
    let result = if data.functionReturnValue.is_null() {
        0
    } else {
        // SAFETY: functionReturnValue points at the call's CUresult at exit.
        unsafe { *(data.functionReturnValue as *const i32) }
    };
    let mut values = CallValues { result, duration_ns: now - started, ..CallValues::EMPTY };
    // SAFETY: functionParams is this entry point's argument struct.
    unsafe { super::params::read(entry.args, data.functionParams, &mut values) };
    if values.device < 0 && !data.context.is_null() {
        values.device = super::device::current().unwrap_or(-1);
    }
    if let (0, Some((memory_kind, release))) = (result, counted_as(entry.kind, entry.op, values.addr)) {
        SEEN.add(memory_kind, release);
    }
    // Paused, the call is still counted above: the cross-check with CUPTI's own records holds.
    if level::now() == Level::Off {
        queue::start_sender();
        return;
    }
    let caller = super::caller::of_this_call();
    recorder::record(
        started,
        Call::Driver { api, values, caller: caller.return_address, pytorch_allocator: caller.pytorch_allocator },
    );
}

#[cfg(test)]
mod tests {
    use cudarc::cupti::sys::CUpti_driver_api_trace_cbid as Cbid;

    use super::*;

    #[test]
    fn callback_ids_follow_the_driver_table_and_cuptis_numbers() {
        let names: Vec<&str> = CALLBACK_IDS.iter().map(|(name, _)| *name).collect();
        let table: Vec<&str> = DRIVER_APIS.iter().map(|api| api.name).collect();
        assert_eq!(names, table);
        // A few against cudarc's declaration of cupti_driver_cbid.h.
        assert_eq!(CALLBACK_IDS[0].1, Cbid::CUPTI_DRIVER_TRACE_CBID_cuMemAlloc_v2 as u32);
        assert_eq!(CALLBACK_IDS[29].1, Cbid::CUPTI_DRIVER_TRACE_CBID_cuIpcOpenMemHandle_v2 as u32);
        assert_eq!(CALLBACK_IDS[40].1, Cbid::CUPTI_DRIVER_TRACE_CBID_cuCtxCreate_v4 as u32);
        assert_eq!(CALLBACK_IDS[20].1, Cbid::CUPTI_DRIVER_TRACE_CBID_cuMemCreate as u32);
        assert!(CALLBACK_IDS.iter().all(|(_, id)| (*id as usize) < MAX_CALLBACK_ID));
    }
}
