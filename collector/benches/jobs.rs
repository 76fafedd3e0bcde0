//! What following distributed jobs costs the collector (`cargo bench -p gpuprof-collector --bench
//! jobs`): the real collector on loopback takes the allocator gauges of 1,000 processes (125
//! nodes of 8) once a second of gauge time for 30 seconds, as OTLP/HTTP protobuf — first as
//! processes of no job (the baseline: the gauges into the processes' summaries), then as 10 jobs
//! of 100 ranks each (also each rank's series, and `rank_divergence` over every job each second),
//! one rank of each job keeping 64 MiB more each second. Reports both times per gauge request and
//! their ratio, and checks that each job's one straying rank was named.

use std::time::Instant;

use gpuprof_model::otel::metric as name;
use gpuprof_otlp::proto::collector::metrics::v1::ExportMetricsServiceRequest;
use gpuprof_otlp::proto::common::v1::{any_value, AnyValue, KeyValue};
use gpuprof_otlp::proto::metrics::v1::{
    metric, number_data_point, Gauge, Metric, NumberDataPoint, ResourceMetrics, ScopeMetrics,
};
use gpuprof_otlp::resource::ProcessIdentity;
use prost::Message;

mod common;
use common::{post, start, Collector};

const NODES: u32 = 125;
const PER_NODE: u32 = 8;
const RANKS_PER_JOB: u32 = 100;
const SECONDS: u64 = 30;
const MIB: u64 = 1 << 20;
const T0: u64 = 1_800_000_000_000_000_000;

fn gauge(metric_name: &str, ts: u64, value: u64) -> Metric {
    let device = KeyValue {
        key: name::ATTR_DEVICE.into(),
        value: Some(AnyValue { value: Some(any_value::Value::StringValue("0".into())) }),
        ..Default::default()
    };
    Metric {
        name: metric_name.into(),
        data: Some(metric::Data::Gauge(Gauge {
            data_points: vec![NumberDataPoint {
                time_unix_nano: ts,
                value: Some(number_data_point::Value::AsInt(value as i64)),
                attributes: vec![device],
                ..Default::default()
            }],
        })),
        ..Default::default()
    }
}

/// One node's gauges at second `s`: each of its processes' allocated and reserved.
fn request(node: u32, s: u64, jobs: bool) -> Vec<u8> {
    let resource_metrics = (0..PER_NODE)
        .map(|i| {
            let process = node * PER_NODE + i;
            let (job, rank) = (process / RANKS_PER_JOB, process % RANKS_PER_JOB);
            let mut identity = ProcessIdentity {
                host_name: format!("node-{node}"),
                pid: 1000 + i,
                executable: "python3".into(),
                ..Default::default()
            };
            if jobs {
                identity.job_id = format!("torchrun:job-{job}");
                identity.rank = Some(rank);
                identity.world_size = Some(RANKS_PER_JOB);
            }
            let kept = if rank == 7 { s * 64 * MIB } else { 0 };
            let ts = T0 + s * 1_000_000_000;
            ResourceMetrics {
                resource: Some(identity.resource()),
                scope_metrics: vec![ScopeMetrics {
                    metrics: vec![
                        gauge(name::ALLOCATOR_ALLOCATED, ts, 4096 * MIB + kept),
                        gauge(name::ALLOCATOR_RESERVED, ts, 6144 * MIB + kept),
                    ],
                    ..Default::default()
                }],
                ..Default::default()
            }
        })
        .collect();
    ExportMetricsServiceRequest { resource_metrics }.encode_to_vec()
}

/// Sends every second's requests in order; returns the seconds taken.
fn send(collector: &Collector, bodies: &[Vec<u8>]) -> f64 {
    let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
    let started = Instant::now();
    for body in bodies {
        post(&agent, &format!("{}/v1/metrics", collector.http), body);
    }
    started.elapsed().as_secs_f64()
}

fn main() {
    let dir = std::env::temp_dir().join("gpuprof-collector-jobs-bench");
    std::fs::create_dir_all(&dir).unwrap();
    let bodies = |jobs: bool| -> Vec<Vec<u8>> {
        (0..SECONDS).flat_map(|s| (0..NODES).map(move |node| request(node, s, jobs))).collect()
    };
    let (plain, ranked) = (bodies(false), bodies(true));
    let requests = plain.len() as f64;
    let mut rounds = Vec::new();
    for round in 0..3 {
        let collector = start(&dir.join(format!("plain-{round}.redb")));
        let without = send(&collector, &plain);
        drop(collector);
        let collector = start(&dir.join(format!("jobs-{round}.redb")));
        let with = send(&collector, &ranked);
        let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
        let found: serde_json::Value = serde_json::from_str(
            &agent
                .get(&format!("{}/api/v1/findings?kind=rank_divergence", collector.http))
                .call()
                .unwrap()
                .into_body()
                .read_to_string()
                .unwrap(),
        )
        .unwrap();
        let named: Vec<u64> = found.as_array().unwrap().iter().map(|f| f["rank"].as_u64().unwrap()).collect();
        assert_eq!(named, vec![7; (NODES * PER_NODE / RANKS_PER_JOB) as usize], "each job's rank 7, once");
        drop(collector);
        println!(
            "round {round}: without jobs {:.1} µs per request, with 10 jobs of 100 ranks {:.1} µs per request ({:.2}x)",
            without / requests * 1e6,
            with / requests * 1e6,
            with / without
        );
        rounds.push(with / without);
    }
    rounds.sort_by(f64::total_cmp);
    println!(
        "median ratio over 3 rounds: {:.2}x the time per gauge request ({} processes, {} requests a round)",
        rounds[1],
        NODES * PER_NODE,
        requests
    );
}
