//! Leak findings: pure functions over the event stream. Each rule is a module of its own; the
//! [`Analyzer`] runs them all beside one [`Tracker`], so `gpuprof report` (offline), the agent
//! (live) and the collector get the same findings from the same events.
//!
//! A clean process produces no finding: a false positive is a bug.

mod exit_with_live_allocations;
mod fail_on;
mod growth;
mod ipc_export_freed_while_imported;
mod ipc_handle_not_closed;
mod oom;
mod orphan_holding_memory;
pub mod rank_divergence;
mod reported;
pub mod wording;
mod worker_cuda_context;

pub use crate::user_frame::user_frame;
pub use fail_on::{FailOn, FAIL_ON_EXIT};

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
    OrphanHoldingMemory,
    RankDivergence,
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
            FindingKind::OrphanHoldingMemory => "orphan_holding_memory",
            FindingKind::RankDivergence => "rank_divergence",
        }
    }
}

/// Whether a finding asks for action.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    /// Memory held that should not be, or a failure: act on it.
    Leak,
    /// Worth knowing; nothing is wrong (a process that exits holding its allocator's cache).
    Info,
}

impl Severity {
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Leak => "leak",
            Severity::Info => "info",
        }
    }

    fn leak() -> Severity {
        Severity::Leak
    }
}

/// Why a finding's memory is held or ran out, where the events show it: one cause, named, with
/// its fix in the finding's sentence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Diagnosis {
    /// The growing blocks were made by forward ops whose autograd nodes no backward pass
    /// evaluated: a graph kept alive (evaluation without `torch.no_grad()`, a loss kept across
    /// steps without `.item()`).
    AutogradGraphRetained,
    /// The growing blocks were allocated at the user's line outside autograd, or outlive the
    /// step that made them: something there keeps them (a list, a cache, a dict).
    TensorsKeptByUserCode,
    /// An out-of-memory failure with enough cached in the process's own allocator, in pieces
    /// too small for the request.
    Fragmentation,
    /// An out-of-memory failure another process's allocator cache would have made room for.
    NeighbourCache,
    /// An out-of-memory failure with the device full of live memory: nothing cached to give back.
    DeviceFull,
    /// A DataLoader worker made a CUDA context of its own.
    CudaInDataloaderWorker,
    /// A process outlived its parent holding device memory.
    OrphanedWorker,
    /// An IPC handle opened (or exported) and never closed.
    IpcHandleNotReleased,
}

impl Diagnosis {
    pub fn as_str(self) -> &'static str {
        match self {
            Diagnosis::AutogradGraphRetained => "autograd_graph_retained",
            Diagnosis::TensorsKeptByUserCode => "tensors_kept_by_user_code",
            Diagnosis::Fragmentation => "fragmentation",
            Diagnosis::NeighbourCache => "neighbour_cache",
            Diagnosis::DeviceFull => "device_full",
            Diagnosis::CudaInDataloaderWorker => "cuda_in_dataloader_worker",
            Diagnosis::OrphanedWorker => "orphaned_worker",
            Diagnosis::IpcHandleNotReleased => "ipc_handle_not_released",
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
    /// A framework allocator's bytes in live tensors, on the failing device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocated: Option<u64>,
    /// The allocator's reserved bytes there; `reserved - allocated` is its cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reserved: Option<u64>,
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
    /// `leak` (act on it) or `info`.
    #[serde(default = "Severity::leak")]
    pub severity: Severity,
    /// The innermost frame of `stack` outside the standard library and installed packages: the
    /// user's own line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_frame: Option<Frame>,
    /// The same finding's id in a report, the live agent and the collector (from its kind, its
    /// process instance, when it began, and its stack).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub finding_id: String,
    /// When the process instance it is about was first seen (ns): with `pid`, which instance of
    /// a reused pid it names.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub process_since: u64,
    /// `growth`: the stacks that grew, most first (`bytes`: how much each grew).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stacks: Vec<StackBytes>,
    /// `growth` of tensors: how much the driver segments that carry them grew meanwhile.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub segment_bytes: Option<u64>,
    /// `oom`: the failing process's allocator had enough cached (reserved but unused) for the
    /// request: its free memory is in pieces too small, or in the wrong pool.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub fragmentation: bool,
    /// The process's rank in a distributed job (`RANK` in its environment), where the live
    /// capture could read it (a recording carries it on the process's first call).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank: Option<u32>,
    /// The distributed job the process is a rank of (`gpuprof.job.id`), where the finding is
    /// about the job (`rank_divergence`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<String>,
    /// The cause the events show, where they show one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diagnosis: Option<Diagnosis>,
    /// `growth`: how fast the grown stacks' live bytes rose (bytes a second).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_per_second: Option<f64>,
    /// `growth`: at that rate, seconds until the device is full (from its free memory, as the
    /// driver or NVML last told it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seconds_to_full: Option<f64>,
    /// Where the node kept the last seconds before it (a daemon's or sidecar's post-mortem).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub postmortem: Option<crate::postmortem::Postmortem>,
}

impl Finding {
    /// A finding with what every kind has; the rest empty, its severity `leak`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        kind: FindingKind,
        pid: u32,
        comm: &str,
        bytes: u64,
        count: u64,
        first_ts: u64,
        last_ts: u64,
        stack: &[Frame],
        detail: String,
    ) -> Finding {
        Finding {
            kind,
            pid,
            comm: comm.to_string(),
            bytes,
            count,
            peer_pid: None,
            first_ts,
            last_ts,
            stack: stack.to_vec(),
            detail,
            api: None,
            processes: Vec::new(),
            severity: Severity::Leak,
            user_frame: None,
            finding_id: String::new(),
            process_since: 0,
            stacks: Vec::new(),
            segment_bytes: None,
            fragmentation: false,
            rank: None,
            job: None,
            diagnosis: None,
            bytes_per_second: None,
            seconds_to_full: None,
            postmortem: None,
        }
    }

    /// Fills what follows from the rest: the user's frame and the stable id (`since`: when the
    /// process instance it is about was first seen).
    fn complete(mut self, since: u64) -> Finding {
        self.user_frame = user_frame(&self.stack).cloned();
        self.finding_id = finding_id(&self, since);
        self.process_since = since;
        self
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// 16 hex digits from what identifies a finding wherever the same events are analyzed.
fn finding_id(finding: &Finding, since: u64) -> String {
    use std::hash::{Hash, Hasher};
    // SipHash with fixed keys: the same id in every process and every run.
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    finding.kind.hash(&mut hasher);
    finding.pid.hash(&mut hasher);
    since.hash(&mut hasher);
    finding.first_ts.hash(&mut hasher);
    finding.peer_pid.hash(&mut hasher);
    finding.stack.hash(&mut hasher);
    format!("{:016x}", hasher.finish())
}

/// Thresholds of the rules that need them.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RuleConfig {
    /// Growth: length of one window.
    pub growth_window_ns: u64,
    /// Growth: consecutive windows, each ending higher than the one before, that make a finding.
    pub growth_rises: u32,
    /// Orphans: how long after a parent's end its descendants may still hold memory (workers
    /// that watch their parent end by themselves).
    #[serde(default = "RuleConfig::default_orphan_grace_ns")]
    pub orphan_grace_ns: u64,
}

impl RuleConfig {
    fn default_orphan_grace_ns() -> u64 {
        5_000_000_000
    }
}

impl Default for RuleConfig {
    fn default() -> Self {
        RuleConfig {
            growth_window_ns: 10_000_000_000,
            growth_rises: 3,
            orphan_grace_ns: RuleConfig::default_orphan_grace_ns(),
        }
    }
}

/// Runs every rule over an event stream, incrementally.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct Analyzer {
    config: RuleConfig,
    tracker: Tracker,
    worker_context: worker_cuda_context::Rule,
    growth: growth::Rule,
    oom: oom::Rule,
    orphans: orphan_holding_memory::Rule,
    /// What each process instance's findings said, so no later rule says it again.
    #[serde(default)]
    reported: reported::Reported,
    last_ts: u64,
}

impl Analyzer {
    pub fn new(config: RuleConfig) -> Self {
        Analyzer {
            config,
            tracker: Tracker::new(),
            worker_context: worker_cuda_context::Rule::default(),
            growth: growth::Rule::new(config),
            oom: oom::Rule::default(),
            orphans: orphan_holding_memory::Rule::default(),
            reported: reported::Reported::default(),
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
        // The world as it was up to this event: an orphan's own exit after its grace period
        // does not undo that it outlived it.
        let mut found = self.orphans.check(Some(event.ts), self.config.orphan_grace_ns, world);
        self.worker_context.orphaned(&orphan_pids(&found));
        found.extend(self.worker_context.check(event, world));
        found.extend(self.growth.before(event, world));
        // Before the exit is judged: what the orphan and growth findings said is theirs.
        self.reported.note(&found, world);
        found.extend(exit_with_live_allocations::check(event, world, &self.reported));
        found.extend(ipc_handle_not_closed::at_exit(event, world));
        found.extend(ipc_export_freed_while_imported::check(event, world));
        found.extend(self.oom.check(event, world));
        self.orphans.at_exit(event, world);
        // Before the tracker closes an exiting process: its instance is still to be found.
        let found = self.completed(found);
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

    /// Process `pid` is recorded at the tensors' level until `until` (wall-clock ns): a growth
    /// finding on its driver allocations alone waits until then for one that names its tensors.
    pub fn expect_tensors(&mut self, pid: u32, until: u64) {
        self.growth.expect_tensors(pid, until);
    }

    /// Time passes without events (`now`: wall-clock nanoseconds): findings that wait for a
    /// moment (orphans after their grace period) fire.
    pub fn tick(&mut self, now: u64) -> Vec<Finding> {
        let mut found = self.orphans.check(Some(now), self.config.orphan_grace_ns, &self.tracker);
        self.worker_context.orphaned(&orphan_pids(&found));
        found.extend(self.worker_context.due(Some(now)));
        found.extend(self.oom.due(Some(now), &self.tracker));
        self.reported.note(&found, &self.tracker);
        self.completed(found)
    }

    /// The window ends: what is still open then.
    pub fn finish(&mut self) -> Vec<Finding> {
        let mut found = self.orphans.check(None, self.config.orphan_grace_ns, &self.tracker);
        self.worker_context.orphaned(&orphan_pids(&found));
        found.extend(self.worker_context.due(None));
        found.extend(self.oom.due(None, &self.tracker));
        found.extend(self.growth.finish(self.last_ts, &self.tracker));
        found.extend(ipc_handle_not_closed::at_end(self.last_ts, &self.tracker));
        self.completed(found)
    }

    /// See `Tracker::forget_closed_before`; the rules forget those processes too.
    pub fn forget_closed_before(&mut self, ts: u64) -> usize {
        let forgotten = self.tracker.forget_closed_before(ts);
        if forgotten > 0 {
            let known: std::collections::HashSet<_> = self.tracker.processes().iter().map(|p| p.as_ref()).collect();
            self.worker_context.forget_unless(|process| known.contains(&process));
            self.oom.forget_unless(|process| known.contains(&process));
            self.growth.forget_unless(|process| known.contains(&process));
            self.reported.forget_unless(|process| known.contains(&process));
        }
        forgotten
    }

    pub fn tracker(&self) -> &Tracker {
        &self.tracker
    }

    fn completed(&self, found: Vec<Finding>) -> Vec<Finding> {
        found
            .into_iter()
            .map(|f| {
                let since = self.tracker.instance_since(f.pid, f.first_ts);
                f.complete(since)
            })
            .collect()
    }
}

/// The processes the orphan findings among `found` are about.
fn orphan_pids(found: &[Finding]) -> Vec<u32> {
    found.iter().filter(|f| f.kind == FindingKind::OrphanHoldingMemory).map(|f| f.pid).collect()
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
