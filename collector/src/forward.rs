//! Forwarding spans over OTLP/HTTP to a trace backend (Jaeger, Tempo, an OpenTelemetry
//! Collector): a bounded queue and one sender thread, so a slow or absent backend costs
//! dropped (and counted) spans, never a stalled receiver.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::Duration;

use gpuprof_otlp::proto::collector::trace::v1::ExportTraceServiceRequest;
use gpuprof_otlp::proto::trace::v1::ResourceSpans;
use prost::Message;

const QUEUE: usize = 1024;
const RETRIES: u32 = 3;

#[derive(Debug, Default)]
pub struct ForwardStats {
    pub forwarded: AtomicU64,
    pub dropped: AtomicU64,
}

pub struct Forwarder {
    queue: SyncSender<Vec<ResourceSpans>>,
    pub stats: Arc<ForwardStats>,
}

fn span_count(spans: &[ResourceSpans]) -> u64 {
    spans.iter().flat_map(|r| &r.scope_spans).map(|s| s.spans.len() as u64).sum()
}

impl Forwarder {
    pub fn start(endpoint: &str) -> Forwarder {
        let (queue, receiver) = mpsc::sync_channel(QUEUE);
        let stats = Arc::new(ForwardStats::default());
        let url = format!("{}/v1/traces", endpoint.trim_end_matches('/'));
        let thread_stats = stats.clone();
        std::thread::Builder::new()
            .name("forward".into())
            .spawn(move || send_all(&url, receiver, &thread_stats))
            .expect("cannot start the forwarding thread");
        Forwarder { queue, stats }
    }

    pub fn forward(&self, spans: Vec<ResourceSpans>) {
        if spans.is_empty() {
            return;
        }
        if let Err(TrySendError::Full(spans) | TrySendError::Disconnected(spans)) = self.queue.try_send(spans) {
            self.stats.dropped.fetch_add(span_count(&spans), Ordering::Relaxed);
        }
    }
}

fn send_all(url: &str, queue: Receiver<Vec<ResourceSpans>>, stats: &ForwardStats) {
    let agent: ureq::Agent =
        ureq::Agent::config_builder().timeout_global(Some(Duration::from_secs(5))).http_status_as_error(false).build().into();
    while let Ok(mut spans) = queue.recv() {
        // Whatever else is waiting goes in the same request.
        while spans.len() < 512 {
            match queue.try_recv() {
                Ok(more) => spans.extend(more),
                Err(_) => break,
            }
        }
        let count = span_count(&spans);
        let body = ExportTraceServiceRequest { resource_spans: spans }.encode_to_vec();
        let mut delivered = false;
        for attempt in 0..RETRIES {
            let result = agent.post(url).header("content-type", "application/x-protobuf").send(&body[..]);
            match result {
                Ok(response) if response.status().is_success() => {
                    delivered = true;
                    break;
                }
                Ok(response) if ![429, 502, 503, 504].contains(&response.status().as_u16()) => {
                    tracing::warn!("forwarding to {url}: HTTP {}", response.status());
                    break;
                }
                Ok(_) | Err(_) => std::thread::sleep(Duration::from_millis(200 << attempt)),
            }
        }
        let counter = if delivered { &stats.forwarded } else { &stats.dropped };
        counter.fetch_add(count, Ordering::Relaxed);
    }
}
