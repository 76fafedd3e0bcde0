//! Each rule with a case that fires and one that must not, over synthetic event streams.

use std::borrow::Cow;

use super::*;
use crate::event::{Event, Frame, Kind, Layer, Op, Source};

const MIB: u64 = 1 << 20;

struct Stream {
    events: Vec<Event>,
    ts: u64,
}

impl Stream {
    fn new() -> Self {
        Stream { events: Vec::new(), ts: 1_000 }
    }

    fn push(&mut self, mut event: Event) -> &mut Self {
        self.ts += 1_000;
        event.ts = self.ts;
        event.comm = "python3".into();
        self.events.push(event);
        self
    }

    fn at(&mut self, ts: u64) -> &mut Self {
        self.ts = ts;
        self
    }

    fn driver(&mut self, pid: u32, op: Op, api: &'static str, kind: Option<Kind>, addr: u64, size: u64) -> &mut Self {
        let mut event = Event::new(0, pid, pid, Source::Ebpf, Layer::Driver, op, Cow::Borrowed(api));
        event.kind = kind;
        event.addr = Some(addr);
        event.size = size;
        self.push(event)
    }

    fn alloc(&mut self, pid: u32, addr: u64, size: u64, stack: &[Frame]) -> &mut Self {
        self.driver(pid, Op::Alloc, "cuMemAlloc_v2", Some(Kind::Device), addr, size);
        self.events.last_mut().unwrap().stack = stack.to_vec().into();
        self
    }

    fn free(&mut self, pid: u32, addr: u64) -> &mut Self {
        self.driver(pid, Op::Free, "cuMemFree_v2", Some(Kind::Device), addr, 0)
    }

    fn context(&mut self, pid: u32) -> &mut Self {
        self.driver(pid, Op::CtxCreate, "cuDevicePrimaryCtxRetain", None, 0x1000, 0);
        self.events.last_mut().unwrap().device = Some(0);
        self
    }

    fn ipc(&mut self, pid: u32, op: Op, addr: u64, handle: u8) -> &mut Self {
        let api = match op {
            Op::IpcExport => "cuIpcGetMemHandle",
            Op::IpcOpen => "cuIpcOpenMemHandle_v2",
            _ => "cuIpcCloseMemHandle",
        };
        self.driver(pid, op, api, Some(Kind::Device), addr, 0);
        if op != Op::IpcClose {
            self.events.last_mut().unwrap().handle = Some(vec![handle; 64]);
        }
        self
    }

    fn process(&mut self, pid: u32, op: Op, ppid: u32) -> &mut Self {
        let mut event = Event::new(0, pid, pid, Source::Ebpf, Layer::Process, op, Cow::Borrowed("sched"));
        event.ppid = Some(ppid);
        if op == Op::Exit {
            event.exit_code = Some(0);
        }
        self.push(event)
    }

    fn findings(&self, config: RuleConfig) -> Vec<Finding> {
        analyze(&self.events, config)
    }

    fn kinds(&self) -> Vec<(FindingKind, u32, Option<u32>, u64)> {
        self.findings(RuleConfig::default()).iter().map(|f| (f.kind, f.pid, f.peer_pid, f.bytes)).collect()
    }
}

fn frame(function: &str, line: u32) -> Vec<Frame> {
    vec![Frame { function: function.into(), file: "train.py".into(), line }]
}

/// A parent (10) with a context and a 4 MiB buffer exported, and a spawned worker (11).
fn parent_and_worker() -> Stream {
    let mut s = Stream::new();
    s.context(10).alloc(10, 0xA000, 4 * MIB, &frame("share", 5)).ipc(10, Op::IpcExport, 0xA000, 0xAA);
    s.process(11, Op::Fork, 10);
    s
}

#[test]
fn a_clean_tree_has_no_finding() {
    let mut s = Stream::new();
    // A worker forked before the parent uses CUDA, cleaning up after itself.
    s.process(11, Op::Fork, 10).context(11).alloc(11, 0xB000, MIB, &[]).free(11, 0xB000).process(11, Op::Exit, 10);
    s.context(10).alloc(10, 0xA000, MIB, &[]).free(10, 0xA000).process(10, Op::Exit, 1);
    assert_eq!(s.kinds(), vec![]);
}

#[test]
fn exit_with_live_allocations_names_the_largest_allocation() {
    let mut s = Stream::new();
    s.alloc(20, 0xA000, MIB, &frame("small", 3)).alloc(20, 0xB000, 8 * MIB, &frame("big", 9));
    s.driver(20, Op::Alloc, "cuMemAllocHost_v2", Some(Kind::HostPinned), 0xC000, 64 * MIB);
    s.process(20, Op::Exit, 1);
    let found = s.findings(RuleConfig::default());
    assert_eq!(found.len(), 1);
    let f = &found[0];
    assert_eq!((f.kind, f.pid, f.bytes, f.count), (FindingKind::ExitWithLiveAllocations, 20, 9 * MIB, 2));
    assert_eq!(f.stack, frame("big", 9));
    assert_eq!(
        f.detail,
        "pid 20 (python3) exited still holding 9.0 MiB of device memory in 2 allocations; the largest, 8.0 MiB, came from cuMemAlloc_v2 at train.py:9 in big: release it once it is no longer needed (drop the tensor, torch.cuda.empty_cache()) instead of leaving it to the end of the process."
    );
}

#[test]
fn ipc_opened_and_closed_is_clean_but_left_open_is_a_finding() {
    let mut clean = parent_and_worker();
    clean.ipc(11, Op::IpcOpen, 0xF000, 0xAA).ipc(11, Op::IpcClose, 0xF000, 0).process(11, Op::Exit, 10);
    clean.free(10, 0xA000);
    assert_eq!(clean.kinds(), vec![]);

    let mut leaky = parent_and_worker();
    leaky.ipc(11, Op::IpcOpen, 0xF000, 0xAA).process(11, Op::Exit, 10);
    let found = leaky.findings(RuleConfig::default());
    assert_eq!(found.len(), 1);
    let f = &found[0];
    assert_eq!((f.kind, f.pid, f.peer_pid, f.bytes, f.count), (FindingKind::IpcHandleNotClosed, 11, Some(10), 4 * MIB, 1));
    assert_eq!(f.api.as_deref(), Some("cuIpcOpenMemHandle_v2"));
    // The exporter's export is gone with its exit, importer or not: no second finding.
}

#[test]
fn ipc_still_open_at_the_end_of_the_window() {
    let mut s = parent_and_worker();
    s.ipc(11, Op::IpcOpen, 0xF000, 0xAA);
    let found = s.findings(RuleConfig::default());
    assert_eq!(found.len(), 1);
    assert_eq!((found[0].kind, found[0].pid), (FindingKind::IpcHandleNotClosed, 11));
    assert!(found[0].detail.contains("still had open, when the capture ended, 1 IPC mapping (4.0 MiB) of pid 10's memory"));
}

#[test]
fn exporter_freeing_or_exiting_under_an_importer() {
    let mut freed = parent_and_worker();
    freed.ipc(11, Op::IpcOpen, 0xF000, 0xAA).free(10, 0xA000).ipc(11, Op::IpcClose, 0xF000, 0).process(11, Op::Exit, 10);
    let found = freed.findings(RuleConfig::default());
    assert_eq!(found.len(), 1, "{found:#?}");
    let f = &found[0];
    assert_eq!((f.kind, f.pid, f.peer_pid, f.bytes), (FindingKind::IpcExportFreedWhileImported, 10, Some(11), 4 * MIB));
    assert_eq!(f.stack, frame("share", 5));

    let mut exited = parent_and_worker();
    exited.ipc(11, Op::IpcOpen, 0xF000, 0xAA).process(10, Op::Exit, 1);
    let kinds: Vec<FindingKind> = exited.findings(RuleConfig::default()).iter().map(|f| f.kind).collect();
    assert_eq!(
        kinds,
        vec![FindingKind::ExitWithLiveAllocations, FindingKind::IpcExportFreedWhileImported, FindingKind::IpcHandleNotClosed]
    );
}

#[test]
fn a_reused_pid_is_not_the_exporter() {
    let mut s = parent_and_worker();
    s.free(10, 0xA000).process(10, Op::Exit, 1);
    // pid 10 comes back as another program and allocates at the same address.
    s.process(10, Op::Fork, 1).alloc(10, 0xA000, MIB, &[]);
    s.ipc(11, Op::IpcOpen, 0xF000, 0xAA).free(10, 0xA000);
    let found = s.findings(RuleConfig::default());
    let kinds: Vec<(FindingKind, u32, Option<u32>)> = found.iter().map(|f| (f.kind, f.pid, f.peer_pid)).collect();
    // The stale handle has no exporter; the new pid 10's free concerns nobody.
    assert_eq!(kinds, vec![(FindingKind::IpcHandleNotClosed, 11, None)]);
}

#[test]
fn worker_context_only_under_a_cuda_parent() {
    let mut s = parent_and_worker();
    s.context(11);
    s.process(12, Op::Fork, 1).context(12); // a child of a process with no context
    let found = s.findings(RuleConfig::default());
    let workers: Vec<(u32, Option<u32>)> =
        found.iter().filter(|f| f.kind == FindingKind::WorkerCudaContext).map(|f| (f.pid, f.peer_pid)).collect();
    assert_eq!(workers, vec![(11, Some(10))]);
}

#[test]
fn oom_pictures_every_process() {
    let mut s = Stream::new();
    s.alloc(30, 0xA000, 3 << 30, &frame("model", 1)).alloc(31, 0xA000, 512 * MIB, &frame("cache", 2));
    s.driver(31, Op::Alloc, "cuMemAlloc_v2", Some(Kind::Device), 0, 2 << 30);
    s.events.last_mut().unwrap().result = 2;
    s.events.last_mut().unwrap().stack = frame("step", 7).into();
    let found: Vec<Finding> = s.findings(RuleConfig::default()).into_iter().filter(|f| f.kind == FindingKind::Oom).collect();
    assert_eq!(found.len(), 1);
    let f = &found[0];
    assert_eq!((f.pid, f.bytes, f.stack.clone()), (31, 2 << 30, frame("step", 7)));
    let picture: Vec<(u32, u64)> = f.processes.iter().map(|p| (p.pid, p.live[&Kind::Device])).collect();
    assert_eq!(picture, vec![(30, 3 << 30), (31, 512 * MIB)]);
    assert_eq!(f.processes[0].top_stacks[0].stack, frame("model", 1));
    assert_eq!(
        f.detail,
        "cuMemAlloc_v2 of 2.0 GiB failed with out of memory in pid 31 (python3) at train.py:7 in step; at that moment gpuprof saw 3.5 GiB of device memory live in the processes it follows (pid 30 (python3) 3.0 GiB, pid 31 (python3) 512.0 MiB): free or shrink the largest holders, or allocate less at once."
    );
    // Other failures are not out-of-memory pictures.
    let mut other = Stream::new();
    other.driver(31, Op::Alloc, "cuMemCreate", Some(Kind::Vmm), 0, 2 * MIB);
    other.events.last_mut().unwrap().result = 800;
    assert_eq!(other.kinds(), vec![]);
}

#[test]
fn growth_fires_for_a_growing_stack_not_for_a_plateau() {
    let config = RuleConfig { growth_window_ns: 100_000, growth_rises: 3 };
    let leak = frame("leak", 10);
    let steady = frame("steady", 20);
    let mut s = Stream::new();
    // Ten windows of 100 µs: the leaking stack allocates every 50 µs and never frees; the steady
    // stack warms up in the first window, then frees what it allocates.
    let mut addr = 0x10_0000;
    s.alloc(40, 0x1, MIB, &steady).alloc(40, 0x2, MIB, &steady);
    for step in 0..20u64 {
        s.at(2_000 + step * 50_000);
        s.alloc(40, addr, MIB, &leak);
        addr += 1;
        s.alloc(40, 0x100 + step, MIB, &steady).free(40, 0x100 + step);
    }
    let found = s.findings(config);
    assert_eq!(found.len(), 1, "{found:#?}");
    let f = &found[0];
    assert_eq!((f.kind, f.pid), (FindingKind::Growth, 40));
    assert_eq!(f.stack, leak);
    // Rises at the ends of windows 1, 2, 3 (2 allocations each): 6 MiB over three windows.
    assert_eq!((f.bytes, f.count), (6 * MIB, 6));
    assert_eq!((f.first_ts, f.last_ts), (1_000 + 1_000, 1_000 + 1_000 + 300_000));
}

#[test]
fn an_analyzer_saved_and_restored_mid_stream_fires_the_same_findings() {
    // Growth half-way through its streak, an export with an importer, a worker context: every
    // piece of rule state is in flight at the cut.
    let config = RuleConfig { growth_window_ns: 100_000, growth_rises: 3 };
    let mut s = parent_and_worker();
    s.ipc(11, Op::IpcOpen, 0xB000, 0xAA).context(11);
    for step in 0..12u64 {
        s.at(10_000 + step * 50_000);
        s.alloc(40, 0x10_0000 + step, MIB, &frame("leak", 10));
    }
    s.free(10, 0xA000).process(11, Op::Exit, 10).process(40, Op::Exit, 1);
    let whole = s.findings(config);
    assert_eq!(whole.len(), 5, "{whole:#?}");

    for cut in [3, s.events.len() / 2, s.events.len() - 2] {
        let mut first = Analyzer::new(config);
        let mut found: Vec<Finding> = Vec::new();
        for event in &s.events[..cut] {
            found.extend(first.observe(&mut event.clone()));
        }
        let saved = postcard::to_stdvec(&first).unwrap();
        let mut restored: Analyzer = postcard::from_bytes(&saved).unwrap();
        for event in &s.events[cut..] {
            found.extend(restored.observe(&mut event.clone()));
        }
        found.extend(restored.finish());
        assert_eq!(found, whole, "cut at {cut}");
    }
}
