//! Long work tells a person at a terminal how far it is: a view's pass over a large recording
//! draws one line on stderr (percent of the file, events a second, time left), in place, and
//! erases it when done; a capture's end says what it is still writing. Nothing through a pipe,
//! with NO_COLOR, or on a dumb terminal. GPUPROF_PROGRESS_AFTER_MS=0 draws from the first tick,
//! so a file made in a second shows what a large one shows after half a second.

use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::process::Command;

use gpuprof_model::event::{Frame, Kind, Layer, Op, Source};
use gpuprof_model::{Event, Stack};
use gpuprof_testkit::*;

/// Allocations in the large recording (each freed but every thousandth: about twice as many events).
const ALLOCATIONS: u64 = 60_000;

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A recording of `ALLOCATIONS` allocations and their frees, made from jsonl by `export -f recording`: a loop's driver
/// allocations of varied sizes from varied lines, each freed after the next is made but every
/// thousandth, which is kept, so that live memory peaks at the end; varied enough that the file
/// is large beside the reader's buffers.
fn large_recording(dir: &Path) -> PathBuf {
    let mut random = 42u64;
    let mut next = move || {
        random = random.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        random >> 33
    };
    let event = |i: u64, op: Op, block: u64| {
        let api = if op == Op::Alloc { "cuMemAlloc_v2" } else { "cuMemFree_v2" };
        let ts = 1_800_000_000_000_000_000 + i * 10_000;
        let mut event = Event::new(ts, 4711, 4711, Source::Ebpf, Layer::Driver, op, Cow::Borrowed(api));
        event.comm = "python3".into();
        event.kind = Some(Kind::Device);
        event.device = Some(0);
        event.addr = Some(0x7f00_0000_0000 + block * (4 << 20));
        event
    };
    let mut jsonl = String::new();
    for block in 0..ALLOCATIONS {
        let mut alloc = event(2 * block, Op::Alloc, block);
        alloc.size = (1 + next() % 4096) * 512;
        let line = 10 + (next() % 500) as u32;
        alloc.stack = Stack::new(vec![Frame { function: "step".into(), file: "/srv/train.py".into(), line }]);
        let mut events = vec![alloc];
        // The one before, freed; every thousandth kept.
        if let Some(previous) = block.checked_sub(1).filter(|b| b % 1000 != 0) {
            events.push(event(2 * block + 1, Op::Free, previous));
        }
        for event in events {
            jsonl.push_str(&serde_json::to_string(&event).unwrap());
            jsonl.push('\n');
        }
    }
    let (from, to) = (dir.join("large.jsonl"), dir.join("large.gpuprof"));
    std::fs::write(&from, jsonl).unwrap();
    let made = Command::new(gpuprof())
        .args(["export", "-f", "recording", "-o"])
        .arg(&to)
        .arg(&from)
        .env("GPUPROF_PROGRESS_AFTER_MS", "0")
        .output_within(PATIENCE);
    assert_eq!(made.status.code(), Some(0), "{}", text(&made.stderr));
    // Through a pipe: what it wrote, and no progress.
    let size = gpuprof_model::bytes::human(std::fs::metadata(&to).unwrap().len());
    let to = to.display();
    let said = format!("gpuprof: wrote {to} ({size}): read it with `gpuprof summary {to}` or `gpuprof report {to}`\n");
    assert_eq!(text(&made.stderr), said);
    let to = dir.join("large.gpuprof");
    std::fs::remove_file(&from).unwrap();
    to
}

/// What a command prints on a pseudo-terminal (script(1)), stdout and stderr together, with
/// `env` set (and the line drawn from the first tick).
fn on_a_terminal(dir: &Path, command: &str, env: &[(&str, &str)]) -> String {
    let mut on_terminal = Command::new("script");
    on_terminal
        .current_dir(dir)
        .args(["-qec", command, "/dev/null"])
        .env_remove("NO_COLOR")
        .env("TERM", "xterm")
        .env("GPUPROF_PROGRESS_AFTER_MS", "0")
        .envs(env.iter().copied());
    workload_env(&mut on_terminal, &dir.join("expected.jsonl"));
    let output = on_terminal.output_within(PATIENCE);
    assert_eq!(output.status.code(), Some(0), "{command}: {}", text(&output.stdout));
    text(&output.stdout).replace("\r\n", "\n")
}

/// The lines drawn: each erases the line, is written, and takes the cursor back to its start.
fn drawn(said: &str) -> Vec<&str> {
    said.split("\r\x1b[2K").filter_map(|d| d.split_once('\r')).map(|(line, _)| line).collect()
}

/// "gpuprof: DOING: 42% · 310,512 events/s · 3 s left": DOING and the percent.
fn progress_of(line: &str, doing: &str) -> Option<u64> {
    let rest = line.strip_prefix(&format!("gpuprof: {doing}: "))?;
    let (percent, rest) = rest.split_once("% · ")?;
    let (rate, left) = rest.split_once(" events/s · ")?;
    assert!(rate.chars().all(|c| c.is_ascii_digit() || c == ','), "{line:?}");
    assert!(left.ends_with(" left") && left.chars().next().is_some_and(|c| c.is_ascii_digit()), "{line:?}");
    percent.parse().ok()
}

#[test]
fn a_summary_of_a_large_recording_draws_its_progress_and_erases_it() {
    let dir = scratch("progress_summary");
    let recording = large_recording(&dir);
    let command = format!("{} summary {}", gpuprof(), recording.display());
    let said = on_a_terminal(&dir, &command, &[]);
    let lines = drawn(&said);
    // Two passes: the peak, then the file again up to it.
    let first: Vec<u64> = lines.iter().filter_map(|l| progress_of(l, "reading large.gpuprof")).collect();
    let second: Vec<u64> = lines.iter().filter_map(|l| progress_of(l, "reading large.gpuprof (pass 2)")).collect();
    assert!(!first.is_empty() && !second.is_empty(), "{said:?}");
    assert_eq!(first.len() + second.len(), lines.len(), "only progress is drawn: {lines:?}");
    for percents in [&first, &second] {
        assert!(percents.windows(2).all(|w| w[0] <= w[1]) && percents.iter().all(|p| *p <= 100), "{percents:?}");
    }
    // Erased, and then the table alone, as through a pipe, from the left edge of a clean line.
    let piped = Command::new(gpuprof())
        .args(["summary", "-f", "table"])
        .arg(&recording)
        .env("GPUPROF_PROGRESS_AFTER_MS", "0")
        .output_within(PATIENCE);
    assert_eq!(piped.status.code(), Some(0));
    let table = text(&piped.stdout);
    assert!(table.contains("pid 4711") && said.ends_with(&table), "{said:?}");
    assert!(said[..said.len() - table.len()].ends_with(" left\r\r\x1b[2K"), "{said:?}");
    // Through a pipe, stderr has no progress at all.
    assert_eq!(text(&piped.stderr), "");
}

#[test]
fn an_export_draws_its_progress_on_a_terminal_only() {
    let dir = scratch("progress_export");
    let recording = recording_name(&large_recording(&dir));
    let command = format!("{} export {recording} -f jsonl -o out.jsonl", gpuprof());
    let said = on_a_terminal(&dir, &command, &[]);
    let lines = drawn(&said);
    assert!(!lines.is_empty() && lines.iter().all(|l| progress_of(l, "reading large.gpuprof").is_some()), "{said:?}");
    // Erased, then what was written, said on a clean line.
    assert!(said.contains("\r\x1b[2Kgpuprof: wrote out.jsonl ("), "{said:?}");
    // NO_COLOR and a dumb terminal ask for plain text: no line drawn.
    for env in [("NO_COLOR", "1"), ("TERM", "dumb")] {
        let plain = on_a_terminal(&dir, &command, &[env]);
        assert!(
            plain.starts_with("gpuprof: wrote out.jsonl (") && !plain.contains('\x1b') && !plain.contains('\r'),
            "{env:?}: {plain:?}"
        );
    }
}

/// A job of the miniature torch (an installed package over the libcuda and libc10 stand-ins)
/// that makes and frees 400 tensors.
const APP: &str = "import os, sys
sys.path.insert(0, os.path.join(os.environ['PYTHONPATH'], 'site-packages'))
import minitorch

minitorch.init()
for _ in range(400):
    tensor = minitorch.empty(1 << 20)
    del tensor
print('done', flush=True)
";

/// At the end of a capture, what is still being written is said, then erased: the recording,
/// then the --html report, whose passes over the recording say how far they are.
#[test]
fn the_end_of_a_capture_says_what_it_is_still_writing() {
    let dir = scratch("progress_run");
    std::fs::write(dir.join("app.py"), APP).unwrap();
    let command = format!("{} run -o app.gpuprof --html app.html -- {} app.py", gpuprof(), python3());
    let said = on_a_terminal(&dir, &command, &[]);
    let events = event_count(&dir.join("app.gpuprof"));
    assert!(events > 800, "{events} events");
    let writing = format!("\r\x1b[2Kgpuprof: writing the recording of {events} events to app.gpuprof…\r");
    let at = said.find(&writing).unwrap_or_else(|| panic!("{said:?}"));
    // Erased before the end of the run is said.
    let after = &said[at + writing.len()..];
    assert!(after.starts_with("\r\x1b[2K"), "{said:?}");
    let ended = after.find("gpuprof: captured ").unwrap_or_else(|| panic!("{said:?}"));
    assert!(!after[..ended].contains("writing the recording"), "{said:?}");
    // The report's two passes, each drawn and erased before the report is said written.
    let report = format!("writing the HTML report of {events} events to app.html");
    let lines = drawn(&said);
    assert!(lines.iter().any(|l| progress_of(l, &report).is_some()), "{said:?}");
    assert!(lines.iter().any(|l| progress_of(l, &format!("{report} (pass 2)")).is_some()), "{said:?}");
    assert!(said.contains(" left\r\r\x1b[2Kgpuprof: wrote the report to app.html; open it in a browser\n"), "{said:?}");
    assert!(said.ends_with("gpuprof: wrote the report to app.html; open it in a browser\n"), "{said:?}");
    // Through a pipe: none of it.
    let mut piped = Command::new(gpuprof());
    piped.current_dir(&dir).args(["run", "-o", "app.gpuprof", "--html", "app.html", "--", python3(), "app.py"]);
    workload_env(&mut piped, &dir.join("expected.jsonl"));
    let piped = piped.env("GPUPROF_PROGRESS_AFTER_MS", "0").output_within(PATIENCE);
    assert_eq!(piped.status.code(), Some(0));
    let stderr = text(&piped.stderr);
    assert!(!stderr.contains("writing") && !stderr.contains('\x1b') && !stderr.contains('\r'), "{stderr:?}");
}

/// The events in a recording, read back as jsonl.
fn event_count(recording: &Path) -> usize {
    let jsonl = recording.with_extension("jsonl");
    let output = Command::new(gpuprof())
        .arg("export")
        .arg(recording)
        .args(["-f", "jsonl", "-o"])
        .arg(&jsonl)
        .output_within(PATIENCE);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    read_events(&jsonl).len()
}

fn recording_name(path: &Path) -> String {
    path.file_name().unwrap().to_string_lossy().into_owned()
}
