//! The tracker: folds an event stream into what each process holds right now — allocations by
//! kind, mappings, IPC imports and the exports they came from, contexts — and closes a
//! process's table when it exits or execs. Leak rules read this state; they never keep their own
//! copy of it.
//!
//! Addresses are per process (two processes may hold the same device address), and a process is
//! one instance of a pid: after its exit, a reused pid starts a new table.

mod ipc;
mod process;

use std::collections::HashMap;

pub use ipc::{Export, ExportKey, ProcessRef};
pub use process::{
    Allocation, AllocatorTotals, FrameTotal, Import, KindTotal, LiveSummary, Mapping, ProcessMemory, ProcessState,
    Space, Stack, StackTotal,
};

use crate::event::{Event, Layer, Op};

/// Every process seen, live and closed, and the IPC exports still standing.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct Tracker {
    live: HashMap<u32, ProcessMemory>,
    closed: Vec<ProcessMemory>,
    exports: HashMap<ExportKey, Export>,
}

impl Tracker {
    pub fn new() -> Self {
        Self::default()
    }

    /// Folds one event in. Failed calls change nothing; events must come in capture order.
    pub fn apply(&mut self, event: &Event) {
        match (event.layer, event.op) {
            (Layer::Process, Op::Fork | Op::Exec) => {
                // A forked child inherits no CUDA state, and exec discards it: a fresh table.
                // Exec keeps the parent: a spawned worker is still its launcher's child.
                let parent = if event.op == Op::Exec { self.live.get(&event.pid).and_then(|p| p.ppid) } else { None };
                self.close(event.pid, ProcessState::Replaced { ts: event.ts });
                let mut process = ProcessMemory::new(event);
                process.ppid = process.ppid.or(parent);
                self.live.insert(event.pid, process);
            }
            (Layer::Process, Op::Exit) => {
                self.process_mut(event);
                let state =
                    ProcessState::Exited { code: event.exit_code.unwrap_or(0), signal: event.signal, ts: event.ts };
                self.close(event.pid, state);
            }
            (Layer::Allocator, _) => {
                self.process_mut(event).apply_allocator(event);
            }
            _ => {
                let import = self.import_of(event);
                let process = self.process_mut(event);
                process.count_driver_call();
                if !event.succeeded() {
                    return;
                }
                let released = process.apply_driver(event, import);
                let exporter = process.as_ref();
                if let Some((space, addr)) = released {
                    self.exports.retain(|_, e| !(e.exporter == exporter && e.space == space && e.addr == addr));
                }
                if event.op == Op::IpcExport {
                    self.record_export(event);
                }
            }
        }
    }

    /// The process an `ipc_open` event's memory comes from, when its export was seen.
    pub fn exporter_of(&self, event: &Event) -> Option<&Export> {
        if event.op != Op::IpcOpen {
            return None;
        }
        self.exports.get(&ExportKey::of(event)?)
    }

    /// The exports of `process` that hold the allocation at `addr` (all of them when `addr` is
    /// None, as at exit).
    pub fn exports_of(&self, process: ProcessRef, addr: Option<u64>) -> Vec<(&ExportKey, &Export)> {
        let mut found: Vec<(&ExportKey, &Export)> =
            self.exports.iter().filter(|(_, e)| e.exporter == process && addr.is_none_or(|a| a == e.addr)).collect();
        found.sort_by_key(|(_, e)| (e.ts, e.addr));
        found
    }

    /// Live processes other than `exporter` with an open import of `key`.
    pub fn importers_of(&self, key: &ExportKey, exporter: ProcessRef) -> Vec<(&ProcessMemory, &Import)> {
        let mut found: Vec<(&ProcessMemory, &Import)> = self
            .live
            .values()
            .filter(|p| p.as_ref() != exporter)
            .flat_map(|p| p.imports().into_iter().filter(|i| i.export.as_ref() == Some(key)).map(move |i| (p, i)))
            .collect();
        found.sort_by_key(|(p, i)| (p.pid, i.mapping.ts));
        found
    }

    fn import_of(&self, event: &Event) -> Option<(ExportKey, Option<Export>)> {
        let key = (event.op == Op::IpcOpen).then(|| ExportKey::of(event)).flatten()?;
        let export = self.exports.get(&key).cloned();
        Some((key, export))
    }

    fn record_export(&mut self, event: &Event) {
        let (Some(key), Some(addr)) = (ExportKey::of(event), event.addr) else { return };
        let Some(process) = self.live.get(&event.pid) else { return };
        let space = if event.kind == Some(crate::event::Kind::Vmm) { Space::VmmHandle } else { Space::Pointer };
        let size = process.allocation(space, addr).map(|a| a.size).unwrap_or(0);
        self.exports.insert(key, Export { exporter: process.as_ref(), space, addr, size, ts: event.ts });
    }

    fn process_mut(&mut self, event: &Event) -> &mut ProcessMemory {
        let process = self.live.entry(event.pid).or_insert_with(|| ProcessMemory::new(event));
        process.touch(event);
        process
    }

    fn close(&mut self, pid: u32, state: ProcessState) {
        if let Some(mut process) = self.live.remove(&pid) {
            let gone = process.as_ref();
            self.exports.retain(|_, e| e.exporter != gone);
            process.state = state;
            self.closed.push(process);
        }
    }

    /// A live process by pid.
    pub fn process(&self, pid: u32) -> Option<&ProcessMemory> {
        self.live.get(&pid)
    }

    /// Live processes, by pid.
    pub fn live_processes(&self) -> Vec<&ProcessMemory> {
        let mut live: Vec<&ProcessMemory> = self.live.values().collect();
        live.sort_by_key(|p| p.pid);
        live
    }

    /// When the instance of `pid` that something at `ts` is about was first seen (`ts` itself
    /// when none was).
    pub fn instance_since(&self, pid: u32, ts: u64) -> u64 {
        let closed = self.closed.iter().filter(|p| p.pid == pid && p.first_ts <= ts);
        let live = self.live.get(&pid).filter(|p| p.first_ts <= ts);
        closed.chain(live).map(|p| p.first_ts).max().unwrap_or(ts)
    }

    /// Every process instance seen, in order of first appearance.
    pub fn processes(&self) -> Vec<&ProcessMemory> {
        let mut all: Vec<&ProcessMemory> = self.closed.iter().chain(self.live.values()).collect();
        all.sort_by_key(|p| (p.first_ts, p.pid));
        all
    }

    /// Drops the tables of processes that ended before `ts`, returning how many: a long-running
    /// consumer (the collector) keeps its memory bounded under process churn. Findings about
    /// them fired when they ended; an IPC import of theirs that outlives this loses its peer.
    pub fn forget_closed_before(&mut self, ts: u64) -> usize {
        let before = self.closed.len();
        self.closed.retain(|p| match p.state {
            ProcessState::Exited { ts: ended, .. } | ProcessState::Replaced { ts: ended } => ended >= ts,
            ProcessState::Running => true,
        });
        before - self.closed.len()
    }

    /// One summary per process instance, in order of first appearance.
    pub fn summaries(&self) -> Vec<LiveSummary> {
        self.processes().into_iter().map(ProcessMemory::summary).collect()
    }
}

#[cfg(test)]
mod tests;
