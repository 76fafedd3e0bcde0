//! OTLP export requests in protobuf (logs, traces, metrics: what gRPC and OTLP/HTTP deliver),
//! decoded and taken into the collector's model as its receivers hand them over
//! (`Collector::logs`, `traces`, `metrics`), then saved at a checkpoint. The first byte picks the
//! signal; the rest is the request.
//!
//! Checked: nothing panics from decoding to the saved state; a request encoded again decodes the
//! same; a logs request rejects no more records than it holds; delivered twice (OTLP delivers at
//! least once), its findings are kept once.

#![no_main]

use std::sync::atomic::Ordering;

use gpuprof_fuzz::{collector, Signal};
use gpuprof_otlp::proto::collector::logs::v1::ExportLogsServiceRequest;
use gpuprof_otlp::proto::collector::metrics::v1::ExportMetricsServiceRequest;
use gpuprof_otlp::proto::collector::trace::v1::ExportTraceServiceRequest;
use libfuzzer_sys::fuzz_target;
use prost::Message;

fuzz_target!(|data: &[u8]| {
    let Some((&first, body)) = data.split_first() else { return };
    let collector = collector();
    match Signal::of(first) {
        Signal::Logs => {
            let Some(request) = decoded::<ExportLogsServiceRequest>(body) else { return };
            let records: usize =
                request.resource_logs.iter().flat_map(|r| &r.scope_logs).map(|s| s.log_records.len()).sum();
            let response = collector.logs(request.clone());
            let rejected = response.partial_success.map_or(0, |p| p.rejected_log_records);
            assert!(rejected >= 0 && rejected as usize <= records, "{rejected} of {records} records rejected");
            let findings = collector.stats.findings_received.load(Ordering::Relaxed);
            collector.logs(request);
            assert_eq!(collector.stats.findings_received.load(Ordering::Relaxed), findings, "findings kept twice");
        }
        Signal::Traces => {
            let Some(request) = decoded::<ExportTraceServiceRequest>(body) else { return };
            collector.traces(request);
        }
        Signal::Metrics => {
            let Some(request) = decoded::<ExportMetricsServiceRequest>(body) else { return };
            collector.metrics(request);
        }
    }
    collector.checkpoint().expect("the state is saved");
});

/// The request, if the bytes are one; encoded again, it decodes the same.
fn decoded<R: Message + Default + PartialEq + Clone>(body: &[u8]) -> Option<R> {
    let request = R::decode(body).ok()?;
    assert!(R::decode(request.encode_to_vec().as_slice()).ok() == Some(request.clone()), "re-encoded otherwise");
    Some(request)
}
