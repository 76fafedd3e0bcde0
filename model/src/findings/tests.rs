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

    /// A segment PyTorch's caching allocator took from the driver (as the capture marks it).
    fn segment(&mut self, pid: u32, addr: u64, size: u64, stack: &[Frame]) -> &mut Self {
        self.alloc(pid, addr, size, stack);
        self.events.last_mut().unwrap().allocator_segment = Some(crate::Framework::Pytorch);
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
    assert_eq!(
        (f.kind, f.pid, f.peer_pid, f.bytes, f.count),
        (FindingKind::IpcHandleNotClosed, 11, Some(10), 4 * MIB, 1)
    );
    assert_eq!(f.api.as_deref(), Some("cuIpcOpenMemHandle_v2"));
    // The exporter's export is gone with its exit, importer or not: no second finding.
}

#[test]
fn ipc_still_open_at_the_end_of_the_window() {
    let mut s = parent_and_worker();
    s.ipc(11, Op::IpcOpen, 0xF000, 0xAA);
    let found = s.findings(RuleConfig::default());
    assert_eq!(found.len(), 1);
    assert_eq!(
        (found[0].kind, found[0].pid, found[0].diagnosis),
        (FindingKind::IpcHandleNotClosed, 11, Some(Diagnosis::IpcHandleNotReleased))
    );
    assert!(found[0]
        .detail
        .contains("still had open, when the capture ended, 1 IPC mapping (4.0 MiB) of pid 10's memory"));
}

#[test]
fn exporter_freeing_or_exiting_under_an_importer() {
    let mut freed = parent_and_worker();
    freed.ipc(11, Op::IpcOpen, 0xF000, 0xAA).free(10, 0xA000).ipc(11, Op::IpcClose, 0xF000, 0).process(
        11,
        Op::Exit,
        10,
    );
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
        vec![
            FindingKind::ExitWithLiveAllocations,
            FindingKind::IpcExportFreedWhileImported,
            FindingKind::IpcHandleNotClosed
        ]
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
fn a_worker_importing_shared_cuda_memory_needs_its_context() {
    let grace = super::worker_cuda_context::IMPORT_GRACE_NS;
    // 11 imports the parent's buffer right after creating its context (a torch.multiprocessing
    // consumer); 12 creates one and computes on its own; 13 imports only after the grace.
    let mut s = parent_and_worker();
    s.process(12, Op::Fork, 10).process(13, Op::Fork, 10);
    s.context(11).ipc(11, Op::IpcOpen, 0xF000, 0xAA).ipc(11, Op::IpcClose, 0xF000, 0);
    let created = s.ts + 1_000;
    s.context(12).context(13);
    s.at(created + grace).ipc(13, Op::IpcOpen, 0xF100, 0xAA).ipc(13, Op::IpcClose, 0xF100, 0);
    let found = s.findings(RuleConfig::default());
    let workers: Vec<(u32, Option<u32>, u64, u64)> = found
        .iter()
        .filter(|f| f.kind == FindingKind::WorkerCudaContext)
        .map(|f| (f.pid, f.peer_pid, f.first_ts, f.last_ts))
        .collect();
    assert_eq!(workers, vec![(12, Some(10), created, created), (13, Some(10), created + 1_000, created + 1_000)]);

    // Live: the agent's clock decides, and the child's exit does before it.
    let mut analyzer = Analyzer::new(RuleConfig::default());
    let mut s = parent_and_worker();
    s.process(12, Op::Fork, 10).context(11).context(12);
    for event in &s.events {
        assert_eq!(analyzer.observe(&mut event.clone()), vec![]);
    }
    let pids = |found: Vec<Finding>| -> Vec<u32> { found.iter().map(|f| f.pid).collect() };
    assert_eq!(pids(analyzer.tick(s.ts + grace - 1_001)), Vec::<u32>::new());
    s.process(12, Op::Exit, 10);
    let exit = s.events.last().unwrap().clone();
    assert_eq!(pids(analyzer.observe(&mut exit.clone())), vec![12]);
    // 11 has allocated nothing of its own: what it is shows only at its end (here the capture's).
    assert_eq!(pids(analyzer.tick(s.ts + grace)), Vec::<u32>::new());
    let end = analyzer.finish();
    assert_eq!(pids(end.clone()), vec![11], "one finding per child");
    assert_eq!((end[0].severity, end[0].diagnosis), (Severity::Leak, None));
    assert!(end[0].detail.ends_with("It allocated no device memory of its own: the context only costs; keep CUDA out of this worker (return CPU tensors) or share tensors from the parent."), "{}", end[0].detail);
}

#[test]
fn a_worker_per_gpu_is_info_a_dataloader_worker_with_cuda_is_a_leak() {
    let grace = super::worker_cuda_context::IMPORT_GRACE_NS;
    let mut s = parent_and_worker();
    // 11 allocates 1 GiB of its own (a worker per GPU); 12 is a DataLoader worker.
    s.process(12, Op::Fork, 10);
    s.context(11).alloc(11, 0xB000, 1 << 30, &frame("run_rank", 40));
    s.context(12);
    let loader = Frame {
        function: "_worker_loop".into(),
        file: "/venv/lib/python3.12/site-packages/torch/utils/data/_utils/worker.py".into(),
        line: 349,
    };
    s.events.last_mut().unwrap().stack = vec![frame("__getitem__", 17)[0].clone(), loader].into();
    let mut analyzer = Analyzer::new(RuleConfig::default());
    for event in &s.events {
        assert_eq!(analyzer.observe(&mut event.clone()), vec![]);
    }
    let due = analyzer.tick(s.ts + grace);
    let got: Vec<(u32, Severity, Option<Diagnosis>)> = due.iter().map(|f| (f.pid, f.severity, f.diagnosis)).collect();
    assert_eq!(got, vec![(11, Severity::Info, None), (12, Severity::Leak, Some(Diagnosis::CudaInDataloaderWorker))]);
    assert!(due[0].detail.ends_with("It allocated 1.0 GiB of its own: GPU work by design (a worker per GPU or per task); nothing to do unless the device is short of memory."), "{}", due[0].detail);
    assert_eq!(due[1].user_frame, Some(frame("__getitem__", 17)[0].clone()));
    assert!(
        due[1].detail.contains("It is a DataLoader worker: keep CUDA out of the dataset and collate_fn"),
        "{}",
        due[1].detail
    );
}

#[test]
fn oom_pictures_every_process() {
    let mut s = Stream::new();
    s.alloc(30, 0xA000, 3 << 30, &frame("model", 1)).alloc(31, 0xA000, 512 * MIB, &frame("cache", 2));
    s.driver(31, Op::Alloc, "cuMemAlloc_v2", Some(Kind::Device), 0, 2 << 30);
    s.events.last_mut().unwrap().result = 2;
    s.events.last_mut().unwrap().stack = frame("step", 7).into();
    let found: Vec<Finding> =
        s.findings(RuleConfig::default()).into_iter().filter(|f| f.kind == FindingKind::Oom).collect();
    assert_eq!(found.len(), 1);
    let f = &found[0];
    assert_eq!((f.pid, f.bytes, f.stack.clone()), (31, 2 << 30, frame("step", 7)));
    let picture: Vec<(u32, u64)> = f.processes.iter().map(|p| (p.pid, p.live[&Kind::Device])).collect();
    assert_eq!(picture, vec![(30, 3 << 30), (31, 512 * MIB)]);
    assert_eq!(f.processes[0].top_stacks[0].stack, frame("model", 1));
    assert_eq!(
        f.detail,
        "cuMemAlloc_v2 of 2.0 GiB failed with out of memory in pid 31 (python3) at train.py:7 in step; at that moment gpuprof saw 3.5 GiB of device memory live in the processes it follows (pid 30 (python3) 3.0 GiB, most at train.py:1 in model; pid 31 (python3) 512.0 MiB, most at train.py:2 in cache): nothing was cached to give back: the device was full of live memory; free or shrink the largest holders, or allocate less at once."
    );
    assert_eq!(f.diagnosis, Some(Diagnosis::DeviceFull));
    // Other failures are not out-of-memory pictures.
    let mut other = Stream::new();
    other.driver(31, Op::Alloc, "cuMemCreate", Some(Kind::Vmm), 0, 2 * MIB);
    other.events.last_mut().unwrap().result = 800;
    assert_eq!(other.kinds(), vec![]);
}

#[test]
fn growth_fires_for_a_growing_stack_not_for_a_plateau() {
    let config = RuleConfig { growth_window_ns: 100_000, growth_rises: 3, ..RuleConfig::default() };
    let leak = frame("leak", 10);
    let steady = frame("steady", 20);
    let mut s = Stream::new();
    // Ten windows of 100 µs: the leaking stack allocates every 50 µs and never frees; the steady
    // stack warms up in the first window, then frees what it allocates.
    s.alloc(40, 0x1, MIB, &steady).alloc(40, 0x2, MIB, &steady);
    for step in 0..20u64 {
        s.at(2_000 + step * 50_000);
        s.alloc(40, 0x10_0000 + step, MIB, &leak);
        s.alloc(40, 0x100 + step, MIB, &steady).free(40, 0x100 + step);
    }
    let found = s.findings(config);
    assert_eq!(found.len(), 1, "{found:#?}");
    let f = &found[0];
    assert_eq!((f.kind, f.pid), (FindingKind::Growth, 40));
    assert_eq!(f.stack, leak);
    // Windows lie on the clock ([0, 100 µs), …): rises at the ends of windows 1, 2, 3 (2
    // allocations each), 6 MiB over three windows.
    assert_eq!((f.bytes, f.count), (6 * MIB, 6));
    assert_eq!((f.first_ts, f.last_ts), (0, 300_000));
}

#[test]
fn an_analyzer_saved_and_restored_mid_stream_fires_the_same_findings() {
    // Growth half-way through its streak, an export with an importer, a worker context: every
    // piece of rule state is in flight at the cut.
    let config = RuleConfig { growth_window_ns: 100_000, growth_rises: 3, ..RuleConfig::default() };
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

impl Stream {
    /// A framework allocator's block, with the allocator's totals after it.
    fn block(&mut self, pid: u32, op: Op, addr: u64, size: u64, totals: (u64, u64), stack: &[Frame]) -> &mut Self {
        let mut event = Event::new(
            0,
            pid,
            pid,
            Source::Ebpf,
            Layer::Allocator,
            op,
            Cow::Borrowed("c10::reportMemoryUsageToProfiler"),
        );
        event.kind = Some(Kind::Device);
        event.device = Some(0);
        event.addr = Some(addr);
        event.size = size;
        event.allocated = Some(totals.0);
        event.reserved = Some(totals.1);
        event.stack = stack.to_vec().into();
        self.push(event)
    }

    fn failed_alloc(&mut self, pid: u32, size: u64, stack: &[Frame]) -> &mut Self {
        self.driver(pid, Op::Alloc, "cuMemAlloc_v2", Some(Kind::Device), 0, size);
        let event = self.events.last_mut().unwrap();
        event.result = 2;
        event.stack = stack.to_vec().into();
        self
    }

    /// PyTorch's caching allocator gives up on a request (`c10::reportOutOfMemoryToProfiler`).
    fn oom_report(&mut self, pid: u32, size: u64, totals: (u64, u64), stack: &[Frame]) -> &mut Self {
        let mut event = Event::new(
            0,
            pid,
            pid,
            Source::Ebpf,
            Layer::Allocator,
            Op::Alloc,
            Cow::Borrowed(crate::event::PYTORCH_OOM_API),
        );
        event.kind = Some(Kind::Device);
        event.device = Some(0);
        event.size = size;
        event.result = 2;
        event.allocated = Some(totals.0);
        event.reserved = Some(totals.1);
        event.stack = stack.to_vec().into();
        self.push(event)
    }

    fn killed(&mut self, pid: u32, ppid: u32, signal: i32) -> &mut Self {
        self.process(pid, Op::Exit, ppid);
        let event = self.events.last_mut().unwrap();
        event.exit_code = Some(128 + signal);
        event.signal = Some(signal);
        self
    }
}

fn library_frame(function: &str, line: u32) -> Frame {
    Frame {
        function: function.into(),
        file: "/venv/lib/python3.12/site-packages/torch/nn/modules/linear.py".into(),
        line,
    }
}

#[test]
fn tensors_and_the_segments_carrying_them_grow_as_one_finding() {
    let config = RuleConfig { growth_window_ns: 100_000, growth_rises: 3, ..RuleConfig::default() };
    let mut s = Stream::new();
    // Evaluation without no_grad: each step keeps two activations (two stacks, 1 and 2 MiB) in
    // a new 4 MiB segment.
    let linear = [library_frame("Linear.forward", 134), frame("evaluate", 42)[0].clone()];
    let relu = frame("evaluate", 43);
    let (mut allocated, mut reserved) = (0, 0);
    // The device had 1 GiB free when the job asked (cuMemGetInfo).
    s.driver(50, Op::MemInfo, "cuMemGetInfo_v2", None, 0, 1 << 30);
    // Each op records an autograd node (the thread's counter moves) and no backward runs.
    let mut counter = 100;
    let mut forward_op = |s: &mut Stream| {
        counter += 1;
        let event = s.events.last_mut().unwrap();
        (event.autograd_seq, event.autograd_thread) = (Some(counter), Some(1));
    };
    for step in 0..8u64 {
        s.at(2_000 + step * 50_000);
        let segment = 0x1000_0000 + step * 0x100_0000;
        s.alloc(50, segment, 4 * MIB, &linear);
        reserved += 4 * MIB;
        allocated += MIB;
        s.block(50, Op::Alloc, segment, MIB, (allocated, reserved), &linear);
        forward_op(&mut s);
        allocated += 2 * MIB;
        s.block(50, Op::Alloc, segment + MIB, 2 * MIB, (allocated, reserved), &relu);
        forward_op(&mut s);
    }
    let found = s.findings(config);
    assert_eq!(found.len(), 1, "{found:#?}");
    let f = &found[0];
    assert_eq!((f.kind, f.pid, f.severity), (FindingKind::Growth, 50, Severity::Leak));
    // Windows 1-3 end with 2 more steps each: 6 steps of 2 MiB (relu) and 1 MiB (linear).
    assert_eq!((f.bytes, f.count, f.segment_bytes), (18 * MIB, 12, Some(24 * MIB)));
    assert_eq!(f.stack, relu);
    let stacks: Vec<(u32, u64, u64)> =
        f.stacks.iter().map(|s| (s.stack.last().unwrap().line, s.bytes, s.count)).collect();
    assert_eq!(stacks, vec![(43, 12 * MIB, 6), (42, 6 * MIB, 6)]);
    assert_eq!(f.user_frame, Some(relu[0].clone()));
    assert_eq!(
        f.detail,
        "live tensor memory (allocator blocks) allocated at train.py:43 in evaluate in pid 50 (python3) grew by 12.0 MiB (and 1 more stacks, 18.0 MiB in all) over 3 consecutive 0.0 s windows without coming back, to 18.0 MiB in 12 allocations; the driver segments carrying them grew by 24.0 MiB: 100% of its recent blocks still live were made by forward ops whose autograd graph no backward pass used: a retained autograd graph, built at train.py:43 in evaluate; run evaluation under torch.no_grad() (or torch.inference_mode()), and keep losses across steps as numbers (loss.item()). At 58.6 GiB/s device 0 is full now."
    );
    assert_eq!(f.diagnosis, Some(Diagnosis::AutogradGraphRetained));
    // 18 MiB from the first window's start (0) to the third's end (300 µs); 1 GiB was free
    // 298 µs before that, less what went at that rate since: full in 16.8 ms.
    assert_eq!((f.first_ts, f.last_ts), (0, 300_000));
    let rate = 18.0 * MIB as f64 / 300e-6;
    assert_eq!(f.bytes_per_second, Some(rate));
    let left = ((1u64 << 30) as f64 - rate * 298e-6) / rate;
    assert!((f.seconds_to_full.unwrap() - left).abs() < 1e-9 && (left - 0.016769).abs() < 1e-6, "{f:?}");
}

/// A job leaking one 2 MiB tensor (and one 2 MiB segment) every 50 µs from train.py:26, recorded
/// at the driver's level (segments from libcudart, no Python stack) until `raised_at`, with its
/// tensors from then on when `tensors`; the findings when the analyzer is told at `raised_at`
/// that tensors come for `detail` ns.
fn leak_raised_at(raised_at: u64, detail: u64, tensors: bool, steps: u64) -> Vec<Finding> {
    let config = RuleConfig { growth_window_ns: 100_000, growth_rises: 3, ..RuleConfig::default() };
    let library = vec![Frame { function: "[libcudart.so.13]".into(), file: String::new(), line: 0 }];
    let keep = frame("keep", 26);
    let mut s = Stream::new();
    let (mut allocated, mut reserved) = (0, 0);
    for step in 0..steps {
        s.at(2_000 + step * 50_000);
        let segment = 0x1000_0000 + step * 0x100_0000;
        s.alloc(60, segment, 2 * MIB, &library);
        reserved += 2 * MIB;
        allocated += 2 * MIB;
        if tensors && s.ts >= raised_at {
            s.block(60, Op::Alloc, segment, 2 * MIB, (allocated, reserved), &keep);
        }
    }
    s.process(60, Op::Exit, 1);
    let mut analyzer = Analyzer::new(config);
    let mut found = Vec::new();
    let mut told = false;
    for event in &s.events {
        if !told && event.ts >= raised_at {
            analyzer.expect_tensors(60, raised_at + detail);
            told = true;
        }
        found.extend(analyzer.observe(&mut event.clone()));
    }
    found.extend(analyzer.finish());
    found.retain(|f| f.kind == FindingKind::Growth);
    found
}

#[test]
fn a_raised_process_has_its_growth_named_by_its_tensors_not_its_driver_calls() {
    // Raised after two rising windows (as the daemon does): the driver's streak reaches three
    // windows first, and waits; the tensors' streak fires and names the line.
    let found = leak_raised_at(200_000, 1_000_000, true, 16);
    assert_eq!(found.len(), 1, "{found:#?}");
    let f = &found[0];
    assert_eq!((f.kind, f.pid, f.stack.clone()), (FindingKind::Growth, 60, frame("keep", 26)));
    assert_eq!((f.first_ts, f.last_ts), (200_000, 500_000));
    assert_eq!((f.bytes, f.count, f.segment_bytes), (12 * MIB, 6, Some(12 * MIB)));
}

#[test]
fn a_held_driver_finding_goes_out_when_no_tensors_came_or_the_process_ended() {
    // No tensors came for the detail period (400 µs from 200 µs): the driver's finding, as
    // last judged, goes out at the first window end after it.
    let found = leak_raised_at(200_000, 400_000, false, 16);
    assert_eq!(found.len(), 1, "{found:#?}");
    let f = &found[0];
    assert_eq!(
        (f.kind, f.pid, f.stack.last().unwrap().function.as_str()),
        (FindingKind::Growth, 60, "[libcudart.so.13]")
    );
    assert_eq!((f.first_ts, f.last_ts, f.bytes), (0, 600_000, 24 * MIB));
    // The process ended while its finding waited: it goes out then, once.
    let found = leak_raised_at(200_000, 10_000_000, false, 8);
    assert_eq!(found.len(), 1, "{found:#?}");
    assert_eq!((found[0].first_ts, found[0].last_ts, found[0].bytes), (0, 300_000, 12 * MIB));
    // Not raised: the driver's finding goes out at its third rising window.
    let found = leak_raised_at(u64::MAX, 0, false, 16);
    assert_eq!(found.len(), 1, "{found:#?}");
    assert_eq!((found[0].first_ts, found[0].last_ts, found[0].bytes), (0, 300_000, 12 * MIB));
}

#[test]
fn a_process_ending_before_its_tensors_had_three_windows_is_named_by_their_growth_over_its_life() {
    // A segment and a tensor kept every 100 ms; recorded at the driver's level until raised at
    // 2 s (for long): the driver's streak reaches three 1 s windows at 3 s and waits for the
    // tensors; the process ends at 4.5 s, two tensor windows later. Its tensors rose all the
    // while: their line is its one finding, not the driver's held for them.
    const S: u64 = 1_000_000_000;
    let config = RuleConfig { growth_window_ns: S, growth_rises: 3, ..RuleConfig::default() };
    let library = vec![Frame { function: "[libcudart.so.13]".into(), file: crate::stack::NATIVE_FILE.into(), line: 0 }];
    let mut s = Stream::new();
    let (mut allocated, mut reserved) = (0, 0);
    for step in 0..45u64 {
        s.at(S / 100 + step * S / 10);
        let segment = 0x1000_0000 + step * 0x100_0000;
        s.alloc(60, segment, 2 * MIB, &library);
        reserved += 2 * MIB;
        allocated += 2 * MIB;
        if s.ts >= 2 * S {
            s.block(60, Op::Alloc, segment, 2 * MIB, (allocated, reserved), &frame("keep", 26));
        }
    }
    s.process(60, Op::Exit, 1);
    let mut analyzer = Analyzer::new(config);
    let mut found = Vec::new();
    for event in &s.events {
        if event.ts >= 2 * S && event.ts < 2 * S + S / 10 && event.layer == Layer::Driver {
            analyzer.expect_tensors(60, 100 * S);
        }
        found.extend(analyzer.observe(&mut event.clone()));
    }
    found.extend(analyzer.finish());
    found.retain(|f| f.kind == FindingKind::Growth);
    assert_eq!(found.len(), 1, "{found:#?}");
    let f = &found[0];
    assert_eq!(
        (f.kind, f.pid, f.stack.clone(), f.api.as_deref()),
        (FindingKind::Growth, 60, frame("keep", 26), Some("c10::reportMemoryUsageToProfiler"))
    );
    assert_eq!((f.bytes, f.count), (48 * MIB, 25));
}

#[test]
fn an_oom_at_another_line_or_size_is_another_incident() {
    let mut s = Stream::new();
    s.alloc(61, 0xA000_0000, 2 << 30, &frame("evaluate", 9));
    // The first request fails twice (the allocator's retry), then, 1.5 s later with no success
    // between, another line asks for another size: two incidents.
    s.failed_alloc(61, 1 << 30, &frame("evaluate", 9)).failed_alloc(61, 1 << 30, &frame("evaluate", 9));
    s.at(1_500_000_000).failed_alloc(61, 3 << 29, &frame("report", 20));
    // The same line asking for another size is another request too.
    s.failed_alloc(61, 1 << 29, &frame("report", 20)).failed_alloc(61, 1 << 29, &frame("report", 20));
    let found: Vec<(u64, u32, Option<Diagnosis>)> = s
        .findings(RuleConfig::default())
        .into_iter()
        .filter(|f| f.kind == FindingKind::Oom)
        .map(|f| (f.bytes, f.user_frame.map_or(0, |u| u.line), f.diagnosis))
        .collect();
    let full = Some(Diagnosis::DeviceFull);
    assert_eq!(found, vec![(1 << 30, 9, full), (3 << 29, 20, full), (1 << 29, 20, full)]);
}

#[test]
fn one_oom_per_incident_with_the_caches_that_would_have_sufficed() {
    let mut s = Stream::new();
    // A neighbour (60) holds 6 GiB of segments with only 1 GiB in tensors; the evaluator (61)
    // holds 2 GiB with 1.5 GiB in tensors and asks for 1 GiB more.
    s.alloc(60, 0xA000_0000, 6 << 30, &frame("train", 3)).block(
        60,
        Op::Alloc,
        0xA000_0000,
        1 << 30,
        (1 << 30, 6 << 30),
        &frame("train", 3),
    );
    s.alloc(61, 0xA000_0000, 2 << 30, &frame("evaluate", 9)).block(
        61,
        Op::Alloc,
        0xA000_0000,
        3 << 29,
        (3 << 29, 2 << 30),
        &frame("evaluate", 9),
    );
    // The allocator fails, returns its cache (nothing whole to return) and fails again.
    s.failed_alloc(61, 1 << 30, &frame("evaluate", 9)).failed_alloc(61, 1 << 30, &frame("evaluate", 9));
    let found: Vec<Finding> =
        s.findings(RuleConfig::default()).into_iter().filter(|f| f.kind == FindingKind::Oom).collect();
    assert_eq!(found.len(), 1, "{found:#?}");
    let f = &found[0];
    assert_eq!((f.pid, f.bytes, f.fragmentation, f.severity), (61, 1 << 30, false, Severity::Leak));
    let caches: Vec<(u32, Option<u64>, Option<u64>)> =
        f.processes.iter().map(|p| (p.pid, p.allocated, p.reserved)).collect();
    assert_eq!(caches, vec![(60, Some(1 << 30), Some(6 << 30)), (61, Some(3 << 29), Some(2 << 30))]);
    assert_eq!(
        f.detail,
        "cuMemAlloc_v2 of 1.0 GiB failed with out of memory in pid 61 (python3) at train.py:9 in evaluate; at that moment gpuprof saw 8.0 GiB of device memory live in the processes it follows (pid 60 (python3) 6.0 GiB, most at train.py:3 in train; pid 61 (python3) 2.0 GiB, most at train.py:9 in evaluate): pid 60 (python3) caches 5.0 GiB it does not use, enough on its own: torch.cuda.empty_cache() there would have made room."
    );
    assert_eq!(f.diagnosis, Some(Diagnosis::NeighbourCache));

    // A successful allocation ends the incident: the next failure is another one. Its own cache
    // (512 MiB free in reserved segments) covers a 256 MiB request: fragmentation.
    s.alloc(61, 0xF000_0000, 2 * MIB, &[]).failed_alloc(61, 256 * MIB, &frame("evaluate", 9));
    let found: Vec<Finding> =
        s.findings(RuleConfig::default()).into_iter().filter(|f| f.kind == FindingKind::Oom).collect();
    assert_eq!(
        found.iter().map(|f| (f.bytes, f.fragmentation)).collect::<Vec<_>>(),
        vec![(1 << 30, false), (256 * MIB, true)]
    );
    assert_eq!(found[1].diagnosis, Some(Diagnosis::Fragmentation));
    assert!(found[1].detail.ends_with(": its allocator had 512.0 MiB cached (reserved, not in tensors), enough for the request but in pieces too small for it: fragmentation; set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, or call torch.cuda.empty_cache() between phases; pid 60 (python3) caches 5.0 GiB it does not use, enough on its own: torch.cuda.empty_cache() there would have made room."), "{}", found[1].detail);
}

#[test]
fn exiting_with_only_the_allocators_segments_is_info_a_missing_free_is_a_leak() {
    let mut s = Stream::new();
    s.alloc(70, 0xA000, 20 * MIB, &frame("model", 1)).block(
        70,
        Op::Alloc,
        0xA000,
        8 * MIB,
        (8 * MIB, 20 * MIB),
        &frame("model", 1),
    );
    s.process(70, Op::Exit, 1);
    s.alloc(71, 0xA000, 20 * MIB, &frame("raw", 2)).process(71, Op::Exit, 1);
    // A framework process whose library also took a workspace from the driver (cuBLAS does, on
    // an H100 machine): still its own, held to the end on purpose.
    s.alloc(72, 0xA000, 20 * MIB, &frame("model", 1)).block(
        72,
        Op::Alloc,
        0xA000,
        20 * MIB,
        (20 * MIB, 20 * MIB),
        &frame("model", 1),
    );
    s.alloc(72, 0xF000, 4 * MIB, &frame("matmul", 3)).process(72, Op::Exit, 1);
    let found = s.findings(RuleConfig::default());
    let got: Vec<(u32, u64, Severity)> = found.iter().map(|f| (f.pid, f.bytes, f.severity)).collect();
    assert_eq!(
        got,
        vec![(70, 20 * MIB, Severity::Info), (71, 20 * MIB, Severity::Leak), (72, 24 * MIB, Severity::Info)]
    );
    assert_eq!(
        found[0].detail,
        "pid 70 (python3) exited still holding 20.0 MiB of device memory in 1 allocation: PyTorch's caching allocator's segments hold 8.0 MiB in live tensors and 12.0 MiB cached; the driver takes it back with the process: nothing to do."
    );
    assert_eq!(
        found[2].detail,
        "pid 72 (python3) exited still holding 24.0 MiB of device memory in 2 allocations: PyTorch's caching allocator's segments hold 20.0 MiB in live tensors and 0 B cached, 4.0 MiB more was allocated outside the allocator (libraries' workspaces, direct driver calls); the driver takes it back with the process: nothing to do."
    );
}

#[test]
fn at_the_drivers_level_the_allocators_segments_are_its_cache_not_a_leak() {
    // Recorded at the driver's level: no tensor events, no allocator totals; the capture marked
    // the segments PyTorch's caching allocator made (one on an autograd thread: no stack).
    let mut s = Stream::new();
    let autograd =
        vec![Frame { function: "[libcudart.so.13]".into(), file: crate::stack::NATIVE_FILE.into(), line: 0 }];
    s.segment(73, 0xA000, 64 * MIB, &autograd).segment(73, 0x10_0000, 20 * MIB, &frame("forward", 12));
    s.alloc(73, 0x20_0000, 4 * MIB, &frame("workspace", 40)).process(73, Op::Exit, 1);
    // The same without the marks: a program's own memory, never freed.
    s.alloc(74, 0xA000, 64 * MIB, &autograd).alloc(74, 0x10_0000, 20 * MIB, &frame("forward", 12));
    s.process(74, Op::Exit, 1);
    let found = s.findings(RuleConfig::default());
    let got: Vec<(u32, u64, Severity)> = found.iter().map(|f| (f.pid, f.bytes, f.severity)).collect();
    assert_eq!(got, vec![(73, 88 * MIB, Severity::Info), (74, 84 * MIB, Severity::Leak)]);
    assert_eq!(
        found[0].detail,
        "pid 73 (python3) exited still holding 88.0 MiB of device memory in 3 allocations: PyTorch's caching allocator's segments hold 84.0 MiB (its cache and the tensors in it, which the driver's level does not tell apart), 4.0 MiB more was allocated outside the allocator (libraries' workspaces, direct driver calls); the driver takes it back with the process: nothing to do."
    );
    // The allocation named is the one with the best stack, not the largest without one.
    assert_eq!((found[0].stack.clone(), found[1].stack.clone()), (frame("forward", 12), frame("forward", 12)));
    assert_eq!(
        found[1].detail,
        "pid 74 (python3) exited still holding 84.0 MiB of device memory in 2 allocations; the largest made from Python, 20.0 MiB, came from cuMemAlloc_v2 at train.py:12 in forward: release it once it is no longer needed (drop the tensor, torch.cuda.empty_cache()) instead of leaving it to the end of the process."
    );
}

#[test]
fn a_growth_and_the_exit_holding_what_grew_are_one_finding() {
    let config = RuleConfig { growth_window_ns: 100_000, growth_rises: 3, ..RuleConfig::default() };
    let mut s = Stream::new();
    for step in 0..10u64 {
        s.at(2_000 + step * 50_000);
        s.alloc(75, 0x1000_0000 + step * 0x100_0000, MIB, &frame("keep", 26));
        s.alloc(76, 0x1000_0000 + step * 0x100_0000, MIB, &frame("keep", 26));
    }
    // 76 also holds a buffer of its own to the end.
    s.alloc(76, 0xA000, 8 * MIB, &frame("buffer", 9));
    s.process(75, Op::Exit, 1).process(76, Op::Exit, 1);
    let found = s.findings(config);
    let got: Vec<(FindingKind, u32, u64, Severity)> =
        found.iter().map(|f| (f.kind, f.pid, f.bytes, f.severity)).collect();
    assert_eq!(
        got,
        vec![
            (FindingKind::Growth, 75, 6 * MIB, Severity::Leak),
            (FindingKind::Growth, 76, 6 * MIB, Severity::Leak),
            (FindingKind::ExitWithLiveAllocations, 75, 10 * MIB, Severity::Info),
            (FindingKind::ExitWithLiveAllocations, 76, 8 * MIB, Severity::Leak),
        ]
    );
    assert_eq!(
        found[2].detail,
        "pid 75 (python3) exited still holding 10.0 MiB of device memory in 10 allocations; its growth finding reported these allocations; the driver takes them back with the process."
    );
    assert_eq!(
        found[3].detail,
        "pid 76 (python3) exited still holding 8.0 MiB of device memory in 1 allocation besides the 10 allocations its growth finding reported; the largest, 8.0 MiB, came from cuMemAlloc_v2 at train.py:9 in buffer: release it once it is no longer needed (drop the tensor, torch.cuda.empty_cache()) instead of leaving it to the end of the process."
    );
}

#[test]
fn an_orphans_exit_is_told_by_its_orphan_finding_not_again_as_a_leak() {
    let mut s = launcher_and_workers();
    s.at(s.ts + 1_000_000).killed(80, 1, 9);
    let killed_at = s.ts;
    s.at(killed_at + 6_000_000_000).process(81, Op::Exit, 80);
    let found = s.findings(RuleConfig::default());
    let of_81: Vec<(FindingKind, Severity)> =
        found.iter().filter(|f| f.pid == 81).map(|f| (f.kind, f.severity)).collect();
    assert_eq!(
        of_81,
        vec![
            (FindingKind::OrphanHoldingMemory, Severity::Leak),
            (FindingKind::ExitWithLiveAllocations, Severity::Info)
        ]
    );
    let exit = found.iter().find(|f| f.pid == 81 && f.kind == FindingKind::ExitWithLiveAllocations).unwrap();
    assert_eq!(
        exit.detail,
        "pid 81 (python3) exited still holding 1.0 GiB of device memory in 1 allocation; its orphan finding reported it (its parent ended first); the driver takes it back with the process."
    );
}

/// A launcher (80) with a context spawns two workers (81, 82) that allocate 1 GiB each, and a
/// third (83) that frees its memory.
fn launcher_and_workers() -> Stream {
    let mut s = Stream::new();
    s.context(80).alloc(80, 0xA000, 2 * MIB, &frame("main", 1));
    for (worker, addr) in [(81, 0xB000), (82, 0xC000), (83, 0xD000)] {
        s.process(worker, Op::Fork, 80).process(worker, Op::Exec, 80).context(worker);
        s.alloc(worker, addr, 1 << 30, &[library_frame("empty", 7), frame("work", 12)[0].clone()]);
    }
    s.free(83, 0xD000);
    s
}

#[test]
fn workers_outliving_a_killed_parent_with_memory_are_orphans() {
    let config = RuleConfig::default();
    let mut s = launcher_and_workers();
    s.at(s.ts + 1_000_000).killed(80, 1, 9);
    let killed_at = s.ts;
    // Worker 82 notices within the grace period and exits; 81 is still there after it.
    s.at(killed_at + 1_000_000_000).process(82, Op::Exit, 80);
    s.at(killed_at + 6_000_000_000).process(90, Op::Fork, 1);
    // One problem, told once: the orphans are the leaks, their contexts part of their
    // findings; the parent's exit is info, and so is the context of 82, which did GPU work of
    // its own and ended in time (its exit holding memory it never freed is its own leak).
    let all: Vec<(FindingKind, u32, Severity, Option<Diagnosis>)> =
        s.findings(config).iter().map(|f| (f.kind, f.pid, f.severity, f.diagnosis)).collect();
    let orphaned = Some(Diagnosis::OrphanedWorker);
    assert_eq!(
        all,
        vec![
            (FindingKind::ExitWithLiveAllocations, 80, Severity::Info, None),
            (FindingKind::WorkerCudaContext, 82, Severity::Info, None),
            (FindingKind::ExitWithLiveAllocations, 82, Severity::Leak, None),
            (FindingKind::OrphanHoldingMemory, 81, Severity::Leak, orphaned),
            (FindingKind::OrphanHoldingMemory, 83, Severity::Leak, orphaned),
        ]
    );
    let parent = s.findings(config).into_iter().find(|f| f.pid == 80).unwrap();
    assert!(parent.detail.ends_with("but its workers (pid 81, pid 82, pid 83) live on with device memory or a context: whether they end by themselves is told by their orphan findings."), "{}", parent.detail);
    let found: Vec<Finding> =
        s.findings(config).into_iter().filter(|f| f.kind == FindingKind::OrphanHoldingMemory).collect();
    assert_eq!(found.len(), 2, "{found:#?}");
    let got: Vec<(u32, Option<u32>, u64, u64, Severity)> =
        found.iter().map(|f| (f.pid, f.peer_pid, f.bytes, f.first_ts, f.severity)).collect();
    assert_eq!(
        got,
        vec![(81, Some(80), 1 << 30, killed_at, Severity::Leak), (83, Some(80), 0, killed_at, Severity::Leak)]
    );
    assert_eq!(found[0].user_frame, Some(frame("work", 12)[0].clone()));
    assert_eq!(
        found[0].detail,
        "pid 81 (python3) still holds 1.0 GiB of device memory in 1 allocation and a CUDA context after its parent pid 80 (python3) was killed by signal 9; the largest, 1.0 GiB, came from cuMemAlloc_v2 at train.py:12 in work (through empty): nothing will use it; end it with `kill 81 83`, and make workers end with their parent (daemon=True, a watchdog on os.getppid(), prctl PR_SET_PDEATHSIG)."
    );
    assert!(found[1].detail.starts_with("pid 83 (python3) still holds a CUDA context after its parent"));

    // Live, with no event after the parent's end, the agent's clock makes them due.
    let mut analyzer = Analyzer::new(config);
    let mut s = launcher_and_workers();
    s.at(killed_at - 1_000).killed(80, 1, 9);
    for event in &s.events {
        analyzer.observe(&mut event.clone());
    }
    let orphans = |found: Vec<Finding>| -> Vec<u32> {
        found.iter().filter(|f| f.kind == FindingKind::OrphanHoldingMemory).map(|f| f.pid).collect()
    };
    assert_eq!(orphans(analyzer.tick(killed_at + 4_000_000_000)), Vec::<u32>::new());
    let due = orphans(analyzer.tick(killed_at + 5_000_000_000));
    assert_eq!(due, vec![81, 82, 83]);
    assert_eq!(analyzer.tick(killed_at + 9_000_000_000).len(), 0, "one finding per orphan");
}

#[test]
fn children_gone_before_their_parent_leave_no_orphan() {
    let mut s = launcher_and_workers();
    s.process(81, Op::Exit, 80).process(82, Op::Exit, 80).process(83, Op::Exit, 80).process(80, Op::Exit, 1);
    let kinds: Vec<FindingKind> = s.findings(RuleConfig::default()).iter().map(|f| f.kind).collect();
    assert!(!kinds.contains(&FindingKind::OrphanHoldingMemory), "{kinds:?}");
    // The capture ends right after the parent: children still holding memory are orphans then.
    let mut s = launcher_and_workers();
    s.process(80, Op::Exit, 1);
    let orphans: Vec<u32> = s
        .findings(RuleConfig::default())
        .iter()
        .filter(|f| f.kind == FindingKind::OrphanHoldingMemory)
        .map(|f| f.pid)
        .collect();
    assert_eq!(orphans, vec![81, 82, 83]);
}

#[test]
fn finding_ids_are_stable_and_distinct() {
    let s = launcher_and_workers();
    let mut s2 = Stream { events: s.events.clone(), ts: s.ts };
    s2.process(80, Op::Exit, 1);
    let first = s2.findings(RuleConfig::default());
    let again = s2.findings(RuleConfig::default());
    let ids: Vec<&str> = first.iter().map(|f| f.finding_id.as_str()).collect();
    assert_eq!(ids, again.iter().map(|f| f.finding_id.as_str()).collect::<Vec<_>>());
    let distinct: std::collections::HashSet<&str> = ids.iter().copied().collect();
    assert_eq!(distinct.len(), ids.len());
    assert!(ids.iter().all(|id| id.len() == 16 && id.chars().all(|c| c.is_ascii_hexdigit())), "{ids:?}");
}

/// A short training job of 300 steps of 20 ms (6 s) on one thread, as the allocator and
/// autograd report it: each step's forward makes two activations (train.py:30, :31) whose ops
/// record autograd nodes, its backward evaluates those nodes (a gradient block each) and the
/// activations are freed. `keep`: the step's output (1 MiB, train.py:32, a forward op) is kept
/// in a list; `evaluate`: 1 MiB made at evaluate:52 each step, kept, its ops recording nodes
/// no backward evaluates (evaluation without no_grad); `no_grad_eval`: 1 MiB made and freed
/// at evaluate:52 without nodes. At the end the interpreter frees what was kept, then exits.
fn short_job(keep: bool, evaluate: bool, no_grad_eval: bool) -> Vec<Finding> {
    const PID: u32 = 60;
    let step_ns = 20_000_000u64;
    let mut s = Stream::new();
    s.process(PID, Op::Exec, 1);
    let (mut counter, mut addr, mut kept) = (1_000u64, 0x7f00_0000_0000u64, Vec::new());
    let (mut allocated, reserved) = (0u64, 4u64 << 30);
    let block =
        |s: &mut Stream, op: Op, addr: u64, size: u64, allocated: u64, line: u32, autograd: (u64, Option<&str>)| {
            let function = if line >= 50 { "evaluate" } else { "train_step" };
            s.block(PID, op, addr, size, (allocated, reserved), &frame(function, line));
            let event = s.events.last_mut().unwrap();
            (event.autograd_seq, event.autograd_thread) = (Some(autograd.0), Some(7));
            event.autograd_node = autograd.1.map(Into::into);
        };
    for step in 0..300u64 {
        s.at(1_000_000_000 + step * step_ns);
        let mut nodes = Vec::new();
        let mut activations = Vec::new();
        for line in [30, 31] {
            counter += 1;
            nodes.push(counter - 1);
            addr += 0x100_0000;
            allocated += 4 * MIB;
            block(&mut s, Op::Alloc, addr, 4 * MIB, allocated, line, (counter, None));
            activations.push(addr);
        }
        if keep {
            counter += 1;
            nodes.push(counter - 1);
            addr += 0x100_0000;
            allocated += MIB;
            block(&mut s, Op::Alloc, addr, MIB, allocated, 32, (counter, None));
            kept.push((addr, MIB));
        }
        // Backward, from the loss down: a gradient block per node, freed at once.
        for node in nodes.iter().rev() {
            addr += 0x100_0000;
            block(&mut s, Op::Alloc, addr, MIB, allocated + MIB, 0, (*node, Some("AddmmBackward0")));
            block(&mut s, Op::Free, addr, MIB, allocated, 0, (*node, Some("AddmmBackward0")));
        }
        for activation in activations {
            allocated -= 4 * MIB;
            block(&mut s, Op::Free, activation, 4 * MIB, allocated, 30, (counter, None));
        }
        if evaluate || no_grad_eval {
            if evaluate {
                counter += 1;
            }
            addr += 0x100_0000;
            allocated += MIB;
            block(&mut s, Op::Alloc, addr, MIB, allocated, 52, (counter, None));
            if evaluate {
                kept.push((addr, MIB));
            } else {
                allocated -= MIB;
                block(&mut s, Op::Free, addr, MIB, allocated, 52, (counter, None));
            }
        }
    }
    // Teardown: the list goes with the interpreter.
    for (addr, size) in kept {
        allocated -= size;
        block(&mut s, Op::Free, addr, size, allocated, 0, (counter, None));
    }
    s.process(PID, Op::Exit, 1);
    s.findings(RuleConfig::default())
}

#[test]
fn a_short_run_that_keeps_a_tensor_each_step_is_one_growth_at_its_line() {
    let found = short_job(true, false, false);
    let growth: Vec<&Finding> = found.iter().filter(|f| f.kind == FindingKind::Growth).collect();
    assert_eq!(growth.len(), 1, "{found:#?}");
    let f = growth[0];
    assert_eq!((f.pid, f.severity, f.diagnosis), (60, Severity::Leak, Some(Diagnosis::TensorsKeptByUserCode)));
    assert_eq!(f.user_frame.as_ref().map(|u| (u.function.as_str(), u.line)), Some(("train_step", 32)));
    // From the first kept block (at 1 s) to the last allocation, before teardown: 299 MiB grew
    // (the first MiB is where it began) in 300 allocations.
    assert_eq!((f.bytes, f.count, f.first_ts), (299 * MIB, 300, 1_000_003_000));
    assert!(
        f.detail
            .contains("grew by 299.0 MiB steadily through the process's 6.0 s and was given back only when it ended"),
        "{}",
        f.detail
    );
    assert!(f.detail.contains("100% of its recent blocks still live were made outside autograd or already went through a backward pass: the user's code keeps these tensors, allocated at train.py:32 in train_step"), "{}", f.detail);
    assert_eq!(f.seconds_to_full, None, "no device memory reading");
}

#[test]
fn a_short_evaluation_without_no_grad_is_a_retained_graph() {
    let found = short_job(false, true, false);
    let growth: Vec<&Finding> = found.iter().filter(|f| f.kind == FindingKind::Growth).collect();
    assert_eq!(growth.len(), 1, "{found:#?}");
    let f = growth[0];
    assert_eq!((f.pid, f.diagnosis), (60, Some(Diagnosis::AutogradGraphRetained)));
    assert_eq!(f.user_frame.as_ref().map(|u| (u.function.as_str(), u.line)), Some(("evaluate", 52)));
    assert!(
        f.detail.contains(
            "a retained autograd graph, built at train.py:52 in evaluate; run evaluation under torch.no_grad()"
        ),
        "{}",
        f.detail
    );
}

#[test]
fn a_healthy_short_run_with_evaluation_under_no_grad_has_no_growth() {
    let found = short_job(false, false, true);
    assert!(found.iter().all(|f| f.kind != FindingKind::Growth), "{found:#?}");
}

#[test]
fn a_short_job_running_out_of_memory_has_its_growth_named_before_its_oom() {
    let mut s = Stream::new();
    // 1 GiB free when asked; then 1 MiB kept every 20 ms for 4 s, then the device is full.
    s.at(900_000_000).driver(70, Op::MemInfo, "cuMemGetInfo_v2", None, 0, 1 << 30);
    for step in 0..200u64 {
        s.at(1_000_000_000 + step * 20_000_000);
        s.block(70, Op::Alloc, 0x7000_0000 + step * MIB, MIB, ((step + 1) * MIB, 256 * MIB), &frame("evaluate", 12));
    }
    s.failed_alloc(70, 64 * MIB, &frame("evaluate", 12));
    let found = s.findings(RuleConfig::default());
    let kinds: Vec<(FindingKind, u32)> = found.iter().map(|f| (f.kind, f.pid)).collect();
    assert_eq!(kinds[..2], [(FindingKind::Growth, 70), (FindingKind::Oom, 70)], "{found:#?}");
    let growth = &found[0];
    assert_eq!((growth.bytes, growth.count), (199 * MIB, 200));
    assert!(
        growth.detail.contains("grew by 199.0 MiB steadily for 4.0 s until the device ran out of memory"),
        "{}",
        growth.detail
    );
    // 1 GiB at ~50 MiB/s, read 4.1 s before the failure: 820 MiB left then, 16.4 s.
    let rate = growth.bytes_per_second.unwrap();
    let left = ((1u64 << 30) as f64 - rate * (growth.last_ts - 900_001_000) as f64 / 1e9) / rate;
    assert!((growth.seconds_to_full.unwrap() - left).abs() < 1e-9 && (16.0..17.0).contains(&left), "{left}");
}

#[test]
fn segments_a_frameworks_allocator_took_until_the_device_was_full_are_its_oom_not_a_growth() {
    // Recorded at the driver's level: PyTorch's caching allocator takes a 20 MiB segment every
    // 20 ms for 4 s (the job fills the device, keeping a block in each), then a request fails.
    let mut marked = Stream::new();
    let mut own = Stream::new();
    for step in 0..200u64 {
        let addr = 0x7000_0000 + step * 20 * MIB;
        marked.at(1_000_000_000 + step * 20_000_000).segment(71, addr, 20 * MIB, &frame("fill", 30));
        own.at(1_000_000_000 + step * 20_000_000).alloc(72, addr, 20 * MIB, &frame("fill", 30));
    }
    marked.failed_alloc(71, 8 << 30, &frame("load", 50));
    own.failed_alloc(72, 8 << 30, &frame("load", 50));
    let kinds = |s: &Stream| -> Vec<FindingKind> {
        s.findings(RuleConfig::default()).iter().filter(|f| f.severity == Severity::Leak).map(|f| f.kind).collect()
    };
    // The allocator's cache and tensors: one problem, the out-of-memory, which tells who held what.
    assert_eq!(kinds(&marked), [FindingKind::Oom]);
    // A program's own memory that rose until the device was full: its growth, then the failure.
    assert_eq!(kinds(&own), [FindingKind::Growth, FindingKind::Oom]);
}

#[test]
fn at_the_drivers_level_pytorchs_own_oom_report_tells_the_request_its_line_and_the_cache() {
    // Recorded at the driver's level: PyTorch's allocator holds 60 MiB of segments (its totals
    // unknown until it reports); a 20 MiB segment fails, the allocator gives back an empty 2 MiB
    // segment and fails again, then reports the request it gives up on, 16 MiB at the user's line,
    // with 24 MiB of its 58 MiB in tensors: fragmentation.
    let mut s = Stream::new();
    let library = vec![Frame { function: "[libcudart.so.13]".into(), file: crate::stack::NATIVE_FILE.into(), line: 0 }];
    s.segment(80, 0xA000_0000, 20 * MIB, &frame("fill", 30)).segment(80, 0xB000_0000, 20 * MIB, &frame("fill", 30));
    s.segment(80, 0xC000_0000, 18 * MIB, &frame("fill", 30)).segment(80, 0xD000_0000, 2 * MIB, &frame("fill", 31));
    s.failed_alloc(80, 20 * MIB, &library).free(80, 0xD000_0000).failed_alloc(80, 20 * MIB, &library);
    s.oom_report(80, 16 * MIB, (24 * MIB, 58 * MIB), &frame("load", 50));
    let found: Vec<Finding> =
        s.findings(RuleConfig::default()).into_iter().filter(|f| f.kind == FindingKind::Oom).collect();
    assert_eq!(found.len(), 1, "{found:#?}");
    let f = &found[0];
    assert_eq!(
        (f.pid, f.bytes, f.stack.clone(), f.api.as_deref()),
        (80, 16 * MIB, frame("load", 50), Some("c10::reportOutOfMemoryToProfiler"))
    );
    assert_eq!((f.diagnosis, f.fragmentation), (Some(Diagnosis::Fragmentation), true));
    let failing = f.processes.iter().find(|p| p.pid == 80).unwrap();
    assert_eq!((failing.allocated, failing.reserved), (Some(24 * MIB), Some(58 * MIB)));
    assert!(f.detail.starts_with("A request of 16.0 MiB to PyTorch's caching allocator failed with out of memory in pid 80 (python3) at train.py:50 in load;"), "{}", f.detail);

    // The allocator's retry made room (the same segment, asked again, granted): no failure for
    // the program, no finding.
    let mut s = Stream::new();
    s.segment(81, 0xA000_0000, 20 * MIB, &frame("fill", 30)).failed_alloc(81, 20 * MIB, &library);
    s.segment(81, 0xB000_0000, 20 * MIB, &library).process(81, Op::Exit, 1);
    assert!(s.findings(RuleConfig::default()).iter().all(|f| f.kind != FindingKind::Oom));

    // No report came (a PyTorch without it): the failure is told from the driver's call when
    // the process goes on, or REPORT_WAIT_NS later on the agent's clock.
    let mut s = Stream::new();
    s.segment(82, 0xA000_0000, 20 * MIB, &frame("fill", 30)).failed_alloc(82, 20 * MIB, &frame("load", 50));
    let mut analyzer = Analyzer::new(RuleConfig::default());
    for event in &s.events {
        assert!(analyzer.observe(&mut event.clone()).is_empty());
    }
    let failed_at = s.ts;
    assert!(analyzer.tick(failed_at + oom::REPORT_WAIT_NS - 1).is_empty());
    let told = analyzer.tick(failed_at + oom::REPORT_WAIT_NS);
    assert_eq!(told.iter().map(|f| (f.kind, f.pid, f.bytes)).collect::<Vec<_>>(), [(FindingKind::Oom, 82, 20 * MIB)]);
    // What the allocator had cached is not known: no diagnosis, and the sentence says so.
    assert_eq!(told[0].diagnosis, None);
    assert!(told[0].detail.ends_with("whether a cache in pieces (fragmentation) or live memory filled the device is not known; free or shrink the largest holders, or allocate less at once."), "{}", told[0].detail);
}
