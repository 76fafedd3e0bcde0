//! The agent's end of the shim's Unix socket: every process running gpuprof's shim connects and
//! sends its events — a binary stream (`gpuprof_model::shim::wire`: tensor blocks naming their
//! stacks by number, the rest as JSON), or jsonl from shims before it — then, when it exits
//! normally, a counters line. A thread per connection decodes; the capture loop receives what
//! they decoded, through a bounded channel: a loop that falls behind makes the readers wait,
//! then the shims (which wait rather than drop), never memory grow without bound. The agent
//! answers on the same connection with words: the capture level each process is to take.
//!
//! A connection speaks for its own process only: the kernel says which process connected
//! (`SO_PEERCRED`), and an event that names another pid — a forged allocation, a forged exit of
//! someone else's process — is refused and counted. The pid an event carries is the one the
//! process sees (its own pid namespace); it is taken if it is any of the connected process's pids
//! (`NSpid` in its /proc status) and replaced by the pid the agent sees. A process the agent
//! cannot see (another pid namespace, no pid there) speaks for the first pid it names.

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use gpuprof_model::event::{wall_clock_ns, Event, Layer, Op, Source};
use gpuprof_model::level::Level;
use gpuprof_model::report::Notice;
use gpuprof_model::shim::wire::{self, Message};
use gpuprof_model::shim::{self, CountersLine, CuptiState};
use gpuprof_model::stack::Stack;

/// Messages decoded and not yet taken by the capture loop (all connections together).
const CHANNEL_BOUND: usize = 1 << 14;

/// The shim's counters, summed over the processes that sent theirs.
#[derive(Debug, Default, Clone, Copy)]
pub struct ShimCounters {
    pub sent: u64,
    pub dropped_queue_full: u64,
    /// Reports whose thread waited for room in its shim's queue, and the time they waited (ns).
    pub waits: u64,
    pub wait_ns: u64,
    pub stacks_cut: u64,
    pub stacks_unresolved: u64,
    /// Processes whose driver calls CUPTI's callbacks captured, and those where it could not:
    /// another subscriber held the slot, or no libcupti was found.
    pub cupti: CuptiProcesses,
    /// Processes whose CUPTI activity records disagreed with the callbacks.
    pub cross_check_disagreed: u64,
}

/// Processes by the state of their CUPTI subscription at exit.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CuptiProcesses {
    pub subscribed: u64,
    /// Another subscriber held the slot first.
    pub slot_taken: u64,
    /// A profiler subscribed later and got the slot.
    pub handed_over: u64,
    pub no_libcupti: u64,
}

impl ShimCounters {
    /// One process's counters line, as a sum over that process.
    fn of(line: &shim::Counters) -> ShimCounters {
        let mut cupti = CuptiProcesses::default();
        match line.cupti {
            Some(CuptiState::Subscribed) => cupti.subscribed = 1,
            Some(CuptiState::SlotTaken) => cupti.slot_taken = 1,
            Some(CuptiState::HandedOver) => cupti.handed_over = 1,
            Some(CuptiState::NoLibrary) => cupti.no_libcupti = 1,
            Some(CuptiState::NotStarted | CuptiState::Failed | CuptiState::Unknown) | None => {}
        }
        ShimCounters {
            sent: line.sent,
            dropped_queue_full: line.dropped_queue_full,
            waits: line.waits,
            wait_ns: line.wait_ns,
            stacks_cut: line.stacks_cut,
            stacks_unresolved: line.stacks_unresolved,
            cupti,
            cross_check_disagreed: u64::from(line.cupti_cross_check.as_ref().is_some_and(|check| !check.agrees)),
        }
    }

    pub(crate) fn add(&mut self, other: &ShimCounters) {
        self.sent += other.sent;
        self.dropped_queue_full += other.dropped_queue_full;
        self.waits += other.waits;
        self.wait_ns += other.wait_ns;
        self.stacks_cut += other.stacks_cut;
        self.stacks_unresolved += other.stacks_unresolved;
        self.cupti.subscribed += other.cupti.subscribed;
        self.cupti.slot_taken += other.cupti.slot_taken;
        self.cupti.handed_over += other.cupti.handed_over;
        self.cupti.no_libcupti += other.cupti.no_libcupti;
        self.cross_check_disagreed += other.cross_check_disagreed;
    }
}

/// What the connections hand the capture loop.
#[allow(clippy::large_enum_variant)] // events are the common case; boxing each would cost more
pub enum ShimMessage {
    /// A process connected: where to send it words.
    Opened {
        connection: u64,
        words: Option<UnixStream>,
    },
    Event {
        connection: u64,
        event: Event,
    },
    /// The process said who it is (before any event): its pid, as the agent sees it.
    Speaks {
        connection: u64,
        pid: u32,
    },
    /// The process took this capture level at `ts`.
    Level {
        connection: u64,
        level: Level,
        ts: u64,
    },
    Counters(ShimCounters),
    /// A line that was neither (counted, not fatal).
    Undecodable,
    /// An event naming a process other than the one connected (counted, said once per connection).
    Refused {
        first: bool,
        claimed: u32,
        peer: Option<u32>,
        uid: u32,
    },
    Closed {
        connection: u64,
    },
}

impl ShimMessage {
    /// The warning a refusal is said with (once per connection).
    pub(crate) fn refusal_text(claimed: u32, peer: Option<u32>, uid: u32) -> String {
        let peer = peer.map_or_else(|| "a process in another pid namespace".to_string(), |pid| format!("pid {pid}"));
        format!("refused events for pid {claimed} from {peer} (uid {uid}) on the shim socket: a process speaks only for itself; its events are counted, not taken")
    }
}

/// Who may connect to a socket the agent listens on: its mode, and the group that owns it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SocketAccess {
    pub mode: u32,
    pub group: Option<u32>,
}

impl SocketAccess {
    /// The owner only.
    pub const PRIVATE: SocketAccess = SocketAccess { mode: 0o600, group: None };
}

/// Listens on `path` (replacing a stale socket file) with the given access and decodes every
/// connection in the background.
pub fn listen(path: &Path, access: SocketAccess) -> Result<Receiver<ShimMessage>> {
    if path.exists() {
        std::fs::remove_file(path).with_context(|| format!("cannot replace {}", path.display()))?;
    }
    // Created with no access for others, then opened as far as asked: no moment open to all.
    // SAFETY: umask only swaps the process's file-creation mask.
    let previous = unsafe { libc::umask(0o177) };
    let bound = UnixListener::bind(path);
    // SAFETY: as above, restoring it.
    unsafe { libc::umask(previous) };
    let listener = bound.with_context(|| format!("cannot listen on {} for the shim", path.display()))?;
    if let Some(gid) = access.group {
        std::os::unix::fs::chown(path, None, Some(gid))
            .with_context(|| format!("cannot give {} to group {gid}", path.display()))?;
    }
    std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(access.mode))
        .with_context(|| format!("cannot set mode {:o} on {}", access.mode, path.display()))?;
    let (messages, received) = mpsc::sync_channel(CHANNEL_BOUND);
    std::thread::Builder::new()
        .name("gpuprof-shim-accept".into())
        .spawn(move || {
            for (connection, stream) in (0u64..).zip(listener.incoming()) {
                let Ok(stream) = stream else { continue };
                let messages = messages.clone();
                let _ = std::thread::Builder::new()
                    .name("gpuprof-shim-read".into())
                    .spawn(move || read_connection(connection, stream, &messages));
            }
        })
        .context("cannot start the shim socket's thread")?;
    Ok(received)
}

fn read_connection(connection: u64, stream: UnixStream, messages: &SyncSender<ShimMessage>) {
    let speaker = Speaker::of(&stream);
    if messages.send(ShimMessage::Opened { connection, words: stream.try_clone().ok() }).is_err() {
        return;
    }
    let mut reader = BufReader::with_capacity(1 << 16, stream);
    let binary = matches!(reader.fill_buf(), Ok(bytes) if bytes.first() == wire::MAGIC.first());
    let mut connection_reader =
        ConnectionReader { connection, speaker, messages, rank: None, allocator_settings: None, rank_told: false };
    let _ = if binary { connection_reader.binary(&mut reader) } else { connection_reader.lines(reader) };
    let _ = messages.send(ShimMessage::Closed { connection });
}

/// One connection's decoding: what it said so far, and where decoded messages go.
struct ConnectionReader<'m> {
    connection: u64,
    speaker: Speaker,
    messages: &'m SyncSender<ShimMessage>,
    /// The rank and allocator settings the process said it has, put on its first call (where a
    /// capture reading /proc puts the ones it reads).
    rank: Option<u32>,
    allocator_settings: Option<Arc<str>>,
    rank_told: bool,
}

/// The loop stopped listening: the reader ends.
struct Gone;

impl ConnectionReader<'_> {
    fn send(&self, message: ShimMessage) -> std::result::Result<(), Gone> {
        self.messages.send(message).map_err(|_| Gone)
    }

    /// An event for the loop, if the process may speak for the pid it names.
    fn event(&mut self, mut event: Event) -> std::result::Result<(), Gone> {
        if !self.rank_told && event.layer != Layer::Process {
            event.rank = event.rank.or(self.rank);
            event.allocator_settings = event.allocator_settings.take().or_else(|| self.allocator_settings.clone());
            self.rank_told = true;
        }
        let message = match self.speaker.admit(&mut event) {
            Ok(()) => ShimMessage::Event { connection: self.connection, event },
            Err(first) => {
                ShimMessage::Refused { first, claimed: event.pid, peer: self.speaker.peer, uid: self.speaker.uid }
            }
        };
        self.send(message)
    }

    fn json(&mut self, line: &str) -> std::result::Result<(), Gone> {
        match decode(self.connection, line) {
            ShimMessage::Event { event, .. } => self.event(event),
            other => self.send(other),
        }
    }

    /// jsonl, from a shim before the binary stream.
    fn lines(&mut self, reader: BufReader<UnixStream>) -> std::result::Result<(), Gone> {
        for line in reader.lines() {
            let Ok(line) = line else { break };
            self.json(&line)?;
        }
        Ok(())
    }

    /// The binary stream: its stacks and node classes kept by number for the blocks naming them.
    fn binary(&mut self, reader: &mut BufReader<UnixStream>) -> std::result::Result<(), Gone> {
        let mut magic = [0u8; 8];
        if reader.read_exact(&mut magic).is_err() || &magic != wire::MAGIC {
            return self.send(ShimMessage::Undecodable);
        }
        let mut stacks: HashMap<u32, Stack> = HashMap::new();
        let mut names: HashMap<u32, Arc<str>> = HashMap::new();
        let (mut comm, mut ppid): (Arc<str>, Option<u32>) = (gpuprof_model::event::no_comm(), None);
        let mut body = Vec::new();
        loop {
            let mut length = [0u8; 4];
            if reader.read_exact(&mut length).is_err() {
                return Ok(());
            }
            let length = u32::from_le_bytes(length) as usize;
            if length > wire::MAX_MESSAGE {
                // Nothing after it can be framed: the connection is given up, counted.
                return self.send(ShimMessage::Undecodable);
            }
            body.resize(length, 0);
            if reader.read_exact(&mut body).is_err() {
                return Ok(());
            }
            let Ok(message) = Message::read(&body) else {
                self.send(ShimMessage::Undecodable)?;
                continue;
            };
            match message {
                Message::Json(text) => self.json(&text)?,
                Message::Process { pid, ppid: parent, comm: name, rank, allocator_settings } => {
                    self.rank = rank;
                    self.allocator_settings = allocator_settings.map(|s| Arc::from(s.as_ref()));
                    comm = Arc::from(name.as_ref());
                    ppid = Some(parent);
                    // Admitted as an event's pid would be: the agent's view of its own pid.
                    let mut hello = Event::new(0, pid, pid, Source::Shim, Layer::Process, Op::Exec, "hello".into());
                    if self.speaker.admit(&mut hello).is_ok() {
                        self.send(ShimMessage::Speaks { connection: self.connection, pid: hello.pid })?;
                    }
                }
                Message::Stack { id, frames } => {
                    stacks.insert(id, Stack::new(frames));
                }
                Message::Name { id, text } => {
                    names.insert(id, Arc::from(text.as_ref()));
                }
                Message::Block(block) => {
                    let stack = match stacks.get(&block.stack) {
                        Some(stack) => stack.clone(),
                        None => {
                            // A number the shim never sent frames for: the block is kept, without
                            // its stack, and the stream counted as undecodable there.
                            if block.stack != 0 {
                                self.send(ShimMessage::Undecodable)?;
                            }
                            Stack::empty()
                        }
                    };
                    let node = block.autograd.and_then(|(node, _, _)| names.get(&node).cloned());
                    let mut event = block.event(stack, node);
                    event.comm = comm.clone();
                    event.ppid = ppid;
                    self.event(event)?;
                }
                Message::Level { level, ts } => {
                    self.send(ShimMessage::Level { connection: self.connection, level, ts })?
                }
                Message::ForgetStacks => stacks.clear(),
            }
        }
    }
}

/// The process at the other end of one connection, as the kernel names it.
struct Speaker {
    /// Its pid as the agent sees it; None when it has none here (another pid namespace) or the
    /// kernel did not say.
    peer: Option<u32>,
    uid: u32,
    /// The pids it may name: its pid in each pid namespace it is in (the agent's first).
    own: Vec<u32>,
    refused_before: bool,
}

impl Speaker {
    fn of(stream: &UnixStream) -> Speaker {
        let (peer, uid) =
            peer_credentials(stream).map_or((None, u32::MAX), |(pid, uid)| ((pid > 0).then_some(pid), uid));
        let own = peer.map(|pid| namespace_pids(pid).unwrap_or_else(|| vec![pid])).unwrap_or_default();
        Speaker { peer, uid, own, refused_before: false }
    }

    /// Ok with the pid rewritten to the agent's view, or Err(first refusal on this connection).
    fn admit(&mut self, event: &mut Event) -> std::result::Result<(), bool> {
        if self.own.is_empty() {
            // Not visible here: the first pid it names is the one it speaks for.
            self.own.push(event.pid);
        }
        if !self.own.contains(&event.pid) {
            let first = !self.refused_before;
            self.refused_before = true;
            return Err(first);
        }
        if let Some(peer) = self.peer {
            if event.tid == event.pid {
                event.tid = peer;
            }
            event.pid = peer;
        }
        Ok(())
    }
}

/// (pid, uid) of the process that connected, from the kernel.
fn peer_credentials(stream: &UnixStream) -> Option<(u32, u32)> {
    use std::os::fd::AsRawFd;
    let mut credentials = libc::ucred { pid: 0, uid: 0, gid: 0 };
    let mut length = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: SO_PEERCRED fills a ucred of the given length on a connected Unix socket.
    let status = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            &mut credentials as *mut libc::ucred as *mut libc::c_void,
            &mut length,
        )
    };
    (status == 0).then_some((credentials.pid as u32, credentials.uid))
}

/// A process's pid in every pid namespace it is in, the agent's first (`NSpid:` of its status).
fn namespace_pids(pid: u32) -> Option<Vec<u32>> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find_map(|l| l.strip_prefix("NSpid:"))?;
    line.split_whitespace().map(|p| p.parse().ok()).collect()
}

fn decode(connection: u64, line: &str) -> ShimMessage {
    if CountersLine::is_one(line) {
        return match serde_json::from_str::<CountersLine>(line) {
            Ok(counters) => ShimMessage::Counters(ShimCounters::of(&counters.gpuprof_shim)),
            Err(_) => ShimMessage::Undecodable,
        };
    }
    match serde_json::from_str::<Event>(line) {
        Ok(event) => ShimMessage::Event { connection, event },
        Err(_) => ShimMessage::Undecodable,
    }
}

/// What the shims have said and done since the socket opened (the capture's statistics copy it).
#[derive(Debug, Default, Clone, Copy)]
pub struct ShimTotals {
    pub processes_seen: u64,
    pub processes_closed: u64,
    /// Closed out by hanging up without saying they exit.
    pub closed_without_exit: u64,
    pub counters: ShimCounters,
    pub undecodable: u64,
    /// Events naming a process other than the one connected.
    pub refused: u64,
}

/// The processes speaking on the socket: each connection is one process; one that hangs up
/// without saying it exits (os._exit, a signal) has exited then — which matters when the shim is
/// the only capture (`run --via shim`, `daemon --capture shim`; beside eBPF the kernel reports
/// exits). Bounded: a process is forgotten when it hangs up.
#[derive(Default)]
pub struct ShimProcesses {
    /// Open connections, and the pid each one speaks for (known from its first event).
    connections: HashMap<u64, Option<u32>>,
    /// Where each open connection takes words, and the pid it said it is.
    words: HashMap<u64, UnixStream>,
    speakers: HashMap<u64, u32>,
    /// The level each process said it took last, and when.
    levels: HashMap<u32, (Level, u64)>,
    /// The level every process is to take when it connects (None: the one it starts with).
    pub initial_level: Option<Level>,
    /// Processes with an open connection that said they exit.
    said_exit: HashSet<u32>,
    pub totals: ShimTotals,
    /// What is to be said of the processes (a level changed, a connection refused), until taken.
    said: Vec<Notice>,
    /// The pids the processes name are this agent's (its /proc shows them); false in a pod's
    /// sidecar, where /proc/PID is another process.
    pub pids_are_ours: bool,
}

impl ShimProcesses {
    /// `pids_are_ours`: see the field.
    pub(crate) fn new(pids_are_ours: bool) -> ShimProcesses {
        ShimProcesses { pids_are_ours, ..ShimProcesses::default() }
    }

    /// What is to be said since the last call.
    pub(crate) fn take_said(&mut self) -> Vec<Notice> {
        std::mem::take(&mut self.said)
    }

    /// Hands what arrived (waiting up to `wait` for the first) to `observe`, exits included.
    pub(crate) fn receive(
        &mut self,
        received: &Receiver<ShimMessage>,
        wait: Duration,
        observe: &mut dyn FnMut(Event) -> Result<()>,
    ) -> Result<()> {
        let mut next = received.recv_timeout(wait).ok();
        while let Some(message) = next {
            match message {
                ShimMessage::Opened { connection, words } => {
                    self.connections.insert(connection, None);
                    if let Some(mut stream) = words {
                        if let Some(level) = self.initial_level {
                            let _ = stream.write_all(wire::level_word(level).as_bytes());
                        }
                        self.words.insert(connection, stream);
                    }
                }
                ShimMessage::Speaks { connection, pid } => {
                    self.speakers.insert(connection, pid);
                }
                ShimMessage::Level { connection, level, ts } => {
                    if let Some(pid) = self.speakers.get(&connection) {
                        // A process's first word is the level it starts at; a change is said.
                        if self.levels.insert(*pid, (level, ts)).is_some_and(|(before, _)| before != level) {
                            self.said.push(Notice::Info(format!("pid {pid}: the shim records at {level} from now on")));
                        }
                    }
                }
                ShimMessage::Event { connection, event } => {
                    let speaker = self.connections.entry(connection).or_insert(None);
                    if speaker.is_none() {
                        self.totals.processes_seen += 1;
                    }
                    *speaker = Some(event.pid);
                    if event.layer == Layer::Process && event.op == Op::Exit {
                        self.said_exit.insert(event.pid);
                    }
                    observe(event)?;
                }
                ShimMessage::Counters(counters) => self.totals.counters.add(&counters),
                ShimMessage::Undecodable => self.totals.undecodable += 1,
                ShimMessage::Refused { first, claimed, peer, uid } => {
                    self.totals.refused += 1;
                    if first {
                        self.said.push(Notice::Warning(ShimMessage::refusal_text(claimed, peer, uid)));
                    }
                }
                ShimMessage::Closed { connection } => {
                    self.words.remove(&connection);
                    if let Some(pid) = self.speakers.remove(&connection) {
                        self.levels.remove(&pid);
                    }
                    if let Some(Some(pid)) = self.connections.remove(&connection) {
                        self.totals.processes_closed += 1;
                        if !self.said_exit.remove(&pid) {
                            self.totals.closed_without_exit += 1;
                            let mut exit = Event::new(
                                wall_clock_ns(),
                                pid,
                                pid,
                                Source::Shim,
                                Layer::Process,
                                Op::Exit,
                                "exit".into(),
                            );
                            if self.pids_are_ours {
                                exit.comm = gpuprof_procfs::process::comm(pid).into();
                            }
                            observe(exit)?;
                        }
                    }
                }
            }
            next = received.try_recv().ok();
        }
        Ok(())
    }

    /// Tells process `pid` (each of its connections) to take `level`; false when no connection
    /// speaks for it (yet).
    pub(crate) fn set_level(&mut self, pid: u32, level: Level) -> bool {
        let mut told = false;
        for (connection, speaker) in &self.speakers {
            if *speaker != pid {
                continue;
            }
            if let Some(stream) = self.words.get_mut(connection) {
                told |= stream.write_all(wire::level_word(level).as_bytes()).is_ok();
            }
        }
        told
    }

    /// Events the shims dropped (their queues were full).
    pub(crate) fn dropped(&self) -> u64 {
        self.totals.counters.dropped_queue_full
    }

    /// Processes connected now.
    pub fn open(&self) -> usize {
        self.connections.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_counters_line_says_the_cupti_state_and_the_cross_check_verdict() {
        let line = r#"{"gpuprof_shim":{"pid":7,"sent":12,"dropped_queue_full":3,"stacks_cut":1,"stacks_unresolved":0,"cupti":"handed_over","cupti_library":"/x/libcupti.so.13","cupti_cross_check":{"callbacks":{"device":[2,1]},"activity":{"device":[2,0]},"activity_pool_records":0,"activity_dropped":0,"interrupted":false,"agrees":false}}}"#;
        let ShimMessage::Counters(counters) = decode(0, line) else { panic!("not a counters line") };
        assert_eq!((counters.sent, counters.dropped_queue_full, counters.stacks_cut), (12, 3, 1));
        assert_eq!(counters.cupti, CuptiProcesses { handed_over: 1, ..CuptiProcesses::default() });
        assert_eq!(counters.cross_check_disagreed, 1);
        // A shim from before CUPTI: no such fields, nothing counted.
        let old = r#"{"gpuprof_shim":{"pid":7,"sent":1,"dropped_queue_full":0,"stacks_cut":0,"stacks_unresolved":0}}"#;
        let ShimMessage::Counters(counters) = decode(0, old) else { panic!("not a counters line") };
        assert_eq!((counters.cupti, counters.cross_check_disagreed), (CuptiProcesses::default(), 0));
    }

    #[test]
    fn a_block_takes_the_stack_sent_under_its_number_an_unsent_number_is_counted_and_the_first_the_rank() {
        let path = gpuprof_testkit::scratch("shim-socket-numbers").join("shim.sock");
        let received = listen(&path, SocketAccess::PRIVATE).unwrap();
        let pid = std::process::id();
        let block = wire::Block {
            ts: 5,
            pid,
            tid: pid,
            ptr: 0x7f00_0020_0000,
            delta: 4096,
            allocated: 4096,
            reserved: 2 << 20,
            device: 0,
            stack: 1,
            autograd: None,
        };
        let frame = gpuprof_model::event::Frame { function: "<module>".into(), file: "train.py".into(), line: 34 };
        let mut stream = wire::MAGIC.to_vec();
        let allocator_settings = Some("max_split_size_mb:128".into());
        Message::Process { pid, ppid: 1, comm: "python3".into(), rank: Some(3), allocator_settings }.write(&mut stream);
        Message::Stack { id: 1, frames: vec![frame.clone()] }.write(&mut stream);
        Message::Block(block).write(&mut stream);
        Message::Block(wire::Block { stack: 2, ptr: 0x7f00_0020_1000, ..block }).write(&mut stream);
        UnixStream::connect(&path).unwrap().write_all(&stream).unwrap();

        let mut seen = Vec::new();
        while let Ok(message) = received.recv_timeout(Duration::from_secs(10)) {
            match message {
                ShimMessage::Event { event, .. } => {
                    let (addr, frames) = (event.addr.unwrap(), event.stack.frames());
                    seen.push(format!("{addr:#x} {frames:?} {:?} {:?}", event.rank, event.allocator_settings))
                }
                ShimMessage::Undecodable => seen.push("undecodable".to_string()),
                ShimMessage::Closed { .. } => break,
                _ => {}
            }
        }
        assert_eq!(
            seen,
            // The rank and allocator settings the process said it has, on its first call only.
            [
                format!("0x7f0000200000 {:?} Some(3) Some(\"max_split_size_mb:128\")", [frame]),
                "undecodable".to_string(),
                "0x7f0000201000 [] None None".to_string()
            ]
        );
    }
}
