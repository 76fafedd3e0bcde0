//! OTLP export of a live capture (`--otlp-endpoint`): every event as a log record, one span per
//! allocation lifetime, live bytes as gauges each second. The capture thread only builds
//! batches and hands them to a bounded queue; a sender thread delivers them with retries and
//! back-off. A full queue or a collector that stays away drops batches — counted, reported at
//! the end — and never slows the capture.

mod identity;
pub mod transport;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use gpuprof_model::{Event, Layer, Op, Tracker};
use gpuprof_otlp::lifetimes::Lifetimes;
use gpuprof_otlp::proto::collector::logs::v1::ExportLogsServiceRequest;
use gpuprof_otlp::proto::collector::metrics::v1::ExportMetricsServiceRequest;
use gpuprof_otlp::proto::collector::trace::v1::ExportTraceServiceRequest;
use gpuprof_otlp::proto::logs::v1::{LogRecord, ResourceLogs, ScopeLogs};
use gpuprof_otlp::proto::metrics::v1::{ResourceMetrics, ScopeMetrics};
use gpuprof_otlp::proto::trace::v1::{ResourceSpans, ScopeSpans, Span};
use gpuprof_otlp::resource::ProcessIdentity;

pub use identity::node_name;
use transport::{Protocol, Request, SendError, Transport};

const METRICS_INTERVAL: Duration = Duration::from_secs(1);
/// Log records per request, at most (the request stays far below any collector's size limit).
const MAX_RECORDS_PER_BATCH: usize = 4096;
const RETRIES: u32 = 5;
/// How long the end of a capture waits for queued batches to be delivered.
const DRAIN_LIMIT: Duration = Duration::from_secs(5);

#[derive(Debug, Clone)]
pub struct OtlpOptions {
    pub endpoint: String,
    pub protocol: Protocol,
    pub token: Option<String>,
    /// Batches the queue holds before new ones are dropped.
    pub queue: usize,
    pub node: Option<String>,
}

/// How an export ended: a line for people, and the items the collector did not get.
#[derive(Debug, Clone)]
pub struct Delivery {
    pub summary: String,
    pub lost: u64,
}

impl std::fmt::Display for Delivery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.summary)
    }
}

#[derive(Debug, Default)]
struct Counters {
    /// Items handed to the sender: each ends sent, failed or rejected.
    enqueued: AtomicU64,
    sent_records: AtomicU64,
    sent_spans: AtomicU64,
    sent_points: AtomicU64,
    /// Items in batches the queue had no room for.
    dropped_queue_full: AtomicU64,
    /// Items in batches that could not be delivered (retries exhausted, refused, out of time).
    dropped_send_failed: AtomicU64,
    /// Items the collector accepted the request of but rejected (OTLP partial success).
    rejected: AtomicU64,
    last_error: std::sync::Mutex<Option<String>>,
}

/// Items of one request, for the counters.
struct Batch {
    request: Request,
    items: u64,
}

pub struct Telemetry {
    endpoint: String,
    node: String,
    gpus: Vec<String>,
    lifetimes: Lifetimes,
    identities: HashMap<u32, ProcessIdentity>,
    exited: HashSet<u32>,
    records: Vec<(u32, LogRecord)>,
    queue: Option<SyncSender<Batch>>,
    counters: Arc<Counters>,
    draining_until: Arc<AtomicU64>,
    stop_now: Arc<AtomicBool>,
    sender: Option<JoinHandle<()>>,
    last_metrics: Instant,
    started: Instant,
}

impl Telemetry {
    pub fn start(options: OtlpOptions) -> Result<Self> {
        let transport = Transport::new(&options.endpoint, options.protocol, options.token.clone())?;
        let (queue, receiver) = mpsc::sync_channel(options.queue.max(1));
        let counters = Arc::new(Counters::default());
        let draining_until = Arc::new(AtomicU64::new(0));
        let stop_now = Arc::new(AtomicBool::new(false));
        let sender = {
            let (counters, draining_until, stop_now) = (counters.clone(), draining_until.clone(), stop_now.clone());
            std::thread::Builder::new()
                .name("gpuprof-otlp".into())
                .spawn(move || deliver(transport, receiver, &counters, &draining_until, &stop_now))
                .context("cannot start the OTLP sender thread")?
        };
        let node = node_name(options.node.as_deref());
        Ok(Telemetry {
            endpoint: options.endpoint,
            lifetimes: Lifetimes::new(node.clone()),
            node,
            gpus: identity::gpu_uuids(),
            identities: HashMap::new(),
            exited: HashSet::new(),
            records: Vec::new(),
            queue: Some(queue),
            counters,
            draining_until,
            stop_now,
            sender: Some(sender),
            last_metrics: Instant::now(),
            started: Instant::now(),
        })
    }

    /// Before the tracker applies `event`: the lifetimes it ends are still in the tracker.
    pub fn before(&mut self, event: &Event, tracker: &Tracker) {
        self.lifetimes.observe(event, tracker);
    }

    /// After the tracker applied `event` (its peer and segment filled in).
    pub fn after(&mut self, event: &Event) {
        let pid = event.pid;
        let known = self.identities.contains_key(&pid);
        if !known || (event.layer == Layer::Process && event.op == Op::Exec) {
            let identity = identity::of_process(pid, &self.node, &self.gpus, &event.comm, event.ppid);
            self.identities.insert(pid, identity);
        }
        if event.op == Op::Exit {
            self.exited.insert(pid);
        }
        self.records.push((pid, gpuprof_otlp::logs::record_of(event)));
        if self.records.len() >= MAX_RECORDS_PER_BATCH {
            self.flush_records();
        }
    }

    /// Hands what accumulated to the sender; each second, live bytes too.
    pub fn flush(&mut self, tracker: &Tracker) {
        self.flush_records();
        let spans = self.lifetimes.take_finished();
        if !spans.is_empty() {
            let items = spans.len() as u64;
            let request = ExportTraceServiceRequest { resource_spans: self.by_process(spans, spans_of) };
            self.enqueue(Batch { request: Request::Traces(request), items });
        }
        if self.last_metrics.elapsed() >= METRICS_INTERVAL {
            self.last_metrics = Instant::now();
            self.send_metrics(tracker);
        }
        for pid in self.exited.drain() {
            self.identities.remove(&pid);
        }
    }

    fn flush_records(&mut self) {
        if self.records.is_empty() {
            return;
        }
        let records = std::mem::take(&mut self.records);
        let items = records.len() as u64;
        let request = ExportLogsServiceRequest { resource_logs: self.by_process(records, logs_of) };
        self.enqueue(Batch { request: Request::Logs(request), items });
    }

    fn send_metrics(&mut self, tracker: &Tracker) {
        let now = gpuprof_model::event::wall_clock_ns();
        let resource_metrics: Vec<ResourceMetrics> = tracker
            .live_processes()
            .into_iter()
            .map(|process| ResourceMetrics {
                resource: Some(self.identity(process.pid, &process.comm, process.ppid).resource()),
                scope_metrics: vec![ScopeMetrics {
                    scope: Some(gpuprof_otlp::scope()),
                    metrics: gpuprof_otlp::metrics::process_metrics(process, now),
                    ..Default::default()
                }],
                ..Default::default()
            })
            .collect();
        if resource_metrics.is_empty() {
            return;
        }
        let items = resource_metrics
            .iter()
            .flat_map(|r| &r.scope_metrics)
            .flat_map(|s| &s.metrics)
            .map(|m| match &m.data {
                Some(gpuprof_otlp::proto::metrics::v1::metric::Data::Gauge(g)) => g.data_points.len() as u64,
                _ => 0,
            })
            .sum();
        self.enqueue(Batch { request: Request::Metrics(ExportMetricsServiceRequest { resource_metrics }), items });
    }

    fn identity(&mut self, pid: u32, comm: &str, ppid: Option<u32>) -> ProcessIdentity {
        self.identities
            .entry(pid)
            .or_insert_with(|| identity::of_process(pid, &self.node, &self.gpus, comm, ppid))
            .clone()
    }

    /// Items grouped into one resource per process, in order of first appearance.
    fn by_process<T, R>(&mut self, items: Vec<(u32, T)>, wrap: fn(ProcessIdentity, Vec<T>) -> R) -> Vec<R> {
        let mut order: Vec<u32> = Vec::new();
        let mut groups: HashMap<u32, Vec<T>> = HashMap::new();
        for (pid, item) in items {
            groups.entry(pid).or_insert_with(|| {
                order.push(pid);
                Vec::new()
            }).push(item);
        }
        order
            .into_iter()
            .map(|pid| {
                let identity = self.identity(pid, "", None);
                wrap(identity, groups.remove(&pid).unwrap_or_default())
            })
            .collect()
    }

    fn enqueue(&mut self, batch: Batch) {
        let Some(queue) = &self.queue else { return };
        let items = batch.items;
        match queue.try_send(batch) {
            Ok(()) => {
                self.counters.enqueued.fetch_add(items, Ordering::Relaxed);
            }
            Err(TrySendError::Full(batch) | TrySendError::Disconnected(batch)) => {
                self.counters.dropped_queue_full.fetch_add(batch.items, Ordering::Relaxed);
            }
        }
    }

    /// Sends what is left, waits up to a few seconds for delivery, and says how it went.
    pub fn finish(mut self, tracker: &Tracker) -> Delivery {
        self.flush(tracker);
        self.send_metrics(tracker);
        let deadline = self.started.elapsed() + DRAIN_LIMIT;
        self.draining_until.store(deadline.as_nanos() as u64, Ordering::Relaxed);
        drop(self.queue.take());
        if let Some(sender) = self.sender.take() {
            let waited = Instant::now();
            while !sender.is_finished() && waited.elapsed() < DRAIN_LIMIT + Duration::from_secs(1) {
                std::thread::sleep(Duration::from_millis(10));
            }
            if sender.is_finished() {
                let _ = sender.join();
            } else {
                self.stop_now.store(true, Ordering::Relaxed);
            }
        }
        // What the sender had not settled by now (a request stuck in a timeout, batches behind
        // it) is lost to the collector: count it as failed.
        let c = &self.counters;
        let settled = c.sent_records.load(Ordering::Relaxed)
            + c.sent_spans.load(Ordering::Relaxed)
            + c.sent_points.load(Ordering::Relaxed)
            + c.dropped_send_failed.load(Ordering::Relaxed)
            + c.rejected.load(Ordering::Relaxed);
        let unsettled = c.enqueued.load(Ordering::Relaxed).saturating_sub(settled);
        c.dropped_send_failed.fetch_add(unsettled, Ordering::Relaxed);
        Delivery { summary: self.summary(), lost: self.lost() }
    }

    pub fn summary(&self) -> String {
        let c = &self.counters;
        let mut line = format!(
            "otlp to {}: sent {} log records, {} spans, {} metric points; dropped {} (queue full {}, delivery failed {}); rejected by the collector {}",
            self.endpoint,
            c.sent_records.load(Ordering::Relaxed),
            c.sent_spans.load(Ordering::Relaxed),
            c.sent_points.load(Ordering::Relaxed),
            c.dropped_queue_full.load(Ordering::Relaxed) + c.dropped_send_failed.load(Ordering::Relaxed),
            c.dropped_queue_full.load(Ordering::Relaxed),
            c.dropped_send_failed.load(Ordering::Relaxed),
            c.rejected.load(Ordering::Relaxed),
        );
        if let Some(error) = c.last_error.lock().ok().and_then(|e| e.clone()) {
            line.push_str(&format!("; last error: {error}"));
        }
        line
    }

    /// Items the collector accepted so far (log records, spans, metric points).
    pub fn sent(&self) -> u64 {
        let c = &self.counters;
        c.sent_records.load(Ordering::Relaxed) + c.sent_spans.load(Ordering::Relaxed) + c.sent_points.load(Ordering::Relaxed)
    }

    /// Items lost on the way (dropped or rejected): nonzero means the collector has less than
    /// the capture.
    pub fn lost(&self) -> u64 {
        let c = &self.counters;
        c.dropped_queue_full.load(Ordering::Relaxed)
            + c.dropped_send_failed.load(Ordering::Relaxed)
            + c.rejected.load(Ordering::Relaxed)
    }
}

fn logs_of(identity: ProcessIdentity, log_records: Vec<LogRecord>) -> ResourceLogs {
    ResourceLogs {
        resource: Some(identity.resource()),
        scope_logs: vec![ScopeLogs { scope: Some(gpuprof_otlp::scope()), log_records, ..Default::default() }],
        ..Default::default()
    }
}

fn spans_of(identity: ProcessIdentity, spans: Vec<Span>) -> ResourceSpans {
    ResourceSpans {
        resource: Some(identity.resource()),
        scope_spans: vec![ScopeSpans { scope: Some(gpuprof_otlp::scope()), spans, ..Default::default() }],
        ..Default::default()
    }
}

/// The sender thread: one request at a time, retried with doubling back-off while the
/// collector is away; after the end of the capture, only until the drain deadline.
fn deliver(
    mut transport: Transport,
    queue: Receiver<Batch>,
    counters: &Counters,
    draining_until: &AtomicU64,
    stop_now: &AtomicBool,
) {
    let started = Instant::now();
    let out_of_time = || {
        let until = draining_until.load(Ordering::Relaxed);
        stop_now.load(Ordering::Relaxed) || (until != 0 && started.elapsed().as_nanos() as u64 >= until)
    };
    while let Ok(batch) = queue.recv() {
        let Batch { request, items } = batch;
        let sent = match &request {
            Request::Logs(_) => &counters.sent_records,
            Request::Traces(_) => &counters.sent_spans,
            Request::Metrics(_) => &counters.sent_points,
        };
        if out_of_time() {
            counters.dropped_send_failed.fetch_add(items, Ordering::Relaxed);
            continue;
        }
        let mut backoff = Duration::from_millis(100);
        for attempt in 0..=RETRIES {
            match transport.send(&request) {
                Ok(rejected) => {
                    sent.fetch_add(items - rejected.min(items), Ordering::Relaxed);
                    counters.rejected.fetch_add(rejected, Ordering::Relaxed);
                    break;
                }
                Err(error) => {
                    let retry = matches!(error, SendError::Retryable(_)) && attempt < RETRIES && !out_of_time();
                    if let Ok(mut last) = counters.last_error.lock() {
                        *last = Some(error.to_string());
                    }
                    if !retry {
                        counters.dropped_send_failed.fetch_add(items, Ordering::Relaxed);
                        break;
                    }
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(Duration::from_secs(2));
                }
            }
        }
    }
}
