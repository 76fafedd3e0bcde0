//! Captures at a training job's rate: two training-like processes through the libcuda and libc10
//! stand-ins (tens of thousands of allocator events a second each, 41-frame Python stacks) into a
//! recording lose nothing, and the recording holds every event exactly (counts, totals, stacks
//! and their lines); recording ↔ jsonl round trips byte for byte; every export of a
//! multi-million-event recording stays within its memory bound; a recording cut short is read
//! up to its cut.

use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use gpuprof_model::event::{Event, Frame, Kind, Layer, Op, Source};
use gpuprof_model::Stack;
use gpuprof_recording::{Ending, EventFile, Writer};
use gpuprof_testkit::*;
use serde_json::Value;

/// The line of `text` in the training workload (1-based).
fn line_of(text: &str) -> u32 {
    let source = std::fs::read_to_string(workloads().join("training.py")).unwrap();
    let index = source.lines().position(|l| l.contains(text)).unwrap_or_else(|| panic!("{text} not in training.py"));
    index as u32 + 1
}

fn read_recorded(path: &Path) -> (Vec<Event>, Ending) {
    let mut file = EventFile::open(path).unwrap();
    let mut events = Vec::new();
    while let Some(event) = file.next_event().unwrap() {
        events.push(event);
    }
    (events, file.ending().unwrap())
}

/// A number in the counters at the end (`gpuprof: N events (…/s) …; lost N …`), after `label`.
fn stat(stderr: &str, label: &str) -> u64 {
    let line = counters_line(stderr);
    let after = line.split(label).nth(1).unwrap_or_else(|| panic!("{label} not in {line}"));
    after.split(|c: char| !c.is_ascii_digit()).next().unwrap().parse().unwrap()
}

#[test]
fn two_training_processes_at_a_real_rate_lose_nothing_and_the_recording_holds_every_event() {
    let _alone = one_at_a_time();
    let dir = scratch("recording_rate");
    let (log, recording) = (dir.join("expected.jsonl"), dir.join("run.gpuprof"));
    let training = format!("{} {} --seconds 6 --depth 10", python3(), workloads().join("training.py").display());
    let output = gpuprof_run(
        &["--stats", "--output", recording.to_str().unwrap()],
        &["sh", "-c", &format!("{training} & {training} & wait")],
        &log,
    );
    let stderr = String::from_utf8_lossy(&output.stderr).to_string();
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    let workloads: Vec<Value> = read_expected(&log);
    assert_eq!(workloads.len(), 2, "{stderr}");
    let rate: u64 = workloads.iter().map(|w| w["events_per_s"].as_u64().unwrap()).sum();
    assert!(
        rate >= 50_000,
        "the two processes made {rate} allocator events a second, short of a training job's 50,000"
    );
    assert_eq!(stat(&stderr, "lost "), 0, "{stderr}");

    let (events, ending) = read_recorded(&recording);
    assert_eq!(ending, Ending::Closed { events: events.len() as u64, lost: 0 });
    assert_eq!(stat(&stderr, "gpuprof: ") as usize, events.len(), "{stderr}");
    let report_line = line_of("self.report(addr, size, self.allocated, self.reserved, self.device)");
    let forward_line = line_of("out = self.allocator.malloc(self.out_bytes)");
    for workload in &workloads {
        let pid = workload["pid"].as_u64().unwrap() as u32;
        let blocks: Vec<&Event> = events.iter().filter(|e| e.pid == pid && e.layer == Layer::Allocator).collect();
        let count = |op| blocks.iter().filter(|e| e.op == op).count() as u64;
        assert_eq!(
            (count(Op::Alloc), count(Op::Free)),
            (workload["allocs"].as_u64().unwrap(), workload["frees"].as_u64().unwrap())
        );
        let last = blocks.last().unwrap();
        assert_eq!((last.allocated, last.reserved), (workload["allocated"].as_u64(), workload["reserved"].as_u64()));
        let segments =
            events.iter().filter(|e| e.pid == pid && e.api == "cuMemAlloc_v2" && e.result == 0).count() as u64;
        assert_eq!(segments, workload["segments_allocated"].as_u64().unwrap());
        // A linear layer's activation: the report's line, then the forward that asked for it,
        // 41 frames in all: three module calls nested through 11 dispatch frames each, as in
        // PyTorch, under Model.forward, train, main and <module>.
        let activation =
            blocks.iter().find(|e| e.stack.get(1).is_some_and(|f| f.function == "Linear.forward")).unwrap();
        assert_eq!(activation.stack.len(), 41);
        assert_eq!(activation.stack.iter().filter(|f| f.function == "dispatch").count(), 33);
        assert_eq!(
            (activation.stack[0].function.as_str(), activation.stack[0].line),
            ("CachingAllocator.malloc", report_line)
        );
        assert_eq!(activation.stack[1].line, forward_line);
        assert_eq!(activation.stack.last().unwrap().function, "<module>");
        assert!(blocks.iter().all(|e| !e.stack.is_empty()));
    }
    let per_event = std::fs::metadata(&recording).unwrap().len() as f64 / events.len() as f64;
    assert!(per_event <= 64.0, "{per_event:.1} bytes an event on disk");

    // Recording → jsonl → recording → jsonl: the same bytes, the same events.
    let jsonl = dir.join("run.jsonl");
    let again = dir.join("again.gpuprof");
    let jsonl_again = dir.join("again.jsonl");
    for (input, format, output) in
        [(&recording, "jsonl", &jsonl), (&jsonl, "recording", &again), (&again, "jsonl", &jsonl_again)]
    {
        let out = Command::new(gpuprof())
            .args([
                "export",
                "--input",
                input.to_str().unwrap(),
                "--format",
                format,
                "--output",
                output.to_str().unwrap(),
            ])
            .output_within(PATIENCE);
        assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    }
    assert!(std::fs::read(&jsonl).unwrap() == std::fs::read(&jsonl_again).unwrap());
    assert!(read_events(&jsonl) == events);
}

/// Runs gpuprof with `args` to the end and returns its exit code, stdout, stderr and peak
/// resident memory (KiB). A small Python parent forks and execs it and reads its peak with
/// wait4: a child started straight from this (large) test process would be charged the test's
/// own memory, which it shares until exec.
fn run_measured(args: &[&str], dir: &Path) -> (Option<i32>, String, String, u64) {
    const MEASURE: &str = "import os, sys\npid = os.fork()\nif pid == 0:\n    os.execv(sys.argv[2], sys.argv[2:])\n_, status, usage = os.wait4(pid, 0)\nopen(sys.argv[1], 'w').write(str(usage.ru_maxrss))\nsys.exit(os.waitstatus_to_exitcode(status))\n";
    let (out_path, err_path, peak_path) = (dir.join("stdout"), dir.join("stderr"), dir.join("peak"));
    let status = Command::new(python3())
        .args(["-c", MEASURE, peak_path.to_str().unwrap(), gpuprof()])
        .args(args)
        .stdout(Stdio::from(std::fs::File::create(&out_path).unwrap()))
        .stderr(Stdio::from(std::fs::File::create(&err_path).unwrap()))
        .status_within(PATIENCE);
    let read = |p: &PathBuf| String::from_utf8_lossy(&std::fs::read(p).unwrap()).to_string();
    (status.code(), read(&out_path), read(&err_path), read(&peak_path).trim().parse().unwrap())
}

/// One of these tests at a time: the capture at a training job's rate needs the machine's cores.
fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

const PROCESSES: u32 = 8;
const STACKS: u64 = 50;
const STEPS: u64 = 2_500;
const LEAK_EVERY: u64 = 100;
/// Between events: the recording spans 100 s, ten of the growth rule's windows.
const TICK: u64 = 50_000;

/// A 40-frame stack: the same outer frames, its own innermost line.
fn stack(name: &str, line: u32) -> Stack {
    let mut frames: Vec<Frame> = vec![Frame { function: name.into(), file: "/srv/model.py".into(), line }];
    frames.extend((0..39).map(|i| Frame {
        function: format!("dispatch_{i}"),
        file: "/srv/torch/nn/module.py".into(),
        line: 1000 + i,
    }));
    Stack::new(frames)
}

/// 8 training processes, each a segment and then `steps` steps of 50 blocks allocated and freed,
/// keeping one 1 MiB block every LEAK_EVERY steps: 2 million events for STEPS.
fn synthesize(path: &Path, steps: u64) -> u64 {
    let mut writer = Writer::new(std::io::BufWriter::new(std::fs::File::create(path).unwrap()), true).unwrap();
    let stacks: Vec<Stack> = (0..STACKS).map(|s| stack(&format!("layer_{s}"), 10 + s as u32)).collect();
    let leak = stack("keep_for_later", 99);
    let mut ts = 1_800_000_000_000_000_000u64;
    let base = |pid: u32| 0x7f00_0000_0000u64 + u64::from(pid) * (1 << 32);
    let event = |ts, pid, layer, op, api| {
        let mut e = Event::new(ts, pid, pid, Source::Ebpf, layer, op, Cow::Borrowed(api));
        e.comm = "trainer".into();
        (e.kind, e.device) = (Some(Kind::Device), Some(0));
        e
    };
    let mut allocated = vec![0u64; PROCESSES as usize];
    let mut noise = Noise(7);
    let mut written = 0;
    for pid in 100..100 + PROCESSES {
        let mut e = event(ts, pid, Layer::Driver, Op::Alloc, "cuMemAlloc_v2");
        (e.addr, e.size) = (Some(base(pid)), 1 << 30);
        writer.write(&e).unwrap();
        written += 1;
    }
    for step in 1..=steps {
        for pid in 100..100 + PROCESSES {
            let held = &mut allocated[(pid - 100) as usize];
            let mut block = |ts, op, addr, size, stack: &Stack, held: &mut u64| {
                if op == Op::Alloc {
                    *held += size;
                } else {
                    *held -= size;
                }
                let mut e = event(ts, pid, Layer::Allocator, op, "c10::reportMemoryUsageToProfiler");
                (e.addr, e.size, e.stack) = (Some(addr), size, stack.clone());
                (e.allocated, e.reserved) = (Some(*held), Some(1 << 30));
                writer.write(&e).unwrap();
            };
            // Sizes and times vary a little, as a real step's do (and a recording compresses less).
            let sizes: Vec<u64> = (0..STACKS).map(|s| 4096 * (s + 1) + 512 * (noise.next() % 64)).collect();
            for (s, stack) in stacks.iter().enumerate() {
                ts += TICK + noise.next() % 1_000;
                block(ts, Op::Alloc, base(pid) + (1 << 29) + s as u64 * 65_536, sizes[s], stack, held);
            }
            for (s, stack) in stacks.iter().enumerate() {
                ts += TICK + noise.next() % 1_000;
                block(ts, Op::Free, base(pid) + (1 << 29) + s as u64 * 65_536, sizes[s], stack, held);
            }
            written += 2 * STACKS;
            if step % LEAK_EVERY == 0 {
                ts += TICK;
                block(ts, Op::Alloc, base(pid) + step / LEAK_EVERY * (1 << 20), 1 << 20, &leak, held);
                written += 1;
            }
        }
        if step % 10 == 0 {
            // As a live capture does (every half second): a cut file keeps what was flushed.
            writer.flush_now().unwrap();
        }
    }
    writer.finish(0).unwrap();
    written
}

/// A fixed pseudo-random sequence (a linear congruential generator): the same file every run.
struct Noise(u64);

impl Noise {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        self.0 >> 33
    }
}

#[test]
fn every_export_of_a_two_million_event_recording_stays_within_its_memory_bound() {
    let _alone = one_at_a_time();
    let dir = scratch("recording_exports");
    let recording = dir.join("big.gpuprof");
    let events = synthesize(&recording, STEPS);
    assert_eq!(events, 2_000_208);
    const BOUND_KIB: u64 = 150 * 1024;
    let kept = STEPS / LEAK_EVERY;
    let leak_path = format!(
        "keep_for_later (model.py:99);{}",
        (0..39).map(|i| format!("dispatch_{i} (module.py:{})", 1000 + i)).collect::<Vec<_>>().join(";")
    );
    let leak_path: String = leak_path.split(';').rev().collect::<Vec<_>>().join(";");
    let expected_folded: String = (100..100 + PROCESSES)
        .map(|pid| format!("pid {pid} trainer;tensors;{leak_path} {}\n", kept * (1 << 20)))
        .collect();
    let snapshot = dir.join("snap.pickle");
    let svg = dir.join("live.svg");
    let exports: Vec<(Vec<&str>, &str)> = vec![
        (vec!["export", "--format", "folded", "--end"], "folded"),
        (vec!["export", "--format", "folded"], "folded at the peak"),
        (vec!["summary", "--format", "json"], "summary"),
        (vec!["export", "--format", "flamegraph", "--output", svg.to_str().unwrap()], "flamegraph"),
        (
            vec!["export", "--format", "memory-viz", "--pid", "103", "--output", snapshot.to_str().unwrap()],
            "memory-viz",
        ),
        (vec!["export", "--format", "jsonl", "--output", "/dev/null"], "jsonl"),
        (vec!["report", "--format", "json"], "report"),
    ];
    for (mut args, name) in exports {
        args.extend(["--input", recording.to_str().unwrap()]);
        let (code, stdout, stderr, peak_kib) = run_measured(&args, &dir);
        assert_eq!(code, Some(0), "{name}: {stderr}");
        assert!(peak_kib <= BOUND_KIB, "{name} took {peak_kib} KiB at its peak, more than {BOUND_KIB}");
        match name {
            "folded" => assert_eq!(stdout, expected_folded),
            "memory-viz" => {
                // Per step 50 allocs and 50 frees (requested, completed): 150 entries; the segment; the kept blocks.
                let entries = 1 + STEPS * 3 * STACKS + kept;
                let size = gpuprof_model::bytes::human(std::fs::metadata(&snapshot).unwrap().len());
                assert_eq!(
                    stderr.trim_end(),
                    format!("gpuprof: memory_viz: kept the last 100000 trace entries of pid 103, left out {} older ones (--max-entries, --from, --to choose)\ngpuprof: wrote {} ({size}): open https://pytorch.org/memory_viz and drop the file in", entries - 100_000, snapshot.display())
                );
            }
            "report" => {
                let findings: Vec<Value> = serde_json::from_str(&stdout).unwrap();
                let growth: Vec<(u64, &str)> = findings
                    .iter()
                    .filter(|f| f["kind"] == "growth")
                    .map(|f| (f["pid"].as_u64().unwrap(), f["stack"][0]["function"].as_str().unwrap()))
                    .collect();
                assert_eq!(
                    growth,
                    (100..100 + u64::from(PROCESSES)).map(|p| (p, "keep_for_later")).collect::<Vec<_>>(),
                    "{stdout}"
                );
            }
            _ => {}
        }
    }
    let facts = {
        let output = Command::new(python3())
            .arg(fixtures().join("inspect_export.py"))
            .arg("memory-viz")
            .arg(&snapshot)
            .output_within(PATIENCE);
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        serde_json::from_slice::<Value>(&output.stdout).unwrap()
    };
    assert_eq!(
        facts["actions"]["free_completed"].as_u64().unwrap()
            + facts["actions"]["free_requested"].as_u64().unwrap()
            + facts["actions"]["alloc"].as_u64().unwrap(),
        100_000
    );
    assert_eq!(facts["segments"][0]["active"].as_array().unwrap().len() as u64, kept);
}

#[test]
fn a_recording_cut_short_is_read_up_to_its_cut() {
    let _alone = one_at_a_time();
    let dir = scratch("recording_cut");
    let recording = dir.join("whole.gpuprof");
    synthesize(&recording, 250);
    let bytes = std::fs::read(&recording).unwrap();
    let cut = dir.join("cut.gpuprof");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let (events, ending) = read_recorded(&cut);
    assert!(events.len() > 50_000, "{} events before the cut", events.len());
    assert_eq!(ending, Ending::Truncated { events: events.len() as u64 });
    let output = Command::new(gpuprof())
        .args(["report", "--format", "json", "--input", cut.to_str().unwrap()])
        .output_within(PATIENCE);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert_eq!(
        stderr.trim_end(),
        format!(
            "gpuprof: warning: {} is cut short after {} events (its capture did not finish); what follows covers those",
            cut.display(),
            events.len()
        )
    );
}
