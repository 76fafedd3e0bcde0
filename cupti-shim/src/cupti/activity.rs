//! The cross-check: CUPTI's own memory activity records (`CUPTI_ACTIVITY_KIND_MEMORY2`: one per
//! allocation and per release, `MEMORY_POOL`: pool creation, trim, destruction), buffered by
//! CUPTI and handed back in batches, counted here and compared at exit with what the callbacks
//! recorded. They carry no Python stack; they say whether the callbacks missed anything.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use cudarc::cupti::sys::{CUpti_Activity, CUpti_ActivityKind};
use cudarc::driver::sys::CUcontext;

use super::library::{self, Cupti, SUCCESS};
use super::tally::Tally;

/// Bytes of one activity buffer (CUPTI's samples use 8 MiB for every kind; memory records are
/// rare, so less will do).
const BUFFER_SIZE: usize = 1 << 20;
/// CUPTI wants buffers aligned to 8 bytes.
const BUFFER_ALIGN: usize = 8;
/// `CUpti_ActivityMemoryOperationType`.
const OPERATION_ALLOCATION: u32 = 1;
const OPERATION_RELEASE: u32 = 2;
/// `CUPTI_ACTIVITY_FLAG_FLUSH_FORCED`: hand back buffers that are not full yet.
const FLUSH_FORCED: u32 = 1;

/// The fields the memory records of CUDA 12 and 13 (`CUpti_ActivityMemory3`, `4`) begin with,
/// as plain numbers: a Rust enum holding a kind or operation it does not list would be UB.
#[repr(C)]
#[derive(Clone, Copy)]
#[allow(non_snake_case)] // the headers' names
struct MemoryRecordStart {
    kind: u32,
    memoryOperationType: u32,
    memoryKind: u32,
}

/// Memory records by memory kind and operation: the cross-check's other side.
pub static RECORDED: Tally = Tally::new();
pub static POOL_RECORDS: AtomicU64 = AtomicU64::new(0);
/// Records CUPTI said it dropped for want of buffer space.
pub static DROPPED: AtomicU64 = AtomicU64::new(0);
/// Buffers handed back to the shim: none means another tool took the buffer callbacks over.
pub static BUFFERS: AtomicU64 = AtomicU64::new(0);
static ENABLED: AtomicBool = AtomicBool::new(false);

/// Enables the memory activity kinds with the shim's buffer callbacks; false when CUPTI refused.
pub fn enable(cupti: &Cupti) -> bool {
    // SAFETY: plain CUPTI calls with valid function pointers.
    let enabled = unsafe {
        (cupti.activity_register_callbacks)(Some(buffer_requested), Some(buffer_completed)) == SUCCESS
            && (cupti.activity_enable)(CUpti_ActivityKind::CUPTI_ACTIVITY_KIND_MEMORY2 as u32) == SUCCESS
    };
    if enabled {
        // Pool records are a bonus: a CUPTI without them still cross-checks MEMORY2.
        // SAFETY: as above.
        let _ = unsafe { (cupti.activity_enable)(CUpti_ActivityKind::CUPTI_ACTIVITY_KIND_MEMORY_POOL as u32) };
    }
    ENABLED.store(enabled, Ordering::Release);
    enabled
}

pub fn enabled() -> bool {
    ENABLED.load(Ordering::Acquire)
}

/// Hands back what is buffered and stops recording (another CUPTI client takes over).
pub fn disable(cupti: &Cupti) {
    if ENABLED.swap(false, Ordering::AcqRel) {
        // SAFETY: plain CUPTI calls.
        unsafe {
            let _ = (cupti.activity_flush_all)(FLUSH_FORCED);
            let _ = (cupti.activity_disable)(CUpti_ActivityKind::CUPTI_ACTIVITY_KIND_MEMORY2 as u32);
            let _ = (cupti.activity_disable)(CUpti_ActivityKind::CUPTI_ACTIVITY_KIND_MEMORY_POOL as u32);
        }
    }
}

/// Hands back every buffer, full or not (at exit).
pub fn flush() {
    if let (true, Some(cupti)) = (enabled(), library::cupti()) {
        // SAFETY: a plain CUPTI call.
        let _ = unsafe { (cupti.activity_flush_all)(FLUSH_FORCED) };
    }
}

fn layout() -> std::alloc::Layout {
    std::alloc::Layout::from_size_align(BUFFER_SIZE, BUFFER_ALIGN).expect("a valid constant layout")
}

unsafe extern "C" fn buffer_requested(buffer: *mut *mut u8, size: *mut usize, max_records: *mut usize) {
    // SAFETY: a non-zero layout; CUPTI's out-pointers are valid.
    unsafe {
        let allocated = std::alloc::alloc(layout());
        *buffer = allocated;
        *size = if allocated.is_null() { 0 } else { BUFFER_SIZE };
        *max_records = 0;
    }
}

unsafe extern "C" fn buffer_completed(_context: CUcontext, _stream: u32, buffer: *mut u8, _size: usize, valid: usize) {
    let _ = std::panic::catch_unwind(|| {
        BUFFERS.fetch_add(1, Ordering::Relaxed);
        let Some(cupti) = library::cupti() else { return };
        let mut record: *mut CUpti_Activity = std::ptr::null_mut();
        // SAFETY: CUPTI hands back a buffer the shim gave it, with `valid` bytes of records.
        while unsafe { (cupti.activity_get_next_record)(buffer, valid, &mut record) } == SUCCESS {
            // SAFETY: every record starts with its 32-bit kind.
            let kind = unsafe { *(record as *const u32) };
            if kind == CUpti_ActivityKind::CUPTI_ACTIVITY_KIND_MEMORY2 as u32 {
                // SAFETY: a memory record begins with these fields.
                let start = unsafe { record.cast::<MemoryRecordStart>().read_unaligned() };
                match start.memoryOperationType {
                    OPERATION_ALLOCATION => RECORDED.add(start.memoryKind as usize, false),
                    OPERATION_RELEASE => RECORDED.add(start.memoryKind as usize, true),
                    _ => {}
                }
            } else if kind == CUpti_ActivityKind::CUPTI_ACTIVITY_KIND_MEMORY_POOL as u32 {
                POOL_RECORDS.fetch_add(1, Ordering::Relaxed);
            }
        }
        let mut dropped = 0usize;
        // SAFETY: a plain CUPTI call about records dropped from this buffer's stream.
        if unsafe { (cupti.activity_get_num_dropped_records)(_context, _stream, &mut dropped) } == SUCCESS {
            DROPPED.fetch_add(dropped as u64, Ordering::Relaxed);
        }
    });
    if !buffer.is_null() {
        // SAFETY: allocated by buffer_requested with this layout.
        unsafe { std::alloc::dealloc(buffer, layout()) };
    }
}

#[cfg(test)]
mod tests {
    use std::mem::offset_of;

    use cudarc::cupti::sys::{CUpti_ActivityMemory3, CUpti_ActivityMemory4};

    use super::*;

    #[test]
    fn a_memory_record_begins_as_cuptis_declarations_say_in_cuda_12_and_13() {
        let ours = [
            offset_of!(MemoryRecordStart, kind),
            offset_of!(MemoryRecordStart, memoryOperationType),
            offset_of!(MemoryRecordStart, memoryKind),
        ];
        let cuda_12 = [
            offset_of!(CUpti_ActivityMemory3, kind),
            offset_of!(CUpti_ActivityMemory3, memoryOperationType),
            offset_of!(CUpti_ActivityMemory3, memoryKind),
        ];
        let cuda_13 = [
            offset_of!(CUpti_ActivityMemory4, kind),
            offset_of!(CUpti_ActivityMemory4, memoryOperationType),
            offset_of!(CUpti_ActivityMemory4, memoryKind),
        ];
        assert_eq!((ours, ours), (cuda_12, cuda_13));
        assert_eq!(std::mem::size_of::<MemoryRecordStart>(), 12);
    }
}
