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
//! `--collector-pid`) name every shard, comma-separated; `--otelcol-pid` the Collector itself,
//! `--otelcol-log` its log, where it says what it gave up.
//!
//! A shard may be killed and started again on its database and addresses meanwhile
//! (`bench/fleet.py --restart shard:N`): the findings poller asks it again until it answers. Its
//! received counters start again from nothing then, so what the shards received is no longer
//! comparable with what the nodes sent; what counts is what was given up on the way — by the
//! nodes' clients and by the Collector — and every finding being served.
//!
//! Prints a JSON report; fails when anything was given up, a finding is missing, a node's data
//! is on more than one shard, or (no shard restarted) the collectors lack an item a node sent —
//! with `--count-loss` (the Collector itself killed) the missing items and findings are reported
//! instead.

mod node;
mod otelcol;
mod replay;

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
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
    /// The OpenTelemetry Collector's log (its stderr), read at the end for what it gave up.
    #[arg(long)]
    otelcol_log: Option<PathBuf>,
    /// Report the items the collectors lack instead of failing on them: an OpenTelemetry
    /// Collector killed in the middle loses what it held (`bench/fleet.py --restart otelcol`).
    #[arg(long)]
    count_loss: bool,
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
    let n = u64::from(args.nodes);
    let (arrived, nothing_lost) = arrival(args, &result, [n * records, n * spans, n * points], &received_before)?;
    let percentile = |p: f64| {
        let l = &result.latencies_ms;
        l.get(((l.len().max(1) - 1) as f64 * p).round() as usize).copied().unwrap_or(0.0)
    };
    let mut report = json!({
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
        "sent": {"log_records": result.delivery.sent_records, "spans": result.delivery.sent_spans, "metric_points": result.delivery.sent_points, "requests": result.delivery.requests, "bytes": result.delivery.bytes_sent, "largest_request": result.delivery.largest_request, "delivery": result.delivery.to_string(), "last_error": result.delivery.last_error},
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
    if let serde_json::Value::Object(arrived) = arrived {
        report.as_object_mut().expect("an object").extend(arrived);
    }
    let findings_short =
        result.findings_missing > 0 || result.latencies_ms.len() as u64 != n * stream.findings.len() as u64;
    if !nothing_lost || result.nodes_on_several_shards > 0 || findings_short && !args.count_loss {
        bail!("the collector does not have everything the fleet sent: {report}");
    }
    Ok(report.to_string())
}

/// What the collectors received against what the nodes sent (`sent`: log records, spans, metric
/// points), and what was given up on the way — by the nodes' clients, by the Collector (its
/// log): the report's part on it, and whether nothing was lost.
fn arrival(
    args: &Args,
    result: &replay::Replay,
    sent: [u64; 3],
    received_before: &std::collections::BTreeMap<String, u64>,
) -> Result<(serde_json::Value, bool)> {
    let received_after = replay::received(&args.collector_http)?;
    let signals = ["log_records", "spans", "metric_points"];
    let got: Vec<u64> = signals
        .iter()
        .map(|&signal| {
            let before = received_before.get(signal).copied().unwrap_or(0);
            received_after.get(signal).copied().unwrap_or(0).saturating_sub(before)
        })
        .collect();
    let restarted: Vec<usize> =
        (0..result.unanswered_polls.len()).filter(|&n| result.unanswered_polls[n] > 0).collect();
    let given_up = match &args.otelcol_log {
        Some(log) => Some(otelcol::given_up(
            &std::fs::read_to_string(log)
                .with_context(|| format!("cannot read the OpenTelemetry Collector's log {}", log.display()))?,
        )),
        None => None,
    };
    let by_signal = |values: &dyn Fn(usize) -> u64| -> serde_json::Value {
        signals.iter().enumerate().map(|(n, &signal)| (signal.to_string(), json!(values(n)))).collect()
    };
    let arrived = json!({
        "received": by_signal(&|n| got[n]),
        "received_twice": got.iter().sum::<u64>().saturating_sub(sent.iter().sum()),
        // A shard that restarted counts again from nothing: what it received is not comparable.
        "items_missing": restarted.is_empty().then(|| by_signal(&|n| sent[n].saturating_sub(got[n]))),
        "otlp_items_lost": result.delivery.lost(),
        "otelcol_given_up": given_up.as_ref().map(|g| json!({"items": g.items, "batches_unsized": g.batches_unsized, "lines": g.lines})),
        "shards_down_meanwhile": restarted,
        "unanswered_polls": result.unanswered_polls,
    });
    // OTLP delivers at least once: a request the collector answered after the client gave up
    // waiting is sent again, and counted twice there.
    let complete = !restarted.is_empty() || args.count_loss || (0..3).all(|n| got[n] >= sent[n]);
    let collector_gave_up = given_up.as_ref().is_some_and(|g| g.items + g.batches_unsized > 0);
    Ok((arrived, complete && !collector_gave_up && result.delivery.lost() == 0))
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
