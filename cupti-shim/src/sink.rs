//! The shim's sender thread: drains the queue, turns records into contract events (`source:
//! shim`) with their Python stacks symbolized, and writes them to the local agent's Unix socket
//! (`GPUPROF_SHIM_SOCKET`, in the binary stream of `gpuprof_model::shim::wire`: blocks of 75
//! bytes naming their stacks by number) or, with no agent listening, to the jsonl file
//! `GPUPROF_SHIM_OUTPUT` (the agent's own jsonl; appended to, several processes may share it). It
//! also listens to the agent: a word on the socket switches the capture level (`level`), and the
//! switch is acknowledged in the stream. At exit what is queued is sent; drops and waits are said
//! on stderr and, to an agent, in a last counters line. `gpuprof_shim_flush` lets the process
//! itself wait until what it queued is written (the pytest plugin reads each test's events from
//! the file right after the test).

use std::borrow::Cow;
use std::collections::HashMap;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use gpuprof_model::driver_api;
use gpuprof_model::event::{wall_clock_ns, Event, Layer, Op, Source};
use gpuprof_model::framework::Framework;
use gpuprof_model::shim::wire::{self, Block, Message};
use gpuprof_model::shim::{Counters, CountersLine, OUTPUT_VAR, SOCKET_VAR};
use gpuprof_model::stack::Stack;

use crate::autograd_state::{self, NodeNames};
use crate::level;
use crate::queue::{self, Call, CallRecord, Record, COUNTERS};
use crate::stacks::{Interned, Stacks};

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
/// A batch is written once it holds this many bytes (or the queue is empty).
const BATCH: usize = 1 << 16;

static RUNNING: AtomicBool = AtomicBool::new(false);
static STOP: AtomicBool = AtomicBool::new(false);
static DRAINED: AtomicBool = AtomicBool::new(false);
/// Set by the first of the exit paths (exit handlers, `_exit`) to flush.
static EXITING: AtomicBool = AtomicBool::new(false);
/// The process the running sender thread belongs to.
static SENDER_PID: AtomicU32 = AtomicU32::new(0);
static UNRESOLVED: AtomicU64 = AtomicU64::new(0);
static SENT: AtomicU64 = AtomicU64::new(0);
/// Events written before sending failed (the agent went away), u64::MAX while it has not: those
/// counted in SENT after it were not recorded, and exit says how many.
static SENT_BEFORE_FAILURE: AtomicU64 = AtomicU64::new(u64::MAX);
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
    SENT_BEFORE_FAILURE.store(u64::MAX, Ordering::Relaxed);
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
    if !drained {
        // Reports made from here on (the interpreter's teardown) do not wait for a sender that
        // may be gone.
        queue::sender_gone();
    }
    let sent_before_failure = SENT_BEFORE_FAILURE.load(Ordering::Relaxed);
    if sent_before_failure != u64::MAX {
        eprintln!(
            "gpuprof shim: pid {pid}: {} events were not recorded after sending failed (the {sent_before_failure} before were)",
            SENT.load(Ordering::Relaxed).saturating_sub(sent_before_failure)
        );
    }
    if dropped > 0 || !drained {
        eprintln!(
            "gpuprof shim: pid {pid}: queued {}, dropped {dropped} (queue full, the sender stalled){}",
            queue::queued(),
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
    /// The agent: the binary stream, and the agent's words coming back.
    Agent(UnixStream),
    /// The jsonl file.
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

/// The sender's state: what it writes where, and what the destination has been told.
struct Sender {
    destination: Destination,
    /// Messages (to the agent) or lines (to the file) not written yet.
    batch: Vec<u8>,
    stacks: Stacks,
    names: NodeNames,
    /// Node classes numbered for the agent, by vtable.
    numbered_names: HashMap<u64, u32>,
    comm: std::sync::Arc<str>,
    ppid: u32,
    /// One event's JSON before its stack goes in, and one line (reused).
    head: Vec<u8>,
    line: String,
    /// Level changes acknowledged to the agent so far.
    level_changes_told: u64,
    /// The agent's words not read to their end yet.
    words: Vec<u8>,
    /// SENT when the last batch was written: what a failed write loses starts there.
    sent_when_written: u64,
}

impl Sender {
    fn new(destination: Destination) -> Sender {
        let comm: std::sync::Arc<str> = std::fs::read_to_string("/proc/self/comm").unwrap_or_default().trim().into();
        // SAFETY: getppid has no preconditions.
        let ppid = unsafe { libc::getppid() } as u32;
        let mut sender = Sender {
            destination,
            batch: Vec::with_capacity(BATCH * 2),
            stacks: Stacks::new(),
            names: NodeNames::default(),
            numbered_names: HashMap::new(),
            comm,
            ppid,
            head: Vec::new(),
            line: String::new(),
            level_changes_told: u64::MAX,
            words: Vec::new(),
            sent_when_written: 0,
        };
        if sender.binary() {
            sender.batch.extend_from_slice(wire::MAGIC);
            let comm = Cow::Owned(sender.comm.to_string());
            let rank = std::env::var_os(gpuprof_model::rank::RANK_VARIABLE)
                .and_then(|value| gpuprof_model::rank::parse(value.as_encoded_bytes()));
            let settings = gpuprof_model::allocator::settings_in_environment(|name| {
                std::env::var_os(name).map(|value| value.to_string_lossy().into_owned())
            });
            let allocator_settings = Some(Cow::Owned(settings));
            Message::Process { pid: std::process::id(), ppid, comm, rank, allocator_settings }.write(&mut sender.batch);
        }
        sender
    }

    fn binary(&self) -> bool {
        matches!(self.destination, Destination::Agent(_))
    }

    /// An event that is not a block: its JSON line, inside a message to the agent.
    fn push_event(&mut self, event: &Event) {
        let json = serde_json::to_string(event).expect("an event always serializes");
        self.push_json(&json);
        SENT.fetch_add(1, Ordering::Relaxed);
    }

    fn push_json(&mut self, json: &str) {
        if self.binary() {
            Message::Json(Cow::Borrowed(json)).write(&mut self.batch);
        } else {
            self.batch.extend_from_slice(json.as_bytes());
            self.batch.push(b'\n');
        }
    }

    fn push_call(&mut self, record: &CallRecord) {
        if let (Call::Allocator { .. }, true) = (&record.call, self.binary()) {
            let interned = self.stacks.intern(record.stack, record.codes_before);
            // A forget made while interning (a code object described again) voids the numbers
            // given before it, not the one it gives now: the agent hears it before the new
            // stack's frames, or it would drop them with the rest.
            if self.stacks.take_forgotten() {
                Message::ForgetStacks.write(&mut self.batch);
            }
            let stack = match interned {
                Interned::Known(number) => number,
                Interned::New(number, frames) => {
                    Message::Stack { id: number, frames }.write(&mut self.batch);
                    number
                }
                Interned::Unresolved => {
                    UNRESOLVED.fetch_add(1, Ordering::Relaxed);
                    0
                }
            };
            let block = self.block_of(record, stack);
            Message::Block(block).write(&mut self.batch);
            SENT.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let event = self.call_event(record);
        self.line.clear();
        write_call_line(&mut self.line, &mut self.head, &event, record, &mut self.stacks);
        let line = std::mem::take(&mut self.line);
        self.push_json(&line);
        self.line = line;
        SENT.fetch_add(1, Ordering::Relaxed);
    }

    /// A block as the wire carries it, its node class numbered (and sent) on first sight.
    fn block_of(&mut self, record: &CallRecord, stack: u32) -> Block {
        let mut block = block_without_names(record);
        if let (Call::Allocator { autograd: Some(state), .. }, Some(autograd)) = (&record.call, &mut block.autograd) {
            autograd.0 = match state.node_vtable {
                0 => 0,
                vtable => match self.numbered_names.get(&vtable) {
                    Some(number) => *number,
                    None => {
                        let number = self.numbered_names.len() as u32 + 1;
                        self.numbered_names.insert(vtable, number);
                        let text = self.names.name_of(vtable);
                        Message::Name { id: number, text: Cow::Borrowed(&text) }.write(&mut self.batch);
                        number
                    }
                },
            };
        }
        Block { stack, ..block }
    }

    /// The event of a call, its stack left out (`write_call_line` writes it).
    fn call_event(&mut self, record: &CallRecord) -> Event {
        let mut event = match &record.call {
            Call::Allocator { autograd, .. } => {
                let node =
                    autograd.filter(|state| state.node_vtable != 0).map(|state| self.names.name_of(state.node_vtable));
                block_without_names(record).event(Stack::empty(), node)
            }
            Call::Driver { api, values, caller, pytorch_allocator } => {
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
                event.allocator_segment = if *pytorch_allocator {
                    Some(Framework::Pytorch)
                } else {
                    event.caller_module.as_deref().and_then(Framework::of_caller_module)
                };
                event
            }
        };
        event.comm = self.comm.clone();
        event.ppid = Some(self.ppid);
        event
    }

    /// Writes the batch out once it is large enough (`force`: whatever it holds).
    fn write(&mut self, force: bool) {
        if self.batch.is_empty() || (!force && self.batch.len() < BATCH) {
            return;
        }
        let failed = match &mut self.destination {
            Destination::Agent(stream) => stream.write_all(&self.batch).err(),
            Destination::File(file) => file.write_all(&self.batch).err(),
            Destination::Nowhere => None,
        };
        self.batch.clear();
        match failed {
            Some(error) => {
                eprintln!(
                    "gpuprof shim: pid {}: sending failed ({error}); events from now on are not recorded (the job goes on)",
                    std::process::id()
                );
                SENT_BEFORE_FAILURE.store(self.sent_when_written, Ordering::Relaxed);
                self.destination = Destination::Nowhere;
            }
            None => self.sent_when_written = SENT.load(Ordering::Relaxed),
        }
    }

    /// Takes the agent's words (without waiting), and tells it each level change once.
    fn listen(&mut self) {
        if let Destination::Agent(stream) = &self.destination {
            let mut buf = [0u8; 256];
            loop {
                // SAFETY: receiving into a buffer of the given length, without waiting.
                let n =
                    unsafe { libc::recv(stream.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
                if n <= 0 {
                    break;
                }
                self.words.extend_from_slice(&buf[..n as usize]);
            }
            while let Some(end) = self.words.iter().position(|b| *b == b'\n') {
                let word: Vec<u8> = self.words.drain(..=end).collect();
                if let Some(level) = wire::read_word(&String::from_utf8_lossy(&word)) {
                    level::set(level);
                }
            }
        }
        let changes = level::changes();
        if changes != self.level_changes_told && self.binary() {
            self.level_changes_told = changes;
            Message::Level { level: level::now(), ts: wall_clock_ns() }.write(&mut self.batch);
        }
    }
}

/// The block of an allocator report, its stack and node class not numbered (the jsonl path names
/// them; `Sender::block_of` numbers them for the agent).
fn block_without_names(record: &CallRecord) -> Block {
    let Call::Allocator { ptr, delta, allocated, reserved, device_index, autograd } = record.call else {
        unreachable!("blocks are allocator reports")
    };
    Block {
        ts: record.ts_ns,
        pid: record.pid,
        tid: record.tid,
        ptr,
        delta,
        allocated,
        reserved,
        device: device_index,
        stack: 0,
        autograd: autograd.map(|state| (0, state.seq, state.thread)),
    }
}

fn run() {
    let mut sender = Sender::new(open_destination());
    // Exits wait until the blocks queued before them are out.
    let mut exits: Vec<Event> = Vec::new();
    let mut looked_for_torch = Instant::now() - TORCH_LOOK;
    loop {
        if autograd_state::unconfigured() && looked_for_torch.elapsed() >= TORCH_LOOK {
            autograd_state::configure();
            looked_for_torch = Instant::now();
        }
        sender.listen();
        let stopping = STOP.load(Ordering::Acquire);
        let other = |sender: &mut Sender, exits: &mut Vec<Event>| {
            while let Some(record) = queue::pop() {
                match event_of(record, &mut sender.stacks, &sender.comm, sender.ppid) {
                    Some(event) if event.op == Op::Exit => exits.push(event),
                    Some(event) => sender.push_event(&event),
                    None => {}
                }
            }
        };
        other(&mut sender, &mut exits);
        loop {
            let mut call = None;
            if !queue::pop_call(|record| call = Some(*record)) {
                break;
            }
            // A call's code objects were queued before it was published: now that it is here,
            // they are too (and maybe later ones: `Stacks` applies each in its turn).
            if queue::others_waiting() {
                other(&mut sender, &mut exits);
            }
            sender.push_call(&call.expect("set by the read"));
            if sender.batch.len() >= BATCH {
                sender.write(true);
                WRITTEN.store(queue::calls_taken(), Ordering::Release);
            }
        }
        for exit in exits.drain(..) {
            sender.push_event(&exit);
        }
        sender.write(true);
        // Everything taken from the ring is out (or could not be sent, which flushing cannot fix).
        WRITTEN.store(queue::calls_taken(), Ordering::Release);
        if stopping {
            let counters = serde_json::to_string(&CountersLine { gpuprof_shim: counters() })
                .expect("the counters always serialize");
            if sender.binary() {
                sender.push_json(&counters);
                sender.write(true);
            }
            if std::env::var_os(REPORT_VAR).is_some() {
                eprintln!("{counters}");
            }
            queue::sender_gone();
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
        waits: COUNTERS.waits.load(Ordering::Relaxed),
        wait_ns: COUNTERS.wait_ns.load(Ordering::Relaxed),
        stacks_cut: COUNTERS.stacks_cut.load(Ordering::Relaxed),
        stacks_unresolved: UNRESOLVED.load(Ordering::Relaxed),
        cupti: Some(crate::cupti::state()),
        cupti_library: crate::cupti::library_path().map(str::to_string),
        cupti_cross_check: Some(crate::cupti::cross_check().report()),
        timing: crate::timing::report(),
    }
}

fn event_of(record: Record, stacks: &mut Stacks, comm: &std::sync::Arc<str>, ppid: u32) -> Option<Event> {
    match record {
        Record::Code { seq, code, info } => {
            stacks.queue_description(seq, code, *info);
            None
        }
        Record::Stack { hash, frames, .. } => {
            stacks.receive(hash, frames);
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

/// Writes a call's event line (no newline) to `line`: the event serialized with an empty stack,
/// which is last of the fields it has, then the stack's JSON put in its place.
fn write_call_line(line: &mut String, head: &mut Vec<u8>, event: &Event, record: &CallRecord, stacks: &mut Stacks) {
    const EMPTY_STACK_END: &[u8] = b"\"stack\":[]}";
    debug_assert!(event.stack.is_empty() && event.native.is_empty());
    head.clear();
    serde_json::to_writer(&mut *head, event).expect("an event always serializes");
    let Some(start) = head.strip_suffix(EMPTY_STACK_END) else {
        unreachable!("the stack is the last field of an event without native frames");
    };
    line.push_str(std::str::from_utf8(start).expect("serde_json writes UTF-8"));
    line.push_str("\"stack\":");
    if !stacks.write_json(record.stack, record.codes_before, line) {
        // A partial stack would be a wrong one: none, counted.
        line.push_str("[]");
        UNRESOLVED.fetch_add(1, Ordering::Relaxed);
    }
    line.push('}');
    debug_assert!(serde_json::from_str::<Event>(line).is_ok(), "{line}");
}
