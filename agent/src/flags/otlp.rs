//! The OTLP flags: where `attach` and `run` send the capture (`OtlpArgs`) and how the export
//! summarizes and sends (`OtlpTuningArgs`, the daemon's too).

use clap::Args;

use gpuprof_otlp::reporter::OtlpTuning;

values_of! {
    Protocol => gpuprof_otlp::client::Protocol {
        /// OTLP/gRPC (the collector's port 4317).
        Grpc,
        /// OTLP/HTTP with protobuf bodies (port 4318): POST /v1/logs, /v1/traces, /v1/metrics.
        Http,
    }
}

values_of! {
    /// Which events go out as log records.
    EventStream => gpuprof_otlp::reporter::EventStream {
        /// Driver and process events; allocator (tensor) events summarized into gauges and profiles.
        Summary,
        /// Every event, allocator events included (for debugging: tens of thousands a second).
        All,
    }
}

/// Where to send the capture over OpenTelemetry's protocol (docs/otlp.md).
#[derive(Debug, Args)]
pub struct OtlpArgs {
    /// Also send the capture, summarized (driver and process events, findings, gauges, memory
    /// profiles, spans: docs/otlp.md), to this OTLP endpoint, e.g. http://collector:4317 (gRPC)
    /// or http://collector:4318 (--otlp-protocol http).
    #[arg(long, value_name = "URL")]
    pub otlp_endpoint: Option<String>,
    #[arg(long, value_enum, default_value = "grpc", requires = "otlp_endpoint")]
    pub otlp_protocol: Protocol,
    /// Bearer token the collector asks for.
    #[arg(long, value_name = "TOKEN", env = "GPUPROF_OTLP_TOKEN", hide_env_values = true)]
    pub otlp_token: Option<String>,
    /// The node's name in `host.name` (default: $K8S_NODE_NAME, else the host name).
    #[arg(long, value_name = "NAME")]
    pub node_name: Option<String>,
    #[command(flatten, next_help_heading = "Fleet (OTLP)")]
    pub tuning: OtlpTuningArgs,
}

/// Each is optional so that a daemon's file can fill what a flag does not give.
#[derive(Debug, Clone, Default, Args)]
pub struct OtlpTuningArgs {
    /// summary (default): driver and process events, findings, per-process gauges and memory
    /// profiles; all: every event too, tensor events included (tens of thousands a second).
    #[arg(long, value_enum, value_name = "WHICH", env = "GPUPROF_OTLP_EVENTS")]
    pub otlp_events: Option<EventStream>,
    /// Seconds between gauges of each process's allocated, reserved and live bytes (default 1).
    #[arg(long, value_name = "SECS", env = "GPUPROF_OTLP_METRICS_INTERVAL", allow_negative_numbers = true)]
    pub otlp_metrics_interval: Option<f64>,
    /// Seconds between memory profiles of each process (default 10); also sent at each
    /// finding, out-of-memory failure and exit.
    #[arg(long, value_name = "SECS", env = "GPUPROF_OTLP_PROFILE_INTERVAL", allow_negative_numbers = true)]
    pub otlp_profile_interval: Option<f64>,
    /// Stacks a memory profile names per layer and device (default 50); the rest are summed.
    #[arg(long, value_name = "N", env = "GPUPROF_OTLP_PROFILE_STACKS")]
    pub otlp_profile_stacks: Option<usize>,
    /// Tensor blocks from this size up get a span (default 67108864, 64 MiB); driver
    /// allocations always do.
    #[arg(long, value_name = "BYTES", env = "GPUPROF_OTLP_SPAN_MIN_BYTES")]
    pub otlp_span_min_bytes: Option<u64>,
    /// Spans a process's trace gets at most (default 1000); later allocations get none (counted).
    #[arg(long, value_name = "N", env = "GPUPROF_OTLP_MAX_SPANS")]
    pub otlp_max_spans: Option<u64>,
    /// MiB of requests held while the collector is slow or away (default 64); beyond, the
    /// oldest gauges and then new requests are dropped and counted.
    #[arg(long, value_name = "MIB", env = "GPUPROF_OTLP_QUEUE_MIB")]
    pub otlp_queue_mib: Option<u64>,
    /// Bytes one request carries at most (default 3145728: under the 4 MiB an OpenTelemetry
    /// Collector takes by default).
    #[arg(long, value_name = "BYTES", env = "GPUPROF_OTLP_MAX_REQUEST_BYTES")]
    pub otlp_max_request_bytes: Option<usize>,
}

/// A protocol as the daemon's file names it, in any case (as `--otlp-protocol` takes it).
pub fn protocol_named(name: &str) -> Option<gpuprof_otlp::client::Protocol> {
    <Protocol as clap::ValueEnum>::from_str(name, true).ok().map(Into::into)
}

impl From<&OtlpTuningArgs> for OtlpTuning {
    fn from(args: &OtlpTuningArgs) -> OtlpTuning {
        OtlpTuning {
            otlp_events: args.otlp_events.map(Into::into),
            otlp_metrics_interval: args.otlp_metrics_interval,
            otlp_profile_interval: args.otlp_profile_interval,
            otlp_profile_stacks: args.otlp_profile_stacks,
            otlp_span_min_bytes: args.otlp_span_min_bytes,
            otlp_max_spans: args.otlp_max_spans,
            otlp_queue_mib: args.otlp_queue_mib,
            otlp_max_request_bytes: args.otlp_max_request_bytes,
        }
    }
}
