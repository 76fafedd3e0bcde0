//! Live bytes as OTLP gauges: per process, by layer and kind; a framework allocator's allocated
//! and reserved totals per device; and the used memory NVML reports for the process.

use gpuprof_model::otel::metric as name;
use gpuprof_model::track::ProcessMemory;
use opentelemetry_proto::tonic::metrics::v1::{metric, number_data_point, Gauge, Metric, NumberDataPoint};

use crate::kv_str;

/// `nvml_used`: what NVML reports the process uses (all devices), where it is known.
pub(crate) fn process_metrics(process: &ProcessMemory, ts: u64, nvml_used: Option<u64>) -> Vec<Metric> {
    let summary = process.summary();
    let point = |value: u64, attributes| NumberDataPoint {
        time_unix_nano: ts,
        value: Some(number_data_point::Value::AsInt(value as i64)),
        attributes,
        ..Default::default()
    };
    let mut live: Vec<NumberDataPoint> = summary
        .by_kind
        .iter()
        .map(|(kind, total)| {
            point(total.bytes, vec![kv_str(name::ATTR_LAYER, "driver"), kv_str(name::ATTR_KIND, kind.as_str())])
        })
        .collect();
    if summary.blocks.count > 0 {
        live.push(point(
            summary.blocks.bytes,
            vec![kv_str(name::ATTR_LAYER, "allocator"), kv_str(name::ATTR_KIND, "device")],
        ));
    }
    let mut metrics = vec![gauge(name::LIVE_BYTES, "Device memory a process holds, by layer and kind", live)];
    let totals = process.allocator_totals();
    if !totals.is_empty() {
        let per_device = |value: fn(&gpuprof_model::track::AllocatorTotals) -> u64| {
            totals
                .iter()
                .map(|(device, t)| point(value(t), vec![kv_str(name::ATTR_DEVICE, device.to_string())]))
                .collect()
        };
        metrics.push(gauge(
            name::ALLOCATOR_ALLOCATED,
            "Bytes in a framework allocator's live blocks",
            per_device(|t| t.allocated),
        ));
        metrics.push(gauge(
            name::ALLOCATOR_RESERVED,
            "Bytes a framework allocator holds in segments, its cache included",
            per_device(|t| t.reserved),
        ));
    }
    if let Some(used) = nvml_used {
        metrics.push(gauge(
            name::NVML_USED,
            "Device memory the driver accounts to the process (NVML, as nvidia-smi shows), all devices",
            vec![point(used, Vec::new())],
        ));
    }
    metrics
}

fn gauge(metric_name: &str, description: &str, data_points: Vec<NumberDataPoint>) -> Metric {
    Metric {
        name: metric_name.to_string(),
        description: description.to_string(),
        unit: "By".to_string(),
        data: Some(metric::Data::Gauge(Gauge { data_points })),
        ..Default::default()
    }
}
