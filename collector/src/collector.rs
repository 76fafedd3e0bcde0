//! The collector's shared core: turns OTLP requests into the state — each node's events for its
//! tracker, its findings, gauges and memory profiles, its post-mortems' reports — saves findings
//! and reports, hands spans to the forwarder, and counts everything it takes in or turns away. Both receivers (gRPC and HTTP)
//! call into this; neither decides anything itself.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use gpuprof_model::{Event, Finding};
use gpuprof_otlp::proto::collector::logs::v1::{
    ExportLogsPartialSuccess, ExportLogsServiceRequest, ExportLogsServiceResponse,
};
use gpuprof_otlp::proto::collector::metrics::v1::{ExportMetricsServiceRequest, ExportMetricsServiceResponse};
use gpuprof_otlp::proto::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use gpuprof_otlp::proto::metrics::v1::metric;
use gpuprof_otlp::resource::ProcessIdentity;

use crate::config::Config;
use crate::forward::Forwarder;
use crate::jobs::Membership;
use crate::reports::{ReportInfo, Reports};
use crate::state::{AllocatorView, State, StoredFinding, StoredProfile, Workload};
use crate::store::Store;

/// Why a request was turned away, for the counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Refusal {
    Unauthenticated,
    RateLimited,
    TooLarge,
    Malformed,
    UnsupportedMediaType,
}

impl Refusal {
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::Unauthenticated => "unauthenticated",
            Refusal::RateLimited => "rate_limited",
            Refusal::TooLarge => "too_large",
            Refusal::Malformed => "malformed",
            Refusal::UnsupportedMediaType => "unsupported_media_type",
        }
    }

    pub const ALL: [Refusal; 5] = [
        Refusal::Unauthenticated,
        Refusal::RateLimited,
        Refusal::TooLarge,
        Refusal::Malformed,
        Refusal::UnsupportedMediaType,
    ];
}

#[derive(Debug, Default)]
pub struct Stats {
    pub log_records: AtomicU64,
    pub rejected_log_records: AtomicU64,
    /// Log records of other producers (not gpuprof events): accepted and ignored.
    pub foreign_log_records: AtomicU64,
    pub spans: AtomicU64,
    pub metric_points: AtomicU64,
    /// Memory profiles among the log records.
    pub profiles: AtomicU64,
    /// Findings the nodes sent.
    pub findings_received: AtomicU64,
    /// Post-mortems' reports the nodes sent (a note where a page was too large to send counts).
    pub postmortems_received: AtomicU64,
    pub store_errors: AtomicU64,
    refused: Mutex<HashMap<Refusal, u64>>,
}

impl Stats {
    pub fn refused(&self, why: Refusal) {
        if let Ok(mut refused) = self.refused.lock() {
            *refused.entry(why).or_insert(0) += 1;
        }
    }

    pub fn refusals(&self) -> HashMap<Refusal, u64> {
        self.refused.lock().map(|r| r.clone()).unwrap_or_default()
    }
}

pub struct Collector {
    pub config: Config,
    pub state: Mutex<State>,
    /// Post-mortems' reports kept (their pages are in the store).
    pub reports: Mutex<Reports>,
    pub store: Store,
    pub stats: Stats,
    pub forwarder: Option<Forwarder>,
    limiter: Mutex<HashMap<SocketAddr, Bucket>>,
    /// Finding records taken already, by a hash of node, time and body (the findings themselves
    /// are pruned by retention; so is this, at the same checkpoints).
    seen_findings: Mutex<std::collections::HashSet<u64>>,
    /// Findings the database refused (its disk full): tried again at each checkpoint.
    unsaved: Mutex<Vec<StoredFinding>>,
}

struct Bucket {
    tokens: f64,
    last: Instant,
}

impl Collector {
    pub fn new(config: Config, state: State, reports: Reports, store: Store, forwarder: Option<Forwarder>) -> Self {
        Collector {
            config,
            state: Mutex::new(state),
            reports: Mutex::new(reports),
            store,
            stats: Stats::default(),
            forwarder,
            limiter: Mutex::new(HashMap::new()),
            seen_findings: Mutex::new(std::collections::HashSet::new()),
            unsaved: Mutex::new(Vec::new()),
        }
    }

    /// The `authorization` header (or gRPC metadata) carries the agents' token, when one is required.
    pub fn authorized(&self, authorization: Option<&[u8]>) -> bool {
        gpuprof_otlp::bearer::matches(self.config.token.as_deref(), authorization)
    }

    /// The `authorization` header carries the readers' token, when one is required.
    pub fn may_read(&self, authorization: Option<&[u8]>) -> bool {
        gpuprof_otlp::bearer::matches(self.config.read_token.as_deref(), authorization)
    }

    /// A token bucket per connection (peer address and port).
    pub fn admit(&self, peer: SocketAddr) -> bool {
        let Ok(mut buckets) = self.limiter.lock() else { return true };
        let now = Instant::now();
        let rate = self.config.rate_limit;
        if buckets.len() > 10_000 {
            buckets.retain(|_, b| now.duration_since(b.last).as_secs() < 60);
        }
        let bucket = buckets.entry(peer).or_insert(Bucket { tokens: 2.0 * rate, last: now });
        bucket.tokens = (bucket.tokens + now.duration_since(bucket.last).as_secs_f64() * rate).min(2.0 * rate);
        bucket.last = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    pub fn logs(&self, request: ExportLogsServiceRequest) -> ExportLogsServiceResponse {
        use gpuprof_otlp::logs::{kind_of, RecordKind};
        let mut by_node: HashMap<String, Vec<Event>> = HashMap::new();
        let mut findings: HashMap<String, Vec<Finding>> = HashMap::new();
        let mut profiles: Vec<(String, u32, StoredProfile)> = Vec::new();
        let mut postmortems: Vec<(ReportInfo, Vec<u8>)> = Vec::new();
        let (mut received, mut rejected, mut foreign) = (0u64, 0u64, 0u64);
        let mut first_error = None;
        let mut workloads: Vec<(String, u32, Workload)> = Vec::new();
        let mut memberships: Vec<(String, u32, Membership)> = Vec::new();
        for resource_logs in request.resource_logs {
            let identity = resource_logs.resource.as_ref().map(ProcessIdentity::of_resource).unwrap_or_default();
            let node = node_name(&identity);
            if let Some(membership) = Membership::of_identity(&identity) {
                memberships.push((node.clone(), identity.pid, membership));
            }
            if let Some(pod) = &identity.k8s_pod_name {
                let workload = Workload {
                    namespace: identity.k8s_namespace.clone().unwrap_or_default(),
                    pod: pod.clone(),
                    container: identity.k8s_container_name.clone().unwrap_or_default(),
                };
                workloads.push((node.clone(), identity.pid, workload));
            }
            for record in resource_logs.scope_logs.into_iter().flat_map(|s| s.log_records) {
                received += 1;
                let decoded = match kind_of(&record) {
                    RecordKind::Foreign => {
                        foreign += 1;
                        continue;
                    }
                    RecordKind::Event => gpuprof_otlp::logs::event_of(&record)
                        .map(|event| by_node.entry(node.clone()).or_default().push(event))
                        .map_err(|e| e.to_string()),
                    RecordKind::Finding => match self.first_time(&node, &record) {
                        // OTLP delivers at least once: a request answered too late is sent again.
                        false => Ok(()),
                        true => gpuprof_otlp::logs::finding_of(&record)
                            .map(|finding| findings.entry(node.clone()).or_default().push(finding))
                            .map_err(|e| e.to_string()),
                    },
                    RecordKind::Profile => {
                        profile_of(&record).map(|profile| profiles.push((node.clone(), identity.pid, profile)))
                    }
                    RecordKind::Postmortem => gpuprof_otlp::logs::postmortem_of(&record)
                        .map(|report| postmortems.push(report_of(report, &node, identity.pid, record.time_unix_nano)))
                        .map_err(|e| e.to_string()),
                };
                if let Err(error) = decoded {
                    rejected += 1;
                    first_error.get_or_insert_with(|| error.to_string());
                }
            }
        }
        self.stats.log_records.fetch_add(received, Ordering::Relaxed);
        self.stats.rejected_log_records.fetch_add(rejected, Ordering::Relaxed);
        self.stats.foreign_log_records.fetch_add(foreign, Ordering::Relaxed);
        self.stats.profiles.fetch_add(profiles.len() as u64, Ordering::Relaxed);
        let mut stored = Vec::new();
        {
            let mut state = self.state.lock().expect("state lock");
            for (node, mut events) in by_node {
                // Batches group events by process; the tracker wants the node's capture order back.
                events.sort_by_key(|e| e.ts);
                state.ingest(&node, events);
            }
            for (node, pid, profile) in profiles {
                state.profile(&node, pid, profile);
            }
            for (node, found) in findings {
                stored.extend(state.add_findings(&node, found));
            }
            for (node, pid, workload) in workloads {
                state.note_workload(&node, pid, workload);
            }
            for (node, pid, membership) in memberships {
                state.note_job(&node, pid, membership);
            }
        }
        self.keep(&stored);
        self.keep_reports(postmortems);
        ExportLogsServiceResponse {
            partial_success: (rejected > 0).then(|| ExportLogsPartialSuccess {
                rejected_log_records: rejected as i64,
                error_message: first_error.unwrap_or_default(),
            }),
        }
    }

    pub fn traces(&self, request: ExportTraceServiceRequest) -> ExportTraceServiceResponse {
        let spans: usize = request.resource_spans.iter().flat_map(|r| &r.scope_spans).map(|s| s.spans.len()).sum();
        self.stats.spans.fetch_add(spans as u64, Ordering::Relaxed);
        {
            let mut state = self.state.lock().expect("state lock");
            for group in &request.resource_spans {
                let identity = group.resource.as_ref().map(ProcessIdentity::of_resource).unwrap_or_default();
                let count = group.scope_spans.iter().map(|s| s.spans.len() as u64).sum();
                state.spans(&node_name(&identity), identity.pid, count);
            }
        }
        if let Some(forwarder) = &self.forwarder {
            forwarder.spans(request.resource_spans);
        }
        ExportTraceServiceResponse { partial_success: None }
    }

    /// The nodes' gauges: each process's allocator totals per device and live bytes by kind.
    pub fn metrics(&self, request: ExportMetricsServiceRequest) -> ExportMetricsServiceResponse {
        use gpuprof_model::otel::metric as name;
        use gpuprof_otlp::proto::metrics::v1::number_data_point::Value;
        let mut points = 0u64;
        let mut state = self.state.lock().expect("state lock");
        for resource_metrics in request.resource_metrics {
            let identity = resource_metrics.resource.as_ref().map(ProcessIdentity::of_resource).unwrap_or_default();
            let node = node_name(&identity);
            if let Some(membership) = Membership::of_identity(&identity) {
                state.note_job(&node, identity.pid, membership);
            }
            // allocated and reserved come as two metrics: paired per device and time.
            let mut allocator: BTreeMap<(i32, u64), AllocatorView> = BTreeMap::new();
            for metric in resource_metrics.scope_metrics.into_iter().flat_map(|s| s.metrics) {
                let data_points = match metric.data {
                    Some(metric::Data::Gauge(g)) => g.data_points,
                    Some(metric::Data::Sum(s)) => s.data_points,
                    Some(metric::Data::Histogram(h)) => {
                        points += h.data_points.len() as u64;
                        continue;
                    }
                    Some(metric::Data::ExponentialHistogram(h)) => {
                        points += h.data_points.len() as u64;
                        continue;
                    }
                    Some(metric::Data::Summary(s)) => {
                        points += s.data_points.len() as u64;
                        continue;
                    }
                    None => continue,
                };
                points += data_points.len() as u64;
                for point in data_points {
                    let value = match point.value {
                        Some(Value::AsInt(v)) => v.max(0) as u64,
                        Some(Value::AsDouble(v)) => v.max(0.0) as u64,
                        None => continue,
                    };
                    let attribute = |key| gpuprof_otlp::attribute_str(&point.attributes, key);
                    let device = || attribute(name::ATTR_DEVICE).and_then(|d| d.parse::<i32>().ok());
                    match metric.name.as_str() {
                        name::ALLOCATOR_ALLOCATED => {
                            if let Some(device) = device() {
                                allocator.entry((device, point.time_unix_nano)).or_default().allocated = value;
                            }
                        }
                        name::ALLOCATOR_RESERVED => {
                            if let Some(device) = device() {
                                allocator.entry((device, point.time_unix_nano)).or_default().reserved = value;
                            }
                        }
                        name::NVML_USED => state.nvml_gauge(&node, identity.pid, point.time_unix_nano, value),
                        name::LIVE_BYTES => {
                            let (layer, kind) =
                                (attribute(name::ATTR_LAYER).unwrap_or(""), attribute(name::ATTR_KIND).unwrap_or(""));
                            state.live_gauge(&node, identity.pid, point.time_unix_nano, layer, kind, value);
                        }
                        _ => {}
                    }
                }
            }
            for ((device, ts), view) in allocator {
                state.allocator_gauges(&node, identity.pid, ts, device, view);
            }
        }
        // The jobs' ranks as the gauges now stand: a rank that strays from its peers.
        let diverging = state.check_jobs();
        drop(state);
        self.keep(&diverging);
        self.stats.metric_points.fetch_add(points, Ordering::Relaxed);
        ExportMetricsServiceResponse { partial_success: None }
    }

    /// False when this finding record of this node came before (a request delivered twice).
    fn first_time(&self, node: &str, record: &gpuprof_otlp::proto::logs::v1::LogRecord) -> bool {
        use std::hash::{Hash, Hasher};
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        node.hash(&mut hasher);
        record.time_unix_nano.hash(&mut hasher);
        format!("{:?}", record.body).hash(&mut hasher);
        let Ok(mut seen) = self.seen_findings.lock() else { return true };
        seen.insert(hasher.finish())
    }

    /// Findings the nodes sent: stored, counted.
    fn keep(&self, stored: &[StoredFinding]) {
        if stored.is_empty() {
            return;
        }
        self.stats.findings_received.fetch_add(stored.len() as u64, Ordering::Relaxed);
        if let Err(error) = self.store.add_findings(stored) {
            self.stats.store_errors.fetch_add(1, Ordering::Relaxed);
            tracing::error!("{error:#}; they are served from memory and saved at the next checkpoint that can");
            let mut unsaved = self.unsaved.lock().expect("unsaved lock");
            unsaved.extend_from_slice(stored);
        }
    }

    /// Findings the database refused before, saved now if it takes them.
    fn save_unsaved(&self) -> anyhow::Result<()> {
        let mut unsaved = self.unsaved.lock().expect("unsaved lock");
        if unsaved.is_empty() {
            return Ok(());
        }
        self.store.add_findings(&unsaved)?;
        unsaved.clear();
        Ok(())
    }

    /// Findings served from memory that the database has not taken yet (a full disk): saved at
    /// the next checkpoint that can, lost if the collector stops first.
    pub fn findings_unsaved(&self) -> usize {
        self.unsaved.lock().expect("unsaved lock").len()
    }

    /// Post-mortems' reports the nodes sent: stored, counted, the oldest dropped past the cap.
    fn keep_reports(&self, received: Vec<(ReportInfo, Vec<u8>)>) {
        if received.is_empty() {
            return;
        }
        self.stats.postmortems_received.fetch_add(received.len() as u64, Ordering::Relaxed);
        let horizon = gpuprof_model::event::wall_clock_ns().saturating_sub(self.config.retention.as_nanos() as u64);
        let mut reports = self.reports.lock().expect("reports lock");
        for (info, page) in received {
            match self.store.add_report(&info, &page) {
                Ok(()) => reports.add(info),
                Err(error) => {
                    self.stats.store_errors.fetch_add(1, Ordering::Relaxed);
                    tracing::error!("{error:#}");
                }
            }
        }
        let dropped = reports.prune(horizon, self.config.max_report_bytes);
        if let Err(error) = self.store.remove_reports(&dropped) {
            self.stats.store_errors.fetch_add(1, Ordering::Relaxed);
            tracing::error!("{error:#}");
        }
    }

    /// Saves what changed and applies retention. Nodes are serialized and saved a few at a
    /// time: a checkpoint of every node at once held all their saved forms (and the database's
    /// uncommitted pages) together, the shard's largest peak of memory.
    pub fn checkpoint(&self) -> anyhow::Result<()> {
        self.store.reopen_if_failed()?;
        self.save_unsaved()?;
        let horizon = gpuprof_model::event::wall_clock_ns().saturating_sub(self.config.retention.as_nanos() as u64);
        let (names, dropped) = {
            let mut state = self.state.lock().expect("state lock");
            let dropped = state.prune(horizon, self.config.max_findings);
            (state.take_dirty(), dropped)
        };
        if let Ok(mut seen) = self.seen_findings.lock() {
            // Duplicates come within seconds of the first copy: what is older need not be kept.
            if seen.len() > 1 << 20 {
                seen.clear();
            }
        }
        for (n, chunk) in names.chunks(NODES_PER_SAVE).enumerate() {
            let nodes: Vec<(String, Vec<u8>)> = {
                let state = self.state.lock().expect("state lock");
                chunk.iter().filter_map(|name| Some((name.clone(), state.saved_form(name)?))).collect()
            };
            if let Err(error) = self.store.checkpoint(&nodes, &[]) {
                self.state.lock().expect("state lock").mark_dirty(&names[n * NODES_PER_SAVE..]);
                return Err(error);
            }
        }
        self.store.checkpoint(&[], &dropped)?;
        let dropped_reports = self.reports.lock().expect("reports lock").prune(horizon, self.config.max_report_bytes);
        self.store.remove_reports(&dropped_reports)?;
        release_freed_memory();
        Ok(())
    }
}

/// Nodes serialized and committed together at a checkpoint.
const NODES_PER_SAVE: usize = 16;

/// Hands the allocator's freed pages back to the system: a checkpoint's and a large read's
/// buffers are freed, but glibc keeps them in its arenas, and a shard's resident memory would
/// stay near its highest peak (1000 nodes over 4 shards: 0.88 MiB a node without, 0.74 with).
fn release_freed_memory() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim has no preconditions; it only returns free memory to the system.
    unsafe {
        libc::malloc_trim(0);
    }
}

fn node_name(identity: &ProcessIdentity) -> String {
    if identity.host_name.is_empty() {
        "unknown".to_string()
    } else {
        identity.host_name.clone()
    }
}

/// A post-mortem record as the collector keeps it: what it is, and its page (gzipped; empty
/// when the node did not send it).
fn report_of(record: gpuprof_otlp::logs::PostmortemRecord, node: &str, pid: u32, ts: u64) -> (ReportInfo, Vec<u8>) {
    use gpuprof_otlp::logs::PostmortemBody;
    let (page, omitted) = match record.body {
        PostmortemBody::Gzip(page) => (page, None),
        PostmortemBody::Omitted(why) => (Vec::new(), Some(why)),
    };
    let info = ReportInfo {
        finding_id: record.finding_id,
        node: node.to_string(),
        pid,
        ts,
        report: record.report,
        html_bytes: record.html_bytes,
        gzip_bytes: page.len() as u64,
        omitted,
    };
    (info, page)
}

/// A profile record as the state keeps it: the pprof, and its largest samples decoded once.
fn profile_of(record: &gpuprof_otlp::proto::logs::v1::LogRecord) -> Result<StoredProfile, String> {
    let (pprof, reason) = gpuprof_otlp::logs::profile_of(record).map_err(|e| e.to_string())?;
    let profile = gpuprof_otlp::pprof::decode(pprof).map_err(|e| format!("memory profile: {e}"))?;
    let samples = gpuprof_otlp::pprof::top_samples(&profile, crate::state::TOP_STACKS)
        .into_iter()
        .map(|(frames, bytes, count)| (gpuprof_model::Stack::new(frames), bytes, count))
        .collect();
    Ok(StoredProfile { ts: record.time_unix_nano, reason: reason.to_string(), pprof: pprof.to_vec(), samples })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn collector(name: &str, token: Option<&str>, read_token: Option<&str>, rate_limit: f64) -> Collector {
        let dir = std::env::temp_dir().join(format!("gpuprof-collector-unit-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let db = dir.join("state.redb");
        let (store, _) = Store::open(&db).unwrap();
        let config = Config {
            grpc_listen: "127.0.0.1:0".parse().unwrap(),
            http_listen: "127.0.0.1:0".parse().unwrap(),
            db,
            token: token.map(str::to_string),
            read_token: read_token.map(str::to_string),
            max_request_bytes: 4 << 20,
            rate_limit,
            forward_endpoint: None,
            retention: Duration::from_secs(3600),
            max_findings: 1000,
            max_report_bytes: 1 << 30,
            checkpoint_every: Duration::from_secs(10),
        };
        Collector::new(config, State::new(Vec::new(), Vec::new()), Reports::default(), store, None)
    }

    #[test]
    fn agents_and_readers_each_need_their_own_token() {
        let both = collector("tokens", Some("agents"), Some("readers"), 100.0);
        assert!(both.authorized(Some(b"Bearer agents")));
        assert!(!both.authorized(Some(b"Bearer readers")));
        assert!(!both.authorized(None));
        assert!(both.may_read(Some(b"Bearer readers")));
        assert!(!both.may_read(Some(b"Bearer agents")));
        // Without a readers' token, reading is open (the NetworkPolicy limits who reaches it).
        let open = collector("open", Some("agents"), None, 100.0);
        assert!(open.may_read(None));
        assert!(!open.authorized(None));
    }

    #[test]
    fn each_connection_gets_a_burst_of_twice_its_rate_then_waits_for_tokens() {
        let limited = collector("rate", None, None, 5.0);
        let (one, other): (SocketAddr, SocketAddr) =
            ("10.0.0.1:4000".parse().unwrap(), "10.0.0.1:4001".parse().unwrap());
        let admitted = (0..15).filter(|_| limited.admit(one)).count();
        assert_eq!(admitted, 10, "a burst of 2 × 5 requests");
        assert!(limited.admit(other), "another connection has its own bucket");
        // Refilled at 5 a second: after 0.3 s (1.5 tokens, or more on a busy machine) the
        // connection is admitted again.
        std::thread::sleep(Duration::from_millis(300));
        assert!(limited.admit(one));
    }
}
