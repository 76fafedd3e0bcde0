//! The fleet simulation end to end at CI size: a training-like process recorded here (the
//! stand-ins, deep Python stacks) is the template of every simulated process; 10 nodes of 2
//! processes each at 20,000 events a second, and a worker per node every 3 s (its own CUDA
//! context, an exit holding 2 MiB), all through the agent's own summarizing export to one
//! gpuprof-collector. The collector must receive every item each node sent and serve each
//! finding under the node that sent it; the nodes send a few items a second for tens of
//! thousands of events. The 1/10/100/1000-node figures come from `bench/fleet.py`
//! (docs/benchmarks.md). The same fleet behind the OpenTelemetry Collector, one of two shards
//! SIGKILLed and started again under it, gives up nothing; the 1000-node run of it is
//! `bench/fleet.py --shards 4 --restart shard:0` (docs/reliability.md).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use gpuprof_testkit::collector::{free_ports, Collector, OpenTelemetryCollector};
use gpuprof_testkit::*;
use serde_json::Value;

const NODES: u64 = 10;
const SECONDS: u64 = 8;
const WORKER_EVERY: u64 = 3;

/// A training-like process recorded here: the template of every simulated process.
fn record_training(dir: &Path) -> PathBuf {
    let (log, recording) = (dir.join("expected.jsonl"), dir.join("train.gpuprof"));
    let training = workloads().join("training.py");
    let output = gpuprof_run(
        &["--output", recording.to_str().unwrap()],
        &[python3(), training.to_str().unwrap(), "--steps", "30"],
        &log,
    );
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
    recording
}

/// Each simulated node's findings among `served`: `workers` workers' contexts and what each
/// left at its exit (2 MiB), once each.
fn assert_each_node_has_its_workers_findings(served: &[Value], nodes: u64, workers: usize) {
    for node in 0..nodes {
        let name = format!("sim-node-{node:04}");
        let mut of_node: Vec<(&str, u64)> = served
            .iter()
            .filter(|f| f["node"] == name.as_str())
            .map(|f| (f["kind"].as_str().unwrap(), f["bytes"].as_u64().unwrap()))
            .collect();
        of_node.sort_unstable();
        let expected = vec![("exit_with_live_allocations", 2 << 20); workers]
            .into_iter()
            .chain(vec![("worker_cuda_context", 0); workers])
            .collect::<Vec<_>>();
        assert_eq!(of_node, expected, "{name}");
    }
}

#[test]
fn ten_simulated_nodes_at_a_training_rate_reach_the_collector_whole() {
    let dir = scratch("fleet_sim");
    let recording = record_training(&dir);

    let collector = Collector::start(&dir.join("c.redb"), &[]);
    let output = Command::new(env!("CARGO_BIN_EXE_gpuprof-fleet-sim"))
        .args(["--input", recording.to_str().unwrap()])
        .args(["--nodes", &NODES.to_string(), "--processes", "2", "--rate", "20000"])
        .args([
            "--seconds",
            &SECONDS.to_string(),
            "--worker-every",
            &WORKER_EVERY.to_string(),
            "--compare-seconds",
            "1",
        ])
        .args([
            "--collector-grpc",
            &collector.grpc,
            "--collector-http",
            &collector.http,
            "--collector-pid",
            &collector.child.id().to_string(),
            "--timeout",
            "30",
        ])
        .output_within(PATIENCE);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    let report: Value = serde_json::from_slice(&output.stdout).unwrap();
    // Workers at 1.5 s, 4.5 s and 7.5 s (each lives 50 ms): two findings each.
    let workers = 3;
    assert_eq!(report["node"]["findings"], workers * 2, "{report}");
    assert_eq!(report["findings_expected"], NODES * workers * 2);
    assert_eq!(report["findings_served"], NODES * workers * 2);
    assert_eq!(report["findings_missing"], 0);
    assert_eq!(report["otlp_items_lost"], 0);
    for signal in ["log_records", "spans", "metric_points"] {
        assert_eq!(report["received"][signal], report["sent"][signal], "{signal}: {report}");
    }
    // 40,000 events a second per node become a few dozen items.
    let events_per_s = report["node"]["events_per_s"].as_f64().unwrap();
    assert!((39_000.0..=41_000.0).contains(&events_per_s), "{report}");
    assert!(report["node"]["events_per_item"].as_f64().unwrap() >= 100.0, "{report}");
    assert!(
        report["node"]["full_stream"]["items_per_s"].as_f64().unwrap()
            > 100.0 * report["node"]["items_per_s"].as_f64().unwrap(),
        "{report}"
    );

    // Each node's findings are under its own name: its workers' contexts and what they left.
    assert_each_node_has_its_workers_findings(&collector.findings(""), NODES, workers as usize);
    collector.stop();
}

/// Nodes of the fault tests' fleet, and the workers each runs: at 1.5, 4.5, 7.5, 10.5 and 13.5 s,
/// two findings each.
const BEHIND_NODES: u64 = 20;
const BEHIND_WORKERS: u64 = 5;

/// The fleet of the fault tests: 20 nodes of 2 processes at 20,000 events a second for 16 s, a
/// worker each every 3 s, sending through the OpenTelemetry Collector `otelcol` to the shards
/// at `https`.
fn start_fleet_behind(recording: &Path, otelcol: &OpenTelemetryCollector, https: &[String]) -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_gpuprof-fleet-sim"))
        .args(["--input", recording.to_str().unwrap()])
        .args(["--nodes", &BEHIND_NODES.to_string(), "--processes", "2", "--rate", "20000"])
        .args(["--seconds", "16", "--worker-every", "3", "--compare-seconds", "1"])
        .args(["--collector-grpc", &otelcol.grpc, "--collector-http", &https.join(",")])
        .args(["--otelcol-log", otelcol.log.to_str().unwrap(), "--timeout", "60"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Until `shard` has received its first log records (the fleet is sending, and to it).
fn wait_until_it_receives(shard: &Collector) {
    let started = Instant::now();
    while shard.metric("gpuprof_collector_received_total{signal=\"log_records\"}") == 0 {
        assert!(started.elapsed() < READY_LIMIT, "the shard received nothing: no node routed to it?");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The fleet's report once it ends, which must be with success; nothing given up on the way, by
/// the nodes' clients or by the Collector (its log).
fn fleet_report(sim: std::process::Child, otelcol: &OpenTelemetryCollector, what: &str) -> Value {
    let output = sim.output_within(PATIENCE, what);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}\n{}", otelcol.log_tail(5));
    let report: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(report["otlp_items_lost"], 0, "{report}");
    assert_eq!(report["otelcol_given_up"]["items"], 0, "{report}");
    assert_eq!(report["otelcol_given_up"]["batches_unsized"], 0, "{report}");
    report
}

/// 20 nodes through the real OpenTelemetry Collector (each node routed whole to one of two
/// shards, the deployment's per-shard queue and retry); 3 s after shard 0 first receives, it is
/// SIGKILLed — no checkpoint, requests cut mid-way — and 3 s later started again on its database
/// and addresses. Nothing is given up: not by the nodes' clients, not by the Collector (its log
/// names no dropped batch), every finding is served once, and each node stays on one shard.
#[test]
fn a_shard_sigkilled_and_restarted_under_load_behind_the_opentelemetry_collector_gives_up_nothing() {
    let dir = scratch("fleet_sim_shard_kill");
    let recording = record_training(&dir);
    let [grpc0, http0, grpc1, http1] = free_ports();
    let start_shard = |n: usize| {
        let (grpc, http) = [(grpc0, http0), (grpc1, http1)][n];
        let (grpc, http) = (format!("127.0.0.1:{grpc}"), format!("127.0.0.1:{http}"));
        Collector::start(&dir.join(format!("s{n}.redb")), &["--grpc-listen", &grpc, "--http-listen", &http])
    };
    let mut shards = [start_shard(0), start_shard(1)];
    let endpoints = [format!("127.0.0.1:{grpc0}"), format!("127.0.0.1:{grpc1}")];
    let otelcol = OpenTelemetryCollector::start(&dir, &endpoints, None);
    let https: Vec<String> = shards.iter().map(|s| s.http.clone()).collect();
    let sim = start_fleet_behind(&recording, &otelcol, &https);

    wait_until_it_receives(&shards[0]);
    std::thread::sleep(Duration::from_secs(3));
    shards[0].kill();
    std::thread::sleep(Duration::from_secs(3));
    shards[0] = start_shard(0);

    let report = fleet_report(sim, &otelcol, "gpuprof-fleet-sim, a shard killed under it");
    assert_eq!(report["shards_down_meanwhile"], serde_json::json!([0]), "{report}");
    assert_eq!(report["findings_expected"], BEHIND_NODES * BEHIND_WORKERS * 2);
    assert_eq!(report["findings_served"], BEHIND_NODES * BEHIND_WORKERS * 2);
    assert_eq!(report["findings_missing"], 0);
    assert_eq!(report["nodes_on_several_shards"], 0, "{report}");
    let served_by = report["nodes_per_shard"].as_array().unwrap();
    assert!(served_by[0].as_u64().unwrap() > 0 && served_by[1].as_u64().unwrap() > 0, "{report}");

    // After: every finding once, the killed shard's from before the kill read back from its
    // database.
    let served: Vec<Value> = shards.iter().flat_map(|s| s.findings("")).collect();
    assert_each_node_has_its_workers_findings(&served, BEHIND_NODES, BEHIND_WORKERS as usize);
    otelcol.stop();
}

/// The same fleet, the OpenTelemetry Collector itself stopped with SIGTERM (a rollout, a new
/// configuration) 3 s after shard 0 first receives, and started again 3 s later on its ports:
/// it drains what it holds to the shards as it stops, the nodes' clients hold and retry what
/// they send meanwhile, and the shards have every item the nodes sent, every finding once.
/// A SIGKILL loses what it held in memory; `bench/fleet.py --restart otelcol` counts it
/// (docs/reliability.md).
#[test]
fn the_opentelemetry_collector_restarted_under_load_loses_nothing() {
    let dir = scratch("fleet_sim_otelcol_restart");
    let recording = record_training(&dir);
    let shards = [Collector::start(&dir.join("s0.redb"), &[]), Collector::start(&dir.join("s1.redb"), &[])];
    let endpoints: Vec<String> = shards.iter().map(|s| s.grpc.trim_start_matches("http://").to_string()).collect();
    let mut otelcol = OpenTelemetryCollector::start(&dir, &endpoints, None);
    let https: Vec<String> = shards.iter().map(|s| s.http.clone()).collect();
    let sim = start_fleet_behind(&recording, &otelcol, &https);

    wait_until_it_receives(&shards[0]);
    std::thread::sleep(Duration::from_secs(3));
    otelcol.restart(libc::SIGTERM, Duration::from_secs(3));

    let report = fleet_report(sim, &otelcol, "gpuprof-fleet-sim, the OpenTelemetry Collector restarted under it");
    assert_eq!(report["shards_down_meanwhile"], serde_json::json!([]), "{report}");
    assert_eq!(
        report["items_missing"],
        serde_json::json!({"log_records": 0, "spans": 0, "metric_points": 0}),
        "{report}"
    );
    for signal in ["log_records", "spans", "metric_points"] {
        assert!(report["received"][signal].as_u64() >= report["sent"][signal].as_u64(), "{signal}: {report}");
    }
    assert_eq!(report["findings_served"], BEHIND_NODES * BEHIND_WORKERS * 2);
    assert_eq!(report["nodes_on_several_shards"], 0, "{report}");
    // The nodes were cut off while it was away (connection refused): their clients retried.
    assert!(report["sent"]["last_error"].as_str().is_some_and(|e| e.starts_with("gRPC ")), "{report}");
    let served: Vec<Value> = shards.iter().flat_map(|s| s.findings("")).collect();
    assert_each_node_has_its_workers_findings(&served, BEHIND_NODES, BEHIND_WORKERS as usize);
    otelcol.stop();
}
