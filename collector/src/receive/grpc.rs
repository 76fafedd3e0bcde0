//! OTLP/gRPC: the three export services, behind an interceptor that checks the token and the
//! connection's rate; tonic enforces the request size (OUT_OF_RANGE beyond it).

use std::sync::Arc;

use gpuprof_otlp::proto::collector::logs::v1::logs_service_server::{LogsService, LogsServiceServer};
use gpuprof_otlp::proto::collector::logs::v1::{ExportLogsServiceRequest, ExportLogsServiceResponse};
use gpuprof_otlp::proto::collector::metrics::v1::metrics_service_server::{MetricsService, MetricsServiceServer};
use gpuprof_otlp::proto::collector::metrics::v1::{ExportMetricsServiceRequest, ExportMetricsServiceResponse};
use gpuprof_otlp::proto::collector::trace::v1::trace_service_server::{TraceService, TraceServiceServer};
use gpuprof_otlp::proto::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use prost::Message;
use tonic::service::interceptor::InterceptedService;
use tonic::{Request, Response, Status};

use crate::collector::{Collector, Refusal};

#[derive(Clone)]
pub struct Receiver(Arc<Collector>);

#[derive(Clone)]
pub struct Gate(Arc<Collector>);

impl tonic::service::Interceptor for Gate {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        let collector = &self.0;
        if let Some(peer) = request.remote_addr() {
            if !collector.admit(peer) {
                collector.stats.refused(Refusal::RateLimited);
                return Err(rate_limited());
            }
        }
        let token = request.metadata().get("authorization").map(|v| v.as_bytes());
        if !collector.authorized(token) {
            collector.stats.refused(Refusal::Unauthenticated);
            return Err(Status::unauthenticated("missing or wrong bearer token"));
        }
        Ok(request)
    }
}

/// RESOURCE_EXHAUSTED with a `google.rpc.RetryInfo` of one second, as HTTP's 429 has its
/// Retry-After: the OpenTelemetry Collector's OTLP exporter retries RESOURCE_EXHAUSTED only when
/// the server says when, and drops the batch otherwise.
fn rate_limited() -> Status {
    let retry = RetryInfo { retry_delay: Some(ProtoDuration { seconds: RETRY_AFTER_SECS, nanos: 0 }) };
    let status = RpcStatus {
        code: tonic::Code::ResourceExhausted as i32,
        message: RATE_LIMITED.into(),
        details: vec![Any { type_url: RETRY_INFO_TYPE.into(), value: retry.encode_to_vec() }],
    };
    Status::with_details(tonic::Code::ResourceExhausted, RATE_LIMITED, status.encode_to_vec().into())
}

const RATE_LIMITED: &str = "too many requests on this connection; retry later";
const RETRY_AFTER_SECS: i64 = 1;
pub const RETRY_INFO_TYPE: &str = "type.googleapis.com/google.rpc.RetryInfo";

/// gRPC's rich error model (google/rpc/status.proto, error_details.proto), the parts a refusal
/// needs.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RpcStatus {
    #[prost(int32, tag = "1")]
    pub code: i32,
    #[prost(string, tag = "2")]
    pub message: String,
    #[prost(message, repeated, tag = "3")]
    pub details: Vec<Any>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Any {
    #[prost(string, tag = "1")]
    pub type_url: String,
    #[prost(bytes = "vec", tag = "2")]
    pub value: Vec<u8>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RetryInfo {
    #[prost(message, optional, tag = "1")]
    pub retry_delay: Option<ProtoDuration>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ProtoDuration {
    #[prost(int64, tag = "1")]
    pub seconds: i64,
    #[prost(int32, tag = "2")]
    pub nanos: i32,
}

#[tonic::async_trait]
impl LogsService for Receiver {
    async fn export(
        &self,
        request: Request<ExportLogsServiceRequest>,
    ) -> Result<Response<ExportLogsServiceResponse>, Status> {
        let collector = self.0.clone();
        Ok(Response::new(tokio::task::block_in_place(move || collector.logs(request.into_inner()))))
    }
}

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        request: Request<ExportTraceServiceRequest>,
    ) -> Result<Response<ExportTraceServiceResponse>, Status> {
        Ok(Response::new(self.0.traces(request.into_inner())))
    }
}

#[tonic::async_trait]
impl MetricsService for Receiver {
    async fn export(
        &self,
        request: Request<ExportMetricsServiceRequest>,
    ) -> Result<Response<ExportMetricsServiceResponse>, Status> {
        Ok(Response::new(self.0.metrics(request.into_inner())))
    }
}

pub type Services = (
    InterceptedService<LogsServiceServer<Receiver>, Gate>,
    InterceptedService<TraceServiceServer<Receiver>, Gate>,
    InterceptedService<MetricsServiceServer<Receiver>, Gate>,
);

pub fn services(collector: Arc<Collector>) -> Services {
    let limit = collector.config.max_request_bytes;
    let receiver = Receiver(collector.clone());
    let gate = Gate(collector);
    // The OpenTelemetry Collector's OTLP exporter sends gzip unless told otherwise.
    let gzip = tonic::codec::CompressionEncoding::Gzip;
    (
        InterceptedService::new(
            LogsServiceServer::new(receiver.clone()).max_decoding_message_size(limit).accept_compressed(gzip),
            gate.clone(),
        ),
        InterceptedService::new(
            TraceServiceServer::new(receiver.clone()).max_decoding_message_size(limit).accept_compressed(gzip),
            gate.clone(),
        ),
        InterceptedService::new(
            MetricsServiceServer::new(receiver).max_decoding_message_size(limit).accept_compressed(gzip),
            gate,
        ),
    )
}
