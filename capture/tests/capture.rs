//! Driver-level capture end to end: real eBPF probes in this kernel, the libcuda stand-in,
//! Python (ctypes) and C workloads, `gpuprof run` and `gpuprof attach`. Every driver call the
//! workloads make is compared field by field with what gpuprof captured.

use std::collections::{BTreeSet, HashMap};
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

use gpuprof_model::event::{Event, Layer, Op};
use gpuprof_testkit::*;

fn process_events(events: &[Event], pid: u32) -> Vec<(Op, Option<u32>, Option<i32>)> {
    events.iter().filter(|e| e.layer == Layer::Process && e.pid == pid).map(|e| (e.op, e.ppid, e.exit_code)).collect()
}

fn calls_of<'a>(captured: &[&'a Event], pid: u32) -> Vec<&'a Event> {
    captured.iter().filter(|e| e.pid == pid).copied().collect()
}

fn expected_of(expected: &[serde_json::Value], pid: u32) -> Vec<serde_json::Value> {
    expected.iter().filter(|e| e["pid"] == pid).cloned().collect()
}

#[test]
fn run_captures_every_entry_point_exactly() {
    let dir = scratch("every_entry_point");
    let (log, out) = (dir.join("expected.jsonl"), dir.join("events.jsonl"));
    let script = workloads().join("every_entry_point.py");
    let output =
        gpuprof_run(&["--stats", "--output", out.to_str().unwrap()], &[python3(), script.to_str().unwrap()], &log);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert!(counters_line(&stderr).contains("lost 0 (ring buffer full 0, call table full 0)"), "{stderr}");

    let expected = expected_calls(&read_expected(&log));
    let events = read_events(&out);
    let captured = driver_events(&events);
    assert_eq!(expected.len(), 67);
    assert_same_calls(&expected, &captured);

    // The export and the import of one POSIX fd name the same kernel object.
    let fd_events: Vec<&&Event> = captured.iter().filter(|e| e.handle_type.as_deref() == Some("posix_fd")).collect();
    assert_eq!(fd_events.len(), 2);
    assert!(fd_events[0].handle_object.is_some());
    assert_eq!(fd_events[0].handle_object, fd_events[1].handle_object);

    // The command's own lifecycle: exec of python, exit 0.
    let pid = captured[0].pid;
    let lifecycle: Vec<Op> =
        events.iter().filter(|e| e.layer == Layer::Process && e.pid == pid).map(|e| e.op).collect();
    assert_eq!(lifecycle, vec![Op::Exec, Op::Exit]);
    let exec = events.iter().find(|e| e.op == Op::Exec && e.pid == pid).unwrap();
    assert_eq!(exec.filename.as_deref(), Some(python3()));
    assert_eq!(events.last().unwrap().op, Op::Exit);
    assert_eq!(events.last().unwrap().exit_code, Some(0));
}

/// The fork and spawn workers of process_tree.py, checked pid by pid.
fn check_process_tree(events: &[Event], expected_log: &[serde_json::Value], root_is_parent: bool) {
    let parent = pid_of_role(expected_log, "parent");
    let forked = pid_of_role(expected_log, "fork");
    let spawned = pid_of_role(expected_log, "spawn");
    let expected = expected_calls(expected_log);
    let captured = driver_events(events);

    for pid in [parent, forked, spawned] {
        assert_same_calls(&expected_of(&expected, pid), &calls_of(&captured, pid));
    }
    for worker in [forked, spawned] {
        assert!(calls_of(&captured, worker).iter().all(|e| e.ppid == Some(parent)), "worker calls name their parent");
    }
    let pids: BTreeSet<u32> = captured.iter().map(|e| e.pid).collect();
    assert_eq!(pids, BTreeSet::from([parent, forked, spawned]), "driver calls from unexpected processes");

    // The spawned worker opened exactly the handle the parent exported.
    let export = captured.iter().find(|e| e.op == Op::IpcExport).unwrap();
    let open = captured.iter().find(|e| e.op == Op::IpcOpen).unwrap();
    assert_eq!((export.pid, open.pid), (parent, spawned));
    assert_eq!(export.handle.as_ref().unwrap().len(), 64);
    assert_eq!(export.handle, open.handle);

    assert_eq!(process_events(events, forked), vec![(Op::Fork, Some(parent), None), (Op::Exit, Some(parent), Some(0))]);
    assert_eq!(
        process_events(events, spawned),
        vec![(Op::Fork, Some(parent), None), (Op::Exec, Some(parent), None), (Op::Exit, Some(parent), Some(0))]
    );
    let parent_lifecycle: Vec<Op> = process_events(events, parent).iter().map(|p| p.0).collect();
    let expected_lifecycle = if root_is_parent { vec![Op::Exec, Op::Exit] } else { vec![Op::Exit] };
    assert_eq!(parent_lifecycle, expected_lifecycle);
}

#[test]
fn run_follows_fork_and_spawn_workers() {
    let dir = scratch("run_tree");
    let (log, out) = (dir.join("expected.jsonl"), dir.join("events.jsonl"));
    let script = workloads().join("process_tree.py");
    let output = gpuprof_run(&["--output", out.to_str().unwrap()], &[python3(), script.to_str().unwrap()], &log);
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
    check_process_tree(&read_events(&out), &read_expected(&log), true);
}

#[test]
fn attach_follows_a_running_process_tree() {
    let dir = scratch("attach_tree");
    let (log, out) = (dir.join("expected.jsonl"), dir.join("events.jsonl"));
    let mut command = Command::new(python3());
    command.arg(workloads().join("process_tree.py")).arg("--wait-for-go");
    workload_env(&mut command, &log);
    let mut workload = start_ready_workload(command);

    let mut agent = Command::new(gpuprof())
        .args(["attach", &workload.id().to_string(), "--output", out.to_str().unwrap()])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(agent.stderr.take().unwrap());
    wait_for_stderr(&mut stderr, "capturing pid");
    writeln!(workload.stdin.as_mut().unwrap(), "go").unwrap();
    assert!(workload.wait_within(Duration::from_secs(60), "workload").success());
    // The agent stops by itself when its target exits.
    assert!(agent.wait_within(Duration::from_secs(30), "agent").success());
    let rest: Vec<String> = stderr.lines().map(Result::unwrap).collect();
    assert!(rest.iter().any(|l| l.ends_with(", none lost")), "{rest:?}");

    let events = read_events(&out);
    check_process_tree(&events, &read_expected(&log), false);
    let root_exit = events.iter().find(|e| e.op == Op::Exit && e.pid == workload.id()).expect("the target's exit");
    assert_eq!(root_exit.exit_code, Some(0));
}

#[test]
fn c_program_legacy_ipc_handle_by_value_across_fork() {
    let dir = scratch("c_ipc_fork");
    let (log, out) = (dir.join("expected.jsonl"), dir.join("events.jsonl"));
    let program = ipc_fork_program().to_str().unwrap();
    let output = gpuprof_run(&["--output", out.to_str().unwrap()], &[program], &log);
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));

    let expected = read_expected(&log);
    let events = read_events(&out);
    let captured = driver_events(&events);
    // Ordered per process; the two processes interleave by time.
    let mut by_pid: HashMap<u64, Vec<serde_json::Value>> = HashMap::new();
    for line in &expected {
        by_pid.entry(line["pid"].as_u64().unwrap()).or_default().push(line.clone());
    }
    assert_eq!(by_pid.len(), 2);
    for (pid, lines) in &by_pid {
        assert_same_calls(lines, &calls_of(&captured, *pid as u32));
    }
    assert_eq!(captured.len(), expected.len());
    let open = captured.iter().find(|e| e.api == "cuIpcOpenMemHandle").unwrap();
    assert_eq!(open.result, 0);
    assert_eq!(open.addr, Some(0x7fa0_0000_0000));
}

#[test]
fn attach_stops_at_the_duration_and_leaves_the_target_running() {
    let dir = scratch("attach_duration");
    let log = dir.join("expected.jsonl");
    let mut command = Command::new(python3());
    command.args([
        "-c",
        "from cuda_driver import Driver; import sys, time; Driver(); print('ready', flush=True); time.sleep(60)",
    ]);
    workload_env(&mut command, &log);
    let mut workload = start_ready_workload(command);
    let output = Command::new(gpuprof())
        .args(["attach", &workload.id().to_string(), "--duration", "0.5", "--format", "table"])
        .output_within(PATIENCE);
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
    assert!(workload.try_wait().unwrap().is_none(), "the target must outlive the capture");
    let stdout = String::from_utf8(output.stdout).unwrap();
    // No event: no table header, only the (empty) summary.
    assert!(stdout.starts_with("\nLive GPU memory at end, per process and kind:\n"), "{stdout}");
    workload.kill().unwrap();
    workload.wait_within(PATIENCE, "workload");
}

#[test]
fn run_returns_the_command_exit_code() {
    let dir = scratch("exit_codes");
    let log = dir.join("expected.jsonl");
    let out = dir.join("events.jsonl");
    // The shell makes no CUDA call: --all-processes keeps its exit in the stream.
    let output = gpuprof_run(&["--all-processes", "--output", out.to_str().unwrap()], &["sh", "-c", "exit 7"], &log);
    assert_eq!(output.status.code(), Some(7));
    let exit = read_events(&out).into_iter().find(|e| e.op == Op::Exit).unwrap();
    assert_eq!((exit.exit_code, exit.signal), (Some(7), None));

    let output =
        gpuprof_run(&["--all-processes", "--output", out.to_str().unwrap()], &["sh", "-c", "kill -9 $$"], &log);
    assert_eq!(output.status.code(), Some(137));
    let exit = read_events(&out).into_iter().find(|e| e.op == Op::Exit).unwrap();
    assert_eq!((exit.exit_code, exit.signal), (Some(137), Some(9)));
}

#[test]
fn table_format_sums_live_memory_per_process_and_kind() {
    let dir = scratch("table");
    let log = dir.join("expected.jsonl");
    let out = dir.join("table.txt");
    let script = "from cuda_driver import Driver\n\
                  cuda = Driver(); cuda.init()\n\
                  cuda.mem_alloc(3 << 20); cuda.mem_alloc(1 << 20)\n\
                  r, a = cuda.mem_alloc(5 << 20); cuda.mem_free(a)\n\
                  cuda.host_alloc(65536)\n\
                  cuda.mem_alloc(1 << 50)\n";
    let output =
        gpuprof_run(&["--format", "table", "--output", out.to_str().unwrap()], &[python3(), "-c", script], &log);
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
    let table = std::fs::read_to_string(&out).unwrap();
    let pid = read_expected(&log)[0]["pid"].as_u64().unwrap().to_string();

    let rows: Vec<Vec<&str>> = table.lines().map(|l| l.split_whitespace().collect()).collect();
    assert_eq!(rows[0], ["TIME", "PID", "COMM", "CALL", "OP", "SIZE", "RESULT", "PYTHON"]);
    let oom = rows.iter().find(|r| r.contains(&"OUT_OF_MEMORY")).expect("the failed call has a row");
    assert_eq!(oom[1..8], [pid.as_str(), "python3", "cuMemAlloc_v2", "alloc", "1024.0", "TiB", "OUT_OF_MEMORY"]);
    // Each row ends with the innermost Python frame of the call.
    assert_eq!(oom[oom.len() - 2..], ["cuda_driver.py:149", "Driver.call"]);
    // Every line fits 120 columns.
    assert!(table.lines().all(|l| l.chars().count() <= 120), "{table}");
    let summary_at = table.lines().position(|l| l.starts_with("Live GPU memory at end, per process")).unwrap();
    let summary: Vec<&Vec<&str>> = rows[summary_at + 2..]
        .iter()
        .take_while(|r| !r.is_empty())
        .filter(|r| r.first() == Some(&pid.as_str()))
        .collect();
    // pid ppid comm state kind bytes count mapped(2 words) ipc ctx
    assert_eq!(summary.len(), 2, "{table}");
    assert_eq!(summary[0][3..8], ["exited(0)", "device", "4.0", "MiB", "2"]);
    assert_eq!(summary[1][3..8], ["exited(0)", "host_pinned", "64.0", "KiB", "1"]);
    assert_eq!(summary[0][10..], ["0", "1"]);
    let by_frame_at = table.lines().position(|l| l == "Live GPU memory at end, by the user's line (the innermost frame outside the standard library and installed packages):").unwrap();
    let by_frame: Vec<&Vec<&str>> = rows[by_frame_at + 2..].iter().take_while(|r| !r.is_empty()).collect();
    assert_eq!(by_frame.len(), 2, "{table}");
    assert_eq!(by_frame[0][..5], [pid.as_str(), "device", "4.0", "MiB", "2"]);
    // The long path loses its middle, never its end.
    assert!(by_frame[0][5].ends_with("workloads/cuda_driver.py:149"), "{table}");
    assert_eq!(by_frame[0][6..], ["in", "Driver.call"]);
    assert_eq!(by_frame[1][..5], [pid.as_str(), "host_pinned", "64.0", "KiB", "1"]);
    // The process left 4 MiB of device memory behind: the findings say so, after the summary,
    // each with the Python stack of its call.
    let findings_at = table.lines().position(|l| l == "Findings (2 leaks, 0 info):").expect("findings listed");
    let findings: Vec<&str> = table.lines().skip(findings_at + 1).collect();
    assert!(findings[0].starts_with(&format!("  oom [leak] pid {pid}: 1024.0 TiB in 1 (id ")), "{table}");
    // Nothing was cached anywhere: the device was full of live memory.
    assert_eq!(findings[1], "    why: device_full", "{table}");
    // The workload's own frame (cuda_driver.py is a test fixture, not a package): its line.
    assert!(findings[2].starts_with("    your line: ") && findings[2].ends_with(" in Driver.call"), "{table}");
    let (detail, frames_at) = detail_at(&findings, 3);
    assert!(
        detail.contains("failed with out of memory in pid")
            && detail.contains("at that moment gpuprof saw 4.0 MiB of device memory live in the processes it follows"),
        "{table}"
    );
    assert!(
        findings[frames_at].contains("cuda_driver.py:") && findings[frames_at].ends_with(" in Driver.call"),
        "{table}"
    );
    assert!(
        findings[frames_at + 1].contains("cuda_driver.py:")
            && findings[frames_at + 1].ends_with(" in Driver.mem_alloc"),
        "{table}"
    );
    assert_eq!(findings[frames_at + 2], "      <string>:6 in <module>");
    let exit_at = findings.iter().position(|l| l.starts_with("  exit_with_live_allocations")).unwrap();
    assert!(
        findings[exit_at].starts_with(&format!("  exit_with_live_allocations [leak] pid {pid}: 4.0 MiB in 2 (id ")),
        "{table}"
    );
    let (detail, frames_at) = detail_at(&findings, exit_at + 2);
    assert!(detail.starts_with(&format!("pid {pid} (python3) exited still holding 4.0 MiB of device memory in 2 allocations; the largest, 3.0 MiB, came from cuMemAlloc_v2 at ")), "{table}");
    assert_eq!(findings[frames_at + 2], "      <string>:3 in <module>");
    // The detail wraps at 120 columns.
    assert!(findings.iter().all(|l| l.chars().count() <= 120), "{table}");
}

/// A finding's detail in the findings table, starting at line `at`: its wrapped lines (indented
/// 4) joined into one sentence, and where its stack (indented 6) begins.
fn detail_at(findings: &[&str], at: usize) -> (String, usize) {
    let end = (at..findings.len())
        .find(|&i| !findings[i].starts_with("    ") || findings[i].starts_with("      "))
        .unwrap_or(findings.len());
    (findings[at..end].iter().map(|l| l.trim()).collect::<Vec<_>>().join(" "), end)
}

/// A stopped agent cannot drain the ring buffer: the records that did not fit are counted, and
/// received + counted = made.
#[test]
fn a_full_ring_buffer_is_counted_not_silent() {
    let dir = scratch("ring_full");
    let log = dir.join("expected.jsonl");
    let out = dir.join("events.jsonl");
    let mut command = Command::new(ipc_fork_program());
    command.args(["loop", "20000"]);
    workload_env(&mut command, &log);
    let mut workload = start_ready_workload(command);

    let mut agent = Command::new(gpuprof())
        .args(["attach", &workload.id().to_string(), "--buffer-mib", "1", "--output", out.to_str().unwrap()])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(agent.stderr.take().unwrap());
    wait_for_stderr(&mut stderr, "capturing pid");
    // SAFETY: signals to our own children.
    unsafe { libc::kill(agent.id() as i32, libc::SIGSTOP) };
    writeln!(workload.stdin.as_mut().unwrap(), "go").unwrap();
    let status = workload.wait_within(Duration::from_secs(120), "workload");
    // SAFETY: as above.
    unsafe { libc::kill(agent.id() as i32, libc::SIGCONT) };
    assert!(status.success());
    let agent_status = agent.wait_within(Duration::from_secs(30), "agent");
    let rest: String = stderr.lines().map(Result::unwrap).collect::<Vec<_>>().join("\n");
    assert!(agent_status.success(), "{agent_status:?}: {rest}");

    let events = read_events(&out);
    let calls = driver_events(&events).len() as u64;
    let lost: u64 = rest
        .split("ring buffer full ")
        .nth(1)
        .and_then(|s| s.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no drop count in {rest}"));
    // 40,000 driver calls plus the exit record.
    let exit_seen = u64::from(events.iter().any(|e| e.op == Op::Exit));
    assert!(lost > 0, "a 1 MiB buffer cannot hold 40,000 records: {rest}");
    assert_eq!(calls + exit_seen + lost, 40_001, "{rest}");
    assert!(rest.contains(&format!("warning: {lost} events were lost; give a larger --buffer-mib")), "{rest}");
}

#[test]
fn sigint_stops_attach_cleanly_and_sigterm_is_forwarded_by_run() {
    let dir = scratch("signals");
    let log = dir.join("expected.jsonl");
    let mut command = Command::new(python3());
    command.args([
        "-c",
        "from cuda_driver import Driver; import time; Driver(); print('ready', flush=True); time.sleep(60)",
    ]);
    workload_env(&mut command, &log);
    let mut workload = start_ready_workload(command);
    let mut agent = Command::new(gpuprof())
        .args(["attach", &workload.id().to_string(), "--format", "table"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(agent.stderr.take().unwrap());
    wait_for_stderr(&mut stderr, "capturing pid");
    // SAFETY: a signal to our own child.
    unsafe { libc::kill(agent.id() as i32, libc::SIGINT) };
    assert!(agent.wait_within(Duration::from_secs(10), "agent").success());
    let mut summary = String::new();
    std::io::Read::read_to_string(agent.stdout.as_mut().unwrap(), &mut summary).unwrap();
    assert!(summary.contains("Live GPU memory at end"), "{summary}");
    assert!(workload.try_wait().unwrap().is_none(), "attach must not stop the target");
    workload.kill().unwrap();
    workload.wait_within(PATIENCE, "workload");

    let mut run = Command::new(gpuprof())
        .args(["run", "--output", "/dev/null", "--", "sleep", "30"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(run.stderr.take().unwrap());
    wait_for_stderr(&mut stderr, "gpuprof: ");
    std::thread::sleep(Duration::from_millis(200));
    // SAFETY: kill takes no memory; the pid is our own child's, not yet waited for, so not reused.
    unsafe { libc::kill(run.id() as i32, libc::SIGTERM) };
    // sleep dies of the forwarded SIGTERM: 128 + 15.
    assert_eq!(run.wait_within(Duration::from_secs(10), "run").code(), Some(143));
}

/// Kernels before 6.6 get one perf-event link per probe instead of uprobe-multi links: the same
/// calls must come out (forced here; each of those links costs a grace period to detach).
#[test]
fn perf_event_links_capture_the_same_calls() {
    let dir = scratch("perf_event_links");
    let (log, out) = (dir.join("expected.jsonl"), dir.join("events.jsonl"));
    let mut cmd = Command::new(gpuprof());
    cmd.args(["run", "--output", out.to_str().unwrap(), "--"]).arg(ipc_fork_program());
    workload_env(&mut cmd, &log);
    let output = cmd.env("GPUPROF_PROBE_LINKS", "perf-event").output_within(PATIENCE);
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
    let expected = read_expected(&log);
    let events = read_events(&out);
    let captured = driver_events(&events);
    for pid in expected.iter().map(|e| e["pid"].as_u64().unwrap() as u32).collect::<BTreeSet<_>>() {
        assert_same_calls(&expected_of(&expected, pid), &calls_of(&captured, pid));
    }
    assert_eq!(captured.len(), 6);
}

/// A driver call names no device: each event gets the device of the context its thread made
/// current last — set, pushed over and popped back, per thread, as a rank's threads and NCCL's do.
#[test]
fn driver_calls_carry_the_device_of_their_thread_current_context() {
    let dir = scratch("current_context_device");
    let (log, out) = (dir.join("expected.jsonl"), dir.join("events.jsonl"));
    let script = "from cuda_driver import Driver\n\
                  import ctypes, threading\n\
                  cuda = Driver(); ctx0 = cuda.init()\n\
                  ctx1 = cuda.primary_ctx_retain(1)\n\
                  cuda.mem_alloc(1 << 20)\n\
                  assert cuda.call('cuCtxSetCurrent', ctx1) == 0\n\
                  cuda.mem_alloc(2 << 20)\n\
                  assert cuda.call('cuCtxPushCurrent_v2', ctypes.c_void_p(ctx0)) == 0\n\
                  cuda.mem_alloc(3 << 20)\n\
                  assert cuda.call('cuCtxPopCurrent_v2', ctypes.byref(ctypes.c_void_p())) == 0\n\
                  cuda.mem_alloc(4 << 20)\n\
                  def other():\n    assert cuda.call('cuCtxSetCurrent', ctx0) == 0; cuda.mem_alloc(5 << 20)\n\
                  t = threading.Thread(target=other); t.start(); t.join()\n\
                  cuda.mem_alloc(6 << 20)\n";
    let output = gpuprof_run(&["-f", "jsonl", "-o", out.to_str().unwrap()], &[python3(), "-c", script], &log);
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
    assert_same_calls(&expected_calls(&read_expected(&log)), &driver_events(&read_events(&out)));
    let devices: Vec<(u64, Option<i32>)> =
        read_events(&out).iter().filter(|e| e.api == "cuMemAlloc_v2").map(|e| (e.size >> 20, e.device)).collect();
    // Context 0 current after init; then 1; 0 pushed over it; popped back to 1; another thread
    // on 0 while this one stays on 1.
    assert_eq!(devices, [(1, Some(0)), (2, Some(1)), (3, Some(0)), (4, Some(1)), (5, Some(0)), (6, Some(1))]);
}

/// A library that calls the driver itself (NCCL's stand-in): each driver event names it, and
/// where its thread has no Python frame, the table and the findings group its memory under it.
#[test]
fn driver_calls_name_the_module_that_made_them() {
    let dir = scratch("caller_module");
    let log = dir.join("expected.jsonl");
    let out = dir.join("table.txt");
    let events = dir.join("events.jsonl");
    let script = NCCL_CALLS;
    // Once as events, once as a table: the same calls. The process lingers: its modules are
    // named from its maps, read while it lives.
    let mut pids = Vec::new();
    for args in [
        ["--format", "jsonl", "--output", events.to_str().unwrap()],
        ["--format", "table", "--output", out.to_str().unwrap()],
    ] {
        let mut cmd = Command::new(gpuprof());
        cmd.arg("run").args(args).args(["--", python3(), "-c", script]);
        workload_env(&mut cmd, &log);
        cmd.env("LD_LIBRARY_PATH", format!("{}:{}", standin_dir().display(), nccl_standin_dir().display()));
        let output = cmd.output_within(PATIENCE);
        assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
        pids.push(read_expected(&log).last().unwrap()["pid"].as_u64().unwrap() as u32);
    }
    let pid = pids[0];
    assert_nccl_callers(&read_events(&events), pid);

    let table = std::fs::read_to_string(&out).unwrap();
    let pid = pids[1];
    let row = table
        .lines()
        .find(|l| l.contains(" cuMemAlloc_v2 ") && l.contains("4.0 MiB"))
        .unwrap_or_else(|| panic!("{table}"));
    assert!(row.ends_with(" [libnccl.so.2]"), "{row}");
    let by_line = table
        .split("Live GPU memory at end, by the user's line (the innermost frame outside the standard library and installed packages):\n")
        .nth(1)
        .unwrap_or_else(|| panic!("{table}"));
    let by_line: Vec<Vec<&str>> =
        by_line.lines().skip(1).take_while(|l| !l.is_empty()).map(|l| l.split_whitespace().collect()).collect();
    assert_eq!(by_line[0], [pid.to_string().as_str(), "device", "4.0", "MiB", "1", "[libnccl.so.2]"], "{table}");
    let lines: Vec<&str> = table.lines().collect();
    let at = lines.iter().position(|l| l.contains("exited still holding 6.0 MiB")).unwrap_or_else(|| panic!("{table}"));
    let (exit, _) = detail_at(&lines, at);
    // Named by the allocation with a Python stack, not the larger one NCCL made without.
    assert!(exit.ends_with("the largest made from Python, 2.0 MiB, came from cuMemAlloc_v2 at <string>:6 in <module>: release it once it is no longer needed (drop the tensor, torch.cuda.empty_cache()) instead of leaving it to the end of the process."), "{exit}");
}

/// One training step through the caching allocator of the libc10_cuda stand-in (as PyTorch's
/// segments are made: in its alloc_block), beside a driver allocation the program makes itself.
const CACHING_STEP: &str = r#"
import json, os, sys, time
sys.path.insert(0, os.environ["GPUPROF_WORKLOADS"])
from cuda_driver import Driver
from caching_job import Model, libraries, train_step
cuda = Driver()
cuda.init()
model = Model(*libraries())
time.sleep(0.6)
result, own = cuda.mem_alloc(1 << 20)
train_step(model)
cuda.mem_free(own)
print(json.dumps({"pid": os.getpid()}), flush=True)
"#;

/// At the driver's level, through eBPF and through the shim: the segments PyTorch's caching
/// allocator makes are marked as its own, the program's own allocation is not; through eBPF the
/// segment made on the autograd thread carries the stack of the line running the backward pass.
#[test]
fn the_caching_allocators_segments_are_marked_and_a_backward_segment_names_the_line_running_it() {
    shim_library();
    let dir = scratch("allocator_segments");
    let job = workloads().join("caching_job.py");
    let source = std::fs::read_to_string(&job).unwrap();
    let line_of = |text: &str| source.lines().position(|l| l.contains(text)).unwrap() as u32 + 1;
    for via_shim in [false, true] {
        let (log, out) = (dir.join("expected.jsonl"), dir.join(format!("events-{via_shim}.jsonl")));
        let mut command = Command::new(gpuprof());
        command.arg("run");
        if via_shim {
            command.args(["--via", "shim"]);
        }
        command.args(["--level", "driver", "--output", out.to_str().unwrap(), "--", python3(), "-c", CACHING_STEP]);
        workload_env(&mut command, &log);
        command
            .env("GPUPROF_LIBC10_CUDA", libc10_cuda_standin())
            .env("GPUPROF_LIBTORCH_CPU", libtorch_cpu_standin())
            .env("GPUPROF_WORKLOADS", workloads());
        let output = command.stdout(Stdio::piped()).output_within(PATIENCE);
        assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
        let pid: u32 = serde_json::from_slice::<serde_json::Value>(&output.stdout).unwrap()["pid"]
            .as_u64()
            .unwrap()
            .try_into()
            .unwrap();
        let events = read_events(&out);
        let allocations: Vec<(u64, Option<&str>, bool)> = events
            .iter()
            .filter(|e| e.pid == pid && e.api == "cuMemAlloc_v2" && e.op == Op::Alloc)
            .map(|e| (e.size, e.allocator_segment.map(|f| f.as_str()), e.tid == e.pid))
            .collect();
        // The program's 1 MiB; the 2 MiB segment of the forward's activations; the 20 MiB one
        // of the gradients, made on the autograd thread.
        assert_eq!(
            allocations,
            [(1 << 20, None, true), (2 << 20, Some("pytorch"), true), (20 << 20, Some("pytorch"), false)],
            "via the shim: {via_shim}"
        );
        let forward = events.iter().find(|e| e.pid == pid && e.size == 2 << 20).unwrap();
        let at = |e: &Event| e.stack.first().map(|f| (f.function.clone(), f.line));
        assert_eq!(
            at(forward),
            Some(("Model.layer".to_string(), line_of("block = self.allocator.standin_caching_malloc(256 << 10)")))
        );
        let backward = events.iter().find(|e| e.pid == pid && e.size == 20 << 20).unwrap();
        if via_shim {
            // The shim reads only the calling thread's own frames (no other thread's, without
            // the interpreter's lock): the module that called the driver.
            assert_eq!((backward.stack.is_empty(), backward.stack_origin), (true, None));
        } else {
            assert_eq!(backward.stack_origin, Some(gpuprof_model::event::StackOrigin::BackwardCaller));
            let frames: Vec<(String, u32)> =
                backward.stack.frames().iter().take(2).map(|f| (f.function.clone(), f.line)).collect();
            assert_eq!(
                frames,
                [
                    ("backward pass".to_string(), 0),
                    ("train_step".to_string(), line_of("model.torch.gpuprof_standin_backward()"))
                ]
            );
        }
    }
}
