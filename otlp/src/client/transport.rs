//! Sending OTLP requests: gRPC (tonic) or HTTP/protobuf (ureq), bearer token in both, and which
//! failures are worth a retry (the OTLP specification's list: unavailable, throttled, timed out).

use std::time::Duration;

use prost::Message;

use super::ClientError;
use crate::proto::collector::logs::v1::{logs_service_client::LogsServiceClient, ExportLogsServiceRequest};
use crate::proto::collector::metrics::v1::{metrics_service_client::MetricsServiceClient, ExportMetricsServiceRequest};
use crate::proto::collector::trace::v1::{trace_service_client::TraceServiceClient, ExportTraceServiceRequest};

const TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// OTLP/gRPC (the collector's port 4317).
    Grpc,
    /// OTLP/HTTP with protobuf bodies (port 4318): POST /v1/logs, /v1/traces, /v1/metrics.
    Http,
}

/// One OTLP request of any signal.
#[derive(Debug, Clone)]
pub enum Request {
    Logs(ExportLogsServiceRequest),
    Traces(ExportTraceServiceRequest),
    Metrics(ExportMetricsServiceRequest),
}

#[derive(Debug)]
pub(crate) enum SendError {
    /// Worth another try later: the collector is down, busy or slow.
    Retryable(String),
    /// Will never succeed as sent: refused (bad token, malformed, too large).
    Refused(String),
    /// The endpoint serves no such signal (gRPC UNIMPLEMENTED, HTTP 404): a trace store such as
    /// Jaeger takes spans and nothing else.
    NotServed(String),
}

impl std::fmt::Display for SendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SendError::Retryable(why) | SendError::Refused(why) | SendError::NotServed(why) => f.write_str(why),
        }
    }
}

/// How many items a collector said it rejected (OTLP partial success).
pub(crate) type Rejected = u64;

pub(crate) struct Transport {
    inner: Inner,
    token: Option<String>,
}

enum Inner {
    Grpc { runtime: tokio::runtime::Runtime, channel: tonic::transport::Channel },
    Http { agent: ureq::Agent, base: String },
}

impl Transport {
    pub(crate) fn new(endpoint: &str, protocol: Protocol, token: Option<String>) -> Result<Self, ClientError> {
        let bad = |why: &str| ClientError::Endpoint { endpoint: endpoint.to_string(), why: why.to_string() };
        let Some(rest) = endpoint.strip_prefix("http://") else {
            if endpoint.starts_with("https://") {
                return Err(bad("TLS is not supported yet; give an http:// endpoint (a TLS-terminating OpenTelemetry Collector on the node can forward it)"));
            }
            return Err(bad("give a URL such as http://collector:4317"));
        };
        if rest.is_empty() {
            return Err(bad("the URL names no host"));
        }
        let inner = match protocol {
            Protocol::Grpc => {
                let runtime =
                    tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(ClientError::Runtime)?;
                let channel = {
                    let _entered = runtime.enter();
                    tonic::transport::Endpoint::from_shared(endpoint.to_string())
                        .map_err(|_| bad("not a valid URL"))?
                        .connect_timeout(TIMEOUT)
                        .timeout(TIMEOUT)
                        .connect_lazy()
                };
                Inner::Grpc { runtime, channel }
            }
            Protocol::Http => {
                let agent: ureq::Agent = ureq::Agent::config_builder()
                    .timeout_global(Some(TIMEOUT))
                    .http_status_as_error(false)
                    .build()
                    .into();
                Inner::Http { agent, base: endpoint.trim_end_matches('/').to_string() }
            }
        };
        Ok(Transport { inner, token })
    }

    pub(crate) fn send(&mut self, request: &Request) -> Result<Rejected, SendError> {
        match &mut self.inner {
            Inner::Grpc { runtime, channel } => {
                let token = self.token.as_deref();
                runtime.block_on(send_grpc(channel.clone(), request.clone(), token))
            }
            Inner::Http { agent, base } => send_http(agent, base, request, self.token.as_deref()),
        }
    }
}

fn grpc_request<T>(message: T, token: Option<&str>) -> Result<tonic::Request<T>, SendError> {
    let mut request = tonic::Request::new(message);
    if let Some(token) = token {
        let value = format!("Bearer {token}")
            .parse()
            .map_err(|_| SendError::Refused("the OTLP token has characters a header cannot carry".into()))?;
        request.metadata_mut().insert("authorization", value);
    }
    Ok(request)
}

async fn send_grpc(
    channel: tonic::transport::Channel,
    request: Request,
    token: Option<&str>,
) -> Result<Rejected, SendError> {
    let result = match request {
        Request::Logs(r) => LogsServiceClient::new(channel)
            .export(grpc_request(r, token)?)
            .await
            .map(|response| response.into_inner().partial_success.map_or(0, |p| p.rejected_log_records as u64)),
        Request::Traces(r) => TraceServiceClient::new(channel)
            .export(grpc_request(r, token)?)
            .await
            .map(|response| response.into_inner().partial_success.map_or(0, |p| p.rejected_spans as u64)),
        Request::Metrics(r) => MetricsServiceClient::new(channel)
            .export(grpc_request(r, token)?)
            .await
            .map(|response| response.into_inner().partial_success.map_or(0, |p| p.rejected_data_points as u64)),
    };
    result.map_err(|status| grpc_failure(&status))
}

/// Whether a gRPC failure is worth another try. A status the receiver sent: the OTLP
/// specification's retryable codes (OUT_OF_RANGE aside: gpuprof-collector says it of a message
/// over its size limit, which no retry helps). No status at all — the connection broke with the
/// request on the wire (a receiver killed mid-request: tonic says UNKNOWN "transport error") —
/// is retried too: the receiver may or may not have taken it, delivery is at least once, and
/// collectors keep a finding once by its id.
fn grpc_failure(status: &tonic::Status) -> SendError {
    use std::error::Error;
    use tonic::Code::*;
    let mut why = format!("gRPC {:?}: {}", status.code(), status.message());
    // What broke, where it adds to what tonic said ("transport error": "Connection reset by peer").
    for error in std::iter::successors(status.source(), |&error| error.source()) {
        let said = error.to_string();
        if !why.contains(&said) {
            why.push_str(": ");
            why.push_str(&said);
        }
    }
    let cut_off = status.source().is_some();
    match status.code() {
        Unavailable | ResourceExhausted | DeadlineExceeded | Aborted | Cancelled | DataLoss => {
            SendError::Retryable(why)
        }
        _ if cut_off => SendError::Retryable(why),
        Unimplemented => SendError::NotServed(why),
        _ => SendError::Refused(why),
    }
}

fn send_http(agent: &ureq::Agent, base: &str, request: &Request, token: Option<&str>) -> Result<Rejected, SendError> {
    let (path, body) = match request {
        Request::Logs(r) => ("/v1/logs", r.encode_to_vec()),
        Request::Traces(r) => ("/v1/traces", r.encode_to_vec()),
        Request::Metrics(r) => ("/v1/metrics", r.encode_to_vec()),
    };
    let url = format!("{base}{path}");
    let mut post = agent.post(&url).header("content-type", "application/x-protobuf");
    if let Some(token) = token {
        post = post.header("authorization", &format!("Bearer {token}"));
    }
    let mut response = post.send(&body[..]).map_err(|e| SendError::Retryable(format!("POST {url}: {e}")))?;
    let status = response.status().as_u16();
    let reply = response.body_mut().read_to_vec().unwrap_or_default();
    match status {
        200..=299 => Ok(rejected_of(request, &reply)),
        429 | 502 | 503 | 504 => Err(SendError::Retryable(format!("POST {url}: HTTP {status}"))),
        404 => Err(SendError::NotServed(format!("POST {url}: HTTP 404"))),
        _ => Err(SendError::Refused(format!("POST {url}: HTTP {status} {}", String::from_utf8_lossy(&reply).trim()))),
    }
}

fn rejected_of(request: &Request, reply: &[u8]) -> Rejected {
    use crate::proto::collector::{logs, metrics, trace};
    match request {
        Request::Logs(_) => logs::v1::ExportLogsServiceResponse::decode(reply)
            .ok()
            .and_then(|r| r.partial_success)
            .map_or(0, |p| p.rejected_log_records as u64),
        Request::Traces(_) => trace::v1::ExportTraceServiceResponse::decode(reply)
            .ok()
            .and_then(|r| r.partial_success)
            .map_or(0, |p| p.rejected_spans as u64),
        Request::Metrics(_) => metrics::v1::ExportMetricsServiceResponse::decode(reply)
            .ok()
            .and_then(|r| r.partial_success)
            .map_or(0, |p| p.rejected_data_points as u64),
    }
}
