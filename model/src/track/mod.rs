//! The tracker: routes each event to the table of the process instance it belongs to
//! (`process.rs`, which owns everything one process holds) and keeps what spans processes —
//! which instance each pid is now, the instances that ended, and the IPC exports still standing,
//! by which an import finds its exporter. Leak rules read this state; they never keep their own
//! copy of it.
//!
//! Addresses are per process (two processes may hold the same device address), and a process is
//! one instance of a pid: after its exit, a reused pid starts a new table.

mod ipc;
mod process;
mod space;

use std::collections::hash_map::Entry;
use std::collections::HashMap;

pub use ipc::{Export, ExportKey, ProcessRef};
pub use process::{
    Allocation, AllocatorTotals, FrameTotal, Import, KindTotal, LiveSummary, Mapping, ProcessMemory, ProcessState,
    Stack,
};
pub use space::Space;

use crate::event::{Event, Layer, Op};
use process::Outcome;

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
        let import = self.import_of(event);
        let process = match self.live.entry(event.pid) {
            Entry::Occupied(known) => known.into_mut(),
            Entry::Vacant(unseen) => {
                let process = unseen.insert(ProcessMemory::new(event));
                if event.layer == Layer::Process && matches!(event.op, Op::Fork | Op::Exec) {
                    // No earlier instance of the pid to end: this event only begins one.
                    return;
                }
                process
            }
        };
        match process.apply(event, import) {
            Outcome::Kept => {}
            Outcome::Released { exporter, space, addr } => {
                self.exports.retain(|_, e| !(e.exporter == exporter && e.space == space && e.addr == addr));
            }
            Outcome::Exported(export) => {
                if let Some(key) = ExportKey::of(event) {
                    self.exports.insert(key, export);
                }
            }
            Outcome::Ended { instance, next } => {
                self.close(instance);
                if let Some(next) = next {
                    self.live.insert(event.pid, *next);
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
    pub(crate) fn importers_of(&self, key: &ExportKey, exporter: ProcessRef) -> Vec<(&ProcessMemory, &Import)> {
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

    /// Moves an ended instance (its state already says how it ended) to the closed ones; its
    /// exports lead nowhere any more.
    fn close(&mut self, instance: ProcessRef) {
        if let Some(process) = self.live.remove(&instance.pid) {
            self.exports.retain(|_, e| e.exporter != instance);
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
        self.closed.retain(|p| p.ended_at().is_none_or(|ended| ended >= ts));
        before - self.closed.len()
    }

    /// One summary per process instance, in order of first appearance.
    pub fn summaries(&self) -> Vec<LiveSummary> {
        self.processes().into_iter().map(ProcessMemory::summary).collect()
    }
}

#[cfg(test)]
mod tests;
