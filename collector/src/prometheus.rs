//! Prometheus exposition: live bytes per node, pod, process and kind, a framework allocator's
//! allocated/reserved per device, the stacks holding the most per process, findings by kind and
//! the most recent ones, each distributed job's ranks (allocated, reserved, how far from the
//! others' median, findings by rank), and the collector's own ingest, refusal and forwarding
//! counters. Built
//! fresh at each scrape from the state, so gone processes vanish.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use gpuprof_otlp::client::Delivery;

use crate::collector::{Collector, Refusal, Stats};
use crate::state::{LiveProcess, ProcessSummary, State, Workload};

/// Stacks per live process in `gpuprof_top_stack_live_bytes`.
const TOP_STACKS: usize = 5;
/// Frames of a stack in its label, innermost first.
const STACK_LABEL_FRAMES: usize = 3;
/// Findings in `gpuprof_recent_finding_bytes`.
const RECENT_FINDINGS: usize = 100;

/// Where a live process runs: the labels its memory is broken down by.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProcessLabels {
    node: String,
    namespace: String,
    pod: String,
    container: String,
    pid: String,
    comm: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LiveLabels {
    #[prometheus(flatten)]
    process: ProcessLabels,
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DeviceLabels {
    #[prometheus(flatten)]
    process: ProcessLabels,
    device: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StackLabels {
    node: String,
    namespace: String,
    pod: String,
    pid: String,
    comm: String,
    layer: String,
    rank: String,
    stack: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RecentFindingLabels {
    id: String,
    finding_id: String,
    node: String,
    namespace: String,
    pod: String,
    pid: String,
    comm: String,
    kind: String,
    severity: String,
    user_line: String,
    stack: String,
    /// Where the collector serves its post-mortem (`/api/v1/findings/{finding_id}/report`);
    /// empty when it has none.
    report: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FindingLabels {
    node: String,
    kind: String,
    severity: String,
}

/// A rank of a distributed job (`gpuprof.job.id`, `gpuprof.rank`): a job's label set is its
/// ranks, bounded by its world size; jobs go with their processes (`--retention`). `job_id`, not
/// `job`: Prometheus gives every scraped series a `job` label of its own.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RankLabels {
    job_id: String,
    rank: String,
    node: String,
    pid: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct JobLabels {
    job_id: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RankFindingLabels {
    job_id: String,
    rank: String,
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SignalLabels {
    signal: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: String,
}

/// "function (file:line) < caller (file:line) < …", innermost first, a few frames.
fn stack_label(stack: &[gpuprof_model::Frame]) -> String {
    if stack.is_empty() {
        return "(no Python stack)".into();
    }
    let frames: Vec<String> =
        stack.iter().take(STACK_LABEL_FRAMES).map(|f| format!("{} ({}:{})", f.function, f.file, f.line)).collect();
    let more = if stack.len() > STACK_LABEL_FRAMES { " < …" } else { "" };
    format!("{}{more}", frames.join(" < "))
}

pub fn render(collector: &Collector) -> String {
    let mut registry = Registry::default();
    let families = StateFamilies::of(&collector.state.lock().expect("state lock"));
    families.register(&mut registry);
    register_ingest(&mut registry, &collector.stats);
    let (reports, report_bytes) = (Gauge::<i64>::default(), Gauge::<i64>::default());
    {
        let kept = collector.reports.lock().expect("reports lock");
        reports.set(kept.len() as i64);
        report_bytes.set(kept.bytes() as i64);
    }
    registry.register("gpuprof_collector_postmortem_reports", "Post-mortems' reports kept", reports);
    let unsaved = Gauge::<i64>::default();
    unsaved.set(collector.findings_unsaved() as i64);
    registry.register(
        "gpuprof_collector_findings_unsaved",
        "Findings served from memory that the database has not taken yet (its disk full): lost if the collector stops before a checkpoint saves them",
        unsaved,
    );
    registry.register(
        "gpuprof_collector_postmortem_report_bytes",
        "Bytes of post-mortems' reports kept (gzipped), within --max-report-mib",
        report_bytes,
    );
    if let Some(forwarder) = &collector.forwarder {
        register_forwarding(&mut registry, &forwarder.delivery());
    }
    let mut text = String::new();
    encode(&mut text, &registry).expect("writing to a String cannot fail");
    text
}

/// The series read from the state: its live processes' memory and the findings held.
#[derive(Default)]
struct StateFamilies {
    live: Family<LiveLabels, Gauge>,
    allocated: Family<DeviceLabels, Gauge>,
    reserved: Family<DeviceLabels, Gauge>,
    nvml_used: Family<ProcessLabels, Gauge>,
    not_probed: Family<ProcessLabels, Gauge>,
    findings: Family<FindingLabels, Gauge>,
    stacks: Family<StackLabels, Gauge>,
    recent: Family<RecentFindingLabels, Gauge>,
    rank_allocated: Family<RankLabels, Gauge>,
    rank_reserved: Family<RankLabels, Gauge>,
    rank_over_median: Family<RankLabels, Gauge>,
    world_size: Family<JobLabels, Gauge>,
    rank_findings: Family<RankFindingLabels, Gauge>,
}

impl StateFamilies {
    fn of(state: &State) -> StateFamilies {
        let families = StateFamilies::default();
        let no_workload = Workload::default();
        for process in state.live() {
            let workload = state.workload(process.node, process.pid).unwrap_or(&no_workload);
            families.add_process(&process, workload);
        }
        families.add_findings_by_kind(state);
        families.add_recent_findings(state, &no_workload);
        families.add_jobs(state);
        families
    }

    /// Each job's ranks: allocated and reserved now, and how far each sits from the others'
    /// median (what `rank_divergence` judges over its window).
    fn add_jobs(&self, state: &State) {
        for job in state.job_ranks() {
            if let Some(world_size) = job.summary.world_size {
                self.world_size.get_or_create(&JobLabels { job_id: job.summary.id.clone() }).set(i64::from(world_size));
            }
            let allocated: Vec<u64> = job.ranks.iter().map(|r| r.allocated_bytes).collect();
            let medians = gpuprof_model::findings::rank_divergence::medians_of_the_others(&allocated);
            for (rank, median) in job.ranks.iter().zip(medians) {
                let labels = RankLabels {
                    job_id: job.summary.id.clone(),
                    rank: rank.rank.to_string(),
                    node: rank.node.clone(),
                    pid: rank.pid.to_string(),
                };
                self.rank_allocated.get_or_create(&labels).set(rank.allocated_bytes as i64);
                self.rank_reserved.get_or_create(&labels).set(rank.reserved_bytes as i64);
                if let Some(median) = median {
                    self.rank_over_median.get_or_create(&labels).set(rank.allocated_bytes as i64 - median as i64);
                }
            }
        }
        for ((job, rank, kind), count) in state.findings_by_rank() {
            let labels = RankFindingLabels { job_id: job, rank: rank.to_string(), kind: kind.as_str().into() };
            self.rank_findings.get_or_create(&labels).set(count as i64);
        }
    }

    fn add_process(&self, process: &LiveProcess, workload: &Workload) {
        let labels = ProcessLabels {
            node: process.node.to_string(),
            namespace: workload.namespace.clone(),
            pod: workload.pod.clone(),
            container: workload.container.clone(),
            pid: process.pid.to_string(),
            comm: process.comm.to_string(),
        };
        let probed = self.add_live_bytes(process, &labels);
        let Some(summary) = process.summary else { return };
        if let Some(used) = summary.nvml_used {
            self.nvml_used.get_or_create(&labels).set(used as i64);
            self.not_probed.get_or_create(&labels).set(used as i64 - probed as i64);
        }
        for (device, totals) in &summary.allocator {
            let labels = DeviceLabels { process: labels.clone(), device: device.to_string() };
            self.allocated.get_or_create(&labels).set(totals.allocated as i64);
            self.reserved.get_or_create(&labels).set(totals.reserved as i64);
        }
        self.add_top_stacks(process, workload, summary);
    }

    /// Sets the process's live bytes by kind; returns those the probed calls account for
    /// (host memory apart: NVML counts device memory only).
    fn add_live_bytes(&self, process: &LiveProcess, labels: &ProcessLabels) -> u64 {
        let by_kind = driver_live_bytes_by_kind(process);
        let probed = by_kind.iter().filter(|(kind, _)| kind.as_str() != "host_pinned").map(|(_, bytes)| bytes).sum();
        for (kind, bytes) in by_kind {
            self.live.get_or_create(&LiveLabels { process: labels.clone(), kind }).set(bytes as i64);
        }
        probed
    }

    /// From the node's latest memory profile: tensors where the process has a framework
    /// allocator, else driver allocations.
    fn add_top_stacks(&self, process: &LiveProcess, workload: &Workload, summary: &ProcessSummary) {
        let Some(profile) = &summary.profile else { return };
        let layer = if summary.allocator.is_empty() { "driver" } else { "allocator" };
        for (rank, (stack, bytes, _)) in profile.samples.iter().take(TOP_STACKS).enumerate() {
            let labels = StackLabels {
                node: process.node.to_string(),
                namespace: workload.namespace.clone(),
                pod: workload.pod.clone(),
                pid: process.pid.to_string(),
                comm: process.comm.to_string(),
                layer: layer.into(),
                rank: (rank + 1).to_string(),
                stack: stack_label(stack),
            };
            self.stacks.get_or_create(&labels).set(*bytes as i64);
        }
    }

    fn add_findings_by_kind(&self, state: &State) {
        for ((node, kind, severity), count) in state.findings_by_kind() {
            self.findings
                .get_or_create(&FindingLabels { node, kind: kind.as_str().into(), severity: severity.as_str().into() })
                .set(count as i64);
        }
    }

    fn add_recent_findings(&self, state: &State, no_workload: &Workload) {
        for stored in state.recent_findings(RECENT_FINDINGS) {
            let finding = &stored.finding;
            let workload = state.workload(&stored.node, finding.pid).unwrap_or(no_workload);
            let labels = RecentFindingLabels {
                id: stored.id.to_string(),
                finding_id: finding.finding_id.clone(),
                node: stored.node.clone(),
                namespace: workload.namespace.clone(),
                pod: workload.pod.clone(),
                pid: finding.pid.to_string(),
                comm: finding.comm.clone(),
                kind: finding.kind.as_str().into(),
                severity: finding.severity.as_str().into(),
                user_line: finding.user_frame.as_ref().map(|f| f.to_string()).unwrap_or_default(),
                stack: stack_label(&finding.stack),
                report: finding.postmortem.as_ref().map(|p| p.url.clone()).unwrap_or_default(),
            };
            self.recent.get_or_create(&labels).set(finding.bytes as i64);
        }
    }

    /// Registered in the order the exposition lists them.
    fn register(self, registry: &mut Registry) {
        registry.register("gpuprof_live_bytes", "Device memory a process holds now, by kind (driver level)", self.live);
        registry.register(
            "gpuprof_allocator_allocated_bytes",
            "Bytes in a framework allocator's live blocks (tensors), per device",
            self.allocated,
        );
        registry.register(
            "gpuprof_allocator_reserved_bytes",
            "Bytes a framework allocator holds in segments, its cache included, per device",
            self.reserved,
        );
        registry.register(
            "gpuprof_nvml_used_bytes",
            "Device memory the driver accounts to a process, all devices (NVML, as nvidia-smi shows)",
            self.nvml_used,
        );
        registry.register(
            "gpuprof_not_probed_bytes",
            "NVML's used memory less the live device bytes of the probed calls: the CUDA context, modules, memory from before the capture or from calls not probed",
            self.not_probed,
        );
        registry.register(
            "gpuprof_findings",
            "Findings held, by node, kind and severity (leak: act on it; info: a fact)",
            self.findings,
        );
        registry.register("gpuprof_top_stack_live_bytes", "Live bytes of the stacks holding the most, per live process (tensors where PyTorch's allocator reports, else driver allocations)", self.stacks);
        registry.register(
            "gpuprof_recent_finding_bytes",
            "The most recent findings, one series each, valued at the bytes involved",
            self.recent,
        );
        registry.register(
            "gpuprof_job_rank_allocated_bytes",
            "Bytes in a job's rank's allocator blocks (tensors), all devices, as its node last reported",
            self.rank_allocated,
        );
        registry.register(
            "gpuprof_job_rank_reserved_bytes",
            "Bytes a job's rank's allocator holds in segments, all devices",
            self.rank_reserved,
        );
        registry.register(
            "gpuprof_job_rank_over_median_bytes",
            "A rank's allocated bytes less the median of its job's other ranks' (rank_divergence judges this over its window)",
            self.rank_over_median,
        );
        registry.register(
            "gpuprof_job_world_size",
            "A job's world size, as its ranks' launcher set it",
            self.world_size,
        );
        registry.register(
            "gpuprof_job_rank_findings",
            "Findings held of a job's ranks, by rank and kind",
            self.rank_findings,
        );
    }
}

/// Driver-level live bytes by kind: from the node's events, else from its gauges (where no
/// event came).
fn driver_live_bytes_by_kind(process: &LiveProcess) -> BTreeMap<String, u64> {
    let mut by_kind = BTreeMap::new();
    if let Some(summary) = process.summary {
        for ((layer, kind), bytes) in &summary.live {
            if layer == "driver" {
                by_kind.insert(kind.clone(), *bytes);
            }
        }
    }
    if let Some(tracked) = process.tracked {
        for (kind, total) in &tracked.summary().by_kind {
            by_kind.insert(kind.as_str().to_string(), total.bytes);
        }
    }
    by_kind
}

/// The collector's own counters: what it received, turned away and failed to store.
fn register_ingest(registry: &mut Registry, stats: &Stats) {
    let received = Family::<SignalLabels, Counter>::default();
    for (signal, value) in
        [("log_records", &stats.log_records), ("spans", &stats.spans), ("metric_points", &stats.metric_points)]
    {
        received.get_or_create(&SignalLabels { signal: signal.into() }).inc_by(value.load(Ordering::Relaxed));
    }
    registry.register("gpuprof_collector_received", "OTLP items received, by signal", received);
    registry.register(
        "gpuprof_collector_rejected_log_records",
        "Log records that claimed to be gpuprof events but did not decode",
        counter(stats.rejected_log_records.load(Ordering::Relaxed)),
    );
    let refused = Family::<ReasonLabels, Counter>::default();
    let refusals = stats.refusals();
    // Every reason, a zero included, so a rate over it exists before the first refusal.
    for reason in Refusal::ALL {
        refused
            .get_or_create(&ReasonLabels { reason: reason.as_str().into() })
            .inc_by(refusals.get(&reason).copied().unwrap_or(0));
    }
    registry.register("gpuprof_collector_refused_requests", "OTLP requests turned away, by reason", refused);
    registry.register(
        "gpuprof_collector_findings_received",
        "Findings the nodes sent since the collector started",
        counter(stats.findings_received.load(Ordering::Relaxed)),
    );
    registry.register(
        "gpuprof_collector_received_profiles",
        "Memory profiles the nodes sent",
        counter(stats.profiles.load(Ordering::Relaxed)),
    );
    registry.register(
        "gpuprof_collector_received_postmortems",
        "Post-mortems' reports the nodes sent (a note where one was too large to send counts)",
        counter(stats.postmortems_received.load(Ordering::Relaxed)),
    );
    registry.register(
        "gpuprof_collector_store_errors",
        "Failed writes to the embedded database",
        counter(stats.store_errors.load(Ordering::Relaxed)),
    );
}

/// What became of the spans forwarded to the trace backend.
fn register_forwarding(registry: &mut Registry, delivery: &Delivery) {
    registry.register(
        "gpuprof_collector_forwarded_spans",
        "Spans forwarded to the trace backend",
        counter(delivery.sent_spans),
    );
    registry.register(
        "gpuprof_collector_forward_dropped_spans",
        "Spans the trace backend did not take (queue full, refused, unreachable)",
        counter(delivery.lost()),
    );
}

/// A counter standing at `value`: the exposition is built afresh at each scrape from totals
/// kept elsewhere.
fn counter(value: u64) -> Counter {
    let counter = Counter::default();
    counter.inc_by(value);
    counter
}

/// OpenMetrics text as the classic Prometheus text format (0.0.4): a counter's HELP and TYPE
/// name its `_total` sample, and there is no `# EOF`.
pub fn classic(openmetrics: &str) -> String {
    let counters: std::collections::HashSet<&str> =
        openmetrics.lines().filter_map(|l| l.strip_prefix("# TYPE ")?.strip_suffix(" counter")).collect();
    let mut out = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let meta = ["# HELP ", "# TYPE "].into_iter().find_map(|p| line.strip_prefix(p).map(|rest| (p, rest)));
        match meta {
            Some((prefix, rest)) => {
                let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
                if counters.contains(name) {
                    out.push_str(&format!("{prefix}{name}_total {tail}\n"));
                } else {
                    out.push_str(line);
                    out.push('\n');
                }
            }
            None => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn counters_are_named_by_their_total_in_the_classic_format() {
        let openmetrics = "# HELP a_requests Requests.\n# TYPE a_requests counter\na_requests_total 3\n# HELP b Live.\n# TYPE b gauge\nb 7\n# EOF\n";
        assert_eq!(
            super::classic(openmetrics),
            "# HELP a_requests_total Requests.\n# TYPE a_requests_total counter\na_requests_total 3\n# HELP b Live.\n# TYPE b gauge\nb 7\n"
        );
    }
}
