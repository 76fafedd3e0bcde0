//! The shim's sender thread: drains the queue, turns records into contract events (jsonl, the
//! same as the agent writes, `source: shim`) with their Python stacks symbolized, and writes
//! them to the local agent's Unix socket (`GPUPROF_SHIM_SOCKET`) or, with no agent listening, to
//! the jsonl file `GPUPROF_SHIM_OUTPUT` (appended to; several processes may share it). At exit
//! what is queued is sent; drops are said on stderr and, to an agent, in a last counters line.
//! `gpuprof_shim_flush` lets the process itself wait until what it queued is written (the pytest
//! plugin reads each test's events from the file right after the test).

use std::borrow::Cow;
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use gpuprof_model::driver_api;
use gpuprof_model::event::{wall_clock_ns, Event, Kind, Layer, Op, Source, PYTORCH_ALLOCATOR_API};
use gpuprof_model::shim::{Counters, CountersLine, OUTPUT_VAR, SOCKET_VAR};

use crate::autograd::{self, NodeNames};
use crate::queue::{self, Call, CallRecord, Record, COUNTERS};
use crate::stacks::Stacks;

/// Set: the counters line is also written to stderr at exit (to see what a process counted).
pub const REPORT_VAR: &str = "GPUPROF_SHIM_REPORT";
/// The sender's sleep when the queue is empty: the latency of an event, not of the caller.
const IDLE: Duration = Duration::from_millis(2);
/// How often the sender looks for libtorch_cpu.so until it is loaded (or refused).
const TORCH_LOOK: Duration = Duration::from_millis(100);
/// How long exit waits for the queue to be sent.
const EXIT_DRAIN: Duration = Duration::from_secs(2);
/// How long `gpuprof_shim_flush` waits for the sender.
const FLUSH_WAIT: Duration = Duration::from_secs(2);

static RUNNING: AtomicBool = AtomicBool::new(false);
static STOP: AtomicBool = AtomicBool::new(false);
static DRAINED: AtomicBool = AtomicBool::new(false);
/// Set by the first of the exit paths (exit handlers, `_exit`) to flush.
static EXITING: AtomicBool = AtomicBool::new(false);
/// The process the running sender thread belongs to.
static SENDER_PID: AtomicU32 = AtomicU32::new(0);
static UNRESOLVED: AtomicU64 = AtomicU64::new(0);
static SENT: AtomicU64 = AtomicU64::new(0);
/// Call records (ring positions) whose events the sender has written to its destination.
static WRITTEN: AtomicUsize = AtomicUsize::new(0);

/// Starts this process's sender on its first record.
pub fn ensure_running() {
    if RUNNING.load(Ordering::Relaxed) || RUNNING.swap(true, Ordering::AcqRel) {
        return;
    }
    // SAFETY: getpid has no preconditions.
    SENDER_PID.store(unsafe { libc::getpid() } as u32, Ordering::Release);
    let spawned = std::thread::Builder::new().name("gpuprof-shim".into()).spawn(run);
    if spawned.is_err() {
        // No thread, no sending: records stay queued until the queue is full, then are counted.
        eprintln!(
            "gpuprof shim: cannot start its sender thread: events of pid {} are not recorded",
            std::process::id()
        );
    }
}

/// In a forked child: the parent's sender thread did not come along.
pub fn forget_sender_after_fork() {
    RUNNING.store(false, Ordering::Relaxed);
    STOP.store(false, Ordering::Relaxed);
    DRAINED.store(false, Ordering::Relaxed);
    EXITING.store(false, Ordering::Relaxed);
    SENDER_PID.store(0, Ordering::Relaxed);
    UNRESOLVED.store(0, Ordering::Relaxed);
    SENT.store(0, Ordering::Relaxed);
    // The parent's records were dropped from the child's ring: nothing before here is owed.
    WRITTEN.store(queue::calls_taken(), Ordering::Release);
}

/// At exit: an exit record, then up to EXIT_DRAIN for everything to go out.
pub fn register_exit_flush() {
    extern "C" fn at_exit() {
        flush_before_exit();
    }
    // SAFETY: registering a plain function.
    unsafe { libc::atexit(at_exit) };
}

/// Sends an exit record and waits (up to EXIT_DRAIN) for the queue to go out; once, and only in
/// the process whose sender this is (a vfork child shares the parent's memory, not its sender).
pub fn flush_before_exit() {
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() } as u32;
    if !RUNNING.load(Ordering::Acquire)
        || SENDER_PID.load(Ordering::Acquire) != pid
        || EXITING.swap(true, Ordering::AcqRel)
    {
        return;
    }
    queue::push(Record::Exiting { ts_ns: wall_clock_ns(), pid });
    STOP.store(true, Ordering::Release);
    let started = Instant::now();
    while !DRAINED.load(Ordering::Acquire) && started.elapsed() < EXIT_DRAIN {
        std::thread::sleep(Duration::from_millis(1));
    }
    let dropped = COUNTERS.dropped_queue_full.load(Ordering::Relaxed);
    let drained = DRAINED.load(Ordering::Acquire);
    if dropped > 0 || !drained {
        eprintln!(
            "gpuprof shim: pid {pid}: queued {}, dropped {dropped} (queue full){}",
            COUNTERS.queued.load(Ordering::Relaxed),
            if drained { "" } else { "; the rest of the queue was not sent in time" }
        );
    }
}

/// Waits until every call record this process queued before the call (allocator reports,
/// driver calls) has been written by the sender to its destination, up to FLUSH_WAIT; returns 0
/// when it has (or nothing was ever queued), -1 when the sender did not get there in time. For
/// a process that reads its own events (the pytest plugin, through ctypes, which releases the
/// GIL for the wait); never called by the shim itself.
#[no_mangle]
pub extern "C" fn gpuprof_shim_flush() -> libc::c_int {
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() } as u32;
    if !RUNNING.load(Ordering::Acquire) || SENDER_PID.load(Ordering::Acquire) != pid {
        // No sender in this process: nothing was queued here since it started (or forked).
        return 0;
    }
    let target = queue::calls_reserved();
    let started = Instant::now();
    while WRITTEN.load(Ordering::Acquire) < target {
        if DRAINED.load(Ordering::Acquire) {
            // The sender has stopped at exit, having sent all it could.
            return 0;
        }
        if started.elapsed() >= FLUSH_WAIT {
            return -1;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    0
}

/// `_exit`, which `os._exit` calls (multiprocessing and DataLoader workers end that way) and
/// which skips the exit handlers: the queue goes out first, then the real `_exit`.
#[no_mangle]
pub extern "C" fn _exit(status: libc::c_int) -> ! {
    flush_before_exit();
    // SAFETY: the next definition of `_exit` (libc's), called with the caller's status; if none
    // is found the process ends by the system call itself.
    unsafe {
        let real = libc::dlsym(libc::RTLD_NEXT, c"_exit".as_ptr());
        if !real.is_null() {
            let real: extern "C" fn(libc::c_int) -> ! = std::mem::transmute(real);
            real(status);
        }
        libc::syscall(libc::SYS_exit_group, status);
    }
    unreachable!("exit_group returned")
}

enum Destination {
    Agent(UnixStream),
    File(std::fs::File),
    Nowhere,
}

fn open_destination() -> Destination {
    if let Some(path) = std::env::var_os(SOCKET_VAR) {
        match UnixStream::connect(&path) {
            Ok(stream) => return Destination::Agent(stream),
            Err(error) => eprintln!("gpuprof shim: no agent at {} ({error})", path.to_string_lossy()),
        }
    }
    if let Some(path) = std::env::var_os(OUTPUT_VAR) {
        match std::fs::OpenOptions::new().create(true).append(true).open(&path) {
            Ok(file) => return Destination::File(file),
            Err(error) => eprintln!("gpuprof shim: cannot open {OUTPUT_VAR}={} ({error})", path.to_string_lossy()),
        }
    }
    eprintln!(
        "gpuprof shim: pid {}: neither an agent ({SOCKET_VAR}) nor a file ({OUTPUT_VAR}) to send to: events are not recorded",
        std::process::id()
    );
    Destination::Nowhere
}

fn run() {
    let mut destination = open_destination();
    let mut stacks = Stacks::new();
    // One event's JSON before its stack goes in (reused).
    let mut line = Vec::new();
    let comm: std::sync::Arc<str> = std::fs::read_to_string("/proc/self/comm").unwrap_or_default().trim().into();
    // SAFETY: getppid has no preconditions.
    let ppid = unsafe { libc::getppid() } as u32;
    let mut batch = String::new();
    // Exits wait until the blocks queued before them are out.
    let mut exits: Vec<Event> = Vec::new();
    let mut names = NodeNames::default();
    let mut looked_for_torch = Instant::now() - TORCH_LOOK;
    loop {
        if autograd::unconfigured() && looked_for_torch.elapsed() >= TORCH_LOOK {
            autograd::configure();
            looked_for_torch = Instant::now();
        }
        let stopping = STOP.load(Ordering::Acquire);
        let other = |batch: &mut String, exits: &mut Vec<Event>, stacks: &mut Stacks| {
            while let Some(record) = queue::pop() {
                match event_of(record, stacks, &comm, ppid) {
                    Some(event) if event.op == Op::Exit => exits.push(event),
                    Some(event) => push_line(batch, &event),
                    None => {}
                }
            }
        };
        other(&mut batch, &mut exits, &mut stacks);
        loop {
            let mut call = None;
            if !queue::pop_call(|record| call = Some(*record)) {
                break;
            }
            // A call's code objects were queued before it was published: now that it is here,
            // they are too (and maybe later ones: `Stacks` applies each in its turn).
            if queue::others_waiting() {
                other(&mut batch, &mut exits, &mut stacks);
            }
            let record = call.expect("set by the read");
            let event = call_event(&record, &comm, ppid, &mut names);
            push_call_line(&mut batch, &mut line, &event, &record, &mut stacks);
            if batch.len() >= 1 << 16 {
                write(&mut destination, &batch);
                batch.clear();
                WRITTEN.store(queue::calls_taken(), Ordering::Release);
            }
        }
        for exit in exits.drain(..) {
            push_line(&mut batch, &exit);
        }
        if !batch.is_empty() {
            write(&mut destination, &batch);
            batch.clear();
        }
        // Everything taken from the ring is out (or could not be sent, which flushing cannot fix).
        WRITTEN.store(queue::calls_taken(), Ordering::Release);
        if stopping {
            let counters = serde_json::to_string(&CountersLine { gpuprof_shim: counters() })
                .expect("the counters always serialize");
            if let Destination::Agent(stream) = &mut destination {
                let _ = stream.write_all(format!("{counters}\n").as_bytes());
            }
            if std::env::var_os(REPORT_VAR).is_some() {
                eprintln!("{counters}");
            }
            DRAINED.store(true, Ordering::Release);
            return;
        }
        std::thread::sleep(IDLE);
    }
}

/// What this process counted, for the last line to the agent.
fn counters() -> Counters {
    Counters {
        pid: std::process::id(),
        sent: SENT.load(Ordering::Relaxed),
        dropped_queue_full: COUNTERS.dropped_queue_full.load(Ordering::Relaxed),
        stacks_cut: COUNTERS.stacks_cut.load(Ordering::Relaxed),
        stacks_unresolved: UNRESOLVED.load(Ordering::Relaxed),
        cupti: Some(crate::cupti::state()),
        cupti_library: crate::cupti::library_path().map(str::to_string),
        cupti_cross_check: Some(crate::cupti::cross_check().report()),
    }
}

fn push_line(batch: &mut String, event: &Event) {
    batch.push_str(&serde_json::to_string(event).expect("an event always serializes"));
    batch.push('\n');
    SENT.fetch_add(1, Ordering::Relaxed);
}

fn write(destination: &mut Destination, batch: &str) {
    let failed = match destination {
        Destination::Agent(stream) => stream.write_all(batch.as_bytes()).err(),
        Destination::File(file) => file.write_all(batch.as_bytes()).err(),
        Destination::Nowhere => None,
    };
    if let Some(error) = failed {
        eprintln!(
            "gpuprof shim: pid {}: sending failed ({error}); events from now on are not recorded",
            std::process::id()
        );
        *destination = Destination::Nowhere;
    }
}

fn event_of(record: Record, stacks: &mut Stacks, comm: &std::sync::Arc<str>, ppid: u32) -> Option<Event> {
    match record {
        Record::Code { seq, code, info } => {
            stacks.queue_description(seq, code, *info);
            None
        }
        Record::Forked { ts_ns, pid, parent } => {
            let mut event = Event::new(ts_ns, pid, pid, Source::Shim, Layer::Process, Op::Fork, Cow::Borrowed("fork"));
            event.ppid = Some(parent);
            event.comm = comm.clone();
            Some(event)
        }
        Record::Exiting { ts_ns, pid } => {
            let mut event = Event::new(ts_ns, pid, pid, Source::Shim, Layer::Process, Op::Exit, Cow::Borrowed("exit"));
            event.ppid = Some(ppid);
            event.comm = comm.clone();
            Some(event)
        }
    }
}

/// The event of a call, its stack left out (`push_call_line` writes it).
fn call_event(record: &CallRecord, comm: &std::sync::Arc<str>, ppid: u32, names: &mut NodeNames) -> Event {
    let mut event = match &record.call {
        Call::Allocator { ptr, delta, allocated, reserved, device_index, autograd } => {
            let op = if *delta < 0 { Op::Free } else { Op::Alloc };
            let mut event = Event::new(
                record.ts_ns,
                record.pid,
                record.tid,
                Source::Shim,
                Layer::Allocator,
                op,
                Cow::Borrowed(PYTORCH_ALLOCATOR_API),
            );
            event.kind = Some(Kind::Device);
            event.device = Some(i32::from(*device_index));
            event.addr = Some(*ptr);
            event.size = delta.unsigned_abs();
            event.allocated = Some(*allocated);
            event.reserved = Some(*reserved);
            if let Some(state) = autograd {
                event.autograd_seq = Some(state.seq);
                event.autograd_thread = Some(state.thread);
                if state.node_vtable != 0 {
                    event.autograd_node = Some(names.name_of(state.node_vtable));
                }
            }
            event
        }
        Call::Driver { api, values, caller } => {
            let api = driver_api::by_id(*api).expect("the callback records table entries only");
            let mut event = Event::new(
                record.ts_ns,
                record.pid,
                record.tid,
                Source::Shim,
                Layer::Driver,
                api.op,
                Cow::Borrowed(api.name),
            );
            api.fill_event(&mut event, values);
            event.caller_module = crate::cupti::caller::module_of(*caller);
            event
        }
    };
    event.comm = comm.clone();
    event.ppid = Some(ppid);
    event
}

/// Writes a call's event line: the event serialized with an empty stack, which is last of the
/// fields it has, then the stack's JSON put in its place.
fn push_call_line(batch: &mut String, line: &mut Vec<u8>, event: &Event, record: &CallRecord, stacks: &mut Stacks) {
    const EMPTY_STACK_END: &[u8] = b"\"stack\":[]}";
    debug_assert!(event.stack.is_empty() && event.native.is_empty());
    line.clear();
    serde_json::to_writer(&mut *line, event).expect("an event always serializes");
    let Some(head) = line.strip_suffix(EMPTY_STACK_END) else {
        unreachable!("the stack is the last field of an event without native frames");
    };
    let start = batch.len();
    batch.push_str(std::str::from_utf8(head).expect("serde_json writes UTF-8"));
    batch.push_str("\"stack\":");
    if !stacks.write_json(&record.frames[..usize::from(record.frame_count)], record.codes_before, batch) {
        // A partial stack would be a wrong one: none, counted.
        batch.push_str("[]");
        UNRESOLVED.fetch_add(1, Ordering::Relaxed);
    }
    batch.push_str("}\n");
    SENT.fetch_add(1, Ordering::Relaxed);
    debug_assert!(serde_json::from_str::<Event>(&batch[start..batch.len() - 1]).is_ok(), "{}", &batch[start..]);
}
