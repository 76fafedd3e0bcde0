//! Several GPUs, one process each, as DDP over NCCL runs them — on the libcuda stand-in's two
//! devices (testkit/fixtures/workloads/ranks.py): every rank's driver calls carry its device, the
//! VMM buffers the ranks share are matched export to import across processes, and a rank killed
//! while the other holds its imported buffer leaves the findings it should, each naming its rank;
//! the collector shows each rank's memory on its device, and the run's jsonl file or recording,
//! read back by `report`, `summary` and the HTML report, names the ranks as the live capture did.

use gpuprof_model::event::{Event, Layer, Op};
use gpuprof_model::{Finding, FindingKind, Severity};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use gpuprof_testkit::collector::Collector;
use gpuprof_testkit::*;
use serde_json::{json, Value};

const MIB: u64 = 1 << 20;

#[test]
fn ranks_on_two_devices_share_buffers_and_one_dies_holding_the_others() {
    let dir = scratch("multi_gpu_ranks");
    let (log, out, findings) = (dir.join("expected.jsonl"), dir.join("events.jsonl"), dir.join("findings.json"));
    let collector = Collector::start(&dir.join("c.redb"), &[]);
    let stderr = run_ranks(
        &dir.join("hold"),
        &log,
        &collector,
        "ranks-node",
        &["-f", "jsonl", "-o", out.to_str().unwrap(), "--findings", findings.to_str().unwrap()],
    );
    let expected = read_expected(&log);
    let events = read_events(&out);
    let ranks = [pid_of_role(&expected, "rank0"), pid_of_role(&expected, "rank1")];

    let calls_of =
        |pid: u32| -> Vec<&Event> { events.iter().filter(|e| e.pid == pid && e.layer == Layer::Driver).collect() };
    for (device, &pid) in ranks.iter().enumerate() {
        let want: Vec<_> = expected_calls(&expected).into_iter().filter(|e| e["pid"] == pid).collect();
        assert_same_calls(&want, &calls_of(pid));
        // Every call of the rank, the plain cuMemAlloc included, on the rank's own device.
        let devices: Vec<Option<i32>> = calls_of(pid).iter().map(|e| e.device).collect();
        assert_eq!(devices, vec![Some(device as i32); want.len()], "rank {device}");
    }

    // Each rank imports the other's export: the same kernel file object, the exporter as peer.
    let export_of = |pid: u32| calls_of(pid).into_iter().find(|e| e.op == Op::IpcExport).unwrap().handle_object;
    let import_of = |pid: u32| calls_of(pid).into_iter().find(|e| e.op == Op::IpcOpen).unwrap();
    for (me, other) in [(ranks[0], ranks[1]), (ranks[1], ranks[0])] {
        let import = import_of(me);
        assert_eq!(import.peer_pid, Some(other));
        assert!(import.handle_object.is_some());
        assert_eq!(import.handle_object, export_of(other));
    }
    let exit = |pid: u32| events.iter().find(|e| e.pid == pid && e.op == Op::Exit).unwrap();
    assert_eq!((exit(ranks[1]).exit_code, exit(ranks[1]).signal), (Some(137), Some(9)));
    assert_eq!(exit(ranks[0]).exit_code, Some(0));

    // Rank 1, killed: its own memory (1 buffer of 2 MiB, its 2 MiB VMM buffer) and rank 0's
    // buffer it still had open. Rank 0 let go of rank 1's buffer after the death (a VMM handle
    // keeps that memory alive by design: no finding), and ended holding its own 1 MiB and VMM
    // buffer.
    let findings: Vec<Finding> = serde_json::from_str(&std::fs::read_to_string(&findings).unwrap()).unwrap();
    // Each names its rank (RANK in the process's environment, as torchrun sets it).
    type Row = (FindingKind, Severity, u32, Option<u32>, Option<u32>, u64, u64);
    let summary: Vec<Row> =
        findings.iter().map(|f| (f.kind, f.severity, f.pid, f.rank, f.peer_pid, f.bytes, f.count)).collect();
    assert_eq!(
        summary,
        [
            (FindingKind::ExitWithLiveAllocations, Severity::Leak, ranks[1], Some(1), None, 4 * MIB, 2),
            (FindingKind::IpcHandleNotClosed, Severity::Leak, ranks[1], Some(1), Some(ranks[0]), 2 * MIB, 1),
            (FindingKind::ExitWithLiveAllocations, Severity::Leak, ranks[0], Some(0), None, 3 * MIB, 2),
        ]
    );
    assert!(
        stderr.contains(&format!(
            "  ipc_handle_not_closed [leak] pid {} (rank 1) peer {}: 2.0 MiB in 1 (id ",
            ranks[1], ranks[0]
        )),
        "{stderr}"
    );
    // The collector serves the same.
    let (_, served) = collector.get("/api/v1/findings?node=ranks-node");
    let served: Vec<Value> = serde_json::from_str(&served).unwrap();
    let served: Vec<(u64, Option<u64>)> =
        served.iter().map(|f| (f["pid"].as_u64().unwrap(), f["rank"].as_u64())).collect();
    assert_eq!(served, [(ranks[1] as u64, Some(1)), (ranks[1] as u64, Some(1)), (ranks[0] as u64, Some(0))]);

    // The jsonl file says each rank once, on the rank's first call, and names them as the live
    // capture did when read back.
    let first_call = |pid: u32| events.iter().find(|e| e.pid == pid && e.layer != Layer::Process).unwrap();
    assert_eq!((first_call(ranks[0]).rank, first_call(ranks[1]).rank), (Some(0), Some(1)));
    assert_eq!(events.iter().filter(|e| e.rank.is_some()).count(), 2);
    let live: Vec<(u32, Option<u32>)> = findings.iter().map(|f| (f.pid, f.rank)).collect();
    assert_file_names_ranks(&out, ranks, &live);

    // So does a recording, of a second run.
    let (log, recording, findings) = (dir.join("expected2.jsonl"), dir.join("run.gpuprof"), dir.join("findings2.json"));
    let args = ["-o", recording.to_str().unwrap(), "--findings", findings.to_str().unwrap()];
    run_ranks(&dir.join("hold2"), &log, &collector, "ranks-node-2", &args);
    let expected = read_expected(&log);
    let ranks = [pid_of_role(&expected, "rank0"), pid_of_role(&expected, "rank1")];
    let findings: Vec<Finding> = serde_json::from_str(&std::fs::read_to_string(&findings).unwrap()).unwrap();
    let live: Vec<(u32, Option<u32>)> = findings.iter().map(|f| (f.pid, f.rank)).collect();
    assert_eq!(live, [(ranks[1], Some(1)), (ranks[1], Some(1)), (ranks[0], Some(0))]);
    assert_file_names_ranks(&recording, ranks, &live);
}

/// Runs ranks.py under `gpuprof run ARGS`, exporting to `collector` as `node`, and returns
/// gpuprof's stderr. Both ranks hold their buffers (`hold`) until the collector shows each one's
/// memory on its own device: by then the capture has read each rank's environment, which rank 1,
/// killed soon after, takes with it.
fn run_ranks(hold: &Path, log: &Path, collector: &Collector, node: &str, args: &[&str]) -> String {
    let script = workloads().join("ranks.py");
    let mut command = Command::new(gpuprof());
    command
        .arg("run")
        .args(args)
        .args(["--otlp-endpoint", &collector.grpc, "--node-name", node, "--"])
        .args([python3(), script.to_str().unwrap()])
        .env("GPUPROF_RANKS_HOLD", hold)
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    workload_env(&mut command, log);
    let agent = command.spawn().unwrap();

    // While both ranks hold their buffers, the collector shows each one's device memory on its
    // own device: a 1 MiB (rank 0) or 2 MiB (rank 1) buffer and a 2 MiB VMM buffer.
    let marker = |rank: u32| PathBuf::from(format!("{}.rank{rank}", hold.display()));
    let deadline = Instant::now() + Duration::from_secs(30);
    while !(marker(0).exists() && marker(1).exists()) {
        assert!(Instant::now() < deadline, "the ranks never got to hold their buffers");
        std::thread::sleep(Duration::from_millis(20));
    }
    let by_device = |processes: &Value, pid: u32| {
        processes
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["pid"] == pid && p["state"] == "running")
            .map(|p| p["live_bytes_by_device"].clone())
    };
    let ranks_now = [pid_of_role(&read_expected(log), "rank0"), pid_of_role(&read_expected(log), "rank1")];
    let want = [json!({ "0": 3 * MIB }), json!({ "1": 4 * MIB })];
    let processes = loop {
        let (status, text) = collector.get(&format!("/api/v1/processes?node={node}"));
        assert_eq!(status, 200);
        let processes: Value = serde_json::from_str(&text).unwrap();
        let seen = [by_device(&processes, ranks_now[0]), by_device(&processes, ranks_now[1])];
        if seen.iter().zip(&want).all(|(seen, want)| seen.as_ref() == Some(want)) || Instant::now() > deadline {
            break processes;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    for (rank, want) in want.iter().enumerate() {
        assert_eq!(by_device(&processes, ranks_now[rank]).as_ref(), Some(want), "rank {rank}: {processes:#}");
    }
    std::fs::write(hold, "").unwrap();
    let output = agent.output_within(PATIENCE, "agent");
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains(", none lost\n"), "{stderr}");
    stderr
}

/// `report` (JSON and table), `summary` (JSON and table) and the HTML report of an event file of
/// ranks.py name each rank as the live capture did (`live`: its findings' pids and ranks).
fn assert_file_names_ranks(file: &Path, ranks: [u32; 2], live: &[(u32, Option<u32>)]) {
    let gpuprof_of = |args: &[&str]| {
        let output = Command::new(gpuprof()).args(args).arg(file).output_within(PATIENCE);
        assert_eq!(output.status.code(), Some(0), "{args:?}: {}", String::from_utf8_lossy(&output.stderr));
        String::from_utf8(output.stdout).unwrap()
    };
    let reported: Vec<Finding> = serde_json::from_str(&gpuprof_of(&["report", "-f", "json"])).unwrap();
    let reported: Vec<(u32, Option<u32>)> = reported.iter().map(|f| (f.pid, f.rank)).collect();
    assert_eq!(reported, live, "report of {}", file.display());
    let table = gpuprof_of(&["report", "-f", "table"]);
    let line = format!("  ipc_handle_not_closed [leak] pid {} (rank 1) peer {}: 2.0 MiB in 1 (id ", ranks[1], ranks[0]);
    assert!(table.contains(&line), "{table}");

    let summary: Value = serde_json::from_str(&gpuprof_of(&["summary", "-f", "json"])).unwrap();
    let mut by_pid: Vec<(u64, Option<u64>)> = summary["processes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["pid"].as_u64().unwrap(), p["rank"].as_u64()))
        .collect();
    by_pid.sort_unstable();
    let mut want = [(ranks[0] as u64, Some(0)), (ranks[1] as u64, Some(1))];
    want.sort_unstable();
    assert_eq!(by_pid, want, "summary of {}", file.display());
    let table = gpuprof_of(&["summary", "-f", "table"]);
    for (rank, pid) in ranks.iter().enumerate() {
        assert!(table.contains(&format!("\npid {pid} (rank {rank}) python3, driver allocations: ")), "{table}");
    }

    let page = file.with_extension("html");
    gpuprof_of(&["export", "-f", "html", "-o", page.to_str().unwrap()]);
    let shown = browse_report(
        &page,
        json!([
            { "eval": "window.gpuprofReport.data.findings.map(f => [f.pid, f.rank === undefined ? null : f.rank])" },
            { "eval": "Array.from(document.querySelectorAll('#findings tbody tr')).map(r => r.cells[2].textContent)" },
        ]),
    );
    let data: Vec<(u32, Option<u32>)> = serde_json::from_value(shown["results"][0].clone()).unwrap();
    assert_eq!(data, live, "HTML report of {}", file.display());
    let (r0, r1) = (ranks[0], ranks[1]);
    assert_eq!(
        shown["results"][1],
        json!([
            format!("pid {r1} (rank 1) python3"),
            format!("pid {r1} (rank 1) python3 (peer {r0})"),
            format!("pid {r0} (rank 0) python3")
        ]),
        "HTML report of {}",
        file.display()
    );
}
