//! The tracker: folds an event stream into what each process holds right now — allocations by
//! kind, mappings, IPC imports, contexts — and closes a process's table when it exits or execs.
//!
//! Addresses are per process (two processes may hold the same device address), and a process is
//! one instance of a pid: after its exit, a reused pid starts a new table.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};

use crate::event::{Event, Frame, Kind, Layer, Op};

/// Memory a process allocated and has not released.
#[derive(Debug, Clone, PartialEq)]
pub struct Allocation {
    pub addr: u64,
    pub size: u64,
    pub kind: Kind,
    pub api: Cow<'static, str>,
    pub ts: u64,
    pub tid: u32,
    pub stack: Vec<Frame>,
}

/// Memory made reachable in a process without being allocated by it: a VMM mapping, registered
/// host memory, or another process's buffer opened through an IPC handle.
#[derive(Debug, Clone, PartialEq)]
pub struct Mapping {
    pub addr: u64,
    pub size: u64,
    pub kind: Kind,
    pub api: Cow<'static, str>,
    pub ts: u64,
    pub handle: Option<Vec<u8>>,
    pub stack: Vec<Frame>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcessState {
    Running,
    /// The process exited; `code` is its exit status or 128 + signal.
    Exited { code: i32, signal: Option<i32>, ts: u64 },
    /// The program was replaced by exec; the pid lives on with a new table.
    Replaced { ts: u64 },
}

/// Allocations are keyed by their address space: device/host pointers and VMM handles are
/// different namespaces even when the numbers coincide.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Space {
    Pointer,
    VmmHandle,
}

/// One process instance's table.
#[derive(Debug, Clone, PartialEq)]
pub struct ProcessMemory {
    pub pid: u32,
    pub ppid: Option<u32>,
    pub comm: String,
    pub first_ts: u64,
    pub last_ts: u64,
    pub state: ProcessState,
    allocations: HashMap<(Space, u64), Allocation>,
    mappings: HashMap<u64, Mapping>,
    imports: HashMap<u64, Mapping>,
    reservations: HashMap<u64, u64>,
    contexts: u32,
    driver_calls: u64,
}

impl ProcessMemory {
    fn new(event: &Event) -> Self {
        ProcessMemory {
            pid: event.pid,
            ppid: event.ppid,
            comm: event.comm.clone(),
            first_ts: event.ts,
            last_ts: event.ts,
            state: ProcessState::Running,
            allocations: HashMap::new(),
            mappings: HashMap::new(),
            imports: HashMap::new(),
            reservations: HashMap::new(),
            contexts: 0,
            driver_calls: 0,
        }
    }

    /// Driver calls made by this process instance, failed ones included.
    pub fn driver_calls(&self) -> u64 {
        self.driver_calls
    }

    /// Live allocations, oldest first.
    pub fn allocations(&self) -> Vec<&Allocation> {
        let mut live: Vec<&Allocation> = self.allocations.values().collect();
        live.sort_by_key(|a| (a.ts, a.addr));
        live
    }

    /// Open IPC imports, oldest first.
    pub fn imports(&self) -> Vec<&Mapping> {
        let mut open: Vec<&Mapping> = self.imports.values().collect();
        open.sort_by_key(|m| (m.ts, m.addr));
        open
    }

    /// Live mappings (VMM, registered host memory), oldest first.
    pub fn mappings(&self) -> Vec<&Mapping> {
        let mut live: Vec<&Mapping> = self.mappings.values().collect();
        live.sort_by_key(|m| (m.ts, m.addr));
        live
    }

    pub fn live_bytes(&self) -> u64 {
        self.allocations.values().map(|a| a.size).sum()
    }

    pub fn contexts(&self) -> u32 {
        self.contexts
    }

    pub fn summary(&self) -> LiveSummary {
        let mut by_kind: BTreeMap<Kind, KindTotal> = BTreeMap::new();
        for allocation in self.allocations.values() {
            let total = by_kind.entry(allocation.kind).or_default();
            total.bytes += allocation.size;
            total.count += 1;
        }
        LiveSummary {
            pid: self.pid,
            ppid: self.ppid,
            comm: self.comm.clone(),
            state: self.state,
            by_kind,
            mapped_bytes: self.mappings.values().map(|m| m.size).sum(),
            imports: self.imports.len() as u64,
            contexts: self.contexts,
            driver_calls: self.driver_calls,
        }
    }

    fn apply_driver(&mut self, event: &Event) {
        let Some(addr) = event.addr else { return };
        let kind = event.kind.unwrap_or(Kind::Device);
        match event.op {
            Op::Alloc => {
                let space = if kind == Kind::Vmm { Space::VmmHandle } else { Space::Pointer };
                self.allocations.insert((space, addr), allocation_of(event, addr, kind));
            }
            Op::Free => {
                if kind == Kind::Vmm {
                    self.allocations.remove(&(Space::VmmHandle, addr));
                } else if self.allocations.remove(&(Space::Pointer, addr)).is_none() {
                    // An imported pool pointer is released with cuMemFree(Async) in the importer.
                    self.imports.remove(&addr);
                }
            }
            Op::Reserve => {
                self.reservations.insert(addr, event.size);
            }
            Op::Unreserve => {
                self.reservations.remove(&addr);
            }
            Op::Map => {
                self.mappings.insert(addr, mapping_of(event, addr, kind));
            }
            Op::Unmap => {
                self.mappings.remove(&addr);
            }
            Op::IpcOpen => {
                self.imports.insert(addr, mapping_of(event, addr, kind));
            }
            Op::IpcClose => {
                self.imports.remove(&addr);
            }
            Op::CtxCreate => self.contexts += 1,
            Op::CtxDestroy => self.contexts = self.contexts.saturating_sub(1),
            Op::IpcExport | Op::MemInfo | Op::Fork | Op::Exec | Op::Exit => {}
        }
    }
}

fn allocation_of(event: &Event, addr: u64, kind: Kind) -> Allocation {
    Allocation {
        addr,
        size: event.size,
        kind,
        api: event.api.clone(),
        ts: event.ts,
        tid: event.tid,
        stack: event.stack.clone(),
    }
}

fn mapping_of(event: &Event, addr: u64, kind: Kind) -> Mapping {
    Mapping {
        addr,
        size: event.size,
        kind,
        api: event.api.clone(),
        ts: event.ts,
        handle: event.handle.clone(),
        stack: event.stack.clone(),
    }
}

/// Bytes and count of live allocations of one kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KindTotal {
    pub bytes: u64,
    pub count: u64,
}

/// What one process holds, for tables and summaries.
#[derive(Debug, Clone, PartialEq)]
pub struct LiveSummary {
    pub pid: u32,
    pub ppid: Option<u32>,
    pub comm: String,
    pub state: ProcessState,
    pub by_kind: BTreeMap<Kind, KindTotal>,
    pub mapped_bytes: u64,
    pub imports: u64,
    pub contexts: u32,
    pub driver_calls: u64,
}

/// Every process seen, live and closed.
#[derive(Debug, Default)]
pub struct Tracker {
    live: HashMap<u32, ProcessMemory>,
    closed: Vec<ProcessMemory>,
}

impl Tracker {
    pub fn new() -> Self {
        Self::default()
    }

    /// Folds one event in. Failed calls change nothing; events must come in capture order.
    pub fn apply(&mut self, event: &Event) {
        match (event.layer, event.op) {
            (Layer::Process, Op::Fork) => {
                // A forked child inherits no CUDA state: a fresh table, even if the pid was seen.
                self.close(event.pid, ProcessState::Replaced { ts: event.ts });
                self.live.insert(event.pid, ProcessMemory::new(event));
            }
            (Layer::Process, Op::Exec) => {
                self.close(event.pid, ProcessState::Replaced { ts: event.ts });
                self.live.insert(event.pid, ProcessMemory::new(event));
            }
            (Layer::Process, Op::Exit) => {
                self.process_mut(event);
                let state = ProcessState::Exited {
                    code: event.exit_code.unwrap_or(0),
                    signal: event.signal,
                    ts: event.ts,
                };
                self.close(event.pid, state);
            }
            _ => {
                let process = self.process_mut(event);
                process.driver_calls += 1;
                if event.succeeded() {
                    process.apply_driver(event);
                }
            }
        }
    }

    fn process_mut(&mut self, event: &Event) -> &mut ProcessMemory {
        let process = self.live.entry(event.pid).or_insert_with(|| ProcessMemory::new(event));
        process.last_ts = event.ts;
        if !event.comm.is_empty() {
            process.comm.clone_from(&event.comm);
        }
        if process.ppid.is_none() {
            process.ppid = event.ppid;
        }
        process
    }

    fn close(&mut self, pid: u32, state: ProcessState) {
        if let Some(mut process) = self.live.remove(&pid) {
            process.state = state;
            self.closed.push(process);
        }
    }

    /// A live process by pid.
    pub fn process(&self, pid: u32) -> Option<&ProcessMemory> {
        self.live.get(&pid)
    }

    /// Every process instance seen, in order of first appearance.
    pub fn processes(&self) -> Vec<&ProcessMemory> {
        let mut all: Vec<&ProcessMemory> = self.closed.iter().chain(self.live.values()).collect();
        all.sort_by_key(|p| (p.first_ts, p.pid));
        all
    }

    /// One summary per process instance, in order of first appearance.
    pub fn summaries(&self) -> Vec<LiveSummary> {
        self.processes().into_iter().map(ProcessMemory::summary).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::Source;

    fn driver(ts: u64, pid: u32, op: Op, api: &'static str, kind: Kind, addr: u64, size: u64) -> Event {
        let mut event = Event::new(ts, pid, pid, Source::Ebpf, Layer::Driver, op, Cow::Borrowed(api));
        event.kind = Some(kind);
        event.addr = Some(addr);
        event.size = size;
        event
    }

    fn process(ts: u64, pid: u32, op: Op, ppid: u32) -> Event {
        let mut event = Event::new(ts, pid, pid, Source::Ebpf, Layer::Process, op, Cow::Borrowed("sched"));
        event.ppid = Some(ppid);
        event
    }

    #[test]
    fn same_address_in_two_processes_is_two_allocations() {
        let mut tracker = Tracker::new();
        tracker.apply(&driver(1, 10, Op::Alloc, "cuMemAlloc_v2", Kind::Device, 0x7f00_0000_0000, 4096));
        tracker.apply(&driver(2, 11, Op::Alloc, "cuMemAlloc_v2", Kind::Device, 0x7f00_0000_0000, 8192));
        tracker.apply(&driver(3, 10, Op::Free, "cuMemFree_v2", Kind::Device, 0x7f00_0000_0000, 0));
        assert_eq!(tracker.process(10).unwrap().live_bytes(), 0);
        assert_eq!(tracker.process(11).unwrap().live_bytes(), 8192);
    }

    #[test]
    fn failed_calls_change_nothing_and_kinds_are_summed() {
        let mut tracker = Tracker::new();
        let mut failed = driver(1, 10, Op::Alloc, "cuMemAlloc_v2", Kind::Device, 0, 1 << 40);
        failed.result = 2;
        tracker.apply(&failed);
        tracker.apply(&driver(2, 10, Op::Alloc, "cuMemAllocHost_v2", Kind::HostPinned, 0x5000, 100));
        tracker.apply(&driver(3, 10, Op::Alloc, "cuMemCreate", Kind::Vmm, 0x5000, 2 << 20));
        tracker.apply(&driver(4, 10, Op::Map, "cuMemMap", Kind::Vmm, 0x7f00_0000_0000, 2 << 20));
        let summary = tracker.process(10).unwrap().summary();
        assert_eq!(summary.by_kind[&Kind::HostPinned], KindTotal { bytes: 100, count: 1 });
        assert_eq!(summary.by_kind[&Kind::Vmm], KindTotal { bytes: 2 << 20, count: 1 });
        assert_eq!(summary.by_kind.get(&Kind::Device), None);
        assert_eq!(summary.mapped_bytes, 2 << 20);
        // The VMM handle 0x5000 and the host pointer 0x5000 are different things.
        tracker.apply(&driver(5, 10, Op::Free, "cuMemRelease", Kind::Vmm, 0x5000, 0));
        let summary = tracker.process(10).unwrap().summary();
        assert_eq!(summary.by_kind[&Kind::HostPinned], KindTotal { bytes: 100, count: 1 });
        assert_eq!(summary.by_kind.get(&Kind::Vmm), None);
    }

    #[test]
    fn exit_closes_the_table_and_a_reused_pid_starts_fresh() {
        let mut tracker = Tracker::new();
        tracker.apply(&process(1, 20, Op::Fork, 10));
        tracker.apply(&driver(2, 20, Op::Alloc, "cuMemAlloc_v2", Kind::Device, 0x7f00_0000_0000, 4096));
        let mut exit = process(3, 20, Op::Exit, 10);
        exit.exit_code = Some(3);
        tracker.apply(&exit);
        assert!(tracker.process(20).is_none());
        tracker.apply(&process(4, 20, Op::Fork, 10));
        let summaries = tracker.summaries();
        assert_eq!(summaries.len(), 2);
        assert_eq!(summaries[0].state, ProcessState::Exited { code: 3, signal: None, ts: 3 });
        assert_eq!(summaries[0].by_kind[&Kind::Device].bytes, 4096);
        assert_eq!(summaries[1].state, ProcessState::Running);
        assert!(summaries[1].by_kind.is_empty());
    }
}
