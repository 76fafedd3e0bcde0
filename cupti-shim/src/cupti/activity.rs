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
                // Fields read as plain numbers: the memory records of CUDA 12 and 13
                // (CUpti_ActivityMemory3/4) share this prefix: kind, operation, memory kind.
                // SAFETY: a memory record has these three 32-bit fields first.
                let [_, operation, memory_kind] = unsafe { *(record as *const [u32; 3]) };
                match operation {
                    OPERATION_ALLOCATION => RECORDED.add(memory_kind as usize, false),
                    OPERATION_RELEASE => RECORDED.add(memory_kind as usize, true),
                    _ => {}
                }
            } else if kind == CUpti_ActivityKind::CUPTI_ACTIVITY_KIND_MEMORY_POOL as u32 {
                POOL_RECORDS.fetch_add(1, Ordering::Relaxed);
            }
        }
        // SAFETY: a plain CUPTI call about records dropped from this buffer's stream.
        let mut dropped = 0usize;
        if unsafe { (cupti.activity_get_num_dropped_records)(_context, _stream, &mut dropped) } == SUCCESS {
            DROPPED.fetch_add(dropped as u64, Ordering::Relaxed);
        }
    });
    if !buffer.is_null() {
        // SAFETY: allocated by buffer_requested with this layout.
        unsafe { std::alloc::dealloc(buffer, layout()) };
    }
}
