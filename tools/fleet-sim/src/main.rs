//! gpuprof-fleet-sim: a fleet of simulated nodes sending to one gpuprof-collector at a training
//! job's rate. A node runs `--processes` training processes (the recording's busiest process
//! replayed at `--rate` events a second each, steps repeated) and a short-lived worker every
//! `--worker-every` seconds (two findings each, to time).
//!
//! Time is the one thing scaled, and only where it must be: one node's agent path (rules,
//! tracker, OTLP export) runs over its stream once, on a simulated clock and as fast as this
//! machine goes; what it hands its OTLP client is recorded with the simulated time it was
//! handed. Then every node sends that stream — renamed to itself — in real time, through its
//! own client and connection, so the collector sees what N nodes send, at the rate they send
//! it. The same stream, exported in full (every event a record), is counted beside it.
//!
//!   gpuprof-fleet-sim --input run.gpuprof --nodes 100 --processes 8 --rate 50000 --seconds 60 \
//!       --collector-grpc http://127.0.0.1:4317 --collector-http http://127.0.0.1:4318
//!
//! Behind an OpenTelemetry Collector that routes each node to one of several gpuprof-collector
//! shards, `--collector-grpc` is the Collector's address and `--collector-http` (and
//! `--collector-pid`) name every shard, comma-separated; `--otelcol-pid` the Collector itself.
//!
//! Prints a JSON report; fails when the collectors lack anything a node sent, or a node's data
//! is on more than one shard.

mod node;
mod replay;

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Result};
use clap::Parser;
use gpuprof_model::event::wall_clock_ns;
use gpuprof_model::Event;
use gpuprof_otlp::reporter::EventStream;
use gpuprof_recording::EventFile;
use serde_json::json;

use node::NodeShape;

#[derive(Debug, Parser)]
#[command(name = "gpuprof-fleet-sim", about = "Simulated nodes at a training job's rate, sending to gpuprof-collector")]
struct Args {
    /// A recorded capture (a recording or jsonl) of a training process.
    #[arg(long)]
    input: PathBuf,
    #[arg(long, default_value_t = 10)]
    nodes: u32,
    /// Training processes per node.
    #[arg(long, default_value_t = 8)]
    processes: u32,
    /// Events a second each training process makes.
    #[arg(long, default_value_t = 50_000.0)]
    rate: f64,
    /// How long the fleet runs.
    #[arg(long, default_value_t = 60.0)]
    seconds: f64,
    /// A short-lived worker with its own CUDA context per node every this many seconds (0: none).
    #[arg(long, default_value_t = 10.0)]
    worker_every: f64,
    /// Seconds of the full stream (every event a record) counted beside the summary.
    #[arg(long, default_value_t = 5.0)]
    compare_seconds: f64,
    /// Threads sending (nodes are spread over them).
    #[arg(long, default_value_t = 2)]
    threads: u32,
    /// Where the nodes send: a gpuprof-collector, or an OpenTelemetry Collector in front of shards.
    #[arg(long)]
    collector_grpc: String,
    /// The gpuprof-collectors' HTTP addresses (API and /metrics), comma-separated: every shard.
    #[arg(long, value_delimiter = ',', required = true)]
    collector_http: Vec<String>,
    #[arg(long, env = "GPUPROF_OTLP_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// The gpuprof-collectors' pids, comma-separated, for their CPU and memory.
    #[arg(long, value_delimiter = ',')]
    collector_pid: Vec<u32>,
    /// The OpenTelemetry Collector's pid, when the nodes send through one: its CPU and memory.
    #[arg(long)]
    otelcol_pid: Option<u32>,
    /// Give up waiting for the collector after this many seconds past the end.
    #[arg(long, default_value_t = 60.0)]
    timeout: f64,
}

fn main() {
    let args = Args::parse();
    match run(&args) {
        Ok(report) => println!("{report}"),
        Err(error) => {
            eprintln!("gpuprof-fleet-sim: error: {error:#}");
            std::process::exit(1);
        }
    }
}

fn run(args: &Args) -> Result<String> {
    let recording = read_recording(&args.input)?;
    let template = node::template(&recording);
    if template.round.is_empty() {
        bail!("--input {}: no allocation freed within the recording, nothing to repeat", args.input.display());
    }
    let shape = NodeShape {
        processes: args.processes,
        rate: args.rate,
        seconds: args.seconds,
        worker_every: args.worker_every,
    };
    let received_before = replay::received(&args.collector_http)?;
    let start = wall_clock_ns();
    let stream = node::build(&template, shape, EventStream::Summary, start);
    let full = node::build(
        &template,
        NodeShape { seconds: args.compare_seconds.min(args.seconds), ..shape },
        EventStream::All,
        start,
    );
    let (records, spans, points, bytes) = node::count(&stream.batches);
    let (full_records, full_spans, full_points, full_bytes) = node::count(&full.batches);
    let per_s = |n: u64, secs: f64| n as f64 / secs;
    let items = records + spans + points;
    let full_items = full_records + full_spans + full_points;

    let fleet = replay::Fleet {
        nodes: args.nodes,
        threads: args.threads,
        collector_grpc: args.collector_grpc.clone(),
        collector_http: args.collector_http.clone(),
        token: args.token.clone(),
        collector_pids: args.collector_pid.clone(),
        otelcol_pid: args.otelcol_pid,
        timeout: Duration::from_secs_f64(args.timeout),
    };
    let result = replay::run(&fleet, &stream, start)?;
    let received_after = replay::received(&args.collector_http)?;
    let got = |signal: &str| {
        received_after.get(signal).copied().unwrap_or(0) - received_before.get(signal).copied().unwrap_or(0)
    };
    let n = u64::from(args.nodes);
    let percentile = |p: f64| {
        let l = &result.latencies_ms;
        l.get(((l.len().max(1) - 1) as f64 * p).round() as usize).copied().unwrap_or(0.0)
    };
    let report = json!({
        "nodes": args.nodes,
        "processes_per_node": args.processes,
        "events_per_s_per_process": args.rate,
        "seconds": args.seconds,
        "node": {
            "events": stream.events,
            "events_per_s": per_s(stream.events, args.seconds),
            "items_per_s": per_s(items, args.seconds),
            "log_records_per_s": per_s(records, args.seconds),
            "spans_per_s": per_s(spans, args.seconds),
            "metric_points_per_s": per_s(points, args.seconds),
            "bytes_per_s": per_s(bytes, args.seconds),
            "events_per_item": stream.events as f64 / items.max(1) as f64,
            "agent_cpu_s_per_s": stream.cpu_seconds / args.seconds,
            "full_stream": {
                "seconds": args.compare_seconds.min(args.seconds),
                "items_per_s": per_s(full_items, args.compare_seconds.min(args.seconds)),
                "bytes_per_s": per_s(full_bytes, args.compare_seconds.min(args.seconds)),
            },
            "findings": stream.findings.len(),
        },
        "sent": {"log_records": result.delivery.sent_records, "spans": result.delivery.sent_spans, "metric_points": result.delivery.sent_points, "requests": result.delivery.requests, "bytes": result.delivery.bytes_sent, "largest_request": result.delivery.largest_request},
        "received": {"log_records": got("log_records"), "spans": got("spans"), "metric_points": got("metric_points")},
        "received_twice": (got("log_records") + got("spans") + got("metric_points")).saturating_sub(n * items),
        "otlp_items_lost": result.delivery.lost(),
        "replay_max_lag_ms": result.max_lag_ms,
        "collector": usage(result.collectors.iter().fold(None, |total, u| Some(total.unwrap_or_default() + *u)), result.seconds),
        "shards": result.collectors.iter().map(|u| usage(Some(*u), result.seconds)).collect::<Vec<_>>(),
        "nodes_per_shard": result.nodes_per_shard,
        "nodes_on_several_shards": result.nodes_on_several_shards,
        "otelcol": usage(result.otelcol, result.seconds),
        "findings_expected": n * stream.findings.len() as u64,
        "findings_served": result.latencies_ms.len(),
        "findings_missing": result.findings_missing,
        "finding_latency_ms": {"p50": percentile(0.5), "p99": percentile(0.99), "max": percentile(1.0)},
    });
    // OTLP delivers at least once: a request the collector answered after the client gave up
    // waiting is sent again, and counted twice there.
    let complete = got("log_records") >= n * records && got("spans") >= n * spans && got("metric_points") >= n * points;
    if !complete
        || result.delivery.lost() > 0
        || result.findings_missing > 0
        || result.nodes_on_several_shards > 0
        || result.latencies_ms.len() as u64 != n * stream.findings.len() as u64
    {
        bail!("the collector does not have everything the fleet sent: {report}");
    }
    Ok(report.to_string())
}

/// A process's CPU cores used over the replay and its largest resident set (summed over shards
/// for the collectors as a whole).
fn usage(usage: Option<replay::Usage>, seconds: f64) -> serde_json::Value {
    match usage {
        Some(u) => json!({"cpu_cores_used": u.cpu_seconds / seconds, "resident_bytes": u.peak_resident_bytes}),
        None => serde_json::Value::Null,
    }
}

fn read_recording(path: &Path) -> Result<Vec<Event>> {
    let mut file = EventFile::open(path)?;
    let mut events = Vec::new();
    while let Some(event) = file.next_event()? {
        events.push(event);
    }
    if events.is_empty() {
        bail!("--input {}: no events", path.display());
    }
    events.sort_by_key(|e| e.ts);
    Ok(events)
}
