//! The window keeper through the flow it hooks into: what a post-mortem's recording holds and
//! that replaying it gives what the processes held at the finding, the caps and what they drop,
//! one post-mortem per process instance and kind, the neighbours of an out-of-memory failure,
//! a directory that cannot be written.

use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::holdings::Holdings;
use super::*;
use crate::flow::{EventFlow, FlowOptions};
use gpuprof_model::event::{
    Event, Frame, Kind, Layer, Op, Source, CUDA_ERROR_OUT_OF_MEMORY, PYTORCH_ALLOCATOR_API, PYTORCH_OOM_API,
};
use gpuprof_model::{Finding, FindingKind, RuleConfig, Tracker};

const S: u64 = 1_000_000_000;
const MS: u64 = 1_000_000;
const MIB: u64 = 1 << 20;

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("gpuprof-postmortem-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn config(dir: &Path, window: Duration) -> PostmortemConfig {
    PostmortemConfig {
        dir: dir.to_path_buf(),
        node: "node-a".to_string(),
        window,
        process_bytes: 16 * MIB,
        node_bytes: 64 * MIB,
        max_bytes: 1024 * MIB,
        retention: Duration::from_secs(7 * 86400),
    }
}

fn flow_with(config: PostmortemConfig) -> EventFlow {
    let options = FlowOptions { rules: RuleConfig::default(), keep_findings: true, pids_are_ours: false };
    let mut flow = EventFlow::new(options, Vec::new());
    flow.keep_postmortems(Postmortems::start(config, notes_page).unwrap());
    flow
}

/// The report as these tests read it: its notes, a line each (the page around them is the
/// views', tested there).
fn notes_page(_recording: &Path, report: &Path, notes: &[String]) -> anyhow::Result<()> {
    Ok(std::fs::write(report, notes.join("\n"))?)
}

fn frame(function: &str, line: u32) -> Frame {
    Frame { function: function.into(), file: "/srv/train.py".into(), line }
}

fn driver(ts: u64, pid: u32, op: Op, api: &'static str, addr: u64, size: u64) -> Event {
    let mut event = Event::new(ts, pid, pid, Source::Ebpf, Layer::Driver, op, Cow::Borrowed(api));
    event.comm = "trainer".into();
    event.kind = Some(Kind::Device);
    event.device = Some(0);
    event.addr = Some(addr);
    event.size = size;
    event.stack = vec![frame(api, 10 + size.trailing_zeros())].into();
    event
}

fn block(ts: u64, pid: u32, op: Op, addr: u64, size: u64, allocated: u64, reserved: u64) -> Event {
    let mut event = Event::new(ts, pid, pid, Source::Ebpf, Layer::Allocator, op, Cow::Borrowed(PYTORCH_ALLOCATOR_API));
    event.comm = "trainer".into();
    event.kind = Some(Kind::Device);
    event.device = Some(0);
    event.addr = Some(addr);
    event.size = size;
    event.allocated = Some(allocated);
    event.reserved = Some(reserved);
    event.stack = vec![frame("forward", 77)].into();
    event
}

fn failed(ts: u64, pid: u32, size: u64) -> Event {
    let mut event = driver(ts, pid, Op::Alloc, "cuMemAlloc_v2", 0, size);
    event.result = CUDA_ERROR_OUT_OF_MEMORY;
    event
}

/// PyTorch's caching allocator gives up on a request (`c10::reportOutOfMemoryToProfiler`), with its
/// totals then.
fn gave_up(ts: u64, pid: u32, size: u64, allocated: u64, reserved: u64) -> Event {
    let mut event = Event::new(ts, pid, pid, Source::Ebpf, Layer::Allocator, Op::Alloc, Cow::Borrowed(PYTORCH_OOM_API));
    event.comm = "trainer".into();
    event.kind = Some(Kind::Device);
    event.device = Some(0);
    event.size = size;
    event.result = CUDA_ERROR_OUT_OF_MEMORY;
    event.allocated = Some(allocated);
    event.reserved = Some(reserved);
    event.stack = vec![frame("load", 90)].into();
    event
}

/// Turns the flow until `done` holds (the writer works on its own thread), for at most 30 s.
fn flush_until(flow: &mut EventFlow, done: impl Fn(&EventFlow) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !done(flow) {
        assert!(Instant::now() < deadline, "not done in 30 s: {:?}", flow.postmortem_stats());
        flow.flush().unwrap();
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn written(flow: &EventFlow) -> u64 {
    flow.postmortem_stats().map_or(0, |s| s.written)
}

fn read(path: &str) -> Vec<Event> {
    let mut file = gpuprof_recording::EventFile::open(Path::new(path)).unwrap();
    std::iter::from_fn(|| file.next_event().unwrap()).collect()
}

/// What the recording's replay holds of `pid` at its end, as the live tracker's holdings are
/// compared: every time no earlier than the window's start.
fn replayed(events: &[Event], pid: u32, start: u64) -> Holdings {
    let mut tracker = Tracker::new();
    for event in events {
        tracker.apply(event);
    }
    Holdings::of(tracker.process(pid).unwrap(), &tracker, None).as_of(start)
}

fn live(flow: &EventFlow, pid: u32, start: u64) -> Holdings {
    let tracker = flow.analyzer().tracker();
    Holdings::of(tracker.process(pid).unwrap(), tracker, None).as_of(start)
}

fn oom(flow: &EventFlow) -> &Finding {
    flow.findings().iter().find(|f| f.kind == FindingKind::Oom).expect("an oom finding")
}

/// A job's memory from long before the window (a buffer kept, one freed inside the window, a
/// tensor kept and one freed inside it), steady churn, then an allocation that fails: the
/// post-mortem opens at the window's start with what the job held then, and its replay holds at
/// the failure what the job held.
#[test]
fn a_post_mortem_opens_with_what_was_held_and_replays_to_what_the_job_held_at_the_failure() {
    let dir = scratch("replay");
    let mut flow = flow_with(config(&dir, Duration::from_secs(5)));
    let pid = 4711;
    let t0 = gpuprof_model::event::wall_clock_ns() - 40 * S;
    let at = |ms: u64| t0 + ms * MS;
    let mut ctx = driver(at(0), pid, Op::CtxCreate, "cuDevicePrimaryCtxRetain", 0x5000, 0);
    ctx.kind = None;
    flow.observe(ctx).unwrap();
    flow.observe(driver(at(100), pid, Op::Alloc, "cuMemAlloc_v2", 0x7f20_0000_0000, 64 * MIB)).unwrap();
    flow.observe(driver(at(200), pid, Op::Alloc, "cuMemAlloc_v2", 0x7f20_0400_0000, 8 * MIB)).unwrap();
    let mut pinned = driver(at(300), pid, Op::Alloc, "cuMemAllocHost_v2", 0x7e00_0000_0000, 2 * MIB);
    pinned.kind = Some(Kind::HostPinned);
    flow.observe(pinned).unwrap();
    // Two tensors in the 64 MiB segment: one kept, one freed inside the window.
    flow.observe(block(at(400), pid, Op::Alloc, 0x7f20_0000_0000, MIB, MIB, 64 * MIB)).unwrap();
    flow.observe(block(at(500), pid, Op::Alloc, 0x7f20_0010_0000, 2 * MIB, 3 * MIB, 64 * MIB)).unwrap();
    // 1 MiB allocated and freed every 100 ms, from 1 s to 29.9 s.
    for k in 0..290 {
        let ts = at(1000 + 100 * k);
        let addr = 0x7f20_1000_0000 + k * 0x20_0000;
        flow.observe(driver(ts, pid, Op::Alloc, "cuMemAlloc_v2", addr, MIB)).unwrap();
        flow.observe(driver(ts + 50 * MS, pid, Op::Free, "cuMemFree_v2", addr, 0)).unwrap();
        if k == 270 {
            flow.observe(driver(ts + 60 * MS, pid, Op::Free, "cuMemFree_v2", 0x7f20_0400_0000, 0)).unwrap();
            flow.observe(block(ts + 70 * MS, pid, Op::Free, 0x7f20_0010_0000, 2 * MIB, MIB, 64 * MIB)).unwrap();
        }
    }
    // The driver refuses a segment; the allocator, its cache emptied, gives up on the request.
    flow.observe(failed(at(29_999), pid, 100 << 30)).unwrap();
    let failure = at(30_000);
    flow.observe(gave_up(failure, pid, 100 << 30, MIB, 64 * MIB)).unwrap();

    let postmortem = oom(&flow).postmortem.clone().expect("the oom names its post-mortem");
    let start = failure - 5 * S;
    assert_eq!((postmortem.window_start, postmortem.window_end), (start, failure));
    assert_eq!(postmortem.node, "node-a");
    assert_eq!(postmortem.pids, [pid]);
    assert_eq!(postmortem.url, format!("/api/v1/findings/{}/report", oom(&flow).finding_id));
    let stem = format!("node-a-{pid}-trainer-oom-{}", directory::utc_stamp(failure));
    assert_eq!(postmortem.recording, dir.join(format!("{stem}.gpuprof")).display().to_string());
    assert_eq!(postmortem.report, dir.join(format!("{stem}.html")).display().to_string());
    flush_until(&mut flow, |flow| written(flow) == 1);

    let events = read(&postmortem.recording);
    // The prologue, all at the window's start: the context, the three buffers (the 8 MiB one
    // freed inside the window among them) and the two tensors, the first carrying the
    // allocator's totals as they stood.
    let prologue: Vec<(Layer, Op, u64, Option<u64>)> =
        events.iter().take(6).map(|e| (e.layer, e.op, e.size, e.allocated)).collect();
    assert_eq!(
        prologue,
        [
            (Layer::Driver, Op::CtxCreate, 0, None),
            (Layer::Driver, Op::Alloc, 64 * MIB, None),
            (Layer::Driver, Op::Alloc, 8 * MIB, None),
            (Layer::Driver, Op::Alloc, 2 * MIB, None),
            (Layer::Allocator, Op::Alloc, MIB, Some(MIB)),
            (Layer::Allocator, Op::Alloc, 2 * MIB, Some(3 * MIB)),
        ]
    );
    assert!(events[..6].iter().all(|e| e.ts == start && e.pid == pid));
    // Then the window: 50 churn pairs from 25.0 s, the two frees, the failed segment and the
    // allocator's giving up.
    assert_eq!(events.len(), 6 + 100 + 2 + 2);
    assert!(events[6..].iter().all(|e| e.ts >= start && e.ts <= failure));
    assert_eq!(events[6].ts, at(25_000));
    assert_eq!(events.last().map(|e| (e.ts, e.result)), Some((failure, CUDA_ERROR_OUT_OF_MEMORY)));
    assert_eq!(replayed(&events, pid, start), live(&flow, pid, start));
    let held = replayed(&events, pid, start);
    let bytes: u64 = held
        .held
        .iter()
        .map(|h| match h {
            holdings::Held::Allocation(a) | holdings::Held::Block(a) => a.size,
            _ => 0,
        })
        .sum();
    assert_eq!((held.contexts, held.totals.get(&0).copied(), bytes), (1, Some((MIB, 64 * MIB)), 66 * MIB + MIB));

    let html = std::fs::read_to_string(&postmortem.report).unwrap();
    assert!(html
        .contains(&format!("Post-mortem of the oom of pid {pid} (trainer) on node node-a: the last 5.0 s before it")));
    assert!(html.contains(&format!(
        "pid {pid} (trainer): tensor detail (1 allocator event) from 3.1 s to 3.1 s of the window; the driver's calls only after it."
    )));
}

/// Fed one event at a time as a flow would, the windows drop their oldest chunks past the caps,
/// say how many events went, and the post-mortem says how far back its window reaches.
#[test]
fn the_caps_drop_the_oldest_chunks_and_count_their_events() {
    let dir = scratch("caps");
    let mut settings = config(&dir, Duration::from_secs(12));
    // Any closed chunk is over these: each is dropped as it closes, the oldest process's first.
    settings.process_bytes = 1;
    let mut flow = flow_with(settings);
    let t0 = gpuprof_model::event::wall_clock_ns() - 20 * S;
    // Two processes, an event every 250 ms for 10 s: a chunk is a second.
    for n in 0..40 {
        for pid in [10, 11] {
            let addr = 0x7f20_0000_0000 + n * 0x20_0000;
            flow.observe(driver(t0 + n * S / 4, pid, Op::Alloc, "cuMemAlloc_v2", addr, 4096)).unwrap();
        }
    }
    let stats = flow.postmortem_stats().unwrap();
    // Nine chunks of four events closed per process, each dropped; the tenth is being written.
    assert_eq!((stats.window_events, stats.window_events_shed), (8, 72));
    flow.observe(failed(t0 + 9 * S + S / 2, 10, 100 << 30)).unwrap();
    flush_until(&mut flow, |flow| written(flow) == 1);
    let postmortem = oom(&flow).postmortem.clone().unwrap();
    // The window begins at the first event kept, not 12 s before the failure.
    assert_eq!(postmortem.window_start, t0 + 9 * S);
    let html = std::fs::read_to_string(&postmortem.report).unwrap();
    assert!(
        html.contains("pid 10 (trainer): its window reaches back only 0.5 s before the failure (of 12.0 s asked): a memory cap of the daemon"),
        "{html}"
    );
}

/// An out-of-memory failure is the device's story: the post-mortem holds the windows of every
/// process that held memory then, each replaying to what it held; a second failure of another
/// size is another finding but not another post-mortem of that process.
#[test]
fn an_oom_post_mortem_holds_its_neighbours_and_a_process_gets_one_per_kind() {
    let dir = scratch("neighbours");
    let mut flow = flow_with(config(&dir, Duration::from_secs(5)));
    let t0 = gpuprof_model::event::wall_clock_ns() - 20 * S;
    let (failing, neighbour, idle) = (20, 21, 22);
    flow.observe(driver(t0, neighbour, Op::Alloc, "cuMemAlloc_v2", 0x7f20_0000_0000, 40 * MIB)).unwrap();
    flow.observe(driver(t0 + S, idle, Op::Alloc, "cuMemAlloc_v2", 0x7f20_0000_0000, 4 * MIB)).unwrap();
    for k in 0..100 {
        let ts = t0 + 2 * S + k * 100 * MS;
        let churn = 0x7f30_0000_0000 + k * 0x20_0000;
        flow.observe(driver(ts, failing, Op::Alloc, "cuMemAlloc_v2", churn, MIB)).unwrap();
        flow.observe(driver(ts + 5 * MS, failing, Op::Free, "cuMemFree_v2", churn, 0)).unwrap();
        flow.observe(driver(
            ts + 10 * MS,
            neighbour,
            Op::Alloc,
            "cuMemAlloc_v2",
            0x7f40_0000_0000 + k * 0x20_0000,
            2 * MIB,
        ))
        .unwrap();
    }
    let failure = t0 + 12 * S;
    flow.observe(failed(failure, failing, 16 * MIB)).unwrap();
    flow.observe(failed(failure + S, failing, 32 * MIB)).unwrap();
    let ooms: Vec<&Finding> = flow.findings().iter().filter(|f| f.kind == FindingKind::Oom).collect();
    assert_eq!(ooms.len(), 2);
    assert!(ooms[1].postmortem.is_none(), "one post-mortem per process instance and kind");
    let postmortem = ooms[0].postmortem.clone().unwrap();
    // The failing process first, then the others holding memory, most first.
    assert_eq!(postmortem.pids, [failing, neighbour, idle]);
    flush_until(&mut flow, |flow| written(flow) == 1);
    let events = read(&postmortem.recording);
    let start = failure - 5 * S;
    for pid in [failing, neighbour, idle] {
        assert_eq!(replayed(&events, pid, start), live(&flow, pid, start), "pid {pid}");
    }
    // The idle process made no event in the window: its holdings open it, nothing more.
    assert_eq!(events.iter().filter(|e| e.pid == idle).count(), 1);
    assert!(events.windows(2).all(|pair| pair[0].ts <= pair[1].ts), "in time order");
}

/// A directory that cannot be written: the post-mortem fails with the path and the remedy,
/// counted, and the capture goes on.
#[test]
fn a_post_mortem_that_cannot_be_written_is_said_and_counted() {
    let dir = scratch("unwritable");
    let mut keeper = Postmortems::start(config(&dir, Duration::from_secs(5)), notes_page).unwrap();
    // The directory goes, and a file takes its name.
    std::fs::remove_dir_all(&dir).unwrap();
    std::fs::write(&dir, b"not a directory").unwrap();
    let mut analyzer = gpuprof_model::Analyzer::new(RuleConfig::default());
    let ranks = gpuprof_model::rank::Ranks::default();
    let t0 = gpuprof_model::event::wall_clock_ns();
    let mut finding = None;
    for mut event in [driver(t0, 30, Op::Alloc, "cuMemAlloc_v2", 0x7f20_0000_0000, MIB), failed(t0 + S, 30, MIB << 20)]
    {
        keeper.before(&event, analyzer.tracker());
        let mut fired = analyzer.observe(&mut event);
        keeper.after(&event, &mut fired, analyzer.tracker(), &ranks);
        finding = fired.into_iter().next().or(finding);
    }
    let recording = finding.and_then(|f| f.postmortem).unwrap().recording;
    let deadline = Instant::now() + Duration::from_secs(30);
    let done = loop {
        let done = keeper.tick(gpuprof_model::event::wall_clock_ns());
        if let Some(failure) = done.into_iter().find(|d| matches!(d, Done::Failed { .. })) {
            break failure;
        }
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(20));
    };
    let Done::Failed { pid, kind, path, error, .. } = done else { unreachable!() };
    assert_eq!((pid, kind, path.display().to_string()), (30, FindingKind::Oom, recording));
    assert_eq!(error, "Not a directory (os error 20)");
    assert_eq!((keeper.stats().failed, keeper.stats().written), (1, 0));
    std::fs::remove_file(&dir).unwrap();
}

/// A process's window goes when the tracker forgets its table.
#[test]
fn a_window_is_forgotten_with_its_process() {
    let dir = scratch("forget");
    let mut flow = flow_with(config(&dir, Duration::from_secs(5)));
    let t0 = gpuprof_model::event::wall_clock_ns() - 10 * S;
    flow.observe(driver(t0, 40, Op::Alloc, "cuMemAlloc_v2", 0x7f20_0000_0000, MIB)).unwrap();
    let mut exit = Event::new(t0 + S, 40, 40, Source::Ebpf, Layer::Process, Op::Exit, Cow::Borrowed("exit"));
    exit.exit_code = Some(0);
    flow.observe(exit).unwrap();
    assert_eq!(flow.postmortem_stats().unwrap().window_events, 2);
    assert_eq!(flow.forget_exited(Duration::from_secs(1)), 1);
    assert_eq!(flow.postmortem_stats().unwrap().window_events, 0);
}
