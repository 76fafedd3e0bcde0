//! How the OTLP export summarizes and sends — one set of settings for `run`/`attach` and the
//! daemon. The binary fills it from its flags, `GPUPROF_*` variables and the daemon's TOML file;
//! here each is optional, and `options` puts in the defaults and checks the values.

use std::time::Duration;

use crate::client::{ClientOptions, Protocol, DEFAULT_MAX_REQUEST_BYTES, DEFAULT_QUEUE_BYTES};
use crate::lifetimes::SpanPolicy;
use anyhow::{bail, Result};

use super::{EventStream, OtlpOptions};

/// Each is optional so that a daemon's file can fill what a flag does not give.
#[derive(Debug, Clone, Default, serde::Deserialize)]
pub struct OtlpTuning {
    /// summary (default): driver and process events, findings, per-process gauges and memory
    /// profiles; all: every event too, tensor events included (tens of thousands a second).
    pub otlp_events: Option<EventStream>,
    /// Seconds between gauges of each process's allocated, reserved and live bytes (default 1).
    pub otlp_metrics_interval: Option<f64>,
    /// Seconds between memory profiles of each process (default 10); also sent at each
    /// finding, out-of-memory failure and exit.
    pub otlp_profile_interval: Option<f64>,
    /// Stacks a memory profile names per layer and device (default 50); the rest are summed.
    pub otlp_profile_stacks: Option<usize>,
    /// Tensor blocks from this size up get a span (default 67108864, 64 MiB); driver
    /// allocations always do.
    pub otlp_span_min_bytes: Option<u64>,
    /// Spans a process's trace gets at most (default 1000); later allocations get none (counted).
    pub otlp_max_spans: Option<u64>,
    /// MiB of requests held while the collector is slow or away (default 64); beyond, the
    /// oldest gauges and then new requests are dropped and counted.
    pub otlp_queue_mib: Option<u64>,
    /// Bytes one request carries at most (default 3145728: under the 4 MiB an OpenTelemetry
    /// Collector takes by default).
    pub otlp_max_request_bytes: Option<usize>,
}

impl OtlpTuning {
    /// Each setting from `self`, else from `other`.
    pub fn or(&self, other: &OtlpTuning) -> OtlpTuning {
        OtlpTuning {
            otlp_events: self.otlp_events.or(other.otlp_events),
            otlp_metrics_interval: self.otlp_metrics_interval.or(other.otlp_metrics_interval),
            otlp_profile_interval: self.otlp_profile_interval.or(other.otlp_profile_interval),
            otlp_profile_stacks: self.otlp_profile_stacks.or(other.otlp_profile_stacks),
            otlp_span_min_bytes: self.otlp_span_min_bytes.or(other.otlp_span_min_bytes),
            otlp_max_spans: self.otlp_max_spans.or(other.otlp_max_spans),
            otlp_queue_mib: self.otlp_queue_mib.or(other.otlp_queue_mib),
            otlp_max_request_bytes: self.otlp_max_request_bytes.or(other.otlp_max_request_bytes),
        }
    }

    /// The export's options, the defaults filled in and every value checked.
    pub fn options(
        &self,
        endpoint: &str,
        protocol: Protocol,
        token: Option<String>,
        node: Option<String>,
    ) -> Result<OtlpOptions> {
        let seconds = |name: &str, value: Option<f64>, default: Duration| -> Result<Duration> {
            match value {
                None => Ok(default),
                Some(v) => {
                    gpuprof_model::seconds::positive_seconds(v).map_err(|error| anyhow::anyhow!("{name} {v}: {error}"))
                }
            }
        };
        let metrics_interval =
            seconds("otlp_metrics_interval", self.otlp_metrics_interval, OtlpOptions::DEFAULT_METRICS_INTERVAL)?;
        let profile_interval =
            seconds("otlp_profile_interval", self.otlp_profile_interval, OtlpOptions::DEFAULT_PROFILE_INTERVAL)?;
        let max_request_bytes = self.otlp_max_request_bytes.unwrap_or(DEFAULT_MAX_REQUEST_BYTES);
        if max_request_bytes < 64 * 1024 {
            bail!("otlp_max_request_bytes {max_request_bytes}: give at least 65536 (a memory profile must fit in one request)");
        }
        let queue_bytes = match self.otlp_queue_mib {
            Some(0) => bail!("otlp_queue_mib 0: give at least 1"),
            Some(mib) => (mib << 20) as usize,
            None => DEFAULT_QUEUE_BYTES,
        };
        if queue_bytes < max_request_bytes {
            bail!(
                "otlp_queue_mib {}: the queue must hold at least one request of {max_request_bytes} bytes",
                queue_bytes >> 20
            );
        }
        let profile_stacks = self.otlp_profile_stacks.unwrap_or(OtlpOptions::DEFAULT_PROFILE_STACKS);
        if profile_stacks == 0 {
            bail!("otlp_profile_stacks 0: give at least 1");
        }
        let mut client = ClientOptions::new(endpoint, protocol);
        client.token = token;
        client.queue_bytes = queue_bytes;
        client.max_request_bytes = max_request_bytes;
        Ok(OtlpOptions {
            client,
            node,
            events: self.otlp_events.unwrap_or(EventStream::Summary),
            metrics_interval,
            profile_interval,
            profile_stacks,
            spans: SpanPolicy {
                block_min_bytes: self.otlp_span_min_bytes.unwrap_or(OtlpOptions::DEFAULT_SPAN_MIN_BYTES),
                max_per_process: self.otlp_max_spans.unwrap_or(OtlpOptions::DEFAULT_MAX_SPANS),
            },
            memory_cap: None,
            pod: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_interval_is_a_positive_number_of_seconds_a_duration_holds() {
        let options = |tuning: OtlpTuning| {
            tuning.options("http://collector:4317", Protocol::Grpc, None, None).map_err(|e| e.to_string())
        };
        let interval = |seconds| OtlpTuning { otlp_metrics_interval: Some(seconds), ..OtlpTuning::default() };
        assert_eq!(options(interval(2.5)).unwrap().metrics_interval, Duration::from_millis(2500));
        assert_eq!(options(interval(0.0)).unwrap_err(), "otlp_metrics_interval 0: give a positive number of seconds");
        assert_eq!(
            options(interval(1e300)).unwrap_err(),
            format!("otlp_metrics_interval {}: too long: give at most 3155760000 seconds", 1e300)
        );
    }
}
