//! Forwarding the nodes' spans (allocation lifetimes, findings) to a trace backend (Jaeger,
//! Tempo, an OpenTelemetry Collector) over OTLP/HTTP, through gpuprof's one OTLP client: a
//! queue bounded in bytes and a sender thread, so a slow or absent backend costs dropped (and
//! counted) spans, never a stalled receiver.

use gpuprof_otlp::client::{Client, ClientError, ClientOptions, Delivery, Protocol};
use gpuprof_otlp::proto::trace::v1::ResourceSpans;

pub struct Forwarder {
    client: Client,
}

impl Forwarder {
    pub fn start(endpoint: &str) -> Result<Forwarder, ClientError> {
        let client = Client::start(ClientOptions::new(endpoint, Protocol::Http), "forward")?;
        Ok(Forwarder { client })
    }

    pub fn spans(&self, spans: Vec<ResourceSpans>) {
        if !spans.is_empty() {
            self.client.spans(spans);
        }
    }

    /// Spans forwarded and lost so far.
    pub fn delivery(&self) -> Delivery {
        self.client.delivery()
    }
}
