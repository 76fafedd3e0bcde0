//! What the collector knows, per node: the processes of the node — a tracker of the events the
//! node sends (driver and process events: segments, VMM, IPC, contexts, exits) for what each
//! holds at the driver level, and the node's own summaries (the allocator's allocated and
//! reserved bytes per device, live bytes by kind, the latest memory profile) — and the findings
//! the node's rules fired. The leak rules run on the node, which sees every event; the
//! collector does not run them again (docs/collector.md). Nodes are independent.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};

use gpuprof_model::findings::rank_divergence::RankMemory;
use gpuprof_model::track::{ProcessMemory, ProcessState, Tracker};
use gpuprof_model::{Event, Finding, FindingKind, Frame, Layer, Op, Severity, Stack, StackTable};
use serde::{Deserialize, Serialize};

use crate::jobs::{DueRank, JobFigures, JobSummary, Jobs, Membership, RankFigures};

/// A finding as the API serves it: the contract of docs/findings.md plus the node and an id.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredFinding {
    pub id: u64,
    pub node: String,
    /// Its `process_since` (the process instance, which names its trace) as the node said it,
    /// else as the collector's tracker of the node knows it (a node from before it was sent).
    #[serde(flatten)]
    pub finding: Finding,
}

/// What a node says of one of its processes between events: its gauges and its profile.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ProcessSummary {
    /// The allocator's totals per device, as last reported.
    pub allocator: BTreeMap<i32, AllocatorView>,
    /// Live bytes by layer and kind (`driver`/`device`, `allocator`/`device`, …), as last reported.
    pub live: BTreeMap<(String, String), u64>,
    /// When the gauges were taken (ns since the epoch).
    pub gauges_ts: u64,
    pub profile: Option<StoredProfile>,
    /// Spans the node sent for the process (its trace's size).
    #[serde(default)]
    pub spans: u64,
    /// Device memory the driver accounts to the process (NVML), as the node last reported it.
    #[serde(default)]
    pub nvml_used: Option<u64>,
}

/// The latest memory profile of a process: the pprof as the node sent it, and its samples.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredProfile {
    pub ts: u64,
    pub reason: String,
    pub pprof: Vec<u8>,
    /// The `TOP_STACKS` largest samples, largest first: (stack innermost first, bytes, count).
    pub samples: Vec<(Stack, u64, u64)>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocatorView {
    pub allocated: u64,
    pub reserved: u64,
}

#[derive(Default, Serialize, Deserialize)]
pub struct Node {
    tracker: Tracker,
    /// Per pid, the node's summaries of the process instance running under it now.
    summaries: HashMap<u32, ProcessSummary>,
    /// Changed since the last checkpoint.
    #[serde(skip)]
    dirty: bool,
    /// Where each process runs, from the resource of its batches (every batch carries it, so
    /// this is not checkpointed: it is back with a process's next batch after a restart).
    #[serde(skip)]
    workloads: HashMap<u32, Workload>,
}

/// The Kubernetes pod a process runs in (empty strings outside Kubernetes).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Workload {
    pub namespace: String,
    pub pod: String,
    pub container: String,
}

pub struct State {
    nodes: BTreeMap<String, Node>,
    findings: VecDeque<StoredFinding>,
    next_finding: u64,
    /// Each distinct stack once, whichever node, process or allocation has it: a fleet's nodes run
    /// the same code, and an event decoded from OTLP brings its own copy.
    stacks: StackTable,
    /// The distributed jobs of the processes, their ranks across nodes.
    jobs: Jobs,
}

/// `GET /api/v1/findings` filters.
#[derive(Debug, Default, Deserialize)]
pub struct FindingFilter {
    pub node: Option<String>,
    pub pid: Option<u32>,
    pub kind: Option<FindingKind>,
    /// `leak` or `info`.
    pub severity: Option<Severity>,
    /// Findings whose last_ts is at or after this (ns since the epoch).
    pub since: Option<u64>,
    /// Findings whose first_ts is before this.
    pub until: Option<u64>,
}

/// One job as `GET /api/v1/jobs/{id}` shows it.
#[derive(Debug, Serialize)]
pub struct JobView {
    #[serde(flatten)]
    pub job: JobSummary,
    pub ranks: Vec<RankView>,
    /// Its processes without a rank (a launcher, workers).
    pub others: Vec<ProcessView>,
    pub findings: Vec<StoredFinding>,
}

/// A rank: its gauges and its process (None until the process's events come).
#[derive(Debug, Serialize)]
pub struct RankView {
    #[serde(flatten)]
    pub figures: RankFigures,
    pub process: Option<ProcessView>,
}

/// One process as `GET /api/v1/processes` shows it.
#[derive(Debug, Serialize)]
pub struct ProcessView {
    pub node: String,
    pub pid: u32,
    pub ppid: Option<u32>,
    pub comm: String,
    pub first_ts: u64,
    pub last_ts: u64,
    pub state: &'static str,
    pub exit_code: Option<i32>,
    /// Live bytes by kind (driver level).
    pub live_bytes: BTreeMap<String, u64>,
    /// Live device memory (driver level) per CUDA device, where the calls' device is known: a
    /// rank's GPU in a data-parallel job.
    pub live_bytes_by_device: BTreeMap<i32, u64>,
    pub open_allocations: usize,
    pub ipc_imports: usize,
    pub contexts: u32,
    /// A framework allocator's totals per device, as the node last reported them.
    pub allocator: BTreeMap<i32, AllocatorView>,
    /// When the node last reported the allocator's totals.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allocator_ts: Option<u64>,
    /// The stacks holding the most, from the node's latest memory profile.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub top_stacks: Vec<StackView>,
    /// Spans the node sent for the process: its trace's size.
    pub spans: u64,
    /// Device memory the driver accounts to the process (NVML, nvidia-smi's figure), where the
    /// node has NVML.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nvml_used_bytes: Option<u64>,
    /// `nvml_used_bytes` less the live device bytes of the probed calls: the CUDA context,
    /// modules, memory from before the capture or from calls not probed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub not_probed_bytes: Option<i64>,
    /// The open driver allocations themselves, with `detail=true`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allocations: Option<Vec<AllocationView>>,
}

#[derive(Debug, Serialize)]
pub struct StackView {
    pub bytes: u64,
    pub count: u64,
    pub stack: Vec<Frame>,
}

#[derive(Debug, Serialize)]
pub struct AllocationView {
    pub addr: String,
    pub size: u64,
    pub kind: &'static str,
    pub api: String,
    pub ts: u64,
    pub stack: Vec<gpuprof_model::Frame>,
}

/// Stacks of a profile kept decoded (what `GET /api/v1/processes` and `/metrics` show); the
/// rest stay in the pprof bytes, served whole.
pub const TOP_STACKS: usize = 10;

impl State {
    pub fn new(nodes: Vec<(String, Node)>, findings: Vec<StoredFinding>) -> Self {
        let next_finding = findings.iter().map(|f| f.id + 1).max().unwrap_or(1);
        State {
            nodes: nodes.into_iter().collect(),
            findings: findings.into(),
            next_finding,
            stacks: StackTable::default(),
            jobs: Jobs::default(),
        }
    }

    /// The node, created at its first word. Summaries (gauges, profiles, span counts) do not
    /// make it dirty: they change every second, and after a restart the live node sends them
    /// again within seconds; its events (the tracker) do.
    fn node(&mut self, name: &str) -> &mut Node {
        self.nodes.entry(name.to_string()).or_default()
    }

    /// Folds one node's events (in capture order) into its tracker.
    pub fn ingest(&mut self, node_name: &str, events: Vec<Event>) {
        let node = self.nodes.entry(node_name.to_string()).or_default();
        node.dirty = true;
        for mut event in events {
            event.stack = self.stacks.intern(std::mem::take(&mut event.stack));
            if event.layer == Layer::Process && matches!(event.op, Op::Fork | Op::Exec) {
                // A new program or process under this pid: the summaries were the old one's.
                node.summaries.remove(&event.pid);
            }
            node.tracker.apply(&event);
        }
    }

    /// Takes a node's findings; returns them as stored, with their ids.
    pub fn add_findings(&mut self, node_name: &str, findings: Vec<Finding>) -> Vec<StoredFinding> {
        let node = self.node(node_name);
        node.dirty = true;
        let stored: Vec<StoredFinding> = findings
            .into_iter()
            .map(|mut finding| {
                if finding.process_since == 0 {
                    finding.process_since = node.tracker.instance_since(finding.pid, finding.first_ts);
                }
                StoredFinding { id: 0, node: node_name.to_string(), finding }
            })
            .collect();
        stored
            .into_iter()
            .map(|mut finding| {
                finding.id = self.next_finding;
                self.next_finding += 1;
                self.findings.push_back(finding.clone());
                finding
            })
            .collect()
    }

    /// A node's gauges of one process, taken at `ts`: the allocator's totals of `device`.
    pub fn allocator_gauges(&mut self, node_name: &str, pid: u32, ts: u64, device: i32, view: AllocatorView) {
        let summary = self.node(node_name).summaries.entry(pid).or_default();
        if ts >= summary.gauges_ts {
            summary.gauges_ts = ts;
            summary.allocator.insert(device, view);
        }
        self.jobs.allocator(node_name, pid, ts, device, view.allocated, view.reserved);
    }

    /// Records which job (and rank) a process of a node is.
    pub fn note_job(&mut self, node_name: &str, pid: u32, membership: Membership) {
        self.jobs.note(node_name, pid, membership);
    }

    /// The `rank_divergence` rule over the jobs whose gauges moved on: the findings it fired,
    /// stored.
    pub fn check_jobs(&mut self) -> Vec<StoredFinding> {
        let mut stored = Vec::new();
        for due in self.jobs.due() {
            let (job, now) = (due.id, due.now);
            let ranks: Vec<RankMemory> = due
                .ranks
                .into_iter()
                .map(|DueRank { rank, node, pid, allocated }| {
                    let known = self.nodes.get(&node);
                    let process = known.and_then(|n| n.tracker.process(pid));
                    let stacks = known
                        .and_then(|n| n.summaries.get(&pid))
                        .and_then(|s| s.profile.as_ref())
                        .map(|p| p.samples.iter().map(|(stack, bytes, _)| (stack.to_vec(), *bytes)).collect())
                        .unwrap_or_default();
                    RankMemory {
                        rank,
                        comm: process.map(|p| p.comm.to_string()).unwrap_or_default(),
                        since: known.map_or(0, |n| n.tracker.instance_since(pid, now)),
                        node,
                        pid,
                        allocated,
                        stacks,
                    }
                })
                .collect();
            let mut by_node: BTreeMap<String, Vec<Finding>> = BTreeMap::new();
            for finding in self.jobs.check(&job, &ranks, now) {
                let node = ranks.iter().find(|r| r.pid == finding.pid && Some(r.rank) == finding.rank);
                by_node.entry(node.map(|r| r.node.clone()).unwrap_or_default()).or_default().push(finding);
            }
            for (node, found) in by_node {
                stored.extend(self.add_findings(&node, found));
            }
        }
        stored
    }

    /// Each job with ranks and its ranks' figures (the metrics).
    pub fn job_ranks(&self) -> Vec<JobFigures> {
        self.jobs.with_ranks()
    }

    /// Findings of jobs' ranks, counted by (job, rank, kind).
    pub fn findings_by_rank(&self) -> BTreeMap<(String, u32, FindingKind), u64> {
        let mut counts = BTreeMap::new();
        for stored in &self.findings {
            let finding = &stored.finding;
            let job = finding.job.as_deref().or_else(|| self.jobs.job_of(&stored.node, finding.pid));
            if let (Some(job), Some(rank)) = (job, finding.rank) {
                *counts.entry((job.to_string(), rank, finding.kind)).or_insert(0) += 1;
            }
        }
        counts
    }

    /// Every job with ranks: what `GET /api/v1/jobs` lists.
    pub fn jobs(&self) -> Vec<JobSummary> {
        self.jobs.list()
    }

    /// One job, rank by rank with each rank's process, and its findings.
    pub fn job(&self, id: &str) -> Option<JobView> {
        let JobFigures { summary, ranks: figures, others } = self.jobs.job(id)?;
        let process = |node: &str, pid: u32| self.process_view(node, pid);
        let ranks = figures
            .into_iter()
            .map(|figures| RankView { process: process(&figures.node, figures.pid), figures })
            .collect::<Vec<_>>();
        let members: HashSet<(&str, u32)> = ranks
            .iter()
            .map(|r| (r.figures.node.as_str(), r.figures.pid))
            .chain(others.iter().map(|(node, pid)| (node.as_str(), *pid)))
            .collect();
        let findings = self
            .findings
            .iter()
            .filter(|f| f.finding.job.as_deref() == Some(id) || members.contains(&(f.node.as_str(), f.finding.pid)))
            .cloned()
            .collect();
        let others = others.iter().filter_map(|(node, pid)| process(node, *pid)).collect();
        Some(JobView { job: summary, ranks, others, findings })
    }

    /// The process running (or last run) under `pid` on a node, as `/api/v1/processes` shows it.
    fn process_view(&self, node: &str, pid: u32) -> Option<ProcessView> {
        let n = self.nodes.get(node)?;
        let latest = n.tracker.processes().into_iter().rfind(|p| p.pid == pid)?;
        Some(view(node, latest, n.summaries.get(&pid), false))
    }

    /// A node's gauge of one process's live bytes in a layer and kind, taken at `ts`.
    pub fn live_gauge(&mut self, node_name: &str, pid: u32, ts: u64, layer: &str, kind: &str, bytes: u64) {
        let summary = self.node(node_name).summaries.entry(pid).or_default();
        if ts >= summary.gauges_ts {
            summary.gauges_ts = ts;
            summary.live.insert((layer.to_string(), kind.to_string()), bytes);
        }
    }

    /// A node's NVML figure for one process, taken at `ts`.
    pub fn nvml_gauge(&mut self, node_name: &str, pid: u32, ts: u64, bytes: u64) {
        let summary = self.node(node_name).summaries.entry(pid).or_default();
        if ts >= summary.gauges_ts {
            summary.gauges_ts = ts;
            summary.nvml_used = Some(bytes);
        }
    }

    /// Spans a node sent for one process.
    pub fn spans(&mut self, node_name: &str, pid: u32, count: u64) {
        self.node(node_name).summaries.entry(pid).or_default().spans += count;
    }

    /// A node's memory profile of one process (the latest one is kept).
    pub fn profile(&mut self, node_name: &str, pid: u32, mut profile: StoredProfile) {
        for sample in &mut profile.samples {
            sample.0 = self.stacks.intern(std::mem::take(&mut sample.0));
        }
        let summary = self.node(node_name).summaries.entry(pid).or_default();
        if summary.profile.as_ref().is_none_or(|p| profile.ts >= p.ts) {
            summary.profile = Some(profile);
        }
    }

    pub fn summary(&self, node: &str, pid: u32) -> Option<&ProcessSummary> {
        self.nodes.get(node)?.summaries.get(&pid)
    }

    pub fn findings(&self, filter: &FindingFilter) -> Vec<&StoredFinding> {
        self.findings
            .iter()
            .filter(|f| filter.node.as_ref().is_none_or(|n| *n == f.node))
            .filter(|f| filter.pid.is_none_or(|p| p == f.finding.pid))
            .filter(|f| filter.kind.is_none_or(|k| k == f.finding.kind))
            .filter(|f| filter.severity.is_none_or(|s| s == f.finding.severity))
            .filter(|f| filter.since.is_none_or(|s| f.finding.last_ts >= s))
            .filter(|f| filter.until.is_none_or(|u| f.finding.first_ts < u))
            .collect()
    }

    pub fn findings_by_kind(&self) -> BTreeMap<(String, FindingKind, Severity), u64> {
        let mut counts = BTreeMap::new();
        for f in &self.findings {
            *counts.entry((f.node.clone(), f.finding.kind, f.finding.severity)).or_insert(0) += 1;
        }
        counts
    }

    pub fn processes(&self, node: Option<&str>, detail: bool) -> Vec<ProcessView> {
        self.nodes
            .iter()
            .filter(|(name, _)| node.is_none_or(|n| n == name.as_str()))
            .flat_map(|(name, n)| {
                let processes = n.tracker.processes();
                // Summaries are of the instance running under the pid now (or last).
                let latest: HashMap<u32, u64> = processes.iter().map(|p| (p.pid, p.first_ts)).collect();
                processes.into_iter().map(move |p| {
                    let current = latest.get(&p.pid) == Some(&p.first_ts);
                    view(name, p, current.then(|| n.summaries.get(&p.pid)).flatten(), detail)
                })
            })
            .collect()
    }

    /// Records where a process of a node runs.
    pub fn note_workload(&mut self, node_name: &str, pid: u32, workload: Workload) {
        self.nodes.entry(node_name.to_string()).or_default().workloads.insert(pid, workload);
    }

    /// Where a process of a node runs, if it came from Kubernetes.
    pub fn workload(&self, node_name: &str, pid: u32) -> Option<&Workload> {
        self.nodes.get(node_name)?.workloads.get(&pid)
    }

    /// Live processes of every node with their summaries, for the metrics: a process the node
    /// summarized but whose events have not come (yet) is live too.
    pub fn live(&self) -> Vec<LiveProcess<'_>> {
        let mut live = Vec::new();
        for (name, node) in &self.nodes {
            let mut seen = HashSet::new();
            for process in node.tracker.live_processes() {
                seen.insert(process.pid);
                live.push(LiveProcess {
                    node: name,
                    pid: process.pid,
                    comm: &process.comm,
                    tracked: Some(process),
                    summary: node.summaries.get(&process.pid),
                });
            }
            let exited: HashSet<u32> = node
                .tracker
                .processes()
                .into_iter()
                .filter(|p| p.state != ProcessState::Running && node.tracker.process(p.pid).is_none())
                .map(|p| p.pid)
                .collect();
            let mut only_summarized: Vec<(&u32, &ProcessSummary)> =
                node.summaries.iter().filter(|(pid, _)| !seen.contains(pid) && !exited.contains(pid)).collect();
            only_summarized.sort_by_key(|(pid, _)| **pid);
            for (pid, summary) in only_summarized {
                live.push(LiveProcess { node: name, pid: *pid, comm: "", tracked: None, summary: Some(summary) });
            }
        }
        live
    }

    /// The finding the collector numbered `id`.
    pub fn finding_numbered(&self, id: u64) -> Option<&StoredFinding> {
        self.findings.iter().find(|f| f.id == id)
    }

    /// The finding whose `finding_id` is this (the latest, were a node to send it twice).
    pub fn finding_with_id(&self, finding_id: &str) -> Option<&StoredFinding> {
        self.findings.iter().rev().find(|f| f.finding.finding_id == finding_id)
    }

    /// The `n` most recent findings, newest first.
    pub fn recent_findings(&self, n: usize) -> impl Iterator<Item = &StoredFinding> {
        self.findings.iter().rev().take(n)
    }

    /// Nodes changed since the last call (their names); `saved_form` serializes each.
    pub fn take_dirty(&mut self) -> Vec<String> {
        self.nodes
            .iter_mut()
            .filter(|(_, n)| n.dirty)
            .map(|(name, n)| {
                n.dirty = false;
                name.clone()
            })
            .collect()
    }

    /// Marks nodes changed again (a checkpoint that could not save them).
    pub fn mark_dirty(&mut self, names: &[String]) {
        for name in names {
            if let Some(node) = self.nodes.get_mut(name) {
                node.dirty = true;
            }
        }
    }

    /// A node as the store keeps it; None once it is gone.
    pub fn saved_form(&self, name: &str) -> Option<Vec<u8>> {
        self.nodes.get(name).map(|n| postcard::to_stdvec(n).expect("node state always serializes"))
    }

    /// Forgets processes that ended before `horizon` (and summaries of pids no longer known),
    /// findings older than it, and the oldest findings beyond `max_findings`. Returns the ids of
    /// the findings dropped.
    pub fn prune(&mut self, horizon: u64, max_findings: usize) -> Vec<u64> {
        for node in self.nodes.values_mut() {
            let forgotten = node.tracker.forget_closed_before(horizon);
            let known: HashSet<u32> = node.tracker.processes().iter().map(|p| p.pid).collect();
            let before = node.summaries.len();
            node.summaries.retain(|pid, summary| known.contains(pid) || summary.gauges_ts >= horizon);
            if forgotten > 0 || node.summaries.len() != before {
                node.dirty = true;
                node.workloads.retain(|pid, _| known.contains(pid));
            }
        }
        let known: HashSet<(&str, u32)> = self
            .nodes
            .iter()
            .flat_map(|(name, n)| {
                let tracked = n.tracker.processes().into_iter().map(|p| p.pid);
                tracked.chain(n.summaries.keys().copied()).map(move |pid| (name.as_str(), pid))
            })
            .collect();
        self.jobs.retain(|node, pid| known.contains(&(node, pid)));
        self.stacks.forget_unused();
        let mut dropped = Vec::new();
        while let Some(oldest) = self.findings.front() {
            if oldest.finding.last_ts >= horizon && self.findings.len() <= max_findings {
                break;
            }
            dropped.push(oldest.id);
            self.findings.pop_front();
        }
        dropped
    }
}

/// A live process of a node, as the metrics show it.
pub struct LiveProcess<'a> {
    pub node: &'a str,
    pub pid: u32,
    pub comm: &'a str,
    /// What the node's events say it holds (none when only its summaries came).
    pub tracked: Option<&'a ProcessMemory>,
    pub summary: Option<&'a ProcessSummary>,
}

fn view(node: &str, p: &ProcessMemory, summary: Option<&ProcessSummary>, detail: bool) -> ProcessView {
    let live = p.summary();
    let (state, exit_code) = match p.state {
        ProcessState::Running => ("running", None),
        ProcessState::Exited { code, .. } => ("exited", Some(code)),
        ProcessState::Replaced { .. } => ("replaced", None),
    };
    let allocations = detail.then(|| {
        p.allocations()
            .into_iter()
            .map(|a| AllocationView {
                addr: gpuprof_model::hex::format_addr(a.addr),
                size: a.size,
                kind: a.kind.as_str(),
                api: a.api.to_string(),
                ts: a.ts,
                stack: a.stack.to_vec(),
            })
            .collect()
    });
    // The node's own totals; the events', in the full stream, where it sent none.
    let allocator = match summary.filter(|s| !s.allocator.is_empty()) {
        Some(summary) => summary.allocator.clone(),
        None => p
            .allocator_totals()
            .iter()
            .map(|(d, t)| (*d, AllocatorView { allocated: t.allocated, reserved: t.reserved }))
            .collect(),
    };
    let nvml_used_bytes = summary.and_then(|s| s.nvml_used);
    let probed: u64 =
        live.by_kind.iter().filter(|(k, _)| **k != gpuprof_model::Kind::HostPinned).map(|(_, t)| t.bytes).sum();
    ProcessView {
        nvml_used_bytes,
        not_probed_bytes: nvml_used_bytes.map(|used| used as i64 - probed as i64),
        node: node.to_string(),
        pid: p.pid,
        ppid: p.ppid,
        comm: p.comm.to_string(),
        first_ts: p.first_ts,
        last_ts: p.last_ts,
        state,
        exit_code,
        live_bytes: live.by_kind.iter().map(|(k, t)| (k.as_str().to_string(), t.bytes)).collect(),
        live_bytes_by_device: live.by_device.iter().map(|(d, t)| (*d, t.bytes)).collect(),
        open_allocations: p.allocations().len(),
        ipc_imports: p.imports().len(),
        contexts: p.contexts(),
        allocator,
        allocator_ts: summary.filter(|s| !s.allocator.is_empty()).map(|s| s.gauges_ts),
        top_stacks: summary
            .and_then(|s| s.profile.as_ref())
            .map(|profile| {
                profile
                    .samples
                    .iter()
                    .take(TOP_STACKS)
                    .map(|(stack, bytes, count)| StackView { bytes: *bytes, count: *count, stack: stack.to_vec() })
                    .collect()
            })
            .unwrap_or_default(),
        spans: summary.map_or(0, |s| s.spans),
        allocations,
    }
}

impl std::fmt::Debug for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("State").field("nodes", &self.nodes.len()).field("findings", &self.findings.len()).finish()
    }
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;

    use gpuprof_model::{Event, Kind, Source};

    use super::*;

    fn finding(kind: FindingKind, pid: u32, first_ts: u64, last_ts: u64) -> Finding {
        Finding::new(kind, pid, "python3", 1 << 20, 1, first_ts, last_ts, &[], "detail".to_string())
    }

    fn ids(found: Vec<&StoredFinding>) -> Vec<u64> {
        found.iter().map(|f| f.id).collect()
    }

    #[test]
    fn findings_are_numbered_in_arrival_and_filtered_by_node_pid_kind_and_time() {
        let mut state = State::new(Vec::new(), Vec::new());
        let a = state.add_findings(
            "node-a",
            vec![finding(FindingKind::Growth, 10, 100, 200), finding(FindingKind::Oom, 11, 300, 300)],
        );
        let b = state.add_findings("node-b", vec![finding(FindingKind::Growth, 10, 150, 400)]);
        assert_eq!(
            a.iter().chain(&b).map(|f| (f.id, f.node.as_str())).collect::<Vec<_>>(),
            [(1, "node-a"), (2, "node-a"), (3, "node-b")]
        );
        let all = FindingFilter::default();
        assert_eq!(ids(state.findings(&all)), [1, 2, 3]);
        assert_eq!(
            ids(state.findings(&FindingFilter { node: Some("node-a".into()), ..FindingFilter::default() })),
            [1, 2]
        );
        assert_eq!(ids(state.findings(&FindingFilter { pid: Some(10), ..FindingFilter::default() })), [1, 3]);
        assert_eq!(
            ids(state.findings(&FindingFilter { kind: Some(FindingKind::Oom), ..FindingFilter::default() })),
            [2]
        );
        // since: still going at or after; until: begun before.
        assert_eq!(ids(state.findings(&FindingFilter { since: Some(250), ..FindingFilter::default() })), [2, 3]);
        assert_eq!(ids(state.findings(&FindingFilter { until: Some(150), ..FindingFilter::default() })), [1]);
        let counts = state.findings_by_kind();
        assert_eq!(counts[&("node-a".to_string(), FindingKind::Growth, Severity::Leak)], 1);
        assert_eq!(counts[&("node-b".to_string(), FindingKind::Growth, Severity::Leak)], 1);

        // A restarted collector numbers on from the highest id it loaded.
        let loaded: Vec<StoredFinding> = state.findings(&all).into_iter().cloned().collect();
        let mut again = State::new(Vec::new(), loaded);
        assert_eq!(again.add_findings("node-a", vec![finding(FindingKind::Oom, 12, 500, 500)])[0].id, 4);
    }

    #[test]
    fn pruning_drops_findings_past_the_horizon_and_beyond_the_bound_oldest_first() {
        let mut state = State::new(Vec::new(), Vec::new());
        state.add_findings(
            "node-a",
            (0..5).map(|i| finding(FindingKind::Growth, 10 + i, 100 * u64::from(i), 100 * u64::from(i) + 50)).collect(),
        );
        // Last seen before 160: findings 1 (50) and 2 (150).
        assert_eq!(state.prune(160, 10), [1, 2]);
        // At most two kept: the oldest of the rest goes.
        assert_eq!(state.prune(0, 2), [3]);
        assert_eq!(ids(state.findings(&FindingFilter::default())), [4, 5]);
    }

    fn driver(ts: u64, pid: u32, op: Op, addr: u64, size: u64) -> Event {
        let mut event = Event::new(
            ts,
            pid,
            pid,
            Source::Ebpf,
            Layer::Driver,
            op,
            Cow::Borrowed(if op == Op::Alloc { "cuMemAlloc_v2" } else { "cuMemFree_v2" }),
        );
        event.kind = Some(Kind::Device);
        event.addr = Some(addr);
        event.size = size;
        event
    }

    #[test]
    fn a_nodes_events_make_it_dirty_once_and_its_processes_show_what_they_hold() {
        let mut state = State::new(Vec::new(), Vec::new());
        state.ingest(
            "node-a",
            vec![
                driver(1, 10, Op::Alloc, 0x1000, 8 << 20),
                driver(2, 10, Op::Alloc, 0x2000, 2 << 20),
                driver(3, 10, Op::Free, 0x2000, 0),
            ],
        );
        // Gauges alone change nothing to save: the live node sends them again after a restart.
        state.live_gauge("node-b", 20, 5, "driver", "device", 1 << 20);
        let dirty = state.take_dirty();
        assert_eq!(dirty, ["node-a"]);
        assert!(state.take_dirty().is_empty());
        state.mark_dirty(&dirty);
        assert_eq!(state.take_dirty(), ["node-a"]);
        // What was saved is the node, whole.
        let saved: Node = postcard::from_bytes(&state.saved_form("node-a").unwrap()).unwrap();
        let restored = State::new(vec![("node-a".to_string(), saved)], Vec::new());
        for state in [&state, &restored] {
            let processes = state.processes(Some("node-a"), true);
            assert_eq!(processes.len(), 1);
            assert_eq!((processes[0].pid, processes[0].open_allocations), (10, 1));
            assert_eq!(processes[0].live_bytes["device"], 8 << 20);
            assert_eq!(processes[0].allocations.as_ref().unwrap()[0].addr, "0x1000");
        }
        // A newer gauge wins, an older one is ignored.
        state.live_gauge("node-b", 20, 4, "driver", "device", 7);
        assert_eq!(state.summary("node-b", 20).unwrap().live[&("driver".to_string(), "device".to_string())], 1 << 20);
        state.live_gauge("node-b", 20, 6, "driver", "device", 3 << 20);
        assert_eq!(state.summary("node-b", 20).unwrap().live[&("driver".to_string(), "device".to_string())], 3 << 20);
    }
}
