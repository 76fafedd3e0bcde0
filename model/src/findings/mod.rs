//! Leak findings: pure functions over the event stream. Each rule is a module of its own; the
//! [`Analyzer`] runs them all beside one [`Tracker`], so `gpuprof report` (offline), the agent
//! (live) and the collector get the same findings from the same events.
//!
//! A clean process produces no finding: a false positive is a bug.

mod exit_with_live_allocations;
mod growth;
mod ipc_export_freed_while_imported;
mod ipc_handle_not_closed;
mod oom;
mod wording;
mod worker_cuda_context;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::event::{Event, Frame, Kind, Layer, Op};
use crate::track::Tracker;

/// The finding kinds of the contract.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FindingKind {
    ExitWithLiveAllocations,
    IpcHandleNotClosed,
    IpcExportFreedWhileImported,
    WorkerCudaContext,
    Growth,
    Oom,
}

impl FindingKind {
    pub fn as_str(self) -> &'static str {
        match self {
            FindingKind::ExitWithLiveAllocations => "exit_with_live_allocations",
            FindingKind::IpcHandleNotClosed => "ipc_handle_not_closed",
            FindingKind::IpcExportFreedWhileImported => "ipc_export_freed_while_imported",
            FindingKind::WorkerCudaContext => "worker_cuda_context",
            FindingKind::Growth => "growth",
            FindingKind::Oom => "oom",
        }
    }
}

/// Live memory of one stack in one process.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StackBytes {
    pub stack: Vec<Frame>,
    pub bytes: u64,
    pub count: u64,
}

/// What one process held at the moment of an `oom` finding.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProcessSnapshot {
    pub pid: u32,
    pub comm: String,
    /// Live bytes by memory kind.
    pub live: BTreeMap<Kind, u64>,
    /// The stacks holding the most live bytes, largest first.
    pub top_stacks: Vec<StackBytes>,
}

/// One finding, as `gpuprof report --format json` and the collector's API write it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Finding {
    pub kind: FindingKind,
    pub pid: u32,
    pub comm: String,
    pub bytes: u64,
    pub count: u64,
    /// The other process involved (the exporter, the importer, the parent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer_pid: Option<u32>,
    pub first_ts: u64,
    pub last_ts: u64,
    /// Innermost-first frames of the representative allocation or call.
    #[serde(default)]
    pub stack: Vec<Frame>,
    /// One sentence a person can act on.
    pub detail: String,
    /// The entry point of the representative call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api: Option<String>,
    /// `oom`: every process seen and what it held at that moment.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub processes: Vec<ProcessSnapshot>,
}

/// Thresholds of the rules that need them.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RuleConfig {
    /// Growth: length of one window.
    pub growth_window_ns: u64,
    /// Growth: consecutive windows, each ending higher than the one before, that make a finding.
    pub growth_rises: u32,
}

impl Default for RuleConfig {
    fn default() -> Self {
        RuleConfig { growth_window_ns: 10_000_000_000, growth_rises: 3 }
    }
}

/// Runs every rule over an event stream, incrementally.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct Analyzer {
    tracker: Tracker,
    worker_context: worker_cuda_context::Rule,
    growth: growth::Rule,
    last_ts: u64,
}

impl Analyzer {
    pub fn new(config: RuleConfig) -> Self {
        Analyzer {
            tracker: Tracker::new(),
            worker_context: worker_cuda_context::Rule::default(),
            growth: growth::Rule::new(config),
            last_ts: 0,
        }
    }

    /// Folds one event in (filling in what the stream knows about it, e.g. the exporter of an
    /// IPC open) and returns the findings it fired.
    pub fn observe(&mut self, event: &mut Event) -> Vec<Finding> {
        if event.op == Op::IpcOpen && event.peer_pid.is_none() {
            event.peer_pid = self.tracker.exporter_of(event).map(|e| e.exporter.pid);
        }
        if event.layer == Layer::Allocator && event.segment.is_none() {
            event.segment =
                event.addr.and_then(|addr| self.tracker.process(event.pid).and_then(|p| p.segment_of(addr)));
        }
        self.last_ts = self.last_ts.max(event.ts);
        let world = &self.tracker;
        let mut found = self.growth.before(event, world);
        found.extend(exit_with_live_allocations::check(event, world));
        found.extend(ipc_handle_not_closed::at_exit(event, world));
        found.extend(ipc_export_freed_while_imported::check(event, world));
        found.extend(oom::check(event, world));
        found.extend(self.worker_context.check(event, world));
        self.tracker.apply(event);
        if event.layer == Layer::Driver && matches!(event.op, Op::Free | Op::Unmap) {
            // The allocator's curves move when it returns a segment (empty_cache): say so on the
            // event, since the allocator itself reports nothing then.
            let process = self.tracker.process(event.pid);
            let changed = process.and_then(|p| p.allocator_totals().values().find(|t| t.ts == event.ts).copied());
            if let Some(totals) = changed {
                event.allocated = Some(totals.allocated);
                event.reserved = Some(totals.reserved);
            }
        }
        self.growth.after(event, &self.tracker);
        found
    }

    /// The window ends: what is still open then.
    pub fn finish(&mut self) -> Vec<Finding> {
        let mut found = self.growth.finish(self.last_ts, &self.tracker);
        found.extend(ipc_handle_not_closed::at_end(self.last_ts, &self.tracker));
        found
    }

    /// See `Tracker::forget_closed_before`; the rules forget those processes too.
    pub fn forget_closed_before(&mut self, ts: u64) -> usize {
        let forgotten = self.tracker.forget_closed_before(ts);
        if forgotten > 0 {
            let known: std::collections::HashSet<_> = self.tracker.processes().iter().map(|p| p.as_ref()).collect();
            self.worker_context.forget_unless(|process| known.contains(&process));
        }
        forgotten
    }

    pub fn tracker(&self) -> &Tracker {
        &self.tracker
    }
}

/// All findings of an event stream, in the order they fired.
pub fn analyze<'a>(events: impl IntoIterator<Item = &'a Event>, config: RuleConfig) -> Vec<Finding> {
    let mut analyzer = Analyzer::new(config);
    let mut found = Vec::new();
    for event in events {
        found.extend(analyzer.observe(&mut event.clone()));
    }
    found.extend(analyzer.finish());
    found
}

#[cfg(test)]
mod tests;
