//! The collector's shared core: turns OTLP requests into per-node event streams for the state,
//! saves findings, hands spans to the forwarder, and counts everything it takes in or turns
//! away. Both receivers (gRPC and HTTP) call into this; neither decides anything itself.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use gpuprof_model::Event;
use gpuprof_otlp::proto::collector::logs::v1::{ExportLogsPartialSuccess, ExportLogsServiceRequest, ExportLogsServiceResponse};
use gpuprof_otlp::proto::collector::metrics::v1::{ExportMetricsServiceRequest, ExportMetricsServiceResponse};
use gpuprof_otlp::proto::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use gpuprof_otlp::proto::metrics::v1::metric;
use gpuprof_otlp::proto::trace::v1::{ResourceSpans, ScopeSpans};
use gpuprof_otlp::resource::ProcessIdentity;

use crate::config::Config;
use crate::forward::Forwarder;
use crate::state::{State, StoredFinding, Workload};
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

    pub const ALL: [Refusal; 5] =
        [Refusal::Unauthenticated, Refusal::RateLimited, Refusal::TooLarge, Refusal::Malformed, Refusal::UnsupportedMediaType];
}

#[derive(Debug, Default)]
pub struct Stats {
    pub log_records: AtomicU64,
    pub rejected_log_records: AtomicU64,
    /// Log records of other producers (not gpuprof events): accepted and ignored.
    pub foreign_log_records: AtomicU64,
    pub spans: AtomicU64,
    pub metric_points: AtomicU64,
    pub findings_fired: AtomicU64,
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
    pub store: Store,
    pub stats: Stats,
    pub forwarder: Option<Forwarder>,
    limiter: Mutex<HashMap<SocketAddr, Bucket>>,
}

struct Bucket {
    tokens: f64,
    last: Instant,
}

impl Collector {
    pub fn new(config: Config, state: State, store: Store, forwarder: Option<Forwarder>) -> Self {
        Collector { config, state: Mutex::new(state), store, stats: Stats::default(), forwarder, limiter: Mutex::new(HashMap::new()) }
    }

    /// The `authorization` header (or gRPC metadata) carries the token, when one is required.
    pub fn authorized(&self, authorization: Option<&[u8]>) -> bool {
        let Some(token) = &self.config.token else { return true };
        let Some(given) = authorization.and_then(|a| a.strip_prefix(b"Bearer ")) else { return false };
        // Same time whatever the first wrong byte.
        given.len() == token.len() && given.iter().zip(token.as_bytes()).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
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
        let mut by_node: HashMap<String, Vec<Event>> = HashMap::new();
        let (mut received, mut rejected, mut foreign) = (0u64, 0u64, 0u64);
        let mut first_error = None;
        let mut workloads: Vec<(String, u32, Workload)> = Vec::new();
        for resource_logs in request.resource_logs {
            let node = node_of(resource_logs.resource.as_ref());
            if let Some(resource) = &resource_logs.resource {
                let identity = ProcessIdentity::of_resource(resource);
                if let Some(pod) = identity.k8s_pod_name {
                    let workload = Workload {
                        namespace: identity.k8s_namespace.unwrap_or_default(),
                        pod,
                        container: identity.k8s_container_name.unwrap_or_default(),
                    };
                    workloads.push((node.clone(), identity.pid, workload));
                }
            }
            let events = by_node.entry(node).or_default();
            for record in resource_logs.scope_logs.into_iter().flat_map(|s| s.log_records) {
                received += 1;
                if !gpuprof_otlp::logs::is_gpuprof_event(&record) {
                    foreign += 1;
                    continue;
                }
                match gpuprof_otlp::logs::event_of(&record) {
                    Ok(event) => events.push(event),
                    Err(error) => {
                        rejected += 1;
                        first_error.get_or_insert_with(|| error.to_string());
                    }
                }
            }
        }
        self.stats.log_records.fetch_add(received, Ordering::Relaxed);
        self.stats.rejected_log_records.fetch_add(rejected, Ordering::Relaxed);
        self.stats.foreign_log_records.fetch_add(foreign, Ordering::Relaxed);
        let mut fired = Vec::new();
        {
            let mut state = self.state.lock().expect("state lock");
            for (node, mut events) in by_node {
                // Batches group events by process; the rules want the node's capture order back.
                events.sort_by_key(|e| e.ts);
                fired.extend(state.ingest(&node, events));
            }
            for (node, pid, workload) in workloads {
                state.note_workload(&node, pid, workload);
            }
        }
        self.fired(&fired);
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
        if let Some(forwarder) = &self.forwarder {
            forwarder.forward(request.resource_spans);
        }
        ExportTraceServiceResponse { partial_success: None }
    }

    pub fn metrics(&self, request: ExportMetricsServiceRequest) -> ExportMetricsServiceResponse {
        // The collector's own gauges come from its trackers; agents' gauges are counted (their
        // values equal what the events already told).
        let points: usize = request
            .resource_metrics
            .iter()
            .flat_map(|r| &r.scope_metrics)
            .flat_map(|s| &s.metrics)
            .map(|m| match &m.data {
                Some(metric::Data::Gauge(g)) => g.data_points.len(),
                Some(metric::Data::Sum(s)) => s.data_points.len(),
                Some(metric::Data::Histogram(h)) => h.data_points.len(),
                Some(metric::Data::ExponentialHistogram(h)) => h.data_points.len(),
                Some(metric::Data::Summary(s)) => s.data_points.len(),
                None => 0,
            })
            .sum();
        self.stats.metric_points.fetch_add(points as u64, Ordering::Relaxed);
        ExportMetricsServiceResponse { partial_success: None }
    }

    fn fired(&self, fired: &[StoredFinding]) {
        if fired.is_empty() {
            return;
        }
        self.stats.findings_fired.fetch_add(fired.len() as u64, Ordering::Relaxed);
        if let Err(error) = self.store.add_findings(fired) {
            self.stats.store_errors.fetch_add(1, Ordering::Relaxed);
            tracing::error!("{error:#}");
        }
        if let Some(forwarder) = &self.forwarder {
            let spans = fired
                .iter()
                .map(|f| {
                    let identity = ProcessIdentity {
                        host_name: f.node.clone(),
                        pid: f.finding.pid,
                        executable: f.finding.comm.clone(),
                        ..Default::default()
                    };
                    let span = gpuprof_otlp::findings::span_of(&f.finding, &f.node, f.process_since, f.id);
                    ResourceSpans {
                        resource: Some(identity.resource()),
                        scope_spans: vec![ScopeSpans { scope: Some(gpuprof_otlp::scope()), spans: vec![span], ..Default::default() }],
                        ..Default::default()
                    }
                })
                .collect();
            forwarder.forward(spans);
        }
    }

    /// Saves what changed and applies retention.
    pub fn checkpoint(&self) -> anyhow::Result<()> {
        let horizon = gpuprof_model::event::wall_clock_ns().saturating_sub(self.config.retention.as_nanos() as u64);
        let (nodes, dropped) = {
            let mut state = self.state.lock().expect("state lock");
            let dropped = state.prune(horizon, self.config.max_findings);
            (state.take_dirty(), dropped)
        };
        self.store.checkpoint(&nodes, &dropped)
    }
}

fn node_of(resource: Option<&gpuprof_otlp::proto::resource::v1::Resource>) -> String {
    let name = resource.map(|r| ProcessIdentity::of_resource(r).host_name).unwrap_or_default();
    if name.is_empty() {
        "unknown".to_string()
    } else {
        name
    }
}
