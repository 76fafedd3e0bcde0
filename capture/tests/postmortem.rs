//! Post-mortems against the libcuda stand-in: a node daemon at its defaults (the driver's calls),
//! with a short window, follows a Python job that allocates for longer than the window and then
//! runs out of memory. The oom finding names the post-mortem; the recording starts no earlier
//! than the window before the failure, opens with what the job held, and its replay holds at the
//! failure exactly what the job held; the HTML page, opened in headless Chromium, shows the
//! out-of-memory finding and says which part of the window has tensor detail; the collector
//! serves the same page for the finding; the directory's retention deletes an old post-mortem.
//! A PyTorch-like job (the libc10 stand-ins) whose device fills up is raised to its tensors
//! before it fails: its post-mortem's page says from when it has tensor detail, and why.

// A test reads as one scenario from start to end, so it may run past the length limit on functions.
#![allow(clippy::too_many_lines)]

use std::io::{BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use gpuprof_model::event::{Event, Kind, Layer, Op};
use gpuprof_model::Tracker;
use gpuprof_testkit::collector::Collector;
use gpuprof_testkit::daemon::{one_daemon_at_a_time, Daemon};
use gpuprof_testkit::*;
use serde_json::{json, Value};

const S: u64 = 1_000_000_000;
const MIB: u64 = 1 << 20;

fn read(path: &Path) -> Vec<Event> {
    let mut file = gpuprof_recording::EventFile::open(path).unwrap();
    std::iter::from_fn(|| file.next_event().unwrap()).collect()
}

/// `YYYYmmdd-HHMMSS` of `ts` (ns) in UTC, as post-mortems are named.
fn utc(ts: u64) -> String {
    let output =
        Command::new("date").args(["-u", "-d", &format!("@{}", ts / S), "+%Y%m%d-%H%M%S"]).output_within(PATIENCE);
    String::from_utf8(output.stdout).unwrap().trim().to_string()
}

/// An old post-mortem left in the directory, last written `age` ago.
fn old_postmortem(dir: &Path, stem: &str, age: Duration) {
    for extension in ["gpuprof", "html"] {
        let path = dir.join(format!("{stem}.{extension}"));
        std::fs::write(&path, b"from an earlier day").unwrap();
        std::fs::File::options().write(true).open(&path).unwrap().set_modified(SystemTime::now() - age).unwrap();
    }
}

/// The job (`postmortem_oom.py 8 <256 MiB> [args]`) on a device of 256 MiB; returns it and its pid
/// once it ran out of memory.
fn start_job(dir: &Path, args: &[&str]) -> (Child, u32) {
    let mut command = Command::new(python3());
    command.arg(workloads().join("postmortem_oom.py")).args(["8", &(256 * MIB).to_string()]).args(args);
    workload_env(&mut command, &dir.join("workload.jsonl"));
    command.env("GPUPROF_STANDIN_DEVICE_MEMORY", (256 * MIB).to_string());
    command.env("GPUPROF_LIBC10_CUDA", libc10_cuda_standin());
    let mut job = command.stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
    let mut stdout = BufReader::new(job.stdout.take().unwrap());
    let line = line_within(&mut stdout, READY_LIMIT, "the workload's \"ready PID\"");
    let pid = line.strip_prefix("ready ").and_then(|p| p.trim().parse().ok()).unwrap_or_else(|| panic!("{line:?}"));
    assert_eq!(line_within(&mut stdout, Duration::from_secs(60), "the workload's \"oom\"").trim(), "oom");
    (job, pid)
}

/// The oom finding of `pid`, once it reached the collector.
fn oom_at_the_collector(collector: &Collector, pid: u32) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(finding) = collector.findings("?node=pm-node&kind=oom").into_iter().find(|f| f["pid"] == pid) {
            return finding;
        }
        assert!(Instant::now() < deadline, "no oom finding of pid {pid} at the collector");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Lets the job give everything back and exit.
fn finish(mut job: Child) {
    job.stdin.take().unwrap().write_all(b"go\n").unwrap();
    assert_eq!(job.wait_within(Duration::from_secs(30), "job").code(), Some(0));
}

#[test]
fn an_out_of_memory_failure_leaves_a_post_mortem_on_the_node_and_at_the_collector() {
    let _node = one_daemon_at_a_time();
    let dir = scratch("postmortem_oom");
    let postmortems = dir.join("postmortems");
    std::fs::create_dir_all(&postmortems).unwrap();
    old_postmortem(&postmortems, "pm-node-1-python3-oom-20200101-000000", Duration::from_secs(8 * 86400));
    let collector = Collector::start(&dir.join("c.redb"), &[]);
    let libcuda = standin_dir().join("libcuda.so.1");
    let daemon = Daemon::start(&[
        "--otlp-endpoint",
        &collector.grpc,
        "--node-name",
        "pm-node",
        "--libcuda",
        libcuda.to_str().unwrap(),
        "--postmortem-dir",
        postmortems.to_str().unwrap(),
        "--postmortem-window",
        "5",
    ]);
    assert!(
        daemon.started.contains(&format!("; post-mortems of the last 5 s in {}", postmortems.display())),
        "{}",
        daemon.started
    );
    // The retention (7 days by default) took the one of 8 days ago at the start.
    daemon.wait_for("gpuprof_daemon_postmortems_deleted_total", 1, Duration::from_secs(10));
    assert!(!postmortems.join("pm-node-1-python3-oom-20200101-000000.html").exists());

    // 8 s of churn, then 256 MiB asked of a 256 MiB device that already holds 64.
    let (job, pid) = start_job(&dir, &[]);
    // The finding reached the collector naming its post-mortem.
    let finding = oom_at_the_collector(&collector, pid);
    let finding_id = finding["finding_id"].as_str().unwrap().to_string();
    let postmortem = &finding["postmortem"];
    let (start, end) = (postmortem["window_start"].as_u64().unwrap(), postmortem["window_end"].as_u64().unwrap());
    assert_eq!(end - start, 5 * S, "the job ran longer than the window");
    let stem = format!("pm-node-{pid}-python3-oom-{}", utc(end));
    let recording = postmortems.join(format!("{stem}.gpuprof"));
    let report = postmortems.join(format!("{stem}.html"));
    assert_eq!(
        *postmortem,
        json!({
            "node": "pm-node",
            "recording": recording.display().to_string(),
            "report": report.display().to_string(),
            "window_start": start,
            "window_end": end,
            "url": format!("/api/v1/findings/{finding_id}/report"),
            "pids": [pid],
        })
    );

    // The files appear once written, the report sent on to the collector.
    daemon.wait_for("gpuprof_daemon_postmortems_written_total", 1, Duration::from_secs(30));
    let events = read(&recording);
    assert!(events.iter().all(|e| e.pid == pid && e.ts >= start && e.ts <= end));
    // It opens at the window's start with what the job held then: its context, the buffers kept
    // (the 8 MiB one freed inside the window among them) and the pinned memory, at their lines.
    let prologue: Vec<(Op, Option<Kind>, u64, u64, String)> = events
        .iter()
        .take_while(|e| e.ts == start)
        .map(|e| {
            let line = e
                .stack
                .iter()
                .find(|f| f.file.ends_with("postmortem_oom.py"))
                .map(|f| format!("{}:{}", f.function, f.line));
            (e.op, e.kind, e.size, e.ts, line.unwrap_or_default())
        })
        .collect();
    assert_eq!(
        prologue,
        [
            (Op::CtxCreate, None, 0, start, String::new()),
            (Op::Alloc, Some(Kind::Device), 64 * MIB, start, "keep:29".to_string()),
            (Op::Alloc, Some(Kind::Device), 8 * MIB, start, "early:35".to_string()),
            (Op::Alloc, Some(Kind::HostPinned), 2 * MIB, start, "pinned:41".to_string()),
        ]
    );
    let early_free = events
        .iter()
        .find(|e| e.op == Op::Free && e.stack.iter().any(|f| f.file.ends_with("postmortem_oom.py") && f.line == 96))
        .unwrap();
    assert!(early_free.ts > start && early_free.ts < end);
    // The window: 1 MiB handed out and taken back every 50 ms (about 5 s of it), then the failure.
    let churn = events.iter().filter(|e| e.op == Op::Alloc && e.size == MIB).count();
    assert!((50..=100).contains(&churn), "{churn} churn allocations in 5 s");
    let failure = events.last().unwrap();
    assert_eq!((failure.op, failure.size, failure.result, failure.ts), (Op::Alloc, 256 * MIB, 2, end));
    assert!(failure.stack.iter().any(|f| f.function == "oom" && f.line == 53), "{:?}", failure.stack.frames());
    // Replayed to its end, the recording holds what the job held at the failure, to the byte.
    let mut tracker = Tracker::new();
    for event in &events {
        tracker.apply(event);
    }
    let held = tracker.process(pid).unwrap().summary();
    let bytes = |kind| held.by_kind.get(&kind).map(|t| (t.bytes, t.count));
    assert_eq!(
        (bytes(Kind::Device), bytes(Kind::HostPinned), held.contexts),
        (Some((64 * MIB, 1)), Some((2 * MIB, 1)), 1)
    );

    // The page shows the failure as its out-of-memory finding, and says what its window is.
    let page = browse_report(
        &report,
        json!([
            {"eval": "[...document.querySelectorAll('#findings tbody tr')].map(r => [r.dataset.kind, Number(r.dataset.pid), Number(r.dataset.bytes)])"},
            {"eval": "[...document.querySelectorAll('#notes li')].map(li => li.textContent)"},
            {"eval": "document.querySelector('#findings tbody tr').textContent"},
        ]),
    );
    let results = page["results"].as_array().unwrap();
    assert_eq!(results[0], json!([["oom", pid, 256 * MIB]]));
    let notes = results[1].as_array().unwrap();
    assert!(
        notes[0].as_str().unwrap().starts_with(&format!(
            "Post-mortem of the oom of pid {pid} (python3) on node pm-node: the last 5.0 s before it ("
        )),
        "{notes:?}"
    );
    assert!(notes[0].as_str().unwrap().ends_with("It opens with what each process held then, made earlier: 3 driver allocations and mappings and 0 tensors, stamped at its first instant."), "{notes:?}");
    assert_eq!(notes[1], format!("pid {pid} (python3): no tensor detail in this window, the driver's calls only (the daemon records every tensor while a process's memory grows, its device is nearly full or it ran out, or when asked: docs/levels.md)."));
    let row = results[2].as_str().unwrap();
    assert!(
        row.contains(&format!("cuMemAlloc_v2 of 256.0 MiB failed with out of memory in pid {pid} (python3)")),
        "{row}"
    );

    // The collector serves the same page, by the finding's id and by its own number.
    let html = std::fs::read(&report).unwrap();
    let served = |id: &str| {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let (status, body) = collector.get_bytes(&format!("/api/v1/findings/{id}/report"));
            if status == 200 || Instant::now() > deadline {
                break (status, body);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    assert!(served(&finding_id) == (200, html.clone()), "the collector's page differs from {}", report.display());
    assert!(served(&finding["id"].to_string()) == (200, html.clone()));
    let (status, body) = collector.get("/api/v1/findings/00000000000000aa/report");
    assert_eq!((status, body.as_str()), (404, r#"{"error":"no post-mortem report of finding 00000000000000aa"}"#));
    assert_eq!(collector.metric("gpuprof_collector_received_postmortems_total"), 1);

    finish(job);
    let metrics = daemon.metrics();
    assert_eq!(
        (metrics["gpuprof_daemon_postmortems_written_total"], metrics["gpuprof_daemon_postmortems_failed_total"]),
        (1, 0)
    );
    let said = daemon.stop();
    assert!(said.contains("post-mortem reports among the log records"), "{said}");
}

/// A PyTorch-like job fills its device, asks the driver how much is free, and fails 3 s later:
/// the daemon raised it to its tensors when its device was nearly full, and the post-mortem's
/// page says that its window has tensor detail from then to the failure, and why.
#[test]
fn a_post_mortem_says_which_part_of_its_window_has_tensor_detail_and_why() {
    let _node = one_daemon_at_a_time();
    let dir = scratch("postmortem_tensors");
    let postmortems = dir.join("postmortems");
    let collector = Collector::start(&dir.join("c.redb"), &[]);
    let libcuda = standin_dir().join("libcuda.so.1");
    let daemon = Daemon::start(&[
        "--otlp-endpoint",
        &collector.grpc,
        "--node-name",
        "pm-node",
        "--libcuda",
        libcuda.to_str().unwrap(),
        "--postmortem-dir",
        postmortems.to_str().unwrap(),
        "--postmortem-window",
        "5",
    ]);
    let (job, pid) = start_job(&dir, &["tensors"]);
    let raised = daemon.wait_for_line(&format!("pid {pid}: capturing tensors for 120 s"), Duration::from_secs(5));
    assert!(raised.contains("(device 0 has 24.0 MiB free of 256.0 MiB)"), "{raised}");
    let finding = oom_at_the_collector(&collector, pid);
    let report = finding["postmortem"]["report"].as_str().unwrap().to_string();
    daemon.wait_for("gpuprof_daemon_postmortems_written_total", 1, Duration::from_secs(30));
    let page = browse_report(
        Path::new(&report),
        json!([{"eval": "[...document.querySelectorAll('#notes li')].map(li => li.textContent)"}]),
    );
    let notes = page["results"][0].as_array().unwrap();
    // Raised 3 s before the failure (the window's 2.0 s); its tensors come with its next step.
    let detail = notes[1].as_str().unwrap();
    let from = detail
        .strip_prefix(&format!("pid {pid} (python3): tensor detail ("))
        .and_then(|rest| rest.split(" allocator events) from ").nth(1))
        .unwrap_or_else(|| panic!("{notes:?}"));
    let (first, rest) = from.split_once(" s to the failure at 5.0 s of the window (raised at ").unwrap();
    let (raise, why) = rest.split_once(" s: ").unwrap();
    let (first, raise): (f64, f64) = (first.parse().unwrap(), raise.parse().unwrap());
    assert!((1.5..=2.5).contains(&raise) && first >= raise && first - raise < 0.5, "{detail}");
    assert_eq!(why, "device 0 has 24.0 MiB free of 256.0 MiB).");
    // The recording has those tensors, each at the line that makes it.
    let events = read(Path::new(finding["postmortem"]["recording"].as_str().unwrap()));
    let tensors: Vec<&Event> = events.iter().filter(|e| e.layer == Layer::Allocator).collect();
    assert!(tensors.len() >= 40, "{} allocator events in the last 3 s", tensors.len());
    // Handed out at line 63, taken back at 64.
    let lines = |e: &Event| (e.op, e.stack.frames()[0].function.clone(), e.stack.frames()[0].line);
    let step = |op, line| (op, "step".to_string(), line);
    assert!(tensors.iter().all(|e| lines(e) == step(Op::Alloc, 63) || lines(e) == step(Op::Free, 64)));
    finish(job);
    daemon.stop();
}
