//! gpuprof's in-process shim (libgpuprof_shim.so) without a GPU: preloaded into programs without
//! libcuda or PyTorch it changes nothing; preloaded into a Python workload whose toy caching
//! allocator reports through stand-ins of libc10_cuda and libc10 (the same exported names and
//! ABI as PyTorch's), every report becomes exactly the event the workload expects, with its
//! Python stack, and still reaches libc10; the driver's memory entry points, watched through the
//! CUPTI stand-in's callbacks, become exactly the driver events the workload expects, cross-checked
//! with CUPTI's activity records; without CUPTI (none installed, or its one slot held by a
//! profiler) that is said once and the allocator path goes on; with no agent the events go to the
//! file named by GPUPROF_SHIM_OUTPUT, and a process may wait for its own to be written there
//! (`gpuprof_shim_flush`); a burst of 500,000 reports reaches the agent whole, the calling thread
//! waiting for room when the queue is full; only an agent that stops reading makes the queue
//! drop (counted); the process switches its own capture level and the events stop and resume
//! exactly there.

use std::os::unix::net::UnixListener;
use std::path::Path;
use std::process::{Command, Output};

use gpuprof_model::event::{Layer, Op, Source};
use gpuprof_testkit::*;
use serde_json::Value;

fn run(command: &mut Command) -> Output {
    command.output_within(PATIENCE)
}

fn preloaded(program: &str, args: &[&str]) -> Command {
    let mut command = Command::new(program);
    command.args(args).env("LD_PRELOAD", shim_library());
    command
}

#[test]
fn the_shim_changes_nothing_in_programs_without_cuda() {
    let dir = scratch("shim_unharmed");
    let script = "import sys; print('hello from', sys.argv[1]); sys.stderr.write('to stderr\\n'); sys.exit(3)";
    let plain = run(Command::new(python3()).args(["-c", script, "x"]));
    let output = dir.join("never.jsonl");
    for mut command in [
        preloaded(python3(), &["-c", script, "x"]),
        // As an injection library too: without libcuda nothing ever calls it.
        {
            let mut c = Command::new(python3());
            c.args(["-c", script, "x"]).env("CUDA_INJECTION64_PATH", shim_library());
            c
        },
    ] {
        let shimmed = run(command.env("GPUPROF_SHIM_OUTPUT", &output));
        assert_eq!(shimmed.status.code(), Some(3));
        assert_eq!(
            (shimmed.stdout.as_slice(), shimmed.stderr.as_slice()),
            (plain.stdout.as_slice(), plain.stderr.as_slice())
        );
    }
    assert_eq!(plain.stdout, b"hello from x\n");
    // A C program that fails to load libcuda (none on the library path): the same failure.
    let worker = churn_worker_program().to_str().unwrap();
    let plain = run(Command::new(worker).args(["0", "4096"]).env("LD_LIBRARY_PATH", "/nonexistent"));
    let shimmed = run(preloaded(worker, &["0", "4096"]).env("LD_LIBRARY_PATH", "/nonexistent"));
    assert_eq!(plain.status.code(), Some(2));
    assert_eq!(
        (shimmed.status.code(), shimmed.stdout, shimmed.stderr),
        (plain.status.code(), plain.stdout, plain.stderr)
    );
    assert!(!output.exists(), "nothing was captured, so nothing was written");
}

/// A code object freed and another made at its address (functions made at run time): every
/// report is attributed to the function that made it, not to the address's earlier occupant.
#[test]
fn a_code_object_at_a_reused_address_is_described_again() {
    let dir = scratch("shim_code_reuse");
    let events = dir.join("events.jsonl");
    let output = run(&mut shimmed(
        &[workloads().join("shim_code_reuse.py").to_str().unwrap(), "200"],
        &dir.join("log"),
        &events,
    ));
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
    let mut lines = stdout.lines();
    let reused: u32 = lines.next().unwrap().strip_prefix("reused ").unwrap().parse().unwrap();
    assert!(reused > 10, "CPython reused only {reused} addresses: the test shows nothing");
    let expected: Vec<(String, String)> =
        lines.map(|l| l.split_once(' ').map(|(a, f)| (a.to_string(), f.to_string())).unwrap()).collect();
    let captured: Vec<(String, String)> = read_events(&events)
        .iter()
        .filter(|e| e.layer == Layer::Allocator)
        .map(|e| (gpuprof_model::hex::format_addr(e.addr.unwrap()), e.stack[0].function.clone()))
        .collect();
    assert_eq!(captured.len(), 200);
    assert_eq!(captured, expected);
}

/// A forked worker that reports blocks and ends with `os._exit` (no exit handlers run, as
/// multiprocessing and DataLoader workers end): its reports, made right before, and its exit are
/// all sent — the shim's `_exit` sends the queue first.
#[test]
fn a_worker_ending_with_os_exit_loses_nothing() {
    let dir = scratch("shim_os_exit");
    let events = dir.join("events.jsonl");
    let output =
        run(&mut shimmed(&[workloads().join("shim_os_exit.py").to_str().unwrap(), "50"], &dir.join("log"), &events));
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
    let child: u32 = stdout.trim().strip_prefix("child ").unwrap().parse().unwrap();
    let captured = read_events(&events);
    let of_child: Vec<(Layer, Op, u64)> =
        captured.iter().filter(|e| e.pid == child).map(|e| (e.layer, e.op, e.addr.unwrap_or(0))).collect();
    let mut expected = vec![(Layer::Process, Op::Fork, 0)];
    expected.extend((0..50u64).map(|i| (Layer::Allocator, Op::Alloc, 0x7f00_0000_0000 + i * 512)));
    expected.push((Layer::Process, Op::Exit, 0));
    assert_eq!(of_child, expected);
}

/// A process that reads its own events (the pytest plugin) calls `gpuprof_shim_flush`: when it
/// returns, every report made before it is in the file, none left in the queue.
#[test]
fn a_flush_returns_once_every_queued_report_is_written() {
    let dir = scratch("shim_flush");
    let events = dir.join("events.jsonl");
    let output =
        run(&mut shimmed(&[workloads().join("shim_flush.py").to_str().unwrap(), "3000"], &dir.join("log"), &events));
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
    assert_eq!(String::from_utf8_lossy(&output.stdout), "before 0\nflushed 0, lines 3000\n");
    let captured = read_events(&events);
    let addrs: Vec<u64> = captured.iter().filter(|e| e.layer == Layer::Allocator).map(|e| e.addr.unwrap()).collect();
    assert_eq!(addrs, (0..3000u64).map(|i| 0x7f00_0000_0000 + i * 512).collect::<Vec<_>>());
    assert_eq!((captured.len(), captured.last().unwrap().op), (3001, Op::Exit));
}

/// The driver calls a workload expects (the allocator's reports left out).
fn expected_driver_calls(expected: &[Value]) -> Vec<Value> {
    expected_calls(expected).into_iter().filter(|e| e["layer"] != "allocator").collect()
}

/// every_entry_point.py with the shim preloaded over the libcuda and libcupti stand-ins;
/// returns (expected, events, stderr).
fn shimmed_entry_points(dir: &Path, env: &[(&str, &str)]) -> (Vec<Value>, Vec<gpuprof_model::Event>, String) {
    shimmed_workload(dir, &workloads().join("every_entry_point.py"), env)
}

/// Preloaded, the shim has the driver inject it at cuInit, subscribes to CUPTI's callbacks for
/// the memory entry points, and turns each call — successes and failures, outputs read at exit,
/// IPC handles, the Python line that made it — into exactly the event eBPF capture makes of it.
/// CUPTI's memory activity records count the same allocations and releases.
#[test]
fn cupti_callbacks_capture_every_driver_entry_point_exactly() {
    let dir = scratch("shim_cupti_entry_points");
    let (expected, events, stderr) = shimmed_entry_points(&dir, &[]);
    assert_eq!(stderr, "", "the activity records agree with the callbacks: nothing to say");
    let calls = expected_driver_calls(&expected);
    assert_eq!(calls.len(), 67);
    let captured = driver_events(&events);
    assert_same_calls_from(&calls, &captured, Source::Shim);
    assert!(captured.iter().all(|e| e.duration_ns.is_some() && &*e.comm == "python3"));
    assert_eq!((events.len(), events.last().unwrap().op), (68, Op::Exit));

    // CUPTI dropped two records (out of buffer space): the cross-check says so at exit.
    let dir = scratch("shim_cupti_cross_check");
    let (_, events, stderr) = shimmed_entry_points(&dir, &[("GPUPROF_STANDIN_CUPTI_LOSE", "2")]);
    assert_eq!(driver_events(&events).len(), 67, "the callbacks lost nothing");
    let pid = events[0].pid;
    assert_eq!(
        stderr,
        format!(
            "gpuprof shim: pid {pid}: CUPTI cross-check (callbacks vs activity records): device and managed allocations 11 vs 10, releases 13 vs 12; 2 records dropped by CUPTI\n"
        )
    );
}

/// A profiler that subscribes to CUPTI after the shim (as PyTorch's does, binding
/// `cuptiSubscribe` by name) gets the process's one slot handed over — its traces are not lost
/// to gpuprof — and when it unsubscribes the shim takes the slot back: the calls made meanwhile
/// are the only ones not captured in-process, and each hand-over is said once.
#[test]
fn a_profiler_subscribing_later_gets_cupti_and_the_shim_takes_it_back_after() {
    let dir = scratch("shim_cupti_handover");
    let (log, events) = (dir.join("expected.jsonl"), dir.join("events.jsonl"));
    let output = run(shimmed(&[workloads().join("cupti_profiler.py").to_str().unwrap()], &log, &events)
        .env("GPUPROF_SHIM_REPORT", "1"));
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    let expected = read_expected(&log);
    let profiled = expected.iter().find(|e| e["op"] == "note").unwrap()["profiled"].as_str().unwrap().to_string();
    let calls: Vec<Value> = expected_driver_calls(&expected)
        .into_iter()
        .filter(|e| !(e["api"] == "cuMemAlloc_v2" && e["addr"] == profiled.as_str()))
        .collect();
    let captured = read_events(&events);
    assert_same_calls_from(&calls, &driver_events(&captured), Source::Shim);
    assert_eq!(calls.iter().filter(|e| e["api"] == "cuMemFree_v2").count(), 2);
    let pid = captured[0].pid;
    let said: Vec<&str> = stderr.lines().collect();
    assert_eq!(said.len(), 3, "{stderr}");
    assert_eq!(said[0], format!("gpuprof shim: pid {pid}: a profiler subscribed to CUPTI: gpuprof handed it the process's only slot; driver calls are not captured in-process until it unsubscribes (allocator events go on)"));
    assert_eq!(said[1], format!("gpuprof shim: pid {pid}: the other CUPTI subscriber let go: gpuprof captures driver calls in-process again"));
    // The counters: subscribed at the end; the cross-check spans a hand-over, so it compares nothing.
    let counters: Value = serde_json::from_str(said[2]).unwrap();
    assert_eq!(counters["gpuprof_shim"]["cupti"], "subscribed");
    assert_eq!(counters["gpuprof_shim"]["cupti_cross_check"]["interrupted"], true);
    assert_eq!(counters["gpuprof_shim"]["cupti_cross_check"]["agrees"], true);
}

/// Where CUPTI cannot watch the driver — no libcupti installed, or a profiler already holding
/// the process's one subscriber slot — the shim says so once, on stderr, and every allocator
/// report is still an event.
#[test]
fn without_cupti_the_shim_says_why_once_and_the_allocator_path_goes_on() {
    let no_library = standin_dir_without_cupti().to_str().unwrap();
    let held_by = workloads().join("cupti_held.py");
    for (case, env) in [("shim_no_cupti", vec![("LD_LIBRARY_PATH", no_library)]), ("shim_cupti_held", vec![])] {
        let dir = scratch(case);
        let (expected, events, stderr) = if case == "shim_cupti_held" {
            shimmed_workload(&dir, &held_by, &env)
        } else {
            shimmed_tensors(&dir, &env)
        };
        let pid = pid_of_role(&expected, "parent");
        let why = if case == "shim_no_cupti" {
            "no libcupti (loaded, $GPUPROF_CUPTI, beside libcudart, $CUDA_HOME, /usr/local/cuda, the loader's path): set GPUPROF_CUPTI=/path/to/libcupti.so"
        } else {
            "another CUPTI subscriber (a profiler: PyTorch's, Nsight) holds this process's only slot; allocator events go on"
        };
        assert_eq!(
            stderr,
            format!("gpuprof shim: pid {pid}: driver calls are not captured in-process: {why}\n"),
            "{case}"
        );
        let blocks = expected_blocks(&expected);
        let captured: Vec<&gpuprof_model::Event> = events.iter().filter(|e| e.layer == Layer::Allocator).collect();
        assert_same_calls_from(&blocks, &captured, Source::Shim);
        assert_eq!(driver_events(&events).len(), 0, "{case}");
    }
}

/// tensors.py through the stand-ins with the shim preloaded; returns (expected, events, stderr).
fn shimmed_tensors(dir: &Path, env: &[(&str, &str)]) -> (Vec<Value>, Vec<gpuprof_model::Event>, String) {
    shimmed_workload(dir, &workloads().join("tensors.py"), env)
}

/// A workload that logs what it expects, with the shim preloaded over the stand-ins; returns
/// (expected, events, stderr).
fn shimmed_workload(
    dir: &Path,
    script: &Path,
    env: &[(&str, &str)],
) -> (Vec<Value>, Vec<gpuprof_model::Event>, String) {
    let (log, events) = (dir.join("expected.jsonl"), dir.join("events.jsonl"));
    let mut command = shimmed(&[script.to_str().unwrap()], &log, &events);
    command.envs(env.iter().copied());
    let output = run(&mut command);
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    (read_expected(&log), read_events(&events), stderr)
}

/// `python3 script args…` with the shim preloaded over the stand-ins (libcuda, libcupti, libc10,
/// libc10_cuda), the workload's log to `log`, the shim's events to `events`.
fn shimmed(script_and_args: &[&str], log: &Path, events: &Path) -> Command {
    let mut command = preloaded(python3(), script_and_args);
    workload_env(&mut command, log);
    command.env("GPUPROF_LIBC10_CUDA", libc10_cuda_standin()).env("GPUPROF_SHIM_OUTPUT", events);
    command
}

#[test]
fn every_allocator_report_is_an_event_with_its_python_stack_and_still_reaches_libc10() {
    let dir = scratch("shim_tensors");
    let (expected, events, stderr) = shimmed_tensors(&dir, &[]);
    assert_eq!(stderr, "");
    let pid = pid_of_role(&expected, "parent");
    // The workload's CPU report is not a CUDA block: not recorded, but forwarded like the rest.
    let blocks = expected_blocks(&expected);
    let captured: Vec<&gpuprof_model::Event> = events.iter().filter(|e| e.layer == Layer::Allocator).collect();
    assert!(blocks.len() > 20, "{}", blocks.len());
    assert_same_calls_from(&blocks, &captured, Source::Shim);
    for event in &captured {
        assert_eq!((event.pid, &*event.comm), (pid, "python3"));
    }
    // The segments under the blocks, through CUPTI's callbacks: cuMemAlloc_v2 and cuMemFree_v2.
    let segments = expected_driver_calls(&expected);
    assert_eq!(segments.iter().filter(|e| e["api"] == "cuMemAlloc_v2").count(), 3);
    assert_same_calls_from(&segments, &driver_events(&events), Source::Shim);
    // The process's exit closes it.
    let exit = events.last().unwrap();
    assert_eq!((exit.layer, exit.op, exit.pid), (Layer::Process, Op::Exit, pid));
    let forwarded = expected.iter().find(|e| e["role"] == "libc10").unwrap()["reports"].as_u64().unwrap();
    assert_eq!(forwarded, blocks.len() as u64 + 1, "libc10 got every report, the CPU one included");
}

#[test]
fn with_no_agent_the_events_go_to_the_file_and_a_full_queue_is_counted() {
    let dir = scratch("shim_no_agent");
    let missing = dir.join("no-agent.sock");
    let (expected, events, stderr) = shimmed_tensors(&dir, &[("GPUPROF_SHIM_SOCKET", missing.to_str().unwrap())]);
    assert!(stderr.starts_with(&format!("gpuprof shim: no agent at {} (", missing.display())), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    let blocks = expected.iter().filter(|e| e["layer"] == "allocator").count();
    assert_eq!(events.iter().filter(|e| e.layer == Layer::Allocator).count(), blocks);

    // An agent that accepts and never reads: the sender blocks on the socket, the queue fills,
    // the workload waits for it a second, then goes on (the sender is stalled), and what could
    // not be queued is counted at exit.
    let socket = dir.join("stuck.sock");
    let listener = UnixListener::bind(&socket).unwrap();
    let holder = std::thread::spawn(move || listener.accept().map(|(stream, _)| stream));
    let mut command = preloaded(python3(), &[workloads().join("shim_flood.py").to_str().unwrap(), "60000"]);
    command.env("GPUPROF_LIBC10", libc10_standin()).env("GPUPROF_LIBC10_CUDA", libc10_cuda_standin());
    command.env("GPUPROF_SHIM_SOCKET", &socket);
    let started = std::time::Instant::now();
    let output = run(&mut command);
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert_eq!(String::from_utf8_lossy(&output.stdout), "reports 60000\n");
    // "gpuprof shim: pid P: queued Q, dropped D (queue full, the sender stalled); the rest of the
    // queue was not sent in time"
    let numbers: Vec<u64> =
        stderr.split(|c: char| !c.is_ascii_digit()).filter(|s| !s.is_empty()).map(|s| s.parse().unwrap()).collect();
    assert!(
        stderr.contains("(queue full, the sender stalled); the rest of the queue was not sent in time"),
        "{stderr}"
    );
    let (queued, dropped) = (numbers[1], numbers[2]);
    assert!(dropped > 0, "{stderr}");
    // Every report, every code object described and the exit record: queued or dropped.
    assert!(queued + dropped >= 60_001, "{stderr}");
    assert!(started.elapsed() < std::time::Duration::from_secs(30));
    drop(holder);
}

/// The allocator reports the workload expects, without the segment each lies in: segments are
/// the driver's, and the shim alone does not see cuMemAlloc.
fn expected_blocks(expected: &[Value]) -> Vec<Value> {
    expected
        .iter()
        .filter(|e| e["layer"] == "allocator")
        .map(|e| {
            let mut e = e.clone();
            e.as_object_mut().unwrap().remove("segment");
            e
        })
        .collect()
}

/// `gpuprof run --via shim` with every capability dropped (eBPF capture refuses to start there):
/// no eBPF, the shim found next to gpuprof,
/// events over the run's socket equal to what the workload expects, the same flow as eBPF
/// capture (findings, counters line).
#[test]
fn run_via_shim_captures_without_privileges() {
    shim_library(); // built next to gpuprof, where `run --via shim` looks for it
    let dir = scratch("shim_run");
    let (log, events, findings) = (dir.join("expected.jsonl"), dir.join("events.jsonl"), dir.join("findings.json"));
    let unprivileged = |command: &mut Command| {
        command.args(["--bounding-set=-all", "--inh-caps=-all", "--ambient-caps=-all", "--no-new-privs", "--"]);
    };
    let mut ebpf = Command::new("setpriv");
    unprivileged(&mut ebpf);
    let refused = run(ebpf.arg(gpuprof()).args(["run", "--", "true"]));
    assert_eq!(refused.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&refused.stderr)
        .starts_with("gpuprof: error: missing privileges CAP_BPF, CAP_PERFMON, CAP_SYS_PTRACE"));
    let mut command = Command::new("setpriv");
    unprivileged(&mut command);
    command.arg(gpuprof()).args([
        "run",
        "--via",
        "shim",
        "--stats",
        "--output",
        events.to_str().unwrap(),
        "--findings",
        findings.to_str().unwrap(),
    ]);
    command.arg("--").arg(python3()).arg(workloads().join("tensors.py"));
    workload_env(&mut command, &log);
    command.env("GPUPROF_LIBC10_CUDA", libc10_cuda_standin());
    let output = run(&mut command);
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    let expected = read_expected(&log);
    let pid = pid_of_role(&expected, "parent");
    let blocks = expected_blocks(&expected);
    let segments = expected_driver_calls(&expected);
    let captured = read_events(&events);
    let allocator: Vec<&gpuprof_model::Event> = captured.iter().filter(|e| e.layer == Layer::Allocator).collect();
    assert_same_calls_from(&blocks, &allocator, Source::Shim);
    assert_same_calls_from(&segments, &driver_events(&captured), Source::Shim);
    assert_eq!((captured.last().unwrap().op, captured.last().unwrap().pid), (Op::Exit, pid));
    // Every block was freed before the end: nothing to find.
    assert_eq!(std::fs::read_to_string(&findings).unwrap().trim(), "[]");
    let stats = stderr.lines().find(|l| l.contains("via the shim")).unwrap_or_else(|| panic!("{stderr}"));
    assert_eq!(
        stats,
        format!(
            "gpuprof: {} events from 1 process via the shim; dropped 0 (queue full in the process); waited for room 0 times (0.0 ms in all); stacks cut 0, unresolved 0; undecodable lines 0; refused (naming another process) 0; processes closed out by hanging up 0; CUPTI driver callbacks in 1 (slot held by another subscriber 0, handed to a profiler 0, no libcupti 0, activity cross-check disagreed 0)",
            blocks.len() + segments.len() + 1
        )
    );
}

/// Loaded as the CUDA driver loads an injection library (dlopen, RTLD_LOCAL, after the
/// allocator's libraries; InitializeInjection called, twice): the allocator's already-bound import
/// (full RELRO) is rebound to the shim, so the reports after it are events — each once, with its
/// Python stack — and all of them still reach libc10.
#[test]
fn as_an_injection_library_the_shim_rebinds_the_allocators_import() {
    let dir = scratch("shim_injected");
    let events = dir.join("events.jsonl");
    let output = run(Command::new(python3())
        .arg(workloads().join("shim_injected.py"))
        .arg(shim_library())
        .env("GPUPROF_LIBC10", libc10_standin())
        .env("GPUPROF_LIBC10_CUDA", libc10_cuda_standin())
        .env("GPUPROF_SHIM_OUTPUT", &events));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert_eq!(String::from_utf8_lossy(&output.stdout), "reports 8\ninjected [1, 1]\n");
    let captured = read_events(&events);
    let blocks: Vec<_> = captured.iter().filter(|e| e.layer == Layer::Allocator).collect();
    let addrs: Vec<String> = blocks.iter().map(|e| gpuprof_model::hex::format_addr(e.addr.unwrap())).collect();
    assert_eq!(addrs, ["0x7f0000003000", "0x7f0000004000", "0x7f0000005000", "0x7f0000006000", "0x7f0000007000"]);
    for (i, block) in blocks.iter().enumerate() {
        assert_eq!((block.op, block.size, block.allocated), (Op::Alloc, 4096, Some((4 + i as u64) * 4096)));
        let frames: Vec<(&str, u32)> = block.stack.iter().map(|f| (f.function.as_str(), f.line)).collect();
        assert_eq!(frames, [("report_blocks", 20), ("main", 31), ("<module>", 37)]);
    }
}

/// `run --via shim` over the autograd workload: the shim reads autograd's thread-locals itself
/// (libtorch_cpu's TLS block through the dynamic linker), the run matches them to forward lines:
/// the same nodes and lines as eBPF capture. `--no-autograd` turns it off.
#[test]
fn via_the_shim_backward_blocks_carry_their_node_and_its_forward_line() {
    shim_library();
    let dir = scratch("shim_autograd");
    for off in [false, true] {
        let (log, events) = (dir.join(format!("expected-{off}.jsonl")), dir.join(format!("events-{off}.jsonl")));
        let mut command = Command::new(gpuprof());
        command.args(["run", "--via", "shim", "--output", events.to_str().unwrap()]);
        if off {
            command.arg("--no-autograd");
        }
        command.arg("--").arg(python3()).arg(workloads().join("autograd.py"));
        workload_env(&mut command, &log);
        command.env("GPUPROF_LIBTORCH_CPU", libtorch_cpu_standin());
        let output = run(&mut command);
        assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
        let captured = read_events(&events);
        if !off {
            assert_backward_attribution(&read_expected(&log), &captured);
            continue;
        }
        let blocks: Vec<&gpuprof_model::Event> = captured.iter().filter(|e| e.layer == Layer::Allocator).collect();
        assert_eq!(blocks.len(), 8 + 24);
        assert!(
            blocks.iter().all(|e| e.autograd_seq.is_none() && e.autograd_node.is_none() && e.stack_origin.is_none()),
            "{blocks:#?}"
        );
    }
}

/// Driver calls seen by CUPTI's callbacks name the module that called the driver, as the eBPF
/// probe does: NCCL's stand-in, from the Python thread and from its own.
#[test]
fn via_the_shim_driver_calls_name_the_module_that_made_them() {
    shim_library();
    let dir = scratch("shim_caller_module");
    let (log, events) = (dir.join("expected.jsonl"), dir.join("events.jsonl"));
    let mut command = Command::new(gpuprof());
    command.args(["run", "--via", "shim", "--output", events.to_str().unwrap(), "--", python3(), "-c", NCCL_CALLS]);
    workload_env(&mut command, &log);
    command.env("LD_LIBRARY_PATH", format!("{}:{}", standin_dir().display(), nccl_standin_dir().display()));
    let output = run(&mut command);
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
    let pid = read_expected(&log).last().unwrap()["pid"].as_u64().unwrap() as u32;
    assert_nccl_callers(&read_events(&events), pid);
}

/// With no agent the shim's file carries autograd's numbers and no forward lines; `gpuprof
/// export` (here to jsonl) matches them as the live run does.
#[test]
fn a_shim_file_gets_its_forward_lines_when_exported() {
    let dir = scratch("shim_autograd_file");
    let (log, events, exported) = (dir.join("expected.jsonl"), dir.join("shim.jsonl"), dir.join("exported.jsonl"));
    let mut command = shimmed(&[workloads().join("autograd.py").to_str().unwrap()], &log, &events);
    command.env("GPUPROF_LIBTORCH_CPU", libtorch_cpu_standin());
    let output = run(&mut command);
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
    let raw = read_events(&events);
    let backward: Vec<&gpuprof_model::Event> = raw.iter().filter(|e| e.autograd_node.is_some()).collect();
    assert_eq!(backward.len(), 24);
    assert!(backward.iter().all(|e| e.stack.is_empty() && e.stack_origin.is_none()), "{backward:#?}");
    let export = run(Command::new(gpuprof()).args([
        "export",
        "--format",
        "jsonl",
        "--input",
        events.to_str().unwrap(),
        "--output",
        exported.to_str().unwrap(),
    ]));
    assert_eq!(export.status.code(), Some(0), "{}", String::from_utf8_lossy(&export.stderr));
    assert_backward_attribution(&read_expected(&log), &read_events(&exported));
}

/// The process switches its level between reports (`gpuprof_shim_set_level`): recorded at
/// tensors, not while off or at driver, recorded again at tensors, each report forwarded
/// whatever the level.
#[test]
fn the_switch_stops_and_resumes_recording_exactly_where_the_process_sets_it() {
    let dir = scratch("shim_switch");
    let events_path = dir.join("events.jsonl");
    let mut command = preloaded(python3(), &[workloads().join("shim_levels.py").to_str().unwrap(), "self"]);
    command
        .env("GPUPROF_LIBC10", libc10_standin())
        .env("GPUPROF_LIBC10_CUDA", libc10_cuda_standin())
        .env("GPUPROF_SHIM_OUTPUT", &events_path);
    let output = run(&mut command);
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    // The level before each switch: tensors (the default), off, driver.
    assert_eq!(String::from_utf8_lossy(&output.stdout), "switched 2\nswitched 0\nswitched 1\nforwarded 400\ndone\n");
    let events = read_events(&events_path);
    let blocks: Vec<&gpuprof_model::Event> = events.iter().filter(|e| e.layer == Layer::Allocator).collect();
    let numbers: Vec<u64> = blocks.iter().map(|e| (e.addr.unwrap() - 0x7f00_0000_0000) / 4096).collect();
    let expected: Vec<u64> = (0..100).chain(300..400).collect();
    assert_eq!(numbers, expected);
    for block in &blocks {
        assert_eq!((block.op, block.size, block.source), (Op::Alloc, 4096, Source::Shim));
        let frame = &block.stack.frames()[0];
        assert_eq!((frame.function.as_str(), frame.line), ("hundred", 32), "{:?}", block.stack.frames());
        assert!(frame.file.ends_with("shim_levels.py"), "{}", frame.file);
    }
}

/// A job filling the card: 500,000 reports from the allocator's C loop, as fast as it makes them
/// (about 10 a microsecond), 30 Python frames deep, through `run --via shim`: every one arrives —
/// the calling thread waits for room while the queue is full rather than lose one — and every
/// free finds its allocation.
#[test]
fn a_burst_of_500_000_reports_reaches_the_agent_whole() {
    let dir = scratch("shim_burst");
    let recording = dir.join("burst.gpuprof");
    let mut command = Command::new(gpuprof());
    command.args(["run", "--via", "shim", "--stats", "--output", recording.to_str().unwrap(), "--"]);
    command.arg(python3()).arg(workloads().join("shim_burst.py")).args(["500000", "30"]);
    command.env("GPUPROF_LIBC10", libc10_standin()).env("GPUPROF_LIBC10_CUDA", libc10_cuda_standin());
    let output = run(&mut command);
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    // "reports 500000 in S s": what libc10 received, and how long the burst took, waits included.
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(stdout.starts_with("reports 500000 in "), "{stdout}");
    eprintln!("burst: {}", stdout.trim());
    let stats = stderr.lines().find(|l| l.contains("via the shim")).unwrap_or_else(|| panic!("{stderr}"));
    eprintln!("{stats}");
    assert!(
        stats.starts_with("gpuprof: 500001 events from 1 process via the shim; dropped 0 (queue full in the process); waited for room "),
        "{stats}"
    );
    assert!(stats.contains("; stacks cut 0, unresolved 0; undecodable lines 0;"), "{stats}");
    // Every block at its line, and every free after its allocation: nothing live at the end.
    let summary = run(Command::new(gpuprof()).args(["summary", recording.to_str().unwrap(), "-f", "json"]));
    let summary: Value = serde_json::from_slice(&summary.stdout).unwrap();
    let process = &summary["processes"][0];
    assert_eq!(process["allocated"], serde_json::json!({"bytes": 250_000u64 * 4096, "count": 250_000}));
    assert_eq!(process["at_end"], serde_json::json!({"bytes": 0, "count": 0}));
    assert_eq!(process["rows"][0]["where"], "shim_burst.py:17 burst");
    assert_eq!(summary["processes"].as_array().unwrap().len(), 1);
}

/// A driver call names no device; the shim gives each the device of the context it was made
/// under (CUPTI's callback context, `cuCtxGetDevice`), so a sidecar's per-device views hold as
/// the daemon's do.
#[test]
fn driver_calls_carry_the_device_of_their_context() {
    let dir = scratch("shim_two_devices");
    let (_, events, stderr) = shimmed_workload(&dir, &workloads().join("two_devices.py"), &[]);
    assert_eq!(stderr, "");
    let calls: Vec<(&str, u64, Option<i32>)> = driver_events(&events)
        .iter()
        .filter(|e| matches!(e.op, Op::Alloc | Op::Free))
        .map(|e| (&*e.api, e.size, e.device))
        .collect();
    assert_eq!(
        calls,
        [
            ("cuMemAlloc_v2", 1 << 20, Some(0)),
            ("cuMemAlloc_v2", 2 << 20, Some(1)),
            ("cuMemFree_v2", 0, Some(1)),
            ("cuMemFree_v2", 0, Some(0)),
        ]
    );
    // Context creations name theirs from their arguments.
    let contexts: Vec<Option<i32>> =
        driver_events(&events).iter().filter(|e| e.op == Op::CtxCreate).map(|e| e.device).collect();
    assert_eq!(contexts, [Some(0), Some(1)]);
}

/// The agent dies while the job sends (its socket closes after the first 200 KB): the job runs
/// on to its end unharmed — even with SIGPIPE at its default, as in a C program — and the shim
/// says at once that it stopped, then at exit how many events were not recorded.
#[test]
fn an_agent_that_dies_mid_run_leaves_the_job_unharmed_and_what_was_not_recorded_counted() {
    let dir = scratch("shim_agent_dies");
    let socket = dir.join("dying.sock");
    let _ = std::fs::remove_file(&socket);
    let listener = UnixListener::bind(&socket).unwrap();
    let agent = std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().unwrap();
        let mut read = 0;
        let mut buffer = vec![0u8; 65536];
        while read < 200_000 {
            match std::io::Read::read(&mut stream, &mut buffer) {
                Ok(0) | Err(_) => break,
                Ok(n) => read += n,
            }
        }
        read
    });
    let flood = workloads().join("shim_flood.py");
    let script = format!(
        "import signal, sys, runpy; signal.signal(signal.SIGPIPE, signal.SIG_DFL); sys.argv = ['shim_flood.py', '200000']; runpy.run_path({:?}, run_name='__main__')",
        flood.to_str().unwrap()
    );
    let mut command = preloaded(python3(), &["-c", &script]);
    command.env("GPUPROF_LIBC10", libc10_standin()).env("GPUPROF_LIBC10_CUDA", libc10_cuda_standin());
    command.env("GPUPROF_SHIM_SOCKET", &socket).env("PYTHONPATH", workloads());
    let output = run(&mut command);
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert_eq!(String::from_utf8_lossy(&output.stdout), "reports 200000\n");
    assert!(agent.join().unwrap() >= 200_000);
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 2, "{stderr}");
    let pid = lines[0].strip_prefix("gpuprof shim: pid ").unwrap().split(':').next().unwrap();
    assert!(
        lines[0].ends_with(
            ": sending failed (Broken pipe (os error 32)); events from now on are not recorded (the job goes on)"
        ),
        "{stderr}"
    );
    let counted = lines[1].strip_prefix(&format!("gpuprof shim: pid {pid}: ")).unwrap();
    let numbers: Vec<u64> =
        counted.split(|c: char| !c.is_ascii_digit()).filter(|s| !s.is_empty()).map(|s| s.parse().unwrap()).collect();
    let (lost, sent) = (numbers[0], numbers[1]);
    assert_eq!(counted, format!("{lost} events were not recorded after sending failed (the {sent} before were)"));
    // Each report, and the process's exit: sent or counted lost.
    assert!(lost > 0 && sent > 0 && sent + lost >= 200_001, "{stderr}");
}
