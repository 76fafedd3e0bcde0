//! Findings a person acts on, end to end: PyTorch-like jobs (testkit/fixtures/workloads/stories.py,
//! through a miniature torch installed in a site-packages folder) under `gpuprof run` against the
//! libcuda, libc10 and libnvidia-ml stand-ins. Each story gives exactly the findings it should —
//! kind, pid, bytes, severity, the user's line — and none of the noise: one finding per problem,
//! a normal exit is a fact, not a leak; orphaned workers are named and followed; NVML's figure
//! per process is reconciled with what the probes saw.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use gpuprof_model::{Diagnosis, Finding, FindingKind, Frame, Kind, Layer, Severity};
use gpuprof_testkit::collector::Collector;
use gpuprof_testkit::*;
use serde_json::Value;

const MIB: u64 = 1 << 20;
/// What the libcuda stand-in accounts to a context (GPUPROF_STANDIN_CONTEXT_BYTES's default).
const CONTEXT_BYTES: u64 = 512 * MIB;

/// Canonical, as spawned children see their parent's main module.
fn script() -> PathBuf {
    std::fs::canonicalize(workloads().join("stories.py")).unwrap()
}

/// The user's frame at the line of stories.py marked `# line:NAME`, in `function`.
fn user_line(name: &str, function: &str) -> Frame {
    marked_line(&script(), name, function)
}

/// The frame at the line of `script` marked `# line:NAME`, in `function`.
fn marked_line(script: &Path, name: &str, function: &str) -> Frame {
    let source = std::fs::read_to_string(script).unwrap();
    let marker = format!("# line:{name}");
    let line = source
        .lines()
        .position(|l| l.trim_end().ends_with(&marker))
        .unwrap_or_else(|| panic!("no {marker} in {}", script.display())) as u32
        + 1;
    Frame { function: function.into(), file: script.to_str().unwrap().into(), line }
}

fn pids_of_role(expected: &[Value], role: &str) -> Vec<u32> {
    expected
        .iter()
        .filter(|e| e["op"] == "note" && e["role"] == role)
        .map(|e| e["pid"].as_u64().unwrap() as u32)
        .collect()
}

struct Story {
    output: Output,
    stderr: String,
    findings: Vec<Finding>,
    events: PathBuf,
    expected: Vec<Value>,
}

/// `gpuprof run ARGS -- python3 stories.py NAME` writing events to jsonl and findings to JSON.
fn run_story(dir: &Path, name: &str, env: &[(&str, String)], args: &[&str]) -> Story {
    run_script(dir, &script(), name, env, args)
}

/// `gpuprof run ARGS -- python3 SCRIPT NAME`, as `run_story`.
fn run_script(dir: &Path, script: &Path, name: &str, env: &[(&str, String)], args: &[&str]) -> Story {
    let (log, events, findings) = (dir.join("expected.jsonl"), dir.join("events.jsonl"), dir.join("findings.json"));
    let mut command = Command::new(gpuprof());
    command.args(["run", "--findings", findings.to_str().unwrap()]);
    if !args.contains(&"--output") {
        command.args(["--output", events.to_str().unwrap()]);
    }
    command.args(args).arg("--").arg(python3()).arg(script).arg(name);
    workload_env(&mut command, &log);
    command.env("GPUPROF_STANDIN_NVML_DIR", dir.join("nvml"));
    for (key, value) in env {
        command.env(key, value);
    }
    let output = command.output_within(PATIENCE);
    let stderr = String::from_utf8_lossy(&output.stderr).to_string();
    assert!(stderr.contains(", none lost\n"), "{stderr}");
    let findings =
        serde_json::from_str(&std::fs::read_to_string(&findings).unwrap_or_else(|e| panic!("{e}: {stderr}"))).unwrap();
    Story { output, stderr, findings, events, expected: read_expected(&log) }
}

/// `gpuprof report` on the run's events: the same findings (the moment a time-driven finding
/// was noticed aside: live, the clock; replayed, the next event).
fn assert_report_agrees(story: &Story, rule_args: &[&str]) {
    let report = Command::new(gpuprof())
        .args(["report", "--input", story.events.to_str().unwrap(), "--format", "json"])
        .args(rule_args)
        .output_within(PATIENCE);
    assert_eq!(report.status.code(), Some(0), "{}", String::from_utf8_lossy(&report.stderr));
    let mut reported: Vec<Finding> = serde_json::from_slice(&report.stdout).unwrap();
    let mut live = story.findings.clone();
    for finding in reported.iter_mut().chain(live.iter_mut()) {
        if finding.kind == FindingKind::OrphanHoldingMemory {
            finding.last_ts = 0;
        }
    }
    assert_eq!(reported, live, "report and the live capture disagree");
}

#[test]
fn evaluation_without_no_grad_next_to_a_caching_neighbour_is_one_growth_and_one_oom() {
    let dir = scratch("stories_eval_oom");
    let env = [
        ("GPUPROF_STANDIN_DEVICE_MEMORY", (96 * MIB).to_string()),
        ("GPUPROF_STANDIN_DEVICE_FILE", dir.join("device").to_str().unwrap().to_string()),
    ];
    let rules = ["--growth-window", "0.3"];
    let story = run_story(&dir, "eval-oom", &env, &rules);
    assert_eq!(story.output.status.code(), Some(0), "{}", story.stderr);
    let (parent, neighbour) = (pid_of_role(&story.expected, "parent"), pid_of_role(&story.expected, "neighbour"));
    assert!(story.expected.iter().any(|e| e["oom"] == true), "the evaluation did not run out of memory");
    let kinds: Vec<(FindingKind, u32, Severity)> = story.findings.iter().map(|f| (f.kind, f.pid, f.severity)).collect();
    assert_eq!(
        kinds,
        vec![
            (FindingKind::Growth, parent, Severity::Leak),
            (FindingKind::Oom, parent, Severity::Leak),
            (FindingKind::ExitWithLiveAllocations, neighbour, Severity::Info),
            (FindingKind::ExitWithLiveAllocations, parent, Severity::Info),
        ],
        "{:#?}",
        story.findings
    );
    let forward = user_line("forward", "evaluate");

    // Growth: the tensors of every step's graph, and the segments carrying them, in one finding.
    let growth = &story.findings[0];
    assert_eq!(growth.user_frame.as_ref(), Some(&forward));
    assert_eq!(growth.stack[0].function, "_CachingAllocator.malloc");
    assert_eq!(growth.stack.iter().find(|f| f.function == "evaluate"), Some(&forward));
    let users: Vec<Frame> =
        growth.stacks.iter().map(|s| gpuprof_model::user_frame(&s.stack).unwrap().clone()).collect();
    assert_eq!(users[..2], [forward.clone(), user_line("batch", "evaluate")]);
    let (outputs, batches) = (growth.stacks[0].bytes, growth.stacks[1].bytes);
    // Each step keeps a 4 MiB output and its 2 MiB batch, each in a segment of its own.
    assert!(batches >= 3 * 2 * MIB && batches % (2 * MIB) == 0, "{batches}");
    assert_eq!(outputs, 2 * batches);
    assert_eq!(growth.bytes, growth.stacks.iter().map(|s| s.bytes).sum::<u64>());
    let segments = growth.segment_bytes.unwrap();
    assert!(
        (outputs + batches..=outputs + batches + 2 * MIB).contains(&segments),
        "{segments} for {outputs} + {batches}"
    );
    assert!(
        growth
            .detail
            .contains(&format!("at {}:{} in evaluate (through _CachingAllocator.malloc)", forward.file, forward.line)),
        "{}",
        growth.detail
    );

    // One OutOfMemoryError, two failed cuMemAlloc_v2 (the allocator retried after returning its
    // cache), then the allocator's own report of the request it gave up on: one oom, made of that
    // report. The device: 96 MiB; the neighbour holds 40 (all cached), the evaluation 54 (8 of
    // weights, a 2 MiB segment of small blocks, 7 steps of 6 MiB and the 8th's batch).
    let failed: Vec<(Layer, u64)> = read_events(&story.events)
        .iter()
        .filter(|e| e.pid == parent && e.result == 2)
        .map(|e| (e.layer, e.size))
        .collect();
    assert_eq!(failed, [(Layer::Driver, 4 * MIB), (Layer::Driver, 4 * MIB), (Layer::Allocator, 4 * MIB)]);
    let oom = &story.findings[1];
    assert_eq!((oom.bytes, oom.count, oom.fragmentation), (4 * MIB, 1, false));
    assert_eq!(oom.user_frame.as_ref(), Some(&forward));
    let picture: Vec<(u32, u64, Option<u64>, Option<u64>)> =
        oom.processes.iter().map(|p| (p.pid, p.live[&Kind::Device], p.allocated, p.reserved)).collect();
    // Allocated: weights, 8 batches, 7 outputs, and 13 small blocks of 512 B (7 sums, 6 totals).
    assert_eq!(
        picture,
        vec![
            (parent, 54 * MIB, Some(52 * MIB + 13 * 512), Some(54 * MIB)),
            (neighbour, 40 * MIB, Some(0), Some(40 * MIB))
        ]
    );
    let neighbour_line = user_line("neighbour", "neighbour");
    assert_eq!(
        oom.detail,
        format!(
            "A request of 4.0 MiB to PyTorch's caching allocator failed with out of memory in pid {parent} (python3) at {}:{} in evaluate (through _CachingAllocator.malloc); at that moment gpuprof saw 94.0 MiB of device memory live in the processes it follows (pid {parent} (python3) 54.0 MiB, most at {}:{} in evaluate (through _Driver.alloc); pid {neighbour} (python3) 40.0 MiB, most at {}:{} in neighbour (through _Driver.alloc)): pid {neighbour} (python3) caches 40.0 MiB it does not use, enough on its own: torch.cuda.empty_cache() there would have made room.",
            forward.file, forward.line, forward.file, forward.line, neighbour_line.file, neighbour_line.line
        )
    );
    assert_eq!(oom.diagnosis, Some(Diagnosis::NeighbourCache));

    // Both exit holding only their allocators' segments: facts, with the user's line.
    let (neighbour_exit, parent_exit) = (&story.findings[2], &story.findings[3]);
    assert_eq!((neighbour_exit.bytes, neighbour_exit.count), (40 * MIB, 1));
    assert_eq!(neighbour_exit.user_frame.as_ref(), Some(&user_line("neighbour", "neighbour")));
    assert_eq!(
        neighbour_exit.detail,
        format!("pid {neighbour} (python3) exited still holding 40.0 MiB of device memory in 1 allocation: PyTorch's caching allocator's segments hold 0 B in live tensors and 40.0 MiB cached; the driver takes it back with the process: nothing to do.")
    );
    assert_eq!((parent_exit.bytes, parent_exit.count), (54 * MIB, 17));
    assert!(
        parent_exit
            .detail
            .contains(": PyTorch's caching allocator's segments hold 0 B in live tensors and 54.0 MiB cached;"),
        "{}",
        parent_exit.detail
    );

    // Stable ids: the report of the same events gives the same findings, ids included.
    let ids: std::collections::HashSet<&str> = story.findings.iter().map(|f| f.finding_id.as_str()).collect();
    assert_eq!(ids.len(), 4);
    assert_report_agrees(&story, &rules);
}

#[test]
fn a_training_process_exiting_normally_is_a_fact_and_nvml_is_reconciled() {
    let dir = scratch("stories_exit_normally");
    let collector = Collector::start(&dir.join("collector.redb"), &[]);
    let table = dir.join("table.txt");
    let library_path = format!("{}:{}", standin_dir().display(), nvml_standin_dir().display());
    let story = run_story(
        &dir,
        "exit-normally",
        &[("LD_LIBRARY_PATH", library_path)],
        &[
            "--format",
            "table",
            "--output",
            table.to_str().unwrap(),
            "--otlp-endpoint",
            &collector.grpc,
            "--node-name",
            "story-node",
        ],
    );
    assert_eq!(story.output.status.code(), Some(0), "{}", story.stderr);
    let parent = pid_of_role(&story.expected, "parent");
    let stats = story.expected.iter().find(|e| e.get("reserved").is_some()).unwrap();
    // Weights (8 MiB), a batch (2) and an output (4) segment, reused from the cache each step.
    assert_eq!((stats["allocated"].as_u64(), stats["reserved"].as_u64()), (Some(8 * MIB), Some(14 * MIB)));
    let weights = user_line("train-weights", "exit_normally");

    assert_eq!(story.findings.len(), 1, "{:#?}", story.findings);
    let exit = &story.findings[0];
    assert_eq!(
        (exit.kind, exit.pid, exit.bytes, exit.count, exit.severity),
        (FindingKind::ExitWithLiveAllocations, parent, 14 * MIB, 3, Severity::Info)
    );
    assert_eq!(exit.user_frame.as_ref(), Some(&weights));

    let table = std::fs::read_to_string(&table).unwrap();
    // Event rows name the user's line (the library function that called the driver, after it,
    // does not fit the 120 columns).
    let short = |frame: &Frame| format!("stories.py:{} {}", frame.line, frame.function);
    let rows: Vec<&str> = table.lines().filter(|l| l.contains(" cuMemAlloc_v2 ")).collect();
    assert_eq!(rows.len(), 3, "{table}");
    assert!(rows[0].ends_with(&short(&weights)), "{}", rows[0]);
    assert!(rows[1].ends_with(&short(&user_line("train-batch", "train"))), "{}", rows[1]);
    assert!(rows[2].ends_with(&short(&user_line("train-forward", "train"))), "{}", rows[2]);
    // Live memory by the user's line.
    let by_line = table
        .split("Live GPU memory at end, by the user's line (the innermost frame outside the standard library and installed packages):\n")
        .nth(1)
        .unwrap_or_else(|| panic!("{table}"));
    let by_line: Vec<&str> = by_line.lines().skip(1).take_while(|l| !l.is_empty()).collect();
    let expected_rows: Vec<String> = [
        (8 * MIB, &weights),
        (4 * MIB, &user_line("train-forward", "train")),
        (2 * MIB, &user_line("train-batch", "train")),
    ]
    .iter()
    .map(|(bytes, frame)| {
        format!(
            "{parent:>7} {:<11} {:>10} {:>6}  {}:{} in {}",
            "device",
            gpuprof_model::bytes::human(*bytes),
            1,
            frame.file,
            frame.line,
            frame.function
        )
    })
    .collect();
    assert_eq!(by_line, expected_rows, "{table}");
    // NVML: what the driver accounts to the process is its segments and its context.
    let nvml = table
        .split("NOT PROBED = NVML USED - PROBED CALLS")
        .nth(1)
        .unwrap_or_else(|| panic!("no NVML section in\n{table}"));
    let row =
        nvml.lines().find(|l| l.trim_start().starts_with(&parent.to_string())).unwrap_or_else(|| panic!("{table}"));
    let numbers: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(numbers, [parent.to_string().as_str(), "python3", "526.0", "MiB", "14.0", "MiB", "512.0", "MiB"]);
    assert_eq!((14 * MIB + CONTEXT_BYTES, CONTEXT_BYTES), (526 * MIB, 512 * MIB));
    // The findings list: facts after leaks, the user's line, the id.
    assert!(table.contains(&format!(
        "Findings (0 leaks, 1 info):\n  exit_with_live_allocations [info] pid {parent}: 14.0 MiB in 3 (id {})\n    your line: {}:{} in exit_normally\n",
        exit.finding_id, weights.file, weights.line
    )), "{table}");

    // The collector shows the same reconciliation and the finding as a fact.
    let (status, processes) = collector.get("/api/v1/processes?node=story-node");
    assert_eq!(status, 200);
    let processes: Value = serde_json::from_str(&processes).unwrap();
    let view =
        processes.as_array().unwrap().iter().find(|p| p["pid"] == parent).unwrap_or_else(|| panic!("{processes}"));
    assert_eq!(view["nvml_used_bytes"], 14 * MIB + CONTEXT_BYTES, "{view}");
    assert_eq!(view["not_probed_bytes"], CONTEXT_BYTES, "{view}");
    let (_, findings) = collector.get("/api/v1/findings?node=story-node&severity=leak");
    assert_eq!(findings.trim(), "[]");
    let (_, findings) = collector.get("/api/v1/findings?node=story-node&severity=info");
    let findings: Value = serde_json::from_str(&findings).unwrap();
    assert_eq!(findings.as_array().unwrap().len(), 1, "{findings}");
    assert_eq!(findings[0]["finding_id"], exit.finding_id.as_str(), "{findings}");
    let (_, metrics) = collector.get("/metrics");
    assert!(
        metrics
            .contains("gpuprof_findings{node=\"story-node\",kind=\"exit_with_live_allocations\",severity=\"info\"} 1"),
        "{metrics}"
    );
}

#[test]
fn workers_left_holding_memory_by_a_killed_launcher_are_orphans_and_followed() {
    let dir = scratch("stories_orphans");
    let rules = ["--orphan-grace", "1"];
    let story = run_story(&dir, "orphans", &[], &rules);
    // The launcher's own end: killed.
    assert_eq!(story.output.status.code(), Some(128 + 9), "{}", story.stderr);
    let parent = pid_of_role(&story.expected, "parent");
    let workers = pids_of_role(&story.expected, "worker");
    assert_eq!(workers.len(), 2);
    let line = story
        .stderr
        .lines()
        .find(|l| l.starts_with("gpuprof: the command exited, but "))
        .unwrap_or_else(|| panic!("{}", story.stderr));
    for worker in &workers {
        assert!(line.contains(&format!("pid {worker} (python3) 32.0 MiB and a CUDA context")), "{line}");
    }
    assert!(
        line.contains(&format!("`kill {} {}` ends them", workers[0].min(workers[1]), workers[0].max(workers[1]))),
        "{line}"
    );
    assert!(story.stderr.contains("gpuprof: the processes left behind have exited"), "{}", story.stderr);

    let mut kinds: Vec<(FindingKind, u32, Option<u32>, u64, Severity)> =
        story.findings.iter().map(|f| (f.kind, f.pid, f.peer_pid, f.bytes, f.severity)).collect();
    kinds.sort();
    // One problem, told once: the orphans (their contexts in their findings), the parent's end a
    // fact.
    let mut expected = vec![(FindingKind::ExitWithLiveAllocations, parent, None, 2 * MIB, Severity::Info)];
    for worker in &workers {
        expected.push((FindingKind::ExitWithLiveAllocations, *worker, None, 32 * MIB, Severity::Info));
        expected.push((FindingKind::OrphanHoldingMemory, *worker, Some(parent), 32 * MIB, Severity::Leak));
    }
    expected.sort();
    assert_eq!(kinds, expected, "{:#?}", story.findings);

    let worker_line = user_line("worker", "worker");
    let orphans: Vec<&Finding> = story.findings.iter().filter(|f| f.kind == FindingKind::OrphanHoldingMemory).collect();
    let killed =
        read_events(&story.events).into_iter().find(|e| e.pid == parent && e.op == gpuprof_model::Op::Exit).unwrap();
    assert_eq!(killed.signal, Some(9));
    for orphan in orphans {
        assert_eq!(orphan.user_frame.as_ref(), Some(&worker_line));
        assert_eq!(orphan.first_ts, killed.ts);
        // Noticed once the grace period had passed, while the worker still held its memory.
        assert!(orphan.last_ts >= killed.ts + 1_000_000_000, "{} after {}", orphan.last_ts, killed.ts);
        assert_eq!(
            orphan.detail,
            format!(
                "pid {} (python3) still holds 32.0 MiB of device memory in 1 allocation and a CUDA context after its parent pid {parent} (python3) was killed by signal 9; the largest, 32.0 MiB, came from cuMemAlloc_v2 at {}:{} in worker (through _Driver.alloc): nothing will use it; end it with `kill {} {}`, and make workers end with their parent (daemon=True, a watchdog on os.getppid(), prctl PR_SET_PDEATHSIG).",
                orphan.pid, worker_line.file, worker_line.line, workers[0].min(workers[1]), workers[0].max(workers[1])
            )
        );
    }
    assert_report_agrees(&story, &rules);
}

/// `gpuprof run` with its defaults on a 6-second job of short_jobs.py (the libtorch_cpu
/// stand-in's autograd; NVML's stand-in telling the device's free memory).
/// The job is rank 1 of a distributed job (`RANK=1`), as a torchrun worker is.
fn short_job(mode: &str) -> (Story, u32, PathBuf) {
    let dir = scratch(&format!("stories_short_{mode}"));
    let script = std::fs::canonicalize(workloads().join("short_jobs.py")).unwrap();
    let library_path = format!("{}:{}", standin_dir().display(), nvml_standin_dir().display());
    let env = [
        ("GPUPROF_LIBTORCH_CPU", libtorch_cpu_standin().to_str().unwrap().to_string()),
        ("LD_LIBRARY_PATH", library_path),
        ("RANK", "1".to_string()),
    ];
    let story = run_script(&dir, &script, mode, &env, &[]);
    assert_eq!(story.output.status.code(), Some(0), "{}", story.stderr);
    let job = pid_of_role(&story.expected, "job");
    (story, job, script)
}

/// (kind, pid, severity, diagnosis, the user's line) of a finding.
type Told = (FindingKind, u32, Severity, Option<Diagnosis>, Option<u32>);

/// What every leak finding tells.
fn leaks(story: &Story) -> Vec<Told> {
    story
        .findings
        .iter()
        .filter(|f| f.severity == Severity::Leak)
        .map(|f| (f.kind, f.pid, f.severity, f.diagnosis, f.user_frame.as_ref().map(|u| u.line)))
        .collect()
}

/// The growth's time until the device is full, worked again from the rate and the last device
/// reading the capture recorded before the finding's end.
fn assert_time_to_full(story: &Story, growth: &Finding) {
    let events = read_events(&story.events);
    let reading = events
        .iter()
        .rfind(|e| e.op == gpuprof_model::Op::MemInfo && e.ts <= growth.last_ts)
        .expect("a device memory reading");
    assert_eq!((reading.api.as_ref(), reading.total), ("nvmlDeviceGetMemoryInfo", Some(80 << 30)));
    let rate = growth.bytes_per_second.unwrap();
    let since = (growth.last_ts - reading.ts) as f64 / 1e9;
    let left = (reading.size as f64 - rate * since) / rate;
    assert!((growth.seconds_to_full.unwrap() - left).abs() < 1e-6 * left, "{growth:?} {reading:?}");
}

#[test]
fn a_six_second_job_keeping_a_tensor_a_step_is_one_growth_at_the_line_that_made_it() {
    let (story, job, script) = short_job("keep");
    let out = marked_line(&script, "out", "Model.forward");
    let kept = Some(Diagnosis::TensorsKeptByUserCode);
    assert_eq!(
        leaks(&story),
        vec![(FindingKind::Growth, job, Severity::Leak, kept, Some(out.line))],
        "{:#?}",
        story.findings
    );
    let growth = story.findings.iter().find(|f| f.kind == FindingKind::Growth).unwrap();
    assert_eq!(growth.user_frame.as_ref(), Some(&out));
    assert_eq!(growth.rank, Some(1));
    // 64 KiB a step, every step kept, given back only at the end: one stack.
    assert_eq!(growth.stacks.len(), 1);
    assert_eq!(growth.bytes % (64 << 10), 0);
    assert_eq!(growth.count, growth.bytes / (64 << 10) + 1);
    assert!((150..=300).contains(&growth.count), "{growth:?}");
    assert!(growth.detail.contains("steadily through the process's"), "{}", growth.detail);
    assert!(
        growth.detail.contains(&format!(
            "the user's code keeps these tensors, allocated at {}:{} in Model.forward",
            out.file, out.line
        )),
        "{}",
        growth.detail
    );
    assert_time_to_full(&story, growth);
    assert_report_agrees(&story, &[]);

    // The findings table and the HTML report say why.
    let table = Command::new(gpuprof()).args(["report", "-f", "table"]).arg(&story.events).output_within(PATIENCE);
    let table = String::from_utf8_lossy(&table.stdout).to_string();
    assert!(table.contains("\n    why: tensors_kept_by_user_code (at "), "{table}");
    let page = story.events.with_extension("html");
    let export = Command::new(gpuprof())
        .args(["export", "-f", "html", "-o"])
        .arg(&page)
        .arg(&story.events)
        .output_within(PATIENCE);
    assert_eq!(export.status.code(), Some(0), "{}", String::from_utf8_lossy(&export.stderr));
    let shown = browse_report(
        &page,
        serde_json::json!([{ "eval": "Array.from(document.querySelectorAll('#findings tbody tr')).map(r => r.cells[1].textContent)" }]),
    );
    let cells: Vec<String> = serde_json::from_value(shown["results"][0].clone()).unwrap();
    assert_eq!(cells.iter().filter(|c| *c == "growth [leak]: tensors_kept_by_user_code").count(), 1, "{cells:?}");
}

#[test]
fn a_healthy_six_second_loop_with_evaluation_under_no_grad_has_no_leak() {
    let (story, _, _) = short_job("healthy");
    assert_eq!(leaks(&story), vec![], "{:#?}", story.findings);
}

#[test]
fn six_seconds_of_evaluation_without_no_grad_is_a_retained_graph() {
    let (story, job, script) = short_job("evaluate");
    let hidden = marked_line(&script, "hidden", "Model.forward");
    let retained = Some(Diagnosis::AutogradGraphRetained);
    assert_eq!(
        leaks(&story),
        vec![(FindingKind::Growth, job, Severity::Leak, retained, Some(hidden.line))],
        "{:#?}",
        story.findings
    );
    let growth = story.findings.iter().find(|f| f.kind == FindingKind::Growth).unwrap();
    // The graph's three forward lines each keep their outputs.
    let lines: Vec<u32> = growth.stacks.iter().map(|s| gpuprof_model::user_frame(&s.stack).unwrap().line).collect();
    let line = |name| marked_line(&script, name, "Model.forward").line;
    assert_eq!(lines, vec![line("hidden"), line("active"), line("out")]);
    assert!(growth.detail.contains("a retained autograd graph, built at"), "{}", growth.detail);
    assert_time_to_full(&story, growth);
}

#[test]
fn a_worker_per_gpu_is_a_design_a_dataloader_worker_with_cuda_is_a_leak() {
    let dir = scratch("stories_worker_per_gpu");
    let story = run_story(&dir, "worker-per-gpu", &[], &[]);
    assert_eq!(story.output.status.code(), Some(0), "{}", story.stderr);
    let workers = pids_of_role(&story.expected, "worker");
    assert_eq!(leaks(&story), vec![], "{:#?}", story.findings);
    let mut contexts: Vec<(u32, Severity)> = story
        .findings
        .iter()
        .filter(|f| f.kind == FindingKind::WorkerCudaContext)
        .map(|f| (f.pid, f.severity))
        .collect();
    contexts.sort();
    let mut expected: Vec<(u32, Severity)> = workers.iter().map(|pid| (*pid, Severity::Info)).collect();
    expected.sort();
    assert_eq!(contexts, expected);

    let dir = scratch("stories_dataloader");
    let story = run_story(&dir, "dataloader", &[], &[]);
    assert_eq!(story.output.status.code(), Some(0), "{}", story.stderr);
    let worker = pid_of_role(&story.expected, "worker");
    let line = user_line("dataset-cuda", "CudaDataset.__getitem__").line;
    let loader = Some(Diagnosis::CudaInDataloaderWorker);
    assert_eq!(leaks(&story), vec![(FindingKind::WorkerCudaContext, worker, Severity::Leak, loader, Some(line))]);
    let context = story.findings.iter().find(|f| f.kind == FindingKind::WorkerCudaContext).unwrap();
    assert!(context
        .stack
        .iter()
        .any(|f| f.file.ends_with("torch/utils/data/_utils/worker.py") && f.function == "_worker_loop"));
    assert_report_agrees(&story, &[]);
}
