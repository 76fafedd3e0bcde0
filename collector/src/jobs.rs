//! Distributed jobs as one: which process of which node is which rank of which job (from the
//! resource of each process's batches: `gpuprof.job.id`, `gpuprof.rank`, …), each rank's
//! allocator totals over the last seconds and its peak, and the `rank_divergence` rule run over
//! a job's ranks (`model::findings::rank_divergence`). The OpenTelemetry Collector routes a
//! job's data whole to one shard (deploy/otel-collector/loadbalancing.yaml), so the ranks are
//! all here, whichever nodes they run on.
//!
//! Like workloads, this is not checkpointed: every batch carries its resource, and the window
//! the rule looks at is seconds long; a restarted shard has it back within a window. Bounded:
//! a rank keeps the points of one window, and jobs whose ranks all went quiet past the horizon
//! are forgotten with their processes.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

use gpuprof_model::findings::rank_divergence::{DivergenceConfig, Divergences, RankMemory};
use gpuprof_model::Finding;
use serde::Serialize;

/// A process's place in a job, as its resource says it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Membership {
    pub job: String,
    pub rank: Option<u32>,
    pub local_rank: Option<u32>,
    pub world_size: Option<u32>,
}

#[derive(Default)]
pub struct Jobs {
    jobs: BTreeMap<String, Job>,
    /// (node, pid) → the job it is a process of.
    members: HashMap<(String, u32), String>,
    divergences: Divergences,
    config: DivergenceConfig,
}

#[derive(Default)]
struct Job {
    world_size: Option<u32>,
    /// Ranked processes, by rank; a rank restarted under a new pid replaces the old one.
    ranks: BTreeMap<u32, Rank>,
    /// Processes of the job without a rank (its launcher, its ranks' workers).
    others: BTreeSet<(String, u32)>,
    /// The newest gauge time of any rank (ns).
    last_ts: u64,
    /// When the rule last looked at the job (gauge time).
    checked_ts: u64,
}

struct Rank {
    node: String,
    pid: u32,
    local_rank: Option<u32>,
    /// Allocated bytes per device, as last reported.
    allocated: BTreeMap<i32, u64>,
    reserved: BTreeMap<i32, u64>,
    /// (ts, allocated on all devices) over the last window, oldest first.
    series: VecDeque<(u64, u64)>,
    peak: (u64, u64),
}

/// A job the rule is to look at.
pub struct DueJob {
    pub id: String,
    /// Its newest gauge time.
    pub now: u64,
    pub ranks: Vec<DueRank>,
}

pub struct DueRank {
    pub rank: u32,
    pub node: String,
    pub pid: u32,
    /// (ts, allocated on all devices) over the window, oldest first.
    pub allocated: Vec<(u64, u64)>,
}

/// One job as `GET /api/v1/jobs` lists it.
#[derive(Debug, Serialize)]
pub struct JobSummary {
    pub id: String,
    /// The job's trace (hex): each rank's span in it, sent by the rank's node.
    pub trace_id: String,
    pub world_size: Option<u32>,
    pub ranks_seen: usize,
    pub nodes: Vec<String>,
    /// The ranks' allocator totals now, summed.
    pub allocated_bytes: u64,
    pub reserved_bytes: u64,
    /// The largest of the ranks' peaks, and when.
    pub peak_allocated_bytes: u64,
    pub peak_ts: u64,
}

/// One job's figures: what the state shows with each rank's process.
pub struct JobFigures {
    pub summary: JobSummary,
    pub ranks: Vec<RankFigures>,
    /// (node, pid) of its processes without a rank.
    pub others: Vec<(String, u32)>,
}

/// A rank's figures, for `GET /api/v1/jobs/{id}`; the state adds its process's view.
#[derive(Debug, Clone, Serialize)]
pub struct RankFigures {
    pub rank: u32,
    pub local_rank: Option<u32>,
    pub node: String,
    pub pid: u32,
    pub allocated_bytes: u64,
    pub reserved_bytes: u64,
    /// Per device: (allocated, reserved).
    pub devices: BTreeMap<i32, (u64, u64)>,
    pub peak_allocated_bytes: u64,
    pub peak_ts: u64,
}

impl Membership {
    /// What a process's OTLP resource (as parsed) says of its job; None without a job id.
    pub fn of_identity(identity: &gpuprof_otlp::resource::ProcessIdentity) -> Option<Membership> {
        (!identity.job_id.is_empty()).then(|| Membership {
            job: identity.job_id.clone(),
            rank: identity.rank,
            local_rank: identity.local_rank,
            world_size: identity.world_size,
        })
    }
}

impl Jobs {
    /// Takes what a process's resource says of its job.
    pub fn note(&mut self, node: &str, pid: u32, membership: Membership) {
        let key = (node.to_string(), pid);
        if let Some(old) = self.members.get(&key).filter(|job| **job != membership.job).cloned() {
            self.leave(&old, &key);
        }
        self.members.insert(key.clone(), membership.job.clone());
        let job = self.jobs.entry(membership.job).or_default();
        job.world_size = membership.world_size.or(job.world_size);
        let Some(rank) = membership.rank else {
            job.others.insert(key);
            return;
        };
        job.others.remove(&key);
        let same = job.ranks.get(&rank).is_some_and(|r| r.node == node && r.pid == pid);
        if !same {
            job.ranks.insert(
                rank,
                Rank {
                    node: node.to_string(),
                    pid,
                    local_rank: membership.local_rank,
                    allocated: BTreeMap::new(),
                    reserved: BTreeMap::new(),
                    series: VecDeque::new(),
                    peak: (0, 0),
                },
            );
        }
    }

    fn leave(&mut self, job: &str, key: &(String, u32)) {
        if let Some(job) = self.jobs.get_mut(job) {
            job.others.remove(key);
            job.ranks.retain(|_, r| (r.node.as_str(), r.pid) != (key.0.as_str(), key.1));
        }
    }

    /// A process's allocator totals of one device at `ts`; a rank's series and peak follow.
    pub fn allocator(&mut self, node: &str, pid: u32, ts: u64, device: i32, allocated: u64, reserved: u64) {
        let Some(job_id) = self.members.get(&(node.to_string(), pid)) else { return };
        let Some(job) = self.jobs.get_mut(job_id) else { return };
        let Some(rank) = job.ranks.values_mut().find(|r| r.node == node && r.pid == pid) else { return };
        rank.allocated.insert(device, allocated);
        rank.reserved.insert(device, reserved);
        let total: u64 = rank.allocated.values().sum();
        match rank.series.back_mut() {
            Some(last) if last.0 == ts => last.1 = total,
            Some(last) if last.0 > ts => {}
            _ => rank.series.push_back((ts, total)),
        }
        // The window's points, and the one in effect as it begins.
        let horizon = ts.saturating_sub(self.config.window_ns);
        while rank.series.get(1).is_some_and(|(t, _)| *t <= horizon) {
            rank.series.pop_front();
        }
        if total > rank.peak.0 {
            rank.peak = (total, ts);
        }
        job.last_ts = job.last_ts.max(ts);
    }

    /// Jobs whose gauges moved on by a second since they were last looked at, with their ranks'
    /// series (the state adds each rank's process name, instance and profile for the rule).
    pub fn due(&mut self) -> Vec<DueJob> {
        let mut due = Vec::new();
        for (id, job) in &mut self.jobs {
            if job.last_ts < job.checked_ts + 1_000_000_000 {
                continue;
            }
            job.checked_ts = job.last_ts;
            let ranks = job
                .ranks
                .iter()
                .filter(|(_, r)| !r.series.is_empty())
                .map(|(n, r)| DueRank {
                    rank: *n,
                    node: r.node.clone(),
                    pid: r.pid,
                    allocated: r.series.iter().copied().collect(),
                })
                .collect();
            due.push(DueJob { id: id.clone(), now: job.last_ts, ranks });
        }
        due
    }

    /// The rule over one job's ranks.
    pub fn check(&mut self, job: &str, ranks: &[RankMemory], now: u64) -> Vec<Finding> {
        self.divergences.check(job, ranks, now, &self.config)
    }

    pub fn list(&self) -> Vec<JobSummary> {
        self.jobs
            .iter()
            .filter(|(_, job)| !job.ranks.is_empty())
            .map(|(id, job)| summary(id, job, &figures(job)))
            .collect()
    }

    /// Every job with ranks, with its ranks' figures (the metrics).
    pub fn with_ranks(&self) -> Vec<JobFigures> {
        self.jobs.iter().filter(|(_, job)| !job.ranks.is_empty()).filter_map(|(id, _)| self.job(id)).collect()
    }

    /// One job: its summary, its ranks' figures, and its processes without a rank.
    pub fn job(&self, id: &str) -> Option<JobFigures> {
        let job = self.jobs.get(id)?;
        let ranks = figures(job);
        Some(JobFigures { summary: summary(id, job, &ranks), ranks, others: job.others.iter().cloned().collect() })
    }

    /// The job a process of a node is one of.
    pub fn job_of(&self, node: &str, pid: u32) -> Option<&str> {
        self.members.get(&(node.to_string(), pid)).map(String::as_str)
    }

    /// Keeps the processes `keep` says; a job left without any is forgotten.
    pub fn retain(&mut self, mut keep: impl FnMut(&str, u32) -> bool) {
        self.members.retain(|(node, pid), _| keep(node, *pid));
        let members = &self.members;
        let known = |node: &str, pid: u32| members.contains_key(&(node.to_string(), pid));
        let mut gone = Vec::new();
        for (id, job) in &mut self.jobs {
            job.ranks.retain(|_, r| known(&r.node, r.pid));
            job.others.retain(|(node, pid)| known(node, *pid));
            if job.ranks.is_empty() && job.others.is_empty() {
                gone.push(id.clone());
            }
        }
        for id in gone {
            self.jobs.remove(&id);
            self.divergences.forget(&id);
        }
    }
}

/// What `GET /api/v1/jobs` says of a job, from its ranks' figures.
fn summary(id: &str, job: &Job, figures: &[RankFigures]) -> JobSummary {
    let peak = figures.iter().max_by_key(|f| (f.peak_allocated_bytes, u64::MAX - f.peak_ts));
    JobSummary {
        id: id.to_string(),
        trace_id: trace_id(id),
        world_size: job.world_size,
        ranks_seen: job.ranks.len(),
        nodes: nodes(job),
        allocated_bytes: figures.iter().map(|f| f.allocated_bytes).sum(),
        reserved_bytes: figures.iter().map(|f| f.reserved_bytes).sum(),
        peak_allocated_bytes: peak.map_or(0, |p| p.peak_allocated_bytes),
        peak_ts: peak.map_or(0, |p| p.peak_ts),
    }
}

fn trace_id(job: &str) -> String {
    gpuprof_otlp::ids::job_trace_id(job).iter().map(|b| format!("{b:02x}")).collect()
}

fn nodes(job: &Job) -> Vec<String> {
    let nodes: BTreeSet<&str> =
        job.ranks.values().map(|r| r.node.as_str()).chain(job.others.iter().map(|(n, _)| n.as_str())).collect();
    nodes.into_iter().map(String::from).collect()
}

fn figures(job: &Job) -> Vec<RankFigures> {
    job.ranks
        .iter()
        .map(|(n, r)| RankFigures {
            rank: *n,
            local_rank: r.local_rank,
            node: r.node.clone(),
            pid: r.pid,
            allocated_bytes: r.allocated.values().sum(),
            reserved_bytes: r.reserved.values().sum(),
            devices: r
                .allocated
                .iter()
                .map(|(device, allocated)| (*device, (*allocated, r.reserved.get(device).copied().unwrap_or(0))))
                .collect(),
            peak_allocated_bytes: r.peak.0,
            peak_ts: r.peak.1,
        })
        .collect()
}
