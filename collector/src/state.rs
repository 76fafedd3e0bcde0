//! What the collector knows: per node, the model's analyzer (tracker + leak rules — the same
//! code `gpuprof report` and the agent run) fed with that node's events in capture order, and
//! the findings it fired. Nodes are independent: correlation never crosses a node.

use std::collections::{BTreeMap, HashMap, VecDeque};

use gpuprof_model::track::{ProcessMemory, ProcessState, Tracker};
use gpuprof_model::{Analyzer, Event, Finding, FindingKind, RuleConfig};
use serde::{Deserialize, Serialize};

/// A finding as the API serves it: the contract of docs/findings.md plus the node and an id.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredFinding {
    pub id: u64,
    pub node: String,
    #[serde(flatten)]
    pub finding: Finding,
    /// When the process instance it is about was first seen (names its trace).
    #[serde(default)]
    pub process_since: u64,
}

struct Node {
    analyzer: Analyzer,
    /// Changed since the last checkpoint.
    dirty: bool,
    /// Where each process runs, from the resource of its batches (every batch carries it, so
    /// this is not checkpointed: it is back with a process's next batch after a restart).
    workloads: HashMap<u32, Workload>,
}

impl Node {
    fn new(analyzer: Analyzer) -> Node {
        Node { analyzer, dirty: false, workloads: HashMap::new() }
    }
}

/// The Kubernetes pod a process runs in (empty strings outside Kubernetes).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Workload {
    pub namespace: String,
    pub pod: String,
    pub container: String,
}

pub struct State {
    rules: RuleConfig,
    nodes: BTreeMap<String, Node>,
    findings: VecDeque<StoredFinding>,
    next_finding: u64,
}

/// `GET /api/v1/findings` filters.
#[derive(Debug, Default, Deserialize)]
pub struct FindingFilter {
    pub node: Option<String>,
    pub pid: Option<u32>,
    pub kind: Option<FindingKind>,
    /// Findings whose last_ts is at or after this (ns since the epoch).
    pub since: Option<u64>,
    /// Findings whose first_ts is before this.
    pub until: Option<u64>,
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
    pub open_allocations: usize,
    pub ipc_imports: usize,
    pub contexts: u32,
    /// A framework allocator's totals per device.
    pub allocator: BTreeMap<i32, AllocatorView>,
    /// The open allocations themselves, with `detail=true`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allocations: Option<Vec<AllocationView>>,
}

#[derive(Debug, Serialize)]
pub struct AllocatorView {
    pub allocated: u64,
    pub reserved: u64,
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

impl State {
    pub fn new(rules: RuleConfig, nodes: Vec<(String, Analyzer)>, findings: Vec<StoredFinding>) -> Self {
        let next_finding = findings.iter().map(|f| f.id + 1).max().unwrap_or(1);
        State {
            rules,
            nodes: nodes.into_iter().map(|(name, analyzer)| (name, Node::new(analyzer))).collect(),
            findings: findings.into(),
            next_finding,
        }
    }

    /// Folds one node's events (in capture order) in; returns the findings they fired.
    pub fn ingest(&mut self, node_name: &str, events: Vec<Event>) -> Vec<StoredFinding> {
        let rules = self.rules;
        let node = self
            .nodes
            .entry(node_name.to_string())
            .or_insert_with(|| Node::new(Analyzer::new(rules)));
        node.dirty = true;
        let mut fired = Vec::new();
        for mut event in events {
            for finding in node.analyzer.observe(&mut event) {
                let process_since = instance_since(node.analyzer.tracker(), finding.pid, finding.first_ts);
                fired.push(StoredFinding { id: 0, node: node_name.to_string(), finding, process_since });
            }
        }
        for finding in &mut fired {
            finding.id = self.next_finding;
            self.next_finding += 1;
            self.findings.push_back(finding.clone());
        }
        fired
    }

    pub fn findings(&self, filter: &FindingFilter) -> Vec<&StoredFinding> {
        self.findings
            .iter()
            .filter(|f| filter.node.as_ref().is_none_or(|n| *n == f.node))
            .filter(|f| filter.pid.is_none_or(|p| p == f.finding.pid))
            .filter(|f| filter.kind.is_none_or(|k| k == f.finding.kind))
            .filter(|f| filter.since.is_none_or(|s| f.finding.last_ts >= s))
            .filter(|f| filter.until.is_none_or(|u| f.finding.first_ts < u))
            .collect()
    }

    pub fn findings_by_kind(&self) -> BTreeMap<(String, FindingKind), u64> {
        let mut counts = BTreeMap::new();
        for f in &self.findings {
            *counts.entry((f.node.clone(), f.finding.kind)).or_insert(0) += 1;
        }
        counts
    }

    pub fn processes(&self, node: Option<&str>, detail: bool) -> Vec<ProcessView> {
        self.nodes
            .iter()
            .filter(|(name, _)| node.is_none_or(|n| n == name.as_str()))
            .flat_map(|(name, n)| n.analyzer.tracker().processes().into_iter().map(move |p| view(name, p, detail)))
            .collect()
    }

    /// Records where a process of a node runs.
    pub fn note_workload(&mut self, node_name: &str, pid: u32, workload: Workload) {
        if let Some(node) = self.nodes.get_mut(node_name) {
            node.workloads.insert(pid, workload);
        }
    }

    /// Where a process of a node runs, if it came from Kubernetes.
    pub fn workload(&self, node_name: &str, pid: u32) -> Option<&Workload> {
        self.nodes.get(node_name)?.workloads.get(&pid)
    }

    /// Live processes of every node, for the metrics.
    pub fn live(&self) -> Vec<(&str, &ProcessMemory)> {
        self.nodes
            .iter()
            .flat_map(|(name, n)| n.analyzer.tracker().live_processes().into_iter().map(move |p| (name.as_str(), p)))
            .collect()
    }

    /// The `n` most recent findings, newest first.
    pub fn recent_findings(&self, n: usize) -> impl Iterator<Item = &StoredFinding> {
        self.findings.iter().rev().take(n)
    }

    /// Nodes changed since the last call, serialized for the store.
    pub fn take_dirty(&mut self) -> Vec<(String, Vec<u8>)> {
        self.nodes
            .iter_mut()
            .filter(|(_, n)| n.dirty)
            .map(|(name, n)| {
                n.dirty = false;
                (name.clone(), postcard::to_stdvec(&n.analyzer).expect("analyzer state always serializes"))
            })
            .collect()
    }

    /// Forgets processes that ended before `horizon` and findings older than it, and the oldest
    /// findings beyond `max_findings`. Returns the ids of the findings dropped.
    pub fn prune(&mut self, horizon: u64, max_findings: usize) -> Vec<u64> {
        for node in self.nodes.values_mut() {
            if node.analyzer.forget_closed_before(horizon) > 0 {
                node.dirty = true;
                let tracker = node.analyzer.tracker();
                let kept: std::collections::HashSet<u32> = tracker.processes().iter().map(|p| p.pid).collect();
                node.workloads.retain(|pid, _| kept.contains(pid));
            }
        }
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

/// When the instance of `pid` that a finding at `ts` is about was first seen.
fn instance_since(tracker: &Tracker, pid: u32, ts: u64) -> u64 {
    tracker
        .processes()
        .into_iter()
        .filter(|p| p.pid == pid && p.first_ts <= ts)
        .map(|p| p.first_ts)
        .max()
        .unwrap_or(ts)
}

fn view(node: &str, p: &ProcessMemory, detail: bool) -> ProcessView {
    let summary = p.summary();
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
    ProcessView {
        node: node.to_string(),
        pid: p.pid,
        ppid: p.ppid,
        comm: p.comm.to_string(),
        first_ts: p.first_ts,
        last_ts: p.last_ts,
        state,
        exit_code,
        live_bytes: summary.by_kind.iter().map(|(k, t)| (k.as_str().to_string(), t.bytes)).collect(),
        open_allocations: p.allocations().len(),
        ipc_imports: p.imports().len(),
        contexts: p.contexts(),
        allocator: p
            .allocator_totals()
            .iter()
            .map(|(d, t)| (*d, AllocatorView { allocated: t.allocated, reserved: t.reserved }))
            .collect(),
        allocations,
    }
}

impl std::fmt::Debug for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("State").field("nodes", &self.nodes.len()).field("findings", &self.findings.len()).finish()
    }
}
