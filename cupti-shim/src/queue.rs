//! The bounded queues between the calling threads and the shim's sender thread, and the records
//! they carry: call records (allocator reports, driver calls) are written in place into a
//! preallocated ring (`ring`), the rare others (code object descriptions, fork, exit) go through
//! a small queue. A call never allocates here and never waits; when a queue is full the record is
//! dropped and counted. The producers above write, the sender on top reads; the queue knows
//! neither (`lib.rs` hands it the function that starts the sender).
//!
//! What every report goes through is `#[inline]`: the producers call it from their own modules,
//! which a release build compiles apart (not inlined, it cost 0.15 µs a report in
//! bench/shim_cpu.py).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use crossbeam_queue::ArrayQueue;
use gpuprof_model::driver_api::CallValues;

use crate::ring::Ring;

/// Python frames kept per event, innermost first (deeper stacks are cut and marked).
pub const MAX_FRAMES: usize = 48;
/// Call records the ring holds (about 0.9 KiB each).
const CAPACITY: usize = 8192;
/// Other records the queue holds.
const OTHER_CAPACITY: usize = 4096;

/// One raw frame: the code object and what the frame's instruction field held.
#[derive(Debug, Clone, Copy, Default)]
pub struct RawFrame {
    pub code: u64,
    pub instr: u64,
}

/// What PyTorch's autograd thread-locals held at one allocator report (`autograd` reads them).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AutogradState {
    /// The evaluated node's vtable (0: no node, a forward-pass or plain block).
    pub node_vtable: u64,
    /// The node's `sequence_nr_`, or the thread's counter (the number its next node takes).
    pub seq: u64,
    /// The node's forward thread, or this thread's RecordFunction id.
    pub thread: u64,
}

/// What one call was, as the calling thread saw it.
#[derive(Debug, Clone, Copy)]
pub enum Call {
    /// A caching-allocator report (`c10::reportMemoryUsageToProfiler`), with autograd's state
    /// where PyTorch's libtorch_cpu.so has been found.
    Allocator { ptr: u64, delta: i64, allocated: u64, reserved: u64, device_index: i8, autograd: Option<AutogradState> },
    /// A libcuda memory entry point, seen by a CUPTI callback at its exit: `api` indexes
    /// `gpuprof_model::driver_api::DRIVER_APIS`; `caller` is the return address into the module
    /// that called the driver (0: not found).
    Driver { api: u16, values: CallValues, caller: u64 },
}

/// One call as it was made, with the calling thread's Python stack.
#[derive(Debug, Clone, Copy)]
pub struct CallRecord {
    pub ts_ns: u64,
    pub pid: u32,
    pub tid: u32,
    pub call: Call,
    /// Code descriptions queued before this record (their `seq` is at most this): the ones its
    /// frames are to be read with, not a later one of a code object at the same address.
    pub codes_before: u64,
    /// Frames in `frames` (a deeper stack is cut, and counted).
    pub frame_count: u8,
    pub frames: [RawFrame; MAX_FRAMES],
}

impl CallRecord {
    const EMPTY: CallRecord = CallRecord {
        ts_ns: 0,
        pid: 0,
        tid: 0,
        call: Call::Allocator { ptr: 0, delta: 0, allocated: 0, reserved: 0, device_index: 0, autograd: None },
        codes_before: 0,
        frame_count: 0,
        frames: [RawFrame { code: 0, instr: 0 }; MAX_FRAMES],
    };
}

/// What else travels from the calling threads to the sender.
#[derive(Debug, Clone)]
pub enum Record {
    /// A code object first seen by a walk (or seen again at an address another one had),
    /// described while it was certainly alive; `seq` orders descriptions against call records.
    Code { seq: u64, code: u64, info: Box<gpuprof_pystack::code::CodeInfo> },
    /// The process forked: this record is the child's first.
    Forked { ts_ns: u64, pid: u32, parent: u32 },
    /// The process is exiting.
    Exiting { ts_ns: u64, pid: u32 },
}

/// Counters the shim reports at exit (and to the agent).
#[derive(Debug, Default)]
pub struct Counters {
    pub queued: AtomicU64,
    pub dropped_queue_full: AtomicU64,
    pub stacks_cut: AtomicU64,
}

pub static COUNTERS: Counters =
    Counters { queued: AtomicU64::new(0), dropped_queue_full: AtomicU64::new(0), stacks_cut: AtomicU64::new(0) };

/// Code descriptions numbered so far.
static CODE_SEQ: AtomicU64 = AtomicU64::new(0);

/// Queues the description of a code object, numbered.
pub fn push_code(code: u64, info: gpuprof_pystack::code::CodeInfo) {
    let seq = CODE_SEQ.fetch_add(1, Ordering::AcqRel) + 1;
    push(Record::Code { seq, code, info: Box::new(info) });
}

/// Descriptions queued so far: a call record made now is read with these (and no later one).
#[inline]
pub fn codes_queued() -> u64 {
    CODE_SEQ.load(Ordering::Acquire)
}

/// Starts the sender if this process has none yet (and returns at once if it has one).
static START_SENDER: OnceLock<fn()> = OnceLock::new();

/// Sets what every push calls to have the sender running: by `lib.rs`, before any record.
pub fn start_sender_with(start: fn()) {
    let _ = START_SENDER.set(start);
}

#[inline]
fn start_sender() {
    if let Some(start) = START_SENDER.get() {
        start();
    }
}

fn queue() -> &'static ArrayQueue<Record> {
    static QUEUE: OnceLock<ArrayQueue<Record>> = OnceLock::new();
    QUEUE.get_or_init(|| ArrayQueue::new(OTHER_CAPACITY))
}

#[inline]
fn ring() -> &'static Ring<CallRecord> {
    static RING: OnceLock<Ring<CallRecord>> = OnceLock::new();
    RING.get_or_init(|| Ring::new(CAPACITY, CallRecord::EMPTY))
}

/// Writes one call record in place (starting the sender if this process has none yet).
#[inline]
pub fn push_call(fill: impl FnOnce(&mut CallRecord)) {
    start_sender();
    let counter = if ring().push_with(fill) { &COUNTERS.queued } else { &COUNTERS.dropped_queue_full };
    counter.fetch_add(1, Ordering::Relaxed);
}

/// The oldest call record, to `read`; false when there is none.
pub fn pop_call(read: impl FnOnce(&CallRecord)) -> bool {
    ring().pop_with(read)
}

/// Call records reserved so far (a flush waits until the sender has written up to here).
pub fn calls_reserved() -> usize {
    ring().reserved()
}

/// Call records the sender has taken from the ring so far.
pub fn calls_taken() -> usize {
    ring().taken()
}

/// True when other records wait (a code object must be known before the blocks that use it).
pub fn others_waiting() -> bool {
    !queue().is_empty()
}

/// Hands a record to the sender, starting it if this process has none yet.
pub fn push(record: Record) {
    start_sender();
    enqueue(record);
}

fn enqueue(record: Record) {
    match queue().push(record) {
        Ok(()) => {
            COUNTERS.queued.fetch_add(1, Ordering::Relaxed);
        }
        Err(_) => {
            COUNTERS.dropped_queue_full.fetch_add(1, Ordering::Relaxed);
        }
    }
}

pub fn pop() -> Option<Record> {
    queue().pop()
}

/// In a forked child, which starts with a copy of the parent's queues and no sender thread:
/// what is queued is the parent's to send, so it is dropped, and the child's first record says
/// it forked. No thread is started here (the child may hold locks it cannot see): the child's
/// first own record starts its sender, which sends this one first.
pub fn restart_in_forked_child() {
    while queue().pop().is_some() {}
    while ring().pop_with(|_| {}) {}
    for counter in [&COUNTERS.queued, &COUNTERS.dropped_queue_full, &COUNTERS.stacks_cut] {
        counter.store(0, Ordering::Relaxed);
    }
    // SAFETY: getpid/getppid have no preconditions.
    let (pid, parent) = unsafe { (libc::getpid() as u32, libc::getppid() as u32) };
    enqueue(Record::Forked { ts_ns: gpuprof_model::event::wall_clock_ns(), pid, parent });
}
