//! The bounded queues between the calling threads and the shim's sender thread, and the records
//! they carry: call records (allocator reports, driver calls) are written in place into a
//! preallocated ring (`ring`), small — a call's Python stack travels as its hash, its frames only
//! the first time the calling thread meets it — and the rare others (a stack's frames, code object
//! descriptions, fork, exit) go through a small queue. A call never allocates here. When the ring is full (a burst the sender has not
//! caught up with), the calling thread waits for a slot rather than lose the record — a lost free
//! is a false leak, a lost allocation a wrong peak — for as long as the sender makes progress;
//! each wait is counted with its time. Only a sender that takes nothing for `STALL` (an agent
//! that stopped reading) makes records drop, counted, until it moves again. The producers above
//! write, the sender on top reads; the queue knows neither (`lib.rs` hands it the function that
//! starts the sender).
//!
//! What every report goes through is `#[inline]`: the producers call it from their own modules,
//! which a release build compiles apart (not inlined, it cost 0.15 µs a report in
//! bench/shim_cpu.py).

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crossbeam_queue::ArrayQueue;
use gpuprof_model::driver_api::CallValues;

use crate::ring::Ring;

/// Python frames kept per event, innermost first (deeper stacks are cut and marked).
pub const MAX_FRAMES: usize = 48;
/// Call records the ring holds (a few cache lines each): a step's burst of reports fits.
const CAPACITY: usize = 16384;
/// A sender that has taken nothing from a full ring for this long is stalled: the calling
/// threads stop waiting for it (and drop, counted) until it takes records again.
const STALL: Duration = Duration::from_secs(1);
/// Other records the queue holds.
const OTHER_CAPACITY: usize = 4096;

/// One raw frame: the code object and what the frame's instruction field held.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct RawFrame {
    pub code: u64,
    pub instr: u64,
}

/// What PyTorch's autograd thread-locals held at one allocator report (`autograd_state` reads them).
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
    /// that called the driver (0: not found); `pytorch_allocator`: the call was made inside
    /// PyTorch's caching allocator (its segments: `gpuprof_model::framework`).
    Driver { api: u16, values: CallValues, caller: u64, pytorch_allocator: bool },
}

/// A Python stack as a call record names it: the hash of its raw frames (0: no frames), whose
/// frames went to the sender in a `Record::Stack` before (in the current generation of the
/// sender's table).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StackRef {
    pub hash: u64,
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
    pub stack: StackRef,
}

impl CallRecord {
    const EMPTY: CallRecord = CallRecord {
        ts_ns: 0,
        pid: 0,
        tid: 0,
        call: Call::Allocator { ptr: 0, delta: 0, allocated: 0, reserved: 0, device_index: 0, autograd: None },
        codes_before: 0,
        stack: StackRef { hash: 0 },
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
    /// A stack's raw frames (innermost first), the first time a thread names it by `hash` in
    /// this generation of the sender's table.
    Stack { hash: u64, frames: Box<[RawFrame]> },
}

/// Counters the shim reports at exit (and to the agent). Call records queued are not counted
/// here (an atomic add per report on a line all threads share): the ring's positions say it
/// (`queued`).
#[derive(Debug, Default)]
pub struct Counters {
    /// Other records queued (code descriptions, forks, exits), and call records that waited.
    pub queued: AtomicU64,
    pub dropped_queue_full: AtomicU64,
    pub stacks_cut: AtomicU64,
    /// Call records whose thread waited for room in the ring, and the time they waited.
    pub waits: AtomicU64,
    pub wait_ns: AtomicU64,
}

pub static COUNTERS: Counters = Counters {
    queued: AtomicU64::new(0),
    dropped_queue_full: AtomicU64::new(0),
    stacks_cut: AtomicU64::new(0),
    waits: AtomicU64::new(0),
    wait_ns: AtomicU64::new(0),
};

/// Set when a waiting thread found the sender stalled; cleared by the sender's next record.
static STALLED: AtomicBool = AtomicBool::new(false);
/// Records the sender has taken (ring and queue): what a waiting thread watches move.
static SENDER_PROGRESS: AtomicU64 = AtomicU64::new(0);

/// Code descriptions numbered so far.
static CODE_SEQ: AtomicU64 = AtomicU64::new(0);

/// Queues the description of a code object, numbered.
pub fn push_code(code: u64, info: gpuprof_pystack::code::CodeInfo) {
    let seq = CODE_SEQ.fetch_add(1, Ordering::AcqRel) + 1;
    push(Record::Code { seq, code, info: Box::new(info) });
}

/// Queues a stack's frames for the sender, before the first call record naming its hash.
pub fn push_stack(hash: u64, frames: &[RawFrame]) {
    push(Record::Stack { hash, frames: frames.into() });
}

/// The generation of the sender's table of stacks: a thread's record of the stacks it sent is
/// good for this generation only (the sender starts a new one when it bounds its table, and a
/// forked child's sender starts empty).
static STACK_GENERATION: AtomicU32 = AtomicU32::new(1);

#[inline]
pub fn stack_generation() -> u32 {
    STACK_GENERATION.load(Ordering::Acquire)
}

/// The sender gave up its table: every thread sends its stacks' frames again.
pub fn new_stack_generation() -> u32 {
    STACK_GENERATION.fetch_add(1, Ordering::AcqRel) + 1
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

/// Starts the sender if this process has none yet: also while paused, so that a process making
/// reports is connected to its agent, which can raise it.
#[inline]
pub fn start_sender() {
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

/// Writes one call record in place (starting the sender if this process has none yet); waits
/// for room when the ring is full (see the module's comment).
#[inline]
pub fn push_call(fill: impl FnOnce(&mut CallRecord)) {
    start_sender();
    match ring().push_with(fill) {
        Ok(()) => {}
        Err(fill) => {
            let mut fill = Some(fill);
            // Counted by the ring's positions once in it, or as dropped.
            wait_for_room(|| match ring().push_with(fill.take().expect("put back on failure")) {
                Ok(()) => true,
                Err(back) => {
                    fill = Some(back);
                    false
                }
            });
        }
    }
}

/// The slow path of a full ring or queue: spin, then yield, then sleep briefly between tries of
/// `push`, as long as the sender keeps taking records. True once pushed; false when dropped
/// (counted).
#[cold]
#[inline(never)]
fn wait_for_room(mut push: impl FnMut() -> bool) -> bool {
    if STALLED.load(Ordering::Relaxed) {
        COUNTERS.dropped_queue_full.fetch_add(1, Ordering::Relaxed);
        return false;
    }
    let started = Instant::now();
    let mut progress = SENDER_PROGRESS.load(Ordering::Relaxed);
    let mut progress_at = started;
    for attempt in 0u32.. {
        if attempt < 64 {
            std::hint::spin_loop();
        } else if attempt < 256 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(50));
        }
        if push() {
            COUNTERS.waits.fetch_add(1, Ordering::Relaxed);
            COUNTERS.wait_ns.fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
            return true;
        }
        let now = SENDER_PROGRESS.load(Ordering::Relaxed);
        if now != progress {
            progress = now;
            progress_at = Instant::now();
        } else if progress_at.elapsed() >= STALL {
            STALLED.store(true, Ordering::Relaxed);
            break;
        }
    }
    COUNTERS.dropped_queue_full.fetch_add(1, Ordering::Relaxed);
    COUNTERS.wait_ns.fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
    false
}

/// The sender took a record: waiting threads see it move.
fn sender_progressed() {
    SENDER_PROGRESS.fetch_add(1, Ordering::Relaxed);
    if STALLED.load(Ordering::Relaxed) {
        STALLED.store(false, Ordering::Relaxed);
    }
}

/// Ring positions reserved before this process's own first record (a forked child starts with
/// its parent's).
static RING_START: AtomicU64 = AtomicU64::new(0);

/// Records queued so far: call records in the ring and the others.
pub fn queued() -> u64 {
    (ring().reserved() as u64).saturating_sub(RING_START.load(Ordering::Relaxed))
        + COUNTERS.queued.load(Ordering::Relaxed)
}

/// The oldest call record, to `read`; false when there is none.
pub fn pop_call(read: impl FnOnce(&CallRecord)) -> bool {
    let taken = ring().pop_with(read);
    if taken {
        sender_progressed();
    }
    taken
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

/// The sender has stopped for good (the process exits): a full ring is not waited on any more.
pub fn sender_gone() {
    STALLED.store(true, Ordering::Relaxed);
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
        Err(record) => {
            let mut record = Some(record);
            let pushed = wait_for_room(|| match queue().push(record.take().expect("put back on failure")) {
                Ok(()) => true,
                Err(back) => {
                    record = Some(back);
                    false
                }
            });
            if pushed {
                COUNTERS.queued.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

pub fn pop() -> Option<Record> {
    let record = queue().pop();
    if record.is_some() {
        sender_progressed();
    }
    record
}

/// In a forked child, which starts with a copy of the parent's queues and no sender thread:
/// what is queued is the parent's to send, so it is dropped, and the child's first record says
/// it forked. No thread is started here (the child may hold locks it cannot see): the child's
/// first own record starts its sender, which sends this one first.
pub fn restart_in_forked_child() {
    while queue().pop().is_some() {}
    while ring().pop_with(|_| {}) {}
    for counter in
        [&COUNTERS.queued, &COUNTERS.dropped_queue_full, &COUNTERS.stacks_cut, &COUNTERS.waits, &COUNTERS.wait_ns]
    {
        counter.store(0, Ordering::Relaxed);
    }
    STALLED.store(false, Ordering::Relaxed);
    RING_START.store(ring().reserved() as u64, Ordering::Relaxed);
    // The child's sender knows no stack: its threads' records of what they sent are stale.
    new_stack_generation();
    // SAFETY: getpid/getppid have no preconditions.
    let (pid, parent) = unsafe { (libc::getpid() as u32, libc::getppid() as u32) };
    enqueue(Record::Forked { ts_ns: gpuprof_model::event::wall_clock_ns(), pid, parent });
}
