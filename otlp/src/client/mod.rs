//! gpuprof's one OTLP client, for the agent's export and the collector's forwarding alike:
//! requests split by their encoded size so that none exceeds the receiver's limit, a queue
//! bounded in bytes, and one sender thread that delivers them with retries. The caller never
//! waits on the network. What cannot be delivered is counted, never silently lost:
//!
//! - a full queue first gives up its oldest gauge batches (a newer point of the same curve
//!   follows), then refuses the new batch — counted as `queue full`;
//! - a request the receiver refuses (bad token, malformed, too large) is dropped — `delivery
//!   failed`; one it cannot take now (unavailable, throttled, timed out) is retried with
//!   doubling back-off, as long as it takes, while newer batches wait behind it in the queue;
//! - an item larger than a whole request — `too large`;
//! - items the receiver's answer rejects (OTLP partial success) — `rejected`.

mod queue;
mod split;
pub(crate) mod transport;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::proto::collector::logs::v1::ExportLogsServiceRequest;
use crate::proto::collector::metrics::v1::ExportMetricsServiceRequest;
use crate::proto::collector::trace::v1::ExportTraceServiceRequest;
use crate::proto::logs::v1::ResourceLogs;
use crate::proto::metrics::v1::ResourceMetrics;
use crate::proto::trace::v1::ResourceSpans;
use queue::{Batch, Queue};
pub(crate) use transport::SendError;
use transport::Transport;
pub use transport::{Protocol, Request};

/// The OpenTelemetry Collector's gRPC receiver takes 4 MiB a message unless told otherwise
/// (Jaeger's and Tempo's OTLP receivers are that receiver): requests stay under it.
pub(crate) const DEFAULT_MAX_REQUEST_BYTES: usize = 3 << 20;
/// What the queue holds while the receiver is slow or away.
pub(crate) const DEFAULT_QUEUE_BYTES: usize = 64 << 20;
const BACKOFF_FIRST: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(2);

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("{endpoint}: {why}")]
    Endpoint { endpoint: String, why: String },
    #[error("cannot start the OTLP sender's runtime: {0}")]
    Runtime(std::io::Error),
    #[error("cannot start the OTLP sender thread: {0}")]
    Thread(std::io::Error),
}

#[derive(Debug, Clone)]
pub struct ClientOptions {
    pub endpoint: String,
    pub protocol: Protocol,
    pub token: Option<String>,
    /// Encoded bytes the queue holds at most.
    pub queue_bytes: usize,
    /// Encoded bytes one request carries at most.
    pub max_request_bytes: usize,
}

impl ClientOptions {
    pub fn new(endpoint: &str, protocol: Protocol) -> Self {
        ClientOptions {
            endpoint: endpoint.to_string(),
            protocol,
            token: None,
            queue_bytes: DEFAULT_QUEUE_BYTES,
            max_request_bytes: DEFAULT_MAX_REQUEST_BYTES,
        }
    }
}

#[derive(Debug, Default)]
struct Counters {
    /// Items handed to the queue: each ends sent, dropped or rejected.
    enqueued: AtomicU64,
    sent_records: AtomicU64,
    sent_spans: AtomicU64,
    sent_points: AtomicU64,
    requests: AtomicU64,
    bytes_sent: AtomicU64,
    largest_request: AtomicU64,
    dropped_queue_full: AtomicU64,
    dropped_send_failed: AtomicU64,
    dropped_too_large: AtomicU64,
    rejected: AtomicU64,
    /// Items of a signal the endpoint serves not (`SIGNALS` bits in `not_served`).
    not_taken: AtomicU64,
    not_served: AtomicU8,
    last_error: Mutex<Option<String>>,
}

/// The signals, in `Counters::not_served` bit order.
const SIGNALS: [&str; 3] = ["logs", "traces", "metrics"];

fn signal_bit(request: &Request) -> u8 {
    match request {
        Request::Logs(_) => 1,
        Request::Traces(_) => 2,
        Request::Metrics(_) => 4,
    }
}

/// What a client has done so far.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Delivery {
    pub sent_records: u64,
    pub sent_spans: u64,
    pub sent_points: u64,
    pub requests: u64,
    pub bytes_sent: u64,
    pub largest_request: u64,
    pub dropped_queue_full: u64,
    pub dropped_send_failed: u64,
    pub dropped_too_large: u64,
    pub rejected: u64,
    /// Items of signals the endpoint does not serve (`signals_not_served`): not sent there, and
    /// not lost either — a trace store takes the spans and nothing else.
    pub not_taken: u64,
    pub signals_not_served: Vec<&'static str>,
    /// Items in the queue or in flight (0 once the client has finished).
    pub pending: u64,
    pub last_error: Option<String>,
}

impl Delivery {
    pub(crate) fn sent(&self) -> u64 {
        self.sent_records + self.sent_spans + self.sent_points
    }

    /// Items the receiver did not get.
    pub fn lost(&self) -> u64 {
        self.dropped_queue_full + self.dropped_send_failed + self.dropped_too_large + self.rejected
    }
}

/// The line people read at the end of an export.
impl std::fmt::Display for Delivery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "sent {} log records, {} spans, {} metric points in {} requests ({} bytes, the largest {}); dropped {} (queue full {}, delivery failed {}, too large {}); rejected by the collector {}",
            self.sent_records,
            self.sent_spans,
            self.sent_points,
            self.requests,
            self.bytes_sent,
            self.largest_request,
            self.dropped_queue_full + self.dropped_send_failed + self.dropped_too_large,
            self.dropped_queue_full,
            self.dropped_send_failed,
            self.dropped_too_large,
            self.rejected,
        )?;
        if self.not_taken > 0 {
            write!(
                f,
                "; not taken by the endpoint {} (it serves no {}: a trace store? findings, gauges and memory profiles need a gpuprof-collector or an OpenTelemetry Collector)",
                self.not_taken,
                self.signals_not_served.join(", ")
            )?;
        }
        if let Some(error) = &self.last_error {
            write!(f, "; last error: {error}")?;
        }
        Ok(())
    }
}

pub struct Client {
    endpoint: String,
    max_request_bytes: usize,
    queue: Arc<Queue>,
    counters: Arc<Counters>,
    /// Set when the sender must stop retrying (the drain time is up).
    give_up: Arc<AtomicBool>,
    sender: Option<JoinHandle<()>>,
}

impl Client {
    pub fn start(options: ClientOptions, thread_name: &str) -> Result<Client, ClientError> {
        let transport = Transport::new(&options.endpoint, options.protocol, options.token.clone())?;
        let queue = Arc::new(Queue::new(options.queue_bytes));
        let counters = Arc::new(Counters::default());
        let give_up = Arc::new(AtomicBool::new(false));
        let sender = {
            let (queue, counters, give_up) = (queue.clone(), counters.clone(), give_up.clone());
            std::thread::Builder::new()
                .name(thread_name.to_string())
                .spawn(move || deliver(transport, &queue, &counters, &give_up))
                .map_err(ClientError::Thread)?
        };
        Ok(Client {
            endpoint: options.endpoint,
            max_request_bytes: options.max_request_bytes.max(1024),
            queue,
            counters,
            give_up,
            sender: Some(sender),
        })
    }

    pub(crate) fn endpoint(&self) -> &str {
        &self.endpoint
    }

    pub fn logs(&self, resource_logs: Vec<ResourceLogs>) {
        let requests = split::split(resource_logs, self.max_request_bytes);
        self.too_large(requests.too_large);
        for (resource_logs, items, bytes) in requests.requests {
            self.enqueue(Batch::new(Request::Logs(ExportLogsServiceRequest { resource_logs }), items, bytes));
        }
    }

    pub fn spans(&self, resource_spans: Vec<ResourceSpans>) {
        let requests = split::split(resource_spans, self.max_request_bytes);
        self.too_large(requests.too_large);
        for (resource_spans, items, bytes) in requests.requests {
            self.enqueue(Batch::new(Request::Traces(ExportTraceServiceRequest { resource_spans }), items, bytes));
        }
    }

    pub fn metrics(&self, resource_metrics: Vec<ResourceMetrics>) {
        let requests = split::split(resource_metrics, self.max_request_bytes);
        self.too_large(requests.too_large);
        for (resource_metrics, items, bytes) in requests.requests {
            self.enqueue(Batch::new(Request::Metrics(ExportMetricsServiceRequest { resource_metrics }), items, bytes));
        }
    }

    fn too_large(&self, items: u64) {
        if items > 0 {
            self.counters.dropped_too_large.fetch_add(items, Ordering::Relaxed);
            self.note_error(format!(
                "an item over the {} bytes a request may carry was dropped",
                self.max_request_bytes
            ));
        }
    }

    fn note_error(&self, error: String) {
        if let Ok(mut last) = self.counters.last_error.lock() {
            *last = Some(error);
        }
    }

    fn enqueue(&self, batch: Batch) {
        self.counters.enqueued.fetch_add(batch.items, Ordering::Relaxed);
        let refused = self.queue.push(batch);
        if refused > 0 {
            self.counters.dropped_queue_full.fetch_add(refused, Ordering::Relaxed);
        }
    }

    /// Encoded bytes waiting in the queue.
    pub(crate) fn queued_bytes(&self) -> usize {
        self.queue.bytes()
    }

    /// What was done so far.
    pub fn delivery(&self) -> Delivery {
        let c = &self.counters;
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        let mut delivery = Delivery {
            sent_records: load(&c.sent_records),
            sent_spans: load(&c.sent_spans),
            sent_points: load(&c.sent_points),
            requests: load(&c.requests),
            bytes_sent: load(&c.bytes_sent),
            largest_request: load(&c.largest_request),
            dropped_queue_full: load(&c.dropped_queue_full),
            dropped_send_failed: load(&c.dropped_send_failed),
            dropped_too_large: load(&c.dropped_too_large),
            rejected: load(&c.rejected),
            not_taken: load(&c.not_taken),
            signals_not_served: {
                let bits = c.not_served.load(Ordering::Relaxed);
                SIGNALS.iter().enumerate().filter(|(n, _)| bits & (1 << n) != 0).map(|(_, s)| *s).collect()
            },
            pending: 0,
            last_error: c.last_error.lock().ok().and_then(|e| e.clone()),
        };
        let settled = delivery.sent()
            + delivery.dropped_queue_full
            + delivery.dropped_send_failed
            + delivery.rejected
            + delivery.not_taken;
        delivery.pending = load(&c.enqueued).saturating_sub(settled);
        delivery
    }

    /// Delivers what is queued, waiting at most `drain`; what is still undelivered then counts
    /// as failed. Returns the account.
    pub fn finish(mut self, drain: Duration) -> Delivery {
        self.queue.close();
        if let Some(sender) = self.sender.take() {
            let deadline = Instant::now() + drain;
            while !sender.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
            self.give_up.store(true, Ordering::Relaxed);
            self.queue.wake();
            // A request in flight ends within the transport's timeout.
            let _ = sender.join();
        }
        let mut delivery = self.delivery();
        if delivery.pending > 0 {
            self.counters.dropped_send_failed.fetch_add(delivery.pending, Ordering::Relaxed);
            delivery = self.delivery();
        }
        delivery
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        self.give_up.store(true, Ordering::Relaxed);
        self.queue.close();
    }
}

/// The sender thread: one request at a time, retried with doubling back-off while the
/// receiver is away, until it is taken, refused, or the client gives up.
fn deliver(mut transport: Transport, queue: &Queue, counters: &Counters, give_up: &AtomicBool) {
    while let Some(batch) = queue.pop(give_up) {
        let sent = match &batch.request {
            Request::Logs(_) => &counters.sent_records,
            Request::Traces(_) => &counters.sent_spans,
            Request::Metrics(_) => &counters.sent_points,
        };
        let mut backoff = BACKOFF_FIRST;
        let bit = signal_bit(&batch.request);
        loop {
            if counters.not_served.load(Ordering::Relaxed) & bit != 0 {
                counters.not_taken.fetch_add(batch.items, Ordering::Relaxed);
                break;
            }
            if give_up.load(Ordering::Relaxed) {
                counters.dropped_send_failed.fetch_add(batch.items, Ordering::Relaxed);
                break;
            }
            match transport.send(&batch.request) {
                Ok(rejected) => {
                    sent.fetch_add(batch.items - rejected.min(batch.items), Ordering::Relaxed);
                    counters.rejected.fetch_add(rejected.min(batch.items), Ordering::Relaxed);
                    counters.requests.fetch_add(1, Ordering::Relaxed);
                    counters.bytes_sent.fetch_add(batch.bytes as u64, Ordering::Relaxed);
                    counters.largest_request.fetch_max(batch.bytes as u64, Ordering::Relaxed);
                    break;
                }
                Err(SendError::NotServed(_)) => {
                    // Said in the summary; the signal's later batches are not sent.
                    counters.not_served.fetch_or(bit, Ordering::Relaxed);
                    counters.not_taken.fetch_add(batch.items, Ordering::Relaxed);
                    break;
                }
                Err(error) => {
                    let retry = matches!(error, SendError::Retryable(_));
                    if let Ok(mut last) = counters.last_error.lock() {
                        *last = Some(error.to_string());
                    }
                    if !retry {
                        counters.dropped_send_failed.fetch_add(batch.items, Ordering::Relaxed);
                        break;
                    }
                    queue.sleep(backoff, give_up);
                    backoff = (backoff * 2).min(BACKOFF_MAX);
                }
            }
        }
        queue.done(&batch);
    }
}

#[cfg(test)]
mod tests;
