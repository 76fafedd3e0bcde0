//! Capture levels against the stand-ins: a node daemon at its default (the driver's calls) raises
//! a job whose device memory grows to tensor events with their Python stacks, through allocator
//! probes of the job's own, then lowers it again when its time is up; through the daemon's API a
//! shimmed process is switched between off and tensors and its events stop and resume exactly at
//! the switch; `run --level driver` records the driver's calls and no tensor event.

use std::io::BufReader;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use gpuprof_model::event::{Event, Layer, Op, Source};
use gpuprof_testkit::daemon::{one_daemon_at_a_time, Daemon};
use gpuprof_testkit::*;
use serde_json::Value;

const S: u64 = 1_000_000_000;

/// A workload started with the stand-ins' environment; returns it and its "ready PID" pid.
fn start(
    dir: &Path,
    script: &str,
    args: &[&str],
    env: &[(&str, &Path)],
) -> (Child, u32, BufReader<std::process::ChildStdout>) {
    let mut command = Command::new(python3());
    command.arg(workloads().join(script)).args(args);
    workload_env(&mut command, &dir.join("workload.jsonl"));
    command.env("GPUPROF_LIBC10_CUDA", libc10_cuda_standin());
    for (name, value) in env {
        command.env(name, value);
    }
    let mut child = command.stdout(Stdio::piped()).spawn().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let line = line_within(&mut stdout, READY_LIMIT, "the workload's \"ready PID\"");
    let pid = line.strip_prefix("ready ").and_then(|p| p.trim().parse().ok()).unwrap_or_else(|| panic!("{line:?}"));
    (child, pid, stdout)
}

fn blocks_of(events: &[Event], pid: u32) -> Vec<&Event> {
    events.iter().filter(|e| e.pid == pid && e.layer == Layer::Allocator).collect()
}

/// The daemon's default: driver calls only, until the job's memory rises two windows running;
/// then its tensors, at the line that makes them, for --detail seconds; then the driver's again.
/// The growth finding names the tensors' line, not the driver calls that carry them.
#[test]
fn a_daemon_raises_a_growing_job_to_its_tensors_and_lowers_it_again() {
    let _node = one_daemon_at_a_time();
    let dir = scratch("levels_raise");
    let events_path = dir.join("events.jsonl");
    let libcuda = standin_dir().join("libcuda.so.1");
    let daemon = Daemon::start(&[
        "--output",
        events_path.to_str().unwrap(),
        "--libcuda",
        libcuda.to_str().unwrap(),
        "--growth-window",
        "0.5",
        "--detail",
        "3",
    ]);
    // Grows 4 s, then 6 s flat.
    let (mut job, pid, mut stdout) = start(&dir, "growing.py", &["4", "10"], &[]);
    let raised = daemon.wait_for_line(&format!("pid {pid}: capturing tensors for 3 s"), Duration::from_secs(15));
    assert!(raised.contains("(its device memory rose from "), "{raised}");
    let (status, levels) = daemon.get("/v1/levels");
    let levels: Value = serde_json::from_str(&levels).unwrap();
    assert_eq!((status, &levels[0]["pid"], &levels[0]["level"]), (200, &Value::from(pid), &Value::from("tensors")));
    assert_eq!(levels[0]["reason"], "growing");
    let growth = daemon.wait_for_line("finding growth:", Duration::from_secs(20));
    let keep =
        format!("allocated at {}:33 in keep in pid {pid} (python3) grew by ", workloads().join("growing.py").display());
    assert!(growth.contains(&format!("live tensor memory (allocator blocks) {keep}")), "{growth}");
    daemon.wait_for_line(&format!("pid {pid}: back to driver"), Duration::from_secs(10));
    let done = line_within(&mut stdout, READY_LIMIT, "the workload's \"done\"");
    assert_eq!(done.trim(), "done");
    assert_eq!(job.wait_within(Duration::from_secs(30), "job").code(), Some(0));
    assert!(daemon.metric("gpuprof_daemon_raises_total") >= 1);
    assert_eq!(daemon.metric("gpuprof_daemon_processes_raised"), 0);
    daemon.stop();

    let events = read_events(&events_path);
    let segments: Vec<&Event> =
        events.iter().filter(|e| e.pid == pid && e.api == "cuMemAlloc_v2" && e.op == Op::Alloc).collect();
    // A segment every 0.1 s for 4 s, all of them at the driver's level.
    assert!((35..=41).contains(&segments.len()), "{}", segments.len());
    let blocks = blocks_of(&events, pid);
    // 20 reports a step, 10 steps a second, for about the 3 s raised; one kept a step while
    // growing.
    assert!((300..=800).contains(&blocks.len()), "{}", blocks.len());
    let mut kept = 0;
    for block in &blocks {
        assert_eq!(block.source, Source::Ebpf);
        let frame = &block.stack.frames()[0];
        // Handed out at line 28, taken back at 29; kept at 33.
        let (function, line) = match (block.op, block.size) {
            (Op::Alloc, 4096) => ("step", 28),
            (Op::Alloc, _) => ("keep", 33),
            _ => ("step", 29),
        };
        kept += usize::from(function == "keep");
        assert_eq!((frame.function.as_str(), frame.line), (function, line), "{:?}", block.stack.frames());
        assert!(frame.file.ends_with("growing.py"));
    }
    assert!((10..=35).contains(&kept), "{kept}");
    // None before the memory had risen two windows, none once lowered: the job ran on 3 s more.
    let first_segment = segments[0].ts;
    let (first_block, last_block) = (blocks[0].ts, blocks[blocks.len() - 1].ts);
    let last_event = events.iter().filter(|e| e.pid == pid).map(|e| e.ts).max().unwrap();
    assert!(
        first_block >= first_segment + S / 2,
        "raised {} ms after the first segment",
        (first_block - first_segment) / 1_000_000
    );
    assert!(last_block + 2 * S <= last_event, "lowered {} ms before the end", (last_event - last_block) / 1_000_000);
    assert!(last_block - first_block <= 4 * S);
}

/// Asks the daemon for `level`, waiting for it to know the process (its shim connects at the
/// first report).
fn ask(daemon: &Daemon, pid: u32, level: &str) -> Value {
    for _ in 0..100 {
        let (status, body) = daemon.post(&format!("/v1/level?pid={pid}&level={level}"));
        match status {
            200 => return serde_json::from_str(&body).unwrap(),
            404 => std::thread::sleep(Duration::from_millis(50)),
            _ => panic!("{status} {body}"),
        }
    }
    panic!("the daemon never knew pid {pid}");
}

/// Makes the workload's next hundred reports and waits for them.
fn hundred(dir: &Path, k: usize) {
    std::fs::write(dir.join(format!("go.{k}")), "").unwrap();
    let done = dir.join(format!("done.{k}"));
    for _ in 0..500 {
        if done.exists() {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("the workload did not make its reports {k}");
}

/// A shimmed process that starts paused is switched by the daemon's API: its reports made after
/// the shim said it records are captured, those after it said it is off are not, each hundred
/// exactly; bad requests are answered with what is wrong.
#[test]
fn the_daemons_api_switches_a_shimmed_process_and_its_events_follow_exactly() {
    let _node = one_daemon_at_a_time();
    let dir = scratch("levels_switch");
    let events_path = dir.join("events.jsonl");
    let socket = dir.join("shim.sock");
    let daemon = Daemon::start(&[
        "--capture",
        "shim",
        "--shim-socket",
        socket.to_str().unwrap(),
        "--level",
        "off",
        "--output",
        events_path.to_str().unwrap(),
    ]);
    let workdir = dir.join("steps");
    std::fs::create_dir_all(&workdir).unwrap();
    let (mut job, pid, _stdout) = start(
        &dir,
        "shim_levels.py",
        &["agent", workdir.to_str().unwrap()],
        // Started at the daemon's level: its first report is not recorded before the daemon's word.
        &[("LD_PRELOAD", shim_library()), ("GPUPROF_SHIM_SOCKET", &socket), ("GPUPROF_SHIM_LEVEL", Path::new("off"))],
    );
    let (status, body) = daemon.post("/v1/level?pid=1&level=tensors");
    assert_eq!((status, body.as_str()), (404, r#"{"error":"pid 1 is not followed by this daemon"}"#));
    let (status, body) = daemon.post(&format!("/v1/level?pid={pid}&level=full"));
    assert_eq!((status, body.as_str()), (400, "unknown capture level \"full\": give off, driver or tensors\n"));
    let (status, body) = daemon.post(&format!("/v1/level?pid={pid}&level=tensors&seconds=-1"));
    assert_eq!((status, body.as_str()), (400, "seconds=-1: give a positive number of seconds\n"));
    // More than a century: the daemon's deadline from it would not hold (it panicked making one).
    let (status, body) = daemon.post(&format!("/v1/level?pid={pid}&level=tensors&seconds=1e300"));
    assert_eq!((status, body), (400, format!("seconds={}: too long: give at most 3155760000 seconds\n", 1e300)));

    let raised = ask(&daemon, pid, "tensors");
    assert_eq!(
        (&raised["pid"], &raised["level"], &raised["reason"]),
        (&Value::from(pid), &Value::from("tensors"), &Value::from("requested"))
    );
    daemon.wait_for_line(&format!("pid {pid}: the shim records at tensors from now on"), Duration::from_secs(5));
    hundred(&workdir, 0);
    ask(&daemon, pid, "off");
    daemon.wait_for_line(&format!("pid {pid}: the shim records at off from now on"), Duration::from_secs(5));
    hundred(&workdir, 1);
    ask(&daemon, pid, "tensors");
    daemon.wait_for_line(&format!("pid {pid}: the shim records at tensors from now on"), Duration::from_secs(5));
    hundred(&workdir, 2);
    std::fs::write(workdir.join("go.3"), "stop").unwrap();
    assert_eq!(job.wait_within(Duration::from_secs(30), "job").code(), Some(0));
    daemon.stop();

    let events = read_events(&events_path);
    let numbers: Vec<u64> =
        blocks_of(&events, pid).iter().map(|e| (e.addr.unwrap() - 0x7f00_0000_0000) / 4096).collect();
    assert_eq!(numbers, (0..100).chain(200..300).collect::<Vec<u64>>());
}

/// At the driver's level the probes leave libc10 alone: the job's segments, none of its tensors.
#[test]
fn at_the_driver_level_run_records_the_driver_calls_and_no_tensor() {
    // Its growing job would be one more process for the raise test's daemon to see and raise.
    let _node = one_daemon_at_a_time();
    let dir = scratch("levels_driver");
    for (level, blocks) in [("driver", 0), ("tensors", 210)] {
        let events_path = dir.join(format!("{level}.jsonl"));
        let mut command = Command::new(gpuprof());
        command.args(["run", "--level", level, "--output", events_path.to_str().unwrap(), "--"]);
        command.arg(python3()).arg(workloads().join("growing.py")).args(["1", "1"]);
        workload_env(&mut command, &dir.join("workload.jsonl"));
        command.env("GPUPROF_LIBC10_CUDA", libc10_cuda_standin());
        let output = command.output_within(PATIENCE);
        assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
        let events = read_events(&events_path);
        let segments = events.iter().filter(|e| e.api == "cuMemAlloc_v2").count();
        let tensors = events.iter().filter(|e| e.layer == Layer::Allocator).count();
        // 20 reports a step and one kept, 10 steps.
        assert_eq!((level, segments, tensors), (level, 10, blocks));
    }
    let output = Command::new(gpuprof()).args(["run", "--level", "off", "--", "true"]).output_within(PATIENCE);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2));
    assert!(
        stderr.contains("invalid value 'off' for '--level <LEVEL>': off records nothing: give driver or tensors"),
        "{stderr}"
    );
}
