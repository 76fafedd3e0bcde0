//! What keeping post-mortem windows costs per event at a training job's rate: a stream of tensor
//! events (PyTorch's allocator: blocks handed out and taken back, one kept a step; 30-frame Python
//! stacks over 64 lines; 4 processes at 50,000 events a second in all) through the flow a daemon
//! runs — tracker and leak rules — without and with the window keeper, in pairs of rounds in the
//! same run, and the median of the pairs' ratios. The keeper writes every event into its
//! process's window and compresses each chunk as it closes. Times are the thread's CPU time
//! (on a shared machine, wall time counts other programs' turns too).
//!
//!     cargo bench -p gpuprof-capture --bench postmortem

use std::borrow::Cow;
use std::hint::black_box;
use std::time::Duration;

use gpuprof_capture::flow::{EventFlow, FlowOptions};
use gpuprof_capture::postmortem::{PostmortemConfig, Postmortems};
use gpuprof_model::event::{Event, Frame, Kind, Layer, Op, Source, PYTORCH_ALLOCATOR_API};
use gpuprof_model::{RuleConfig, Stack};

const EVENTS: u64 = 1_000_000;
const ROUNDS: usize = 7;
const PROCESSES: u64 = 4;
/// Between two events of the stream: 50,000 a second.
const STEP_NS: u64 = 20_000;

/// 64 distinct 30-frame stacks, as a training loop's lines.
fn stacks() -> Vec<Stack> {
    (0..64)
        .map(|line| {
            let frames: Vec<Frame> = (0..30)
                .map(|depth| Frame {
                    function: format!("layer_{depth}.forward"),
                    file: format!("/opt/conda/lib/python3.11/site-packages/torch/nn/modules/m{depth}.py"),
                    line: 100 + depth * 7 + if depth == 0 { line } else { 0 },
                })
                .collect();
            Stack::new(frames)
        })
        .collect()
}

/// Blocks handed out and taken back in pairs; one pair in 64 is two blocks kept (at addresses
/// never used again): the allocator's stream, its totals on every report.
fn events(start: u64) -> Vec<Event> {
    let stacks = stacks();
    // A process's name is shared by its events, as the capture shares it.
    let comm: std::sync::Arc<str> = "python3".into();
    let mut allocated = [0u64; PROCESSES as usize];
    (0..EVENTS)
        .map(|n| {
            let process = (n / 2) % PROCESSES;
            let pair = n / 2 / PROCESSES;
            let second = n % 2 == 1;
            let kept = pair % 64 == 0;
            let size = 4096 << (pair % 8);
            let (op, addr) = match (kept, second) {
                (true, _) => (Op::Alloc, 0x7e00_0000_0000 + n * 0x1000),
                (false, false) => (Op::Alloc, 0x7f00_0000_0000 + pair % 1024 * 0x10_0000),
                (false, true) => (Op::Free, 0x7f00_0000_0000 + pair % 1024 * 0x10_0000),
            };
            let pid = 1000 + process as u32;
            let api = Cow::Borrowed(PYTORCH_ALLOCATOR_API);
            let mut event = Event::new(start + n * STEP_NS, pid, pid, Source::Ebpf, Layer::Allocator, op, api);
            event.comm = comm.clone();
            event.kind = Some(Kind::Device);
            event.device = Some(0);
            event.addr = Some(addr);
            event.size = size;
            let total = &mut allocated[process as usize];
            *total = if op == Op::Free { total.saturating_sub(size) } else { *total + size };
            event.allocated = Some(*total);
            event.reserved = Some(8 << 30);
            event.stack = stacks[(pair % 64) as usize].clone();
            event
        })
        .collect()
}

/// This thread's CPU time, ns.
fn cpu_ns() -> u64 {
    let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes the timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) };
    now.tv_sec as u64 * 1_000_000_000 + now.tv_nsec as u64
}

fn flow(postmortems: Option<&std::path::Path>) -> EventFlow {
    let options = FlowOptions { rules: RuleConfig::default(), keep_findings: false, pids_are_ours: false };
    let mut flow = EventFlow::new(options, Vec::new());
    if let Some(dir) = postmortems {
        let config = PostmortemConfig {
            dir: dir.to_path_buf(),
            node: "bench".to_string(),
            window: Duration::from_secs(60),
            process_bytes: 16 << 20,
            node_bytes: 64 << 20,
            max_bytes: 1 << 30,
            retention: Duration::from_secs(86400),
        };
        flow.keep_postmortems(Postmortems::start(config, notes_page).expect("a scratch directory for the bench"));
    }
    flow
}

/// A post-mortem's report as its notes alone: the page around them is the views' to draw, and
/// is written on the writer's thread, not the capture's.
fn notes_page(_recording: &std::path::Path, report: &std::path::Path, notes: &[String]) -> anyhow::Result<()> {
    Ok(std::fs::write(report, notes.join("\n"))?)
}

/// ns per event of one round, and what the windows hold at its end.
fn round(events: &[Event], postmortems: Option<&std::path::Path>) -> (f64, u64) {
    let mut flow = flow(postmortems);
    let started = cpu_ns();
    for event in events {
        flow.observe(event.clone()).unwrap();
    }
    let ns = (cpu_ns() - started) as f64 / events.len() as f64;
    let held = flow.postmortem_stats().map_or(0, |s| s.window_bytes);
    black_box(flow.events());
    (ns, held)
}

/// ns per event of writing the events into one in-memory recording, what each window does.
fn writer_alone(events: &[Event]) -> f64 {
    let mut writer = gpuprof_recording::Writer::new(Vec::new(), false).unwrap();
    let started = cpu_ns();
    for event in events {
        writer.write(event).unwrap();
    }
    let ns = (cpu_ns() - started) as f64 / events.len() as f64;
    black_box(writer.finish(0).unwrap().len());
    ns
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() {
    let dir = std::env::temp_dir().join(format!("gpuprof-bench-postmortem-{}", std::process::id()));
    let start = gpuprof_model::event::wall_clock_ns() - EVENTS * STEP_NS;
    let events = events(start);
    let (mut without, mut with, mut writing, mut held) = (Vec::new(), Vec::new(), Vec::new(), 0);
    for _ in 0..ROUNDS {
        without.push(round(&events, None).0);
        let (ns, bytes) = round(&events, Some(&dir));
        with.push(ns);
        held = bytes;
        writing.push(writer_alone(&events));
    }
    let _ = std::fs::remove_dir_all(&dir);
    let ratios: Vec<f64> = with.iter().zip(&without).map(|(with, without)| with / without).collect();
    let (without, with, writing, ratio) = (median(without), median(with), median(writing), median(ratios));
    println!(
        "post-mortem windows, {EVENTS} tensor events of {PROCESSES} processes ({} s at 50,000 a second), 30-frame stacks, median of {ROUNDS} paired rounds, one core",
        EVENTS * STEP_NS / 1_000_000_000
    );
    println!("{:<40} {:>10}", "flow (tracker, rules)", format!("{without:.1} ns/event"));
    println!("{:<40} {:>10}", "flow + post-mortem windows", format!("{with:.1} ns/event"));
    println!("{:<40} {:>10}", "of which the recording writer", format!("{writing:.1} ns/event"));
    println!(
        "windows / without: {ratio:.2}x, the median of the rounds' ratios (+{:.1} ns an event); at the end the windows held {:.2} MiB",
        with - without,
        held as f64 / f64::from(1 << 20),
    );
}
