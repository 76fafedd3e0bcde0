//! The fleet simulation end to end at CI size: 10 simulated nodes, each the agent's own OTLP
//! export replaying 2 process trees of a capture recorded here (a worker that exits holding
//! memory, and one whose IPC import stays open), all to one gpuprof-collector. The collector must
//! receive every event, and serve each finding under the node that sent it. The 10/100/1000-node
//! figures come from `bench/fleet.sh` (docs/benchmarks.md).

mod support;

use std::process::Command;

use serde_json::Value;
use support::collector::Collector;
use support::*;

const NODES: u64 = 10;
const TREES: u64 = 2;

#[test]
fn ten_simulated_nodes_reach_the_collector_whole() {
    let recorded = run_leaks("fleet_record", "ipc-left-open", &[], &[]);
    let events = read_events(&recorded.events);
    let findings_per_tree = recorded.findings.len() as u64;
    assert!(findings_per_tree >= 2, "{:?}", recorded.findings);

    let dir = scratch("fleet_sim");
    let collector = Collector::start(&dir.join("c.redb"), &[]);
    let output = Command::new(env!("CARGO_BIN_EXE_gpuprof-fleet-sim"))
        .args(["--input", recorded.events.to_str().unwrap()])
        .args(["--nodes", &NODES.to_string(), "--processes", &TREES.to_string()])
        .args(["--collector-grpc", &collector.grpc, "--collector-http", &collector.http, "--timeout", "60"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    let report: Value = serde_json::from_slice(&output.stdout).unwrap();
    let sent = NODES * TREES * events.len() as u64;
    assert_eq!(report["events_sent"], sent);
    assert_eq!(report["events_received"], sent);
    assert_eq!(report["otlp_items_lost"], 0);
    assert_eq!(report["findings_expected"], NODES * TREES * findings_per_tree);
    assert_eq!(report["findings_served"], NODES * TREES * findings_per_tree);
    assert_eq!(report["findings_missing"], 0);

    // Each node's findings are under its own name, with the kinds the recording's own run found.
    let served = collector.findings("");
    let mut kinds: Vec<&str> = recorded.findings.iter().map(|f| f.kind.as_str()).collect();
    kinds.sort_unstable();
    for node in 0..NODES {
        let name = format!("sim-node-{node:04}");
        let mut of_node: Vec<&str> = served.iter().filter(|f| f["node"] == name.as_str()).map(|f| f["kind"].as_str().unwrap()).collect();
        of_node.sort_unstable();
        let expected: Vec<&str> = kinds.iter().flat_map(|k| std::iter::repeat_n(*k, TREES as usize)).collect();
        assert_eq!(of_node, expected, "{name}");
    }
    collector.stop();
}
