//! OTLP export of a live capture (`--otlp-endpoint`), summarized on the node. A training process
//! makes tens of thousands of allocator events a second; the node keeps them and sends what a
//! fleet needs (docs/otlp.md):
//! - log records of driver and process events (segments, VMM, IPC, contexts, failed calls,
//!   fork/exec/exit: few per process), of findings, and of memory profiles (pprof: live bytes
//!   and counts by Python stack, the top stacks and the rest as one) every `profile_interval`
//!   and at each finding, out-of-memory failure and exit; allocator events only with
//!   `--otlp-events all`;
//! - gauges every `metrics_interval`: per process and device, the allocator's allocated and
//!   reserved bytes, and live bytes by layer and kind;
//! - spans, one trace per process instance: driver allocations, tensor blocks from a size up,
//!   findings — a bounded number per trace; and one trace per distributed job, a span per rank
//!   (`job_trace`);
//! - the HTML report of each post-mortem the node writes (gzipped, one log record, when it fits
//!   in a request; else a record saying where it is), which the collector serves by finding.
//!
//! The capture thread only builds requests; `crate::client` queues and sends them, so
//! the network never slows the capture, and whatever is not delivered is counted.

mod identity;
pub mod job_trace;
mod profile;
mod settings;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use crate::client::{Client, ClientOptions, Delivery};
use crate::lifetimes::{Lifetimes, SpanPolicy};
use crate::proto::logs::v1::{LogRecord, ResourceLogs, ScopeLogs};
use crate::proto::metrics::v1::{ResourceMetrics, ScopeMetrics};
use crate::proto::trace::v1::{ResourceSpans, ScopeSpans, Span};
use crate::resource::ProcessIdentity;
use anyhow::Result;
use gpuprof_model::report::{EndOfRun, ExportHealth, PostmortemReport, Reporter};
use gpuprof_model::track::{ProcessMemory, ProcessState};
use gpuprof_model::{Event, Finding, Layer, Op, Tracker};

pub use identity::{node_name, PodIdentity};
pub use settings::OtlpTuning;

/// How long the end of a capture waits for what is queued to be delivered.
const DRAIN_LIMIT: Duration = Duration::from_secs(5);
/// Exited processes whose identities are kept for what comes after their exit: a node's
/// post-mortems within their window.
const DEPARTED_KEPT: usize = 4096;

/// Which events go out as log records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EventStream {
    /// Driver and process events; allocator (tensor) events summarized into gauges and profiles.
    Summary,
    /// Every event, allocator events included (for debugging: tens of thousands a second).
    All,
}

#[derive(Debug, Clone)]
pub struct OtlpOptions {
    pub client: ClientOptions,
    pub node: Option<String>,
    pub events: EventStream,
    pub metrics_interval: Duration,
    pub profile_interval: Duration,
    /// Stacks a profile names per layer and device; the rest are summed in one sample.
    pub profile_stacks: usize,
    pub spans: SpanPolicy,
    /// Resident memory past which event records of the full stream are shed (counted).
    pub memory_cap: Option<u64>,
    /// A sidecar's pod: every process is one of its containers' (their /proc is not ours).
    pub pod: Option<PodIdentity>,
}

impl OtlpOptions {
    pub(crate) const DEFAULT_METRICS_INTERVAL: Duration = Duration::from_secs(1);
    pub(crate) const DEFAULT_PROFILE_INTERVAL: Duration = Duration::from_secs(10);
    pub(crate) const DEFAULT_PROFILE_STACKS: usize = 50;
    pub(crate) const DEFAULT_SPAN_MIN_BYTES: u64 = 64 << 20;
    pub(crate) const DEFAULT_MAX_SPANS: u64 = 1000;
}

/// Why a profile is taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Reason {
    Periodic,
    Finding,
    Oom,
    Exit,
    End,
}

impl Reason {
    fn as_str(self) -> &'static str {
        match self {
            Reason::Periodic => "periodic",
            Reason::Finding => "finding",
            Reason::Oom => "oom",
            Reason::Exit => "exit",
            Reason::End => "end",
        }
    }
}

/// Where the export's requests go: the OTLP client, or (the fleet simulation) a recorder.
pub trait Outbox: Send {
    fn logs(&mut self, resource_logs: Vec<ResourceLogs>);
    fn spans(&mut self, resource_spans: Vec<ResourceSpans>);
    fn metrics(&mut self, resource_metrics: Vec<ResourceMetrics>);
    fn endpoint(&self) -> String;
    /// What was delivered so far.
    fn delivery(&self) -> Delivery;
    fn queued_bytes(&self) -> usize;
    /// Delivers what is queued (waiting at most `drain`) and says how it went.
    fn finish(self: Box<Self>, drain: Duration) -> Delivery;
}

impl Outbox for Client {
    fn logs(&mut self, resource_logs: Vec<ResourceLogs>) {
        Client::logs(self, resource_logs);
    }

    fn spans(&mut self, resource_spans: Vec<ResourceSpans>) {
        Client::spans(self, resource_spans);
    }

    fn metrics(&mut self, resource_metrics: Vec<ResourceMetrics>) {
        Client::metrics(self, resource_metrics);
    }

    fn endpoint(&self) -> String {
        Client::endpoint(self).to_string()
    }

    fn delivery(&self) -> Delivery {
        Client::delivery(self)
    }

    fn queued_bytes(&self) -> usize {
        Client::queued_bytes(self)
    }

    fn finish(self: Box<Self>, drain: Duration) -> Delivery {
        Client::finish(*self, drain)
    }
}

pub struct Telemetry {
    client: Box<dyn Outbox>,
    options: OtlpOptions,
    node: String,
    gpus: Vec<String>,
    lifetimes: Lifetimes,
    identities: HashMap<u32, ProcessIdentity>,
    /// Processes that exited since the last flush: their identity goes after it.
    exited: Vec<u32>,
    records: Vec<(u32, LogRecord)>,
    /// Encoded bytes of `records`.
    records_bytes: usize,
    spans: Vec<(u32, Span)>,
    /// Identities of processes that exited, the latest `DEPARTED_KEPT`.
    departed: std::collections::VecDeque<(u32, ProcessIdentity)>,
    /// Ranks of distributed jobs, each a span of its job's trace until it exits.
    ranks: job_trace::RankSpans,
    metrics: Vec<ResourceMetrics>,
    /// Live processes whose profile is due at the next flush, and why.
    profiles_due: BTreeMap<u32, Reason>,
    findings_sent: u64,
    profiles_sent: u64,
    postmortems_sent: u64,
    /// Log records, spans and metric points handed to the client so far.
    handed: Handed,
    last_metrics: u64,
    last_profiles: u64,
    /// Event records of the full stream left out because the agent was over its memory cap.
    shed: u64,
    over_memory_cap: bool,
    /// NVML's used memory per process in its latest sample.
    nvml_used: BTreeMap<u32, u64>,
}

/// Records are handed to the client when this much is waiting (between flushes, at high rates).
const RECORDS_HANDOFF_BYTES: usize = 1 << 20;
/// Room a post-mortem's record leaves in its request for the resource and the record's own
/// fields: a report gzipped to more than a request less this goes as a note.
const POSTMORTEM_MARGIN: usize = 64 << 10;

impl Telemetry {
    pub fn start(options: OtlpOptions) -> Result<Self> {
        let client = Client::start(options.client.clone(), "gpuprof-otlp")
            .map_err(|e| anyhow::anyhow!("--otlp-endpoint {e}"))?;
        Ok(Telemetry::with_outbox(options, Box::new(client), gpuprof_model::event::wall_clock_ns()))
    }

    /// An export whose requests go to `outbox`, its clock starting at `now` (ns).
    pub fn with_outbox(options: OtlpOptions, outbox: Box<dyn Outbox>, now: u64) -> Self {
        let node = node_name(options.node.as_deref());
        Telemetry {
            client: outbox,
            lifetimes: Lifetimes::with_policy(node.clone(), options.spans),
            options,
            node,
            gpus: identity::gpu_uuids(),
            identities: HashMap::new(),
            exited: Vec::new(),
            records: Vec::new(),
            records_bytes: 0,
            spans: Vec::new(),
            ranks: job_trace::RankSpans::default(),
            departed: std::collections::VecDeque::new(),
            metrics: Vec::new(),
            profiles_due: BTreeMap::new(),
            findings_sent: 0,
            profiles_sent: 0,
            postmortems_sent: 0,
            handed: Handed::default(),
            last_metrics: now,
            last_profiles: now,
            shed: 0,
            over_memory_cap: false,
            nvml_used: BTreeMap::new(),
        }
    }

    /// Before the tracker applies `event`: the lifetimes it ends are still in the tracker.
    pub fn before(&mut self, event: &Event, tracker: &Tracker) {
        self.lifetimes.observe(event, tracker);
    }

    /// After the tracker applied `event` (its peer and segment filled in), with the findings it fired.
    pub fn after(&mut self, event: &Event, fired: &[Finding], tracker: &Tracker) {
        let pid = event.pid;
        if !self.identities.contains_key(&pid) || (event.layer == Layer::Process && event.op == Op::Exec) {
            let identity = self.identity_of(pid, &event.comm, event.ppid);
            self.identities.insert(pid, identity);
        }
        // Made at the process's first event (a fork, often), the identity learns the job at its
        // first call; records go out with it at the next flush, so they name it too.
        if identity::says_job(event) {
            if let Some(identity) = self.identities.get_mut(&pid) {
                identity::learn_job(identity, event);
                self.ranks.learn(pid, identity, event.ts);
            }
        }
        let record = match (self.options.events, event.layer) {
            (EventStream::Summary, Layer::Allocator) => false,
            (EventStream::All, Layer::Allocator) if self.over_memory_cap => {
                self.shed += 1;
                false
            }
            _ => true,
        };
        if record {
            self.push_record(pid, crate::logs::record_of(event));
        }
        if event.layer == Layer::Driver && event.result == gpuprof_model::event::CUDA_ERROR_OUT_OF_MEMORY {
            self.profile_due(pid, Reason::Oom);
        }
        self.findings(fired);
        if event.op == Op::Exit {
            // A CUDA process's last word: what it held as it went, as gauges and a profile.
            if let Some(process) =
                last_instance(tracker, pid).filter(|p| p.driver_calls() > 0 || !p.allocator_totals().is_empty())
            {
                self.process_metrics(process, event.ts);
                self.profile(process, event.ts, Reason::Exit);
            }
            let rank_span = self.ranks.end(pid, &self.node, last_instance(tracker, pid), event.ts);
            self.spans.extend(rank_span.map(|span| (pid, span)));
            self.profiles_due.remove(&pid);
            self.exited.push(pid);
        }
    }

    /// Findings (fired by an event, or at the end): a record and a span each, and a profile of
    /// the process they are about.
    pub(crate) fn findings(&mut self, fired: &[Finding]) {
        for finding in fired {
            self.profile_due(finding.pid, Reason::Finding);
            let ts = finding.last_ts;
            self.push_record(finding.pid, crate::logs::finding_record(finding, ts));
            self.findings_sent += 1;
            let span = crate::findings::span_of(finding, &self.node, self.findings_sent);
            self.spans.push((finding.pid, span));
            self.ranks.finding(finding);
        }
    }

    /// A post-mortem written: its report, gzipped, for the collector to serve by finding; or,
    /// over what one request carries, a record saying where it is on the node.
    pub(crate) fn postmortem(&mut self, report: &PostmortemReport) {
        use crate::logs::{PostmortemBody, PostmortemRecord};
        let limit = self.options.client.max_request_bytes.saturating_sub(POSTMORTEM_MARGIN);
        let body = if report.gzip.len() <= limit {
            PostmortemBody::Gzip(report.gzip.clone())
        } else {
            PostmortemBody::Omitted(format!(
                "the report is {} gzipped, over the {} one OTLP request carries (--otlp-max-request-bytes); it is on node {} at {}",
                gpuprof_model::bytes::human(report.gzip.len() as u64),
                gpuprof_model::bytes::human(limit as u64),
                self.node,
                report.report.display()
            ))
        };
        let record = PostmortemRecord {
            finding_id: report.finding_id.clone(),
            report: report.report.display().to_string(),
            html_bytes: report.html_bytes,
            body,
        };
        let now = gpuprof_model::event::wall_clock_ns();
        self.postmortems_sent += 1;
        self.push_record(report.pid, crate::logs::postmortem_record(record, now));
    }

    fn profile_due(&mut self, pid: u32, reason: Reason) {
        let due = self.profiles_due.entry(pid).or_insert(reason);
        *due = (*due).max(reason);
    }

    fn push_record(&mut self, pid: u32, record: LogRecord) {
        self.records_bytes += prost::Message::encoded_len(&record);
        self.records.push((pid, record));
        if self.records_bytes >= RECORDS_HANDOFF_BYTES {
            self.send_records();
        }
    }

    /// Hands what accumulated to the client; gauges and profiles when their interval is up.
    /// `now`: wall-clock ns (a replay passes its own clock).
    pub fn flush(&mut self, tracker: &Tracker, now: u64) {
        let due: Vec<(u32, Reason)> = std::mem::take(&mut self.profiles_due).into_iter().collect();
        for (pid, reason) in due {
            if let Some(process) = tracker.process(pid) {
                self.profile(process, now, reason);
            }
        }
        if now.saturating_sub(self.last_profiles) >= self.options.profile_interval.as_nanos() as u64 {
            self.last_profiles = now;
            for process in tracker.live_processes() {
                if process.has_blocks() || !process.allocations().is_empty() {
                    self.profile(process, now, Reason::Periodic);
                }
            }
        }
        if now.saturating_sub(self.last_metrics) >= self.options.metrics_interval.as_nanos() as u64 {
            self.last_metrics = now;
            for process in tracker.live_processes() {
                self.process_metrics(process, now);
            }
            self.check_memory();
        }
        self.send_records();
        let mut spans = self.lifetimes.take_finished();
        spans.append(&mut self.spans);
        if !spans.is_empty() {
            self.handed.spans += spans.len() as u64;
            let resource_spans = self.by_process(spans, spans_of);
            self.client.spans(resource_spans);
        }
        if !self.metrics.is_empty() {
            let metrics = std::mem::take(&mut self.metrics);
            self.handed.points += metrics
                .iter()
                .flat_map(|r| &r.scope_metrics)
                .flat_map(|s| &s.metrics)
                .map(|m| match &m.data {
                    Some(crate::proto::metrics::v1::metric::Data::Gauge(g)) => g.data_points.len() as u64,
                    _ => 0,
                })
                .sum::<u64>();
            self.client.metrics(metrics);
        }
        for pid in self.exited.drain(..) {
            if let Some(identity) = self.identities.remove(&pid) {
                // What comes of it after its exit (a post-mortem written a window later) goes
                // out under the same resource, so to the same job and shard.
                self.departed.push_back((pid, identity));
                if self.departed.len() > DEPARTED_KEPT {
                    self.departed.pop_front();
                }
            }
        }
    }

    fn send_records(&mut self) {
        if self.records.is_empty() {
            return;
        }
        let records = std::mem::take(&mut self.records);
        self.records_bytes = 0;
        self.handed.records += records.len() as u64;
        let resource_logs = self.by_process(records, logs_of);
        self.client.logs(resource_logs);
    }

    fn profile(&mut self, process: &ProcessMemory, ts: u64, reason: Reason) {
        let pprof = profile::of_process(process, ts, self.options.profile_stacks);
        self.profiles_sent += 1;
        self.push_record(process.pid, crate::logs::profile_record(pprof, ts, reason.as_str()));
    }

    /// NVML's used memory per process (nvidia-smi's figure), for the next gauges.
    pub(crate) fn nvml_used(&mut self, used: BTreeMap<u32, u64>) {
        self.nvml_used = used;
    }

    fn process_metrics(&mut self, process: &ProcessMemory, ts: u64) {
        let metrics = crate::metrics::process_metrics(process, ts, self.nvml_used.get(&process.pid).copied());
        let resource = self.identity(process.pid, &process.comm, process.ppid).resource();
        self.metrics.push(ResourceMetrics {
            resource: Some(resource),
            scope_metrics: vec![ScopeMetrics { scope: Some(crate::scope()), metrics, ..Default::default() }],
            ..Default::default()
        });
    }

    /// Over the cap, the full stream's allocator records are shed until it is back under.
    fn check_memory(&mut self) {
        let Some(cap) = self.options.memory_cap else { return };
        let resident = gpuprof_procfs::process::own_resident_bytes();
        let over = resident > cap;
        if over && !self.over_memory_cap {
            tracing::warn!(
                resident,
                cap,
                "over the memory cap: allocator events are no longer sent one by one (counted as shed)"
            );
        }
        self.over_memory_cap = over;
    }

    fn identity(&mut self, pid: u32, comm: &str, ppid: Option<u32>) -> ProcessIdentity {
        if let Some(known) = self.identities.get(&pid) {
            return known.clone();
        }
        if let Some((_, departed)) = self.departed.iter().rev().find(|(gone, _)| *gone == pid) {
            return departed.clone();
        }
        let identity = self.identity_of(pid, comm, ppid);
        self.identities.insert(pid, identity.clone());
        identity
    }

    fn identity_of(&self, pid: u32, comm: &str, ppid: Option<u32>) -> ProcessIdentity {
        match &self.options.pod {
            Some(pod) => pod.identify(pid, &self.node, &self.gpus, comm, ppid),
            None => identity::of_process(pid, &self.node, &self.gpus, comm, ppid),
        }
    }

    /// Items grouped into one resource per process, in order of first appearance.
    fn by_process<T, R>(&mut self, items: Vec<(u32, T)>, wrap: fn(ProcessIdentity, Vec<T>) -> R) -> Vec<R> {
        let mut order: Vec<u32> = Vec::new();
        let mut groups: HashMap<u32, Vec<T>> = HashMap::new();
        for (pid, item) in items {
            groups
                .entry(pid)
                .or_insert_with(|| {
                    order.push(pid);
                    Vec::new()
                })
                .push(item);
        }
        order
            .into_iter()
            .map(|pid| {
                let identity = self.identity(pid, "", None);
                wrap(identity, groups.remove(&pid).unwrap_or_default())
            })
            .collect()
    }

    /// Sends the end of a capture (last gauges and profiles of the processes still running),
    /// waits a few seconds for delivery, and says how it went.
    pub(crate) fn finish(self, tracker: &Tracker) -> Delivered {
        self.finish_at(tracker, gpuprof_model::event::wall_clock_ns())
    }

    /// `finish` on the export's own clock (`now`, ns).
    pub(crate) fn finish_at(mut self, tracker: &Tracker, now: u64) -> Delivered {
        for process in tracker.live_processes() {
            self.process_metrics(process, now);
            if process.has_blocks() || !process.allocations().is_empty() {
                self.profile(process, now, Reason::End);
            }
        }
        self.profiles_due.clear();
        for pid in self.ranks.pids() {
            let rank_span = self.ranks.end(pid, &self.node, last_instance(tracker, pid), now);
            self.spans.extend(rank_span.map(|span| (pid, span)));
        }
        self.flush(tracker, now);
        let (findings, profiles, postmortems, shed, over_cap, handed) = (
            self.findings_sent,
            self.profiles_sent,
            self.postmortems_sent,
            self.shed,
            self.lifetimes.over_cap(),
            self.handed,
        );
        let endpoint = self.client.endpoint();
        let delivery = self.client.finish(DRAIN_LIMIT);
        Delivered { endpoint, handed, delivery, findings, profiles, postmortems, shed, spans_over_cap: over_cap }
    }

    /// What was delivered so far (items the collector accepted, and lost).
    pub(crate) fn delivery(&self) -> Delivery {
        self.client.delivery()
    }

    /// Encoded bytes waiting to be sent.
    pub(crate) fn queued_bytes(&self) -> usize {
        self.client.queued_bytes()
    }
}

/// Items an export handed to its client.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Handed {
    pub records: u64,
    pub spans: u64,
    pub points: u64,
}

/// How an export ended.
#[derive(Debug, Clone)]
pub(crate) struct Delivered {
    pub endpoint: String,
    pub handed: Handed,
    pub delivery: Delivery,
    pub findings: u64,
    pub profiles: u64,
    /// Post-mortems' reports (or notes of where they are) among the log records.
    pub postmortems: u64,
    /// Full-stream event records left out over the memory cap.
    pub shed: u64,
    /// Allocations that got no span (their trace had its share).
    pub spans_over_cap: u64,
}

impl std::fmt::Display for Delivered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "otlp to {}: handed over {} log records ({} findings, {} memory profiles), {} spans, {} metric points; {}",
            self.endpoint,
            self.handed.records,
            self.findings,
            self.profiles,
            self.handed.spans,
            self.handed.points,
            self.delivery
        )?;
        if self.postmortems > 0 {
            write!(f, "; {} post-mortem reports among the log records", self.postmortems)?;
        }
        if self.shed > 0 {
            write!(f, "; over the memory cap, {} allocator events not sent one by one", self.shed)?;
        }
        if self.spans_over_cap > 0 {
            write!(f, "; {} allocations without a span (their trace was full)", self.spans_over_cap)?;
        }
        Ok(())
    }
}

/// The latest instance of `pid` (an exit closes it; it is still the one just seen).
fn last_instance(tracker: &Tracker, pid: u32) -> Option<&ProcessMemory> {
    tracker.processes().into_iter().rev().find(|p| p.pid == pid && p.state != ProcessState::Running)
}

fn logs_of(identity: ProcessIdentity, log_records: Vec<LogRecord>) -> ResourceLogs {
    ResourceLogs {
        resource: Some(identity.resource()),
        scope_logs: vec![ScopeLogs { scope: Some(crate::scope()), log_records, ..Default::default() }],
        ..Default::default()
    }
}

fn spans_of(identity: ProcessIdentity, spans: Vec<Span>) -> ResourceSpans {
    ResourceSpans {
        resource: Some(identity.resource()),
        scope_spans: vec![ScopeSpans { scope: Some(crate::scope()), spans, ..Default::default() }],
        ..Default::default()
    }
}

/// The capture's OTLP reporter: each event, finding, post-mortem and device reading goes out
/// from here.
impl Reporter for Telemetry {
    fn before(&mut self, event: &Event, tracker: &Tracker) {
        Telemetry::before(self, event, tracker);
    }

    fn event(&mut self, event: &Event, fired: &[Finding], tracker: &Tracker) -> std::io::Result<()> {
        Telemetry::after(self, event, fired, tracker);
        Ok(())
    }

    fn findings(&mut self, fired: &[Finding]) {
        Telemetry::findings(self, fired);
    }

    fn postmortem(&mut self, report: &PostmortemReport) {
        Telemetry::postmortem(self, report);
    }

    fn device_used(&mut self, used: &BTreeMap<u32, u64>) {
        self.nvml_used(used.clone());
    }

    fn flush(&mut self, tracker: &Tracker, now: u64) -> std::io::Result<()> {
        Telemetry::flush(self, tracker, now);
        Ok(())
    }

    fn finish(self: Box<Self>, end: &EndOfRun<'_>) -> std::io::Result<Option<String>> {
        Ok(Some(Telemetry::finish(*self, end.tracker).to_string()))
    }

    fn health(&self) -> Option<ExportHealth> {
        let delivery = self.delivery();
        Some(ExportHealth { sent: delivery.sent(), lost: delivery.lost(), queued_bytes: self.queued_bytes() as u64 })
    }
}
