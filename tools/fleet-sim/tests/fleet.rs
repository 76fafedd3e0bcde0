//! The fleet simulation end to end at CI size: a training-like process recorded here (the
//! stand-ins, deep Python stacks) is the template of every simulated process; 10 nodes of 2
//! processes each at 20,000 events a second, and a worker per node every 3 s (its own CUDA
//! context, an exit holding 2 MiB), all through the agent's own summarizing export to one
//! gpuprof-collector. The collector must receive every item each node sent and serve each
//! finding under the node that sent it; the nodes send a few items a second for tens of
//! thousands of events. The 1/10/100/1000-node figures come from `bench/fleet.py`
//! (docs/benchmarks.md).

use std::process::Command;

use gpuprof_testkit::collector::Collector;
use gpuprof_testkit::*;
use serde_json::Value;

const NODES: u64 = 10;
const SECONDS: u64 = 8;
const WORKER_EVERY: u64 = 3;

#[test]
fn ten_simulated_nodes_at_a_training_rate_reach_the_collector_whole() {
    let dir = scratch("fleet_sim");
    let (log, recording) = (dir.join("expected.jsonl"), dir.join("train.gpuprof"));
    let training = workloads().join("training.py");
    let output = gpuprof_run(
        &["--output", recording.to_str().unwrap()],
        &[python3(), training.to_str().unwrap(), "--steps", "30"],
        &log,
    );
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));

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
    let served = collector.findings("");
    for node in 0..NODES {
        let name = format!("sim-node-{node:04}");
        let mut of_node: Vec<(&str, u64)> = served
            .iter()
            .filter(|f| f["node"] == name.as_str())
            .map(|f| (f["kind"].as_str().unwrap(), f["bytes"].as_u64().unwrap()))
            .collect();
        of_node.sort_unstable();
        let expected = [[("exit_with_live_allocations", 2 << 20)]; 3]
            .concat()
            .into_iter()
            .chain([("worker_cuda_context", 0); 3])
            .collect::<Vec<_>>();
        assert_eq!(of_node, expected, "{name}");
    }
    collector.stop();
}
