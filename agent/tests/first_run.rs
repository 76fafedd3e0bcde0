//! The first ten minutes, as a new user meets gpuprof: `run` with no flags writes a recording
//! named after the job and prints what it adds up to and what to run next; jsonl keeps out the
//! shells and launchers; `attach` says what the process held before it came; `summary`, the
//! peak and speedscope; every table keeps to 120 columns. A miniature torch (an installed
//! package over the libcuda and libc10 stand-ins) makes the memory.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use gpuprof_model::event::Layer;
use gpuprof_testkit::*;
use serde_json::Value;

const MIB: u64 = 1 << 20;

/// A job: 6 MiB of weights (line 9), 4 MiB of activations freed after (line 12), 512 KiB kept
/// (line 18). Its peak is 10 MiB, after the activations; it ends holding 6.5 MiB of tensors.
const APP: &str = "import os, sys
sys.path.insert(0, os.path.join(os.environ['PYTHONPATH'], 'site-packages'))
import minitorch

MiB = 1 << 20


def load_weights():
    return minitorch.empty(6 * MiB)

def forward():
    return minitorch.empty(4 * MiB)

minitorch.init()
weights = load_weights()
activations = forward()
del activations
kept = minitorch.empty(512 * 1024)
print('done', flush=True)
os._exit(0)  # no interpreter shutdown: what is live stays live
";

fn app(dir: &Path) -> PathBuf {
    let path = dir.join("app.py");
    std::fs::write(&path, APP).unwrap();
    path
}

fn gpuprof_in(dir: &Path, args: &[&str]) -> Output {
    let mut command = Command::new(gpuprof());
    command.current_dir(dir).args(args);
    workload_env(&mut command, &dir.join("expected.jsonl"));
    command.output_within(PATIENCE)
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The one recording `run` named in `dir`.
fn named_recording(dir: &Path) -> String {
    let names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".gpuprof"))
        .collect();
    assert_eq!(names.len(), 1, "{names:?}");
    names[0].clone()
}

#[test]
fn run_with_no_flags_records_to_a_named_file_and_says_what_next() {
    let dir = scratch("first_run_defaults");
    let app = app(&dir);
    let output = gpuprof_in(&dir, &["run", "--", python3(), app.to_str().unwrap()]);
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    // The job's own output is all stdout carries.
    assert_eq!(text(&output.stdout), "done\n");
    let name = named_recording(&dir);
    assert!(name.starts_with("gpuprof-app-") && name.len() == "gpuprof-app-20261125-223001.gpuprof".len(), "{name}");

    // What the run adds up to: live memory per process, the findings, then the next commands.
    let lines: Vec<&str> = stderr.lines().collect();
    let summary_at = lines
        .iter()
        .position(|l| *l == "Live GPU memory at end, per process and kind:")
        .unwrap_or_else(|| panic!("{stderr}"));
    let row: Vec<&str> = lines[summary_at + 2].split_whitespace().collect();
    // pid ppid comm state kind live(2) count mapped(2) ipc ctx: the 6 MiB and 4 MiB segments.
    assert_eq!(row[2..], ["python3", "exited(0)", "device", "10.0", "MiB", "2", "0", "B", "0", "1"], "{stderr}");
    assert!(stderr.contains("\nFindings (0 leaks, 1 info):\n  exit_with_live_allocations [info] pid "), "{stderr}");
    let next_at = lines
        .iter()
        .position(|l| *l == format!("gpuprof: wrote {} events to {name}; next:", event_count(&dir.join(&name))))
        .unwrap_or_else(|| panic!("{stderr}"));
    // Each command with what it gives, on its line when it fits, else on the line above.
    let next: Vec<String> = lines[next_at + 1..]
        .iter()
        .filter(|l| !l.trim_start().starts_with('#'))
        .map(|l| l.split("  #").next().unwrap().trim().to_string())
        .collect();
    assert_eq!(
        next,
        [
            format!("gpuprof summary {name}"),
            format!("gpuprof report {name}"),
            format!("gpuprof export {name} -f flamegraph"),
            format!("gpuprof export {name} -f html")
        ]
    );
    // What was captured, in words; the capture's counters are --stats's (or said when events
    // were lost).
    let captured = format!("gpuprof: captured {} events from 1 CUDA process in ", event_count(&dir.join(&name)));
    assert!(lines.iter().any(|l| l.starts_with(&captured) && l.ends_with(" s, none lost")), "{captured}…: {stderr}");
    assert!(!stderr.contains("ring buffer full"), "{stderr}");
    // Every line fits 120 columns.
    for line in lines.iter().filter(|l| !l.starts_with("gpuprof: probing")) {
        assert!(line.chars().count() <= 120, "{} columns: {line}", line.chars().count());
    }

    // The commands it names work on the file.
    let summary = gpuprof_in(&dir, &["summary", &name, "-f", "table"]);
    assert_eq!(summary.status.code(), Some(0), "{}", text(&summary.stderr));
    assert!(
        text(&summary.stdout).contains("app.py:9 load_weights < _CachingAllocator.malloc"),
        "{}",
        text(&summary.stdout)
    );
    let flamegraph = gpuprof_in(&dir, &["export", &name, "-f", "flamegraph", "-o", "peak.svg"]);
    assert_eq!(flamegraph.status.code(), Some(0), "{}", text(&flamegraph.stderr));
    let svg = std::fs::read_to_string(dir.join("peak.svg")).unwrap();
    assert!(
        svg.contains("live GPU memory by Python stack, at the peak, ") && svg.contains("(10.0 MiB live)"),
        "{svg:.600}"
    );

    // A run that makes no CUDA call leaves no file behind.
    let empty = scratch("first_run_nothing");
    let output = gpuprof_in(&empty, &["run", "--", "sh", "-c", "true"]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let said = text(&output.stderr);
    assert!(
        said.contains("gpuprof: no CUDA call was captured: no recording kept\n") && !said.contains("next:"),
        "{said}"
    );
    assert_eq!(std::fs::read_dir(&empty).unwrap().count(), 0, "a file was left behind");
}

fn event_count(recording: &Path) -> usize {
    let jsonl = recording.with_extension("jsonl");
    let output = Command::new(gpuprof())
        .args(["export", recording.to_str().unwrap(), "-f", "jsonl", "-o", jsonl.to_str().unwrap()])
        .output_within(PATIENCE);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    read_events(&jsonl).len()
}

#[test]
fn jsonl_leaves_out_processes_that_never_touch_cuda() {
    let dir = scratch("first_run_cuda_only");
    let app = app(&dir);
    let job = format!("sh -c true; ls / > /dev/null; {} {}", python3(), app.display());
    let events_of = |args: &[&str]| {
        let out = dir.join("events.jsonl");
        let mut all = vec!["run", "-f", "jsonl", "-o", out.to_str().unwrap()];
        all.extend_from_slice(args);
        all.extend_from_slice(&["--", "sh", "-c", &job]);
        let output = gpuprof_in(&dir, &all);
        assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
        (read_events(&out), text(&output.stderr))
    };
    let (events, stderr) = events_of(&[]);
    let cuda_pids: Vec<u32> = events.iter().filter(|e| e.layer != Layer::Process).map(|e| e.pid).collect();
    let python = cuda_pids[0];
    assert!(cuda_pids.iter().all(|p| *p == python), "{cuda_pids:?}");
    // Only the job's Python process: its fork or exec, before its first CUDA call, and its exit.
    assert!(
        events.iter().all(|e| e.pid == python),
        "{:?}",
        events.iter().map(|e| (e.pid, e.op.as_str())).collect::<Vec<_>>()
    );
    let lifecycle: Vec<&str> = events.iter().filter(|e| e.layer == Layer::Process).map(|e| e.op.as_str()).collect();
    assert_eq!(lifecycle.last(), Some(&"exit"));
    let first_call = events.iter().position(|e| e.layer != Layer::Process).unwrap();
    assert!(first_call >= 1 && events[..first_call].iter().all(|e| e.layer == Layer::Process), "{lifecycle:?}");
    let left_out = stderr.lines().find(|l| l.starts_with("gpuprof: left out ")).unwrap_or_else(|| panic!("{stderr}"));
    // The shell, its `sh -c true` and `ls`: three processes at least (the shell may exec python).
    let processes: u32 = left_out.split(" events of ").nth(1).unwrap().split(' ').next().unwrap().parse().unwrap();
    assert!(processes >= 2, "{left_out}");
    assert!(
        left_out.ends_with("processes that made no CUDA call (shells, launchers); --all-processes keeps them"),
        "{left_out}"
    );

    let (all, stderr) = events_of(&["--all-processes"]);
    assert!(!stderr.contains("left out"), "{stderr}");
    let mut pids: Vec<u32> = all.iter().map(|e| e.pid).collect();
    pids.sort_unstable();
    pids.dedup();
    assert!(pids.len() as u32 >= processes, "{pids:?}");
    assert_eq!(
        all.iter().filter(|e| e.layer != Layer::Process).count(),
        events.iter().filter(|e| e.layer != Layer::Process).count()
    );
}

#[test]
fn attach_says_what_the_process_held_before_it_came() {
    let dir = scratch("first_run_attach_before");
    let script = "import os, sys
sys.path.insert(0, os.path.join(os.environ['PYTHONPATH'], 'site-packages'))
import minitorch
minitorch.init()
weights = minitorch.empty(6 << 20)
print('ready', flush=True)
sys.stdin.readline()
x = minitorch.empty(1 << 20)
del x
";
    let mut command = Command::new(python3());
    command.args(["-c", script]);
    workload_env(&mut command, &dir.join("expected.jsonl"));
    let mut workload = start_ready_workload(command);
    let out = dir.join("table.txt");
    let mut agent = Command::new(gpuprof())
        .args(["attach", "-p", &workload.id().to_string(), "-f", "table", "-o", out.to_str().unwrap()])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(agent.stderr.take().unwrap());
    let mut said = wait_for_stderr(&mut stderr, "capturing pid");
    writeln!(workload.stdin.as_mut().unwrap(), "go").unwrap();
    assert!(workload.wait_within(Duration::from_secs(60), "workload").success());
    assert!(agent.wait_within(Duration::from_secs(30), "agent").success());
    said.extend(stderr.lines().map(Result::unwrap));
    let rest = said;
    let table = std::fs::read_to_string(&out).unwrap_or_else(|e| panic!("{e}: {rest:?}"));
    let lines: Vec<&str> = table.lines().collect();
    let at = lines
        .iter()
        .position(|l| *l == "Held before the capture started (the allocator's first report, less what gpuprof saw; not in the rows above):")
        .unwrap_or_else(|| panic!("{table}\n{rest:?}"));
    let row: Vec<&str> = lines[at + 2].split_whitespace().collect();
    // 6 MiB of weights in a 6 MiB segment, from before; the 2 MiB segment of x was seen.
    assert_eq!(row, [workload.id().to_string().as_str(), "6.0", "MiB", "6.0", "MiB"], "{table}\n{rest:?}");
    for line in &lines {
        assert!(line.chars().count() <= 120, "{} columns: {line}", line.chars().count());
    }
}

/// `run` into a recording of APP; returns (dir, recording, pid).
fn recorded_app(name: &str) -> (PathBuf, PathBuf, u32) {
    let dir = scratch(name);
    let app = app(&dir);
    let recording = dir.join("app.gpuprof");
    let output = gpuprof_in(&dir, &["run", "-o", recording.to_str().unwrap(), "--", python3(), app.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let jsonl = dir.join("app.jsonl");
    let converted =
        gpuprof_in(&dir, &["export", recording.to_str().unwrap(), "-f", "jsonl", "-o", jsonl.to_str().unwrap()]);
    assert_eq!(converted.status.code(), Some(0));
    let pid = read_events(&jsonl).iter().find(|e| e.layer == Layer::Allocator).unwrap().pid;
    (dir, recording, pid)
}

#[test]
fn summary_lists_the_lines_at_the_peak_at_the_end_and_in_all() {
    let (dir, recording, pid) = recorded_app("first_run_summary");
    let output = gpuprof_in(&dir, &["summary", recording.to_str().unwrap(), "-f", "json"]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let summary: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(summary["peak_bytes"], 10 * MIB);
    let process = &summary["processes"][0];
    assert_eq!((process["pid"].as_u64(), process["counts"].as_str()), (Some(pid as u64), Some("tensors")));
    let amount = |v: &Value| (v["bytes"].as_u64().unwrap(), v["count"].as_u64().unwrap());
    assert_eq!(amount(&process["at_peak"]), (10 * MIB, 2));
    assert_eq!(amount(&process["at_end"]), (6 * MIB + 512 * 1024, 2));
    assert_eq!(amount(&process["allocated"]), (10 * MIB + 512 * 1024, 3));
    type Row = (String, (u64, u64), (u64, u64), (u64, u64));
    let rows: Vec<Row> = process["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["where"].as_str().unwrap().to_string(),
                amount(&r["at_peak"]),
                amount(&r["at_end"]),
                amount(&r["allocated"]),
            )
        })
        .collect();
    assert_eq!(
        rows,
        [
            ("app.py:9 load_weights < _CachingAllocator.malloc".to_string(), (6 * MIB, 1), (6 * MIB, 1), (6 * MIB, 1)),
            ("app.py:12 forward < _CachingAllocator.malloc".to_string(), (4 * MIB, 1), (0, 0), (4 * MIB, 1)),
            ("app.py:18 <module> < _CachingAllocator.malloc".to_string(), (0, 0), (512 * 1024, 1), (512 * 1024, 1)),
        ]
    );

    let output = gpuprof_in(&dir, &["summary", recording.to_str().unwrap(), "--top", "1", "-f", "table"]);
    let table = text(&output.stdout);
    let lines: Vec<&str> = table.lines().collect();
    assert!(lines[0].ends_with(": peak 10.0 MiB live, ") || lines[0].contains(": peak 10.0 MiB live, "), "{table}");
    assert_eq!(lines[2], format!("pid {pid} python3, tensors (allocator blocks): 10.0 MiB at the peak, 6.5 MiB at the end, 10.5 MiB allocated"));
    let row: Vec<&str> = lines[4].split_whitespace().collect();
    assert_eq!(
        row,
        [
            "6.0",
            "MiB",
            "1",
            "6.0",
            "MiB",
            "1",
            "6.0",
            "MiB",
            "1",
            "app.py:9",
            "load_weights",
            "<",
            "_CachingAllocator.malloc"
        ]
    );
    assert_eq!(lines[5], "  (2 more lines: --top N shows more)");
    assert!(lines.iter().all(|l| l.chars().count() <= 120), "{table}");

    let missing = gpuprof_in(&dir, &["summary", recording.to_str().unwrap(), "-p", "1", "-f", "table"]);
    assert_eq!(missing.status.code(), Some(1));
    assert!(
        text(&missing.stderr).starts_with("gpuprof: error: pid 1 allocated no GPU memory in "),
        "{}",
        text(&missing.stderr)
    );
}

#[test]
fn exports_take_the_peak_unless_told_otherwise() {
    let (dir, recording, _) = recorded_app("first_run_peak");
    let folded = |args: &[&str]| {
        let mut all = vec!["export", recording.to_str().unwrap(), "-f", "folded"];
        all.extend_from_slice(args);
        let output = gpuprof_in(&dir, &all);
        assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
        let mut by_line: Vec<(String, u64)> = text(&output.stdout)
            .lines()
            .map(|l| {
                let (stack, bytes) = l.rsplit_once(' ').unwrap();
                let user = stack
                    .split(';')
                    .find(|f| f.contains("(app.py:") && !f.starts_with("<module>"))
                    .or(stack.split(';').find(|f| f.contains("(app.py:")))
                    .unwrap();
                (user.to_string(), bytes.parse().unwrap())
            })
            .collect();
        by_line.sort();
        by_line
    };
    let at_peak = vec![("forward (app.py:12)".to_string(), 4 * MIB), ("load_weights (app.py:9)".to_string(), 6 * MIB)];
    assert_eq!(folded(&[]), at_peak);
    assert_eq!(folded(&["--peak"]), at_peak);
    assert_eq!(
        folded(&["--end"]),
        [("<module> (app.py:18)".to_string(), 512 * 1024), ("load_weights (app.py:9)".to_string(), 6 * MIB)]
    );
    let conflicting =
        gpuprof_in(&dir, &["export", recording.to_str().unwrap(), "-f", "folded", "--peak", "--at", "0.1"]);
    assert_eq!(conflicting.status.code(), Some(2));

    // speedscope: one sampled profile per process, stacks outermost first, weighted by bytes.
    let output = gpuprof_in(&dir, &["export", recording.to_str().unwrap(), "-f", "speedscope"]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let document: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(document["$schema"], "https://www.speedscope.app/file-format-schema.json");
    let profiles = document["profiles"].as_array().unwrap();
    assert_eq!(profiles.len(), 1);
    let profile = &profiles[0];
    assert_eq!(
        (profile["type"].as_str(), profile["unit"].as_str(), profile["endValue"].as_u64()),
        (Some("sampled"), Some("bytes"), Some(10 * MIB))
    );
    let frames = document["shared"]["frames"].as_array().unwrap();
    let mut samples: Vec<(Vec<String>, u64)> = profile["samples"]
        .as_array()
        .unwrap()
        .iter()
        .zip(profile["weights"].as_array().unwrap())
        .map(|(sample, weight)| {
            let names = sample
                .as_array()
                .unwrap()
                .iter()
                .map(|i| frames[i.as_u64().unwrap() as usize]["name"].as_str().unwrap().to_string())
                .collect();
            (names, weight.as_u64().unwrap())
        })
        .collect();
    samples.sort_by_key(|(_, weight)| *weight);
    assert_eq!(samples.len(), 2);
    assert_eq!(samples[0].0[..3], ["tensors", "<module> (app.py:16)", "forward (app.py:12)"]);
    assert_eq!(samples[1].0[..3], ["tensors", "<module> (app.py:15)", "load_weights (app.py:9)"]);
    assert_eq!((samples[0].1, samples[1].1), (4 * MIB, 6 * MIB));
    let weights_frame = frames.iter().find(|f| f["name"] == "load_weights (app.py:9)").unwrap();
    assert_eq!(
        (weights_frame["file"].as_str(), weights_frame["line"].as_u64()),
        (Some(dir.join("app.py").to_str().unwrap()), Some(9))
    );
}

/// A mistyped flag before the command is caught, with the flag it resembles; after the command's
/// first word (or after `--`) everything is the command's own.
#[test]
fn a_mistyped_flag_is_an_error_not_the_command() {
    let dir = scratch("first_run_mistyped");
    let output = gpuprof_in(&dir, &["run", "--fromat", "table", "--", "true"]);
    assert_eq!(output.status.code(), Some(2));
    let stderr = text(&output.stderr);
    assert!(stderr.starts_with("error: unexpected argument '--fromat' found"), "{stderr}");
    assert!(stderr.contains("tip: a similar argument exists: '--format'"), "{stderr}");
    assert!(!dir.read_dir().unwrap().any(|e| e.unwrap().file_name().to_string_lossy().ends_with(".gpuprof")));
    // The command's flags are its own: python3 gets `-c` and `--fromat`.
    let output = gpuprof_in(
        &dir,
        &["run", "--via", "shim", "-o", "/dev/null", python3(), "-c", "import sys; print(sys.argv[1:])", "--fromat"],
    );
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    assert_eq!(text(&output.stdout).lines().next(), Some("['--fromat']"));
    // A program whose name looks like a flag comes after `--`.
    let output = gpuprof_in(&dir, &["run", "--via", "shim", "-o", "/dev/null", "--", "--help"]);
    assert_eq!(output.status.code(), Some(1));
    assert!(text(&output.stderr).contains("gpuprof: error: cannot run `--help`: no such command in PATH"));
}

/// `report` and `summary` speak to a person on a terminal (a table) and to a program through a
/// pipe or into a file (JSON), unless told otherwise.
#[test]
fn report_and_summary_are_tables_on_a_terminal_and_json_through_a_pipe() {
    let (dir, recording, _) = recorded_app("first_run_tty_defaults");
    let recording = recording.to_str().unwrap();
    for view in ["report", "summary"] {
        let piped = gpuprof_in(&dir, &[view, recording]);
        assert_eq!(piped.status.code(), Some(0), "{view}: {}", text(&piped.stderr));
        serde_json::from_slice::<Value>(&piped.stdout).unwrap_or_else(|e| panic!("{view} through a pipe: {e}"));
        let into_file = dir.join(format!("{view}.out"));
        assert_eq!(gpuprof_in(&dir, &[view, recording, "-o", into_file.to_str().unwrap()]).status.code(), Some(0));
        serde_json::from_slice::<Value>(&std::fs::read(&into_file).unwrap())
            .unwrap_or_else(|e| panic!("{view} into a file: {e}"));
        // On a terminal (script(1) gives the command a pseudo-terminal): the table, its
        // findings' severity in colour unless NO_COLOR is set.
        let table = gpuprof_in(&dir, &[view, recording, "-f", "table"]);
        assert!(text(&table.stdout).lines().count() > 2, "{view}: {}", text(&table.stdout));
        let command = format!("{} {view} {recording}", gpuprof());
        let plain = on_a_terminal(&dir, &command, &[("NO_COLOR", "1")]);
        assert_eq!(plain, text(&table.stdout), "{view}");
        let coloured = on_a_terminal(&dir, &command, &[]);
        let info = "\x1b[36m[info]\x1b[0m";
        match view {
            // The app ends holding its allocator's cache: a fact, in cyan.
            "report" => assert_eq!(coloured, plain.replace("[info]", info), "{view}"),
            _ => assert_eq!(coloured, plain, "{view}: nothing to colour"),
        }
    }
}

/// What a command prints on a pseudo-terminal (script(1)), stdout and stderr together, with
/// `env` set.
fn on_a_terminal(dir: &Path, command: &str, env: &[(&str, &str)]) -> String {
    let mut on_terminal = Command::new("script");
    on_terminal.current_dir(dir).args(["-qec", command, "/dev/null"]).env_remove("NO_COLOR").envs(env.iter().copied());
    workload_env(&mut on_terminal, &dir.join("expected.jsonl"));
    let output = on_terminal.output_within(PATIENCE);
    assert_eq!(output.status.code(), Some(0), "{command}: {}", text(&output.stdout));
    text(&output.stdout).replace("\r\n", "\n")
}

/// While a capture runs on a terminal, one line on stderr, redrawn in place each second, says
/// what it has seen and how to stop it; through a pipe there is none, nor where the person asked
/// for plain text (NO_COLOR, TERM=dumb).
#[test]
fn a_capture_on_a_terminal_keeps_a_live_line_and_a_pipe_gets_none() {
    let dir = scratch("first_run_live_line");
    let slow_app = dir.join("slow_app.py");
    std::fs::write(&slow_app, APP.replace("print('done'", "import time; time.sleep(2.5)\nprint('done'")).unwrap();
    let recording = dir.join("slow.gpuprof");
    let (recording, slow_app) = (recording.to_str().unwrap(), slow_app.to_str().unwrap());
    let command = format!("{} run -o {recording} -- {} {slow_app}", gpuprof(), python3());
    let said = on_a_terminal(&dir, &command, &[("TERM", "xterm")]);
    // Drawn over itself: erase the line, write it, back to its start.
    let drawn: Vec<&str> = said
        .split("\r\x1b[2K")
        .skip(1)
        .filter_map(|d| d.split_once(" · Ctrl-C to stop\r"))
        .map(|(line, _)| line)
        .collect();
    assert!(drawn.len() >= 2, "{said:?}");
    // While the job sleeps: all but its exit seen, one process, its two segments (10 MiB).
    let events = event_count(Path::new(recording)) - 1;
    let last = drawn.last().unwrap();
    let expected = format!("gpuprof: {events} events · 1 CUDA process · 10.0 MiB live · ");
    assert!(last.starts_with(&expected) && last.ends_with(" s"), "{last:?} is not {expected:?}… s");
    // The line is gone before anything else is said.
    assert!(said.contains("\r\x1b[2K\nLive GPU memory at end") || said.contains("\r\x1b[2K\ngpuprof: "), "{said:?}");

    let piped = gpuprof_in(&dir, &["run", "-o", recording, "--", python3(), slow_app]);
    assert_eq!(piped.status.code(), Some(0));
    let piped = text(&piped.stderr);
    assert!(!piped.contains("Ctrl-C to stop") && !piped.contains('\x1b'), "{piped:?}");
    for plain_text in [("NO_COLOR", "1"), ("TERM", "dumb")] {
        let plain = on_a_terminal(&dir, &command, &[plain_text]);
        assert!(!plain.contains("Ctrl-C to stop") && !plain.contains('\x1b'), "{plain_text:?}: {plain:?}");
    }
}

/// Exports on a terminal go to files named after the input and the moment, never onto the
/// terminal; down a pipe they stream as before; every file written is said with how to open it;
/// a pattern that matched several inputs, an export given as input, and a name that says
/// nothing of its format are each said in a line.
#[test]
fn exports_write_named_files_and_say_how_to_open_them() {
    let (dir, recording, _) = recorded_app("first_run_export_files");
    let input = recording.to_str().unwrap();
    let export = |args: &str| on_a_terminal(&dir, &format!("{} export {input} {args}", gpuprof()), &[]);
    for (args, file, how) in [
        ("-f flamegraph", "app-peak.svg", "open it in a browser (click a frame to zoom)"),
        ("-f html", "app-report.html", "open it in a browser (one file; it works offline)"),
        ("-f speedscope --end", "app-end.speedscope.json", "open https://www.speedscope.app and drop the file in"),
        ("-f memory-viz", "app-end.pickle", "open https://pytorch.org/memory_viz and drop the file in"),
        ("-f folded --end", "app-end.folded", "one stack a line: draw it with inferno-flamegraph or flamegraph.pl"),
        ("-f jsonl", "app.jsonl", "one event a line (docs/events.md)"),
    ] {
        let said = export(args);
        let size = std::fs::metadata(dir.join(file)).unwrap_or_else(|e| panic!("{args}: {file}: {e}: {said}")).len();
        let wrote = format!("gpuprof: wrote {file} ({}): {how}", gpuprof_model::bytes::human(size));
        assert!(said.starts_with(&wrote), "{args}: {said:?} does not start {wrote:?}");
        assert_eq!(said.lines().count(), 1, "{args}: only the line, nothing of the file: {said:?}");
    }
    // Down a pipe: the view itself, no file.
    let piped = gpuprof_in(&dir, &["export", input, "-f", "folded"]);
    assert_eq!(piped.status.code(), Some(0));
    assert!(text(&piped.stdout).contains("load_weights (app.py:9)"), "{}", text(&piped.stdout));
    assert!(!dir.join("app-peak.folded").exists());
    // Named: said too.
    let named = gpuprof_in(&dir, &["export", input, "-f", "flamegraph", "-o", "peak.svg"]);
    assert!(text(&named.stderr).starts_with("gpuprof: wrote peak.svg ("), "{}", text(&named.stderr));
    // Binary onto a terminal, even asked for: refused.
    let refused = on_a_terminal_failing(&dir, &format!("{} export {input} -f recording -o -", gpuprof()));
    assert_eq!(
        refused,
        "gpuprof: error: -f recording is binary: it does not go onto a terminal; give -o FILE (or redirect stdout)\n"
    );

    // A shell pattern that matched two recordings.
    let second = dir.join("app2.gpuprof");
    std::fs::copy(&recording, &second).unwrap();
    let two = gpuprof_in(&dir, &["export", input, second.to_str().unwrap(), "-f", "html"]);
    assert_eq!(two.status.code(), Some(1));
    assert_eq!(
        text(&two.stderr),
        format!(
            "gpuprof: error: export reads one event file, and 2 were given ({input}, {}): name one, e.g. the newest: gpuprof export {}\n",
            second.display(),
            second.display()
        )
    );
    // An export where events are expected.
    let html = gpuprof_in(&dir, &["summary", "app-report.html"]);
    assert_eq!(html.status.code(), Some(1));
    assert_eq!(
        text(&html.stderr),
        "gpuprof: error: app-report.html is an HTML page (open it in a browser), not an event file: give the recording (.gpuprof) or jsonl it was made from\n"
    );

    // memray's habit: a name that says nothing of the format gets a recording, said.
    let app = dir.join("app.py");
    let run = gpuprof_in(&dir, &["run", "-o", "run.bin", "--", python3(), app.to_str().unwrap()]);
    let stderr = text(&run.stderr);
    assert_eq!(run.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("gpuprof: writing a recording (gpuprof's compact format) to run.bin: name it *.jsonl or give -f jsonl for one event a line\n"), "{stderr}");
    assert!(std::fs::read(dir.join("run.bin")).unwrap().starts_with(b"GPUPROF\0"));
    assert!(stderr.contains(" events to run.bin; next:\n"), "{stderr}");
}

/// What a command that fails prints on a pseudo-terminal.
fn on_a_terminal_failing(dir: &Path, command: &str) -> String {
    let output = Command::new("script").current_dir(dir).args(["-qec", command, "/dev/null"]).output_within(PATIENCE);
    assert_eq!(output.status.code(), Some(1), "{command}: {}", text(&output.stdout));
    text(&output.stdout).replace("\r\n", "\n")
}

/// `run --help` groups its flags under headings, the common ones first, and shows an
/// environment variable's value only where it is set.
#[test]
fn run_help_has_headings_and_shows_environment_values_only_where_set() {
    let help = |env: &[(&str, &str)]| {
        let output = Command::new(gpuprof())
            .args(["run", "--help"])
            .env_remove("GPUPROF_OTLP_EVENTS")
            .env_remove("GPUPROF_SHIM")
            .envs(env.iter().copied())
            .output_within(PATIENCE);
        assert_eq!(output.status.code(), Some(0));
        text(&output.stdout)
    };
    let plain = help(&[]);
    let headings: Vec<&str> =
        plain.lines().filter(|l| !l.starts_with(' ') && l.ends_with(':') && !l.contains(". ")).collect();
    assert_eq!(
        headings,
        ["Arguments:", "Options:", "Capture:", "Output:", "Findings:", "Fleet (OTLP):", "Advanced:", "Example:"]
    );
    let capture = plain.split("\nCapture:\n").nth(1).unwrap();
    let first: Vec<&str> =
        capture.lines().filter(|l| l.starts_with("  -") || l.starts_with("      --")).take(2).map(str::trim).collect();
    assert!(first[0].starts_with("-d, --duration <SECS>") && first[1].starts_with("--via <VIA>"), "{first:?}");
    assert!(!plain.contains("=]") && !plain.contains("[env: GPUPROF_OTLP_EVENTS"), "{plain}");
    assert!(help(&[("GPUPROF_OTLP_EVENTS", "all")]).contains("[env: GPUPROF_OTLP_EVENTS=all]"));
}
