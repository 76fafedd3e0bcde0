//! `gpuprof export` on recordings of the stand-in workloads: folded stacks of the live tensors
//! at a chosen moment (compared with a replay of the workload's own log), a flame graph SVG read
//! back by an XML parser, a memory_viz snapshot read back by Python's pickle and checked against
//! the events, and the picture at an out-of-memory failure.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use gpuprof_model::event::{Event, Layer, Op};
use gpuprof_testkit::*;
use serde_json::Value;

/// Records tensors.py (holding memory for a while) and returns the events file and its events.
fn record(name: &str) -> (std::path::PathBuf, Vec<Event>) {
    let dir = scratch(name);
    let (log, out) = (dir.join("expected.jsonl"), dir.join("events.jsonl"));
    let script = workloads().join("tensors.py");
    let output = gpuprof_run(
        &["--output", out.to_str().unwrap()],
        &[python3(), script.to_str().unwrap(), "--hold", "0.3"],
        &log,
    );
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
    let events = read_events(&out);
    (out, events)
}

fn export(input: &Path, args: &[&str]) -> std::process::Output {
    Command::new(gpuprof()).args(["export", "--input", input.to_str().unwrap()]).args(args).output_within(PATIENCE)
}

fn inspect(kind: &str, path: &Path) -> Value {
    let output =
        Command::new(python3()).arg(fixtures().join("inspect_export.py")).arg(kind).arg(path).output_within(PATIENCE);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    serde_json::from_slice(&output.stdout).unwrap()
}

/// The moment 40 allocator events in: (seconds after the first event, events up to it).
fn moment(events: &[Event]) -> (f64, usize) {
    let block_events: Vec<usize> =
        events.iter().enumerate().filter(|(_, e)| e.layer == Layer::Allocator).map(|(i, _)| i).collect();
    let cut = block_events[40];
    let secs = (events[cut].ts - events[0].ts) as f64 / 1e9;
    // Nothing else may share that nanosecond, or the cut would be ambiguous.
    assert!(events.get(cut + 1).is_none_or(|next| next.ts > events[cut].ts));
    (secs + 0.5e-9, cut + 1)
}

/// Live blocks after the first `n` events, by address.
fn live_blocks(events: &[Event], n: usize) -> BTreeMap<u64, &Event> {
    let mut live = BTreeMap::new();
    for event in events.iter().take(n).filter(|e| e.layer == Layer::Allocator) {
        match event.op {
            Op::Alloc => {
                live.insert(event.addr.unwrap(), event);
            }
            _ => {
                live.remove(&event.addr.unwrap());
            }
        }
    }
    live
}

#[test]
fn folded_and_flamegraph_of_live_tensors_at_a_moment() {
    let (input, events) = record("export_folded");
    let (secs, n) = moment(&events);
    let live = live_blocks(&events, n);
    assert!(!live.is_empty());
    let mut expected: BTreeMap<String, u64> = BTreeMap::new();
    for block in live.values() {
        let frames: Vec<String> = block
            .stack
            .iter()
            .rev()
            .map(|f| format!("{} ({}:{})", f.function, f.file.rsplit('/').next().unwrap(), f.line))
            .collect();
        *expected.entry(format!("pid {} python3;tensors;{}", block.pid, frames.join(";"))).or_default() += block.size;
    }
    let expected: Vec<String> = expected.into_iter().map(|(k, v)| format!("{k} {v}")).collect();

    let output = export(&input, &["--format", "folded", "--at", &secs.to_string()]);
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
    let folded: Vec<String> = String::from_utf8(output.stdout).unwrap().lines().map(String::from).collect();
    assert_eq!(folded, expected);

    let svg = input.with_extension("svg");
    let output =
        export(&input, &["--format", "flamegraph", "--at", &secs.to_string(), "--output", svg.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
    let titles: Vec<String> = inspect("flamegraph", &svg)["titles"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap().to_string())
        .collect();
    let total: u64 = live.values().map(|b| b.size).sum();
    assert!(titles.iter().any(|t| t.starts_with("all (") && t.contains(&format_thousands(total))), "{titles:?}");
    assert!(titles.iter().any(|t| t.starts_with("CachingAllocator._report (tensors.py:")), "{titles:?}");
    assert!(titles.iter().any(|t| t.starts_with("step (tensors.py:")), "{titles:?}");
}

fn format_thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[test]
fn memory_viz_snapshot_matches_the_events() {
    let (input, events) = record("export_memory_viz");
    let (secs, n) = moment(&events);
    let snapshot = input.with_extension("pickle");
    let output =
        export(&input, &["--format", "memory-viz", "--at", &secs.to_string(), "--output", snapshot.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
    let facts = inspect("memory-viz", &snapshot);
    assert_eq!(
        facts["keys"],
        serde_json::json!(["allocator_settings", "device_traces", "external_annotations", "segments"])
    );

    let upto = &events[..n];
    let live = live_blocks(&events, n);
    let count = |layer: Layer, op: Op| upto.iter().filter(|e| e.layer == layer && e.op == op && e.result == 0).count();
    assert_eq!(facts["actions"]["alloc"], count(Layer::Allocator, Op::Alloc));
    assert_eq!(facts["actions"]["free_requested"], count(Layer::Allocator, Op::Free));
    assert_eq!(facts["actions"]["free_completed"], count(Layer::Allocator, Op::Free));
    assert_eq!(facts["actions"]["segment_alloc"], count(Layer::Driver, Op::Alloc));
    // Every segment tiled by its blocks; the active ones are exactly the live blocks.
    let mut active: Vec<(u64, u64, String)> = Vec::new();
    for segment in facts["segments"].as_array().unwrap() {
        assert_eq!(segment["tiled"], true, "{segment}");
        for block in segment["active"].as_array().unwrap() {
            active.push((
                block[0].as_u64().unwrap(),
                block[1].as_u64().unwrap(),
                block[2].as_str().unwrap().to_string(),
            ));
        }
    }
    let expected: Vec<(u64, u64, String)> =
        live.values().map(|b| (b.addr.unwrap(), b.size, b.stack[0].function.clone())).collect();
    assert_eq!(active, expected);
}

#[test]
fn the_picture_at_an_out_of_memory_failure() {
    let dir = scratch("export_oom");
    let (log, out) = (dir.join("expected.jsonl"), dir.join("events.jsonl"));
    let mut cmd = Command::new(gpuprof());
    cmd.args(["run", "--output", out.to_str().unwrap(), "--"])
        .arg(python3())
        .arg(workloads().join("leaks.py"))
        .arg("oom");
    workload_env(&mut cmd, &log);
    cmd.env("GPUPROF_STANDIN_DEVICE_MEMORY", (64u64 << 20).to_string())
        .env("GPUPROF_STANDIN_DEVICE_FILE", dir.join("device"));
    assert!(cmd.output_within(PATIENCE).status.success());
    let expected = read_expected(&log);
    let (parent, worker) = (pid_of_role(&expected, "parent"), pid_of_role(&expected, "worker"));

    let output = export(&out, &["--format", "folded", "--oom", "1"]);
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
    let folded = String::from_utf8(output.stdout).unwrap();
    let bytes: Vec<(u32, u64)> = folded
        .lines()
        .map(|l| {
            let pid = l.split_whitespace().nth(1).unwrap().parse().unwrap();
            (pid, l.rsplit(' ').next().unwrap().parse().unwrap())
        })
        .collect();
    // The worker's 40 MiB and the parent's 16 MiB, each under its allocating stack.
    assert_eq!(bytes.len(), 2, "{folded}");
    assert!(bytes.contains(&(worker, 40 << 20)) && bytes.contains(&(parent, 16 << 20)), "{folded}");
    assert!(folded.lines().any(|l| l.contains(";device;") && l.contains("holder (leaks.py:")), "{folded}");

    let output = export(&out, &["--format", "folded", "--oom", "2"]);
    assert_eq!(output.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&output.stderr).contains("has fewer than 2 out-of-memory failures"));
}

/// `gpuprof export … | head -1`: the reader leaves after one line; gpuprof stops writing and
/// exits quietly (0, nothing on stderr), as a Unix filter does.
#[test]
fn a_reader_that_leaves_early_ends_the_export_quietly() {
    use std::io::Write;
    let dir = scratch("export_closed_pipe");
    let input = dir.join("many.jsonl");
    let mut file = std::io::BufWriter::new(std::fs::File::create(&input).unwrap());
    // Far more than a pipe holds, so that writing goes on after the reader has left.
    for i in 0..20_000u64 {
        let mut event = Event::new(
            1_000 + i,
            42,
            42,
            gpuprof_model::event::Source::Ebpf,
            Layer::Driver,
            Op::Alloc,
            "cuMemAlloc_v2".into(),
        );
        event.addr = Some(0x7f00_0000_0000 + i * 4096);
        event.size = 4096;
        writeln!(file, "{}", serde_json::to_string(&event).unwrap()).unwrap();
    }
    file.flush().unwrap();
    drop(file);
    let mut child = Command::new(gpuprof())
        .args(["export", "--format", "jsonl", "--input", input.to_str().unwrap()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let first = line_within(&mut std::io::BufReader::new(child.stdout.take().unwrap()), READY_LIMIT, "the first event");
    assert!(first.contains("\"addr\":\"0x7f0000000000\""), "{first}");
    let output = child.output_within(PATIENCE, "child");
    assert_eq!((output.status.code(), String::from_utf8_lossy(&output.stderr).into_owned()), (Some(0), String::new()));
}

/// A view of nothing is an error with a hint, before any file is made; moments outside the
/// recording are refused, each in one line.
#[test]
fn empty_and_impossible_moments_are_refused_with_a_hint() {
    let (input, events) = record("export_moments");
    let path = input.display().to_string();
    let said =
        |output: &std::process::Output| (output.status.code(), String::from_utf8_lossy(&output.stderr).into_owned());
    // tensors.py frees every block before it ends: its end is empty, its peak (the default) not.
    let empty = format!("gpuprof: error: no live GPU memory at the end in {path}: every block was freed by then; leave the moment out for the peak, or pick one with --at SECS or --oom N\n");
    assert_eq!(said(&export(&input, &["--format", "folded", "--end"])), (Some(1), empty.clone()));
    let svg = input.with_file_name("end.svg");
    assert_eq!(
        said(&export(&input, &["--format", "flamegraph", "--end", "--output", svg.to_str().unwrap()])),
        (Some(1), empty)
    );
    assert!(!svg.exists(), "an empty flame graph was written");
    let peak = export(&input, &["--format", "folded"]);
    assert_eq!(said(&peak), (Some(0), String::new()));
    // The peak is the most tensor bytes live at once, as the events add up.
    let bytes: u64 = String::from_utf8_lossy(&peak.stdout)
        .lines()
        .map(|l| l.rsplit_once(' ').unwrap().1.parse::<u64>().unwrap())
        .sum();
    let (mut live, mut most) = (0u64, 0u64);
    for block in events.iter().filter(|e| e.layer == gpuprof_model::event::Layer::Allocator) {
        live = if block.op == Op::Alloc { live + block.size } else { live - block.size };
        most = most.max(live);
    }
    assert_eq!(bytes, most);
    assert!(most > 6 * 1024 * 1024, "{most}");
    let span = (events.last().unwrap().ts - events[0].ts) as f64 / 1e9;
    assert_eq!(
        said(&export(&input, &["--format", "folded", "--at", "99999"])),
        (Some(1), format!("gpuprof: error: --at 99999 is past the end of {path}: its events span {span:.3} s; give at most that, or --end for the end\n"))
    );
    let (code, stderr) = said(&export(&input, &["--format", "folded", "--oom", "0"]));
    assert_eq!(code, Some(2));
    assert!(stderr.starts_with("error: invalid value '0' for '--oom <N>': 0 is not in 1.."), "{stderr}");
    let (code, stderr) = said(&export(&input, &["--format", "folded", "--at=-1"]));
    assert_eq!(code, Some(2));
    assert!(stderr.starts_with("error: invalid value '-1' for '--at <SECS>': -1 is not a number of seconds from the first event (0 or more)"), "{stderr}");
}

/// The short spellings and the file argument say the same as the long flags.
#[test]
fn short_flags_and_a_file_argument_are_the_long_flags() {
    let (input, _) = record("export_short_flags");
    let path = input.to_str().unwrap();
    let run = |args: &[&str]| {
        let output = Command::new(gpuprof()).args(args).output_within(PATIENCE);
        assert_eq!(output.status.code(), Some(0), "{args:?}: {}", String::from_utf8_lossy(&output.stderr));
        output.stdout
    };
    let long = run(&["export", "--input", path, "--format", "jsonl"]);
    assert!(!long.is_empty());
    assert_eq!(run(&["export", path, "-f", "jsonl"]), long);
    assert_eq!(run(&["export", "-i", path, "-f", "jsonl"]), long);
    let long = run(&["report", "--input", path, "--format", "table"]);
    assert_eq!(run(&["report", path, "-f", "table"]), long);
    let out = input.with_file_name("report.json");
    run(&["report", path, "-o", out.to_str().unwrap()]);
    assert_eq!(std::fs::read_to_string(&out).unwrap().into_bytes(), run(&["report", path]));
    // One spelling of a pid for every verb: attach takes `-p` too.
    let output = Command::new(gpuprof()).args(["attach", "-p", "4194304"]).output_within(PATIENCE);
    assert_eq!(
        (output.status.code(), String::from_utf8_lossy(&output.stderr).into_owned()),
        (
            Some(1),
            "gpuprof: error: no process with pid 4194304: check the pid with `ps -p 4194304` (it may have exited)\n"
                .to_string()
        )
    );
}
