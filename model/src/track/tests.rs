//! The tracker through its public face: synthetic event streams in, each process's table out —
//! per-process addresses, pid reuse, IPC exports and imports, both layers' live bytes.

use std::borrow::Cow;

use super::*;
use crate::event::{Event, Kind, Layer, Op, Source};

fn driver(ts: u64, pid: u32, op: Op, api: &'static str, kind: Kind, addr: u64, size: u64) -> Event {
    let mut event = Event::new(ts, pid, pid, Source::Ebpf, Layer::Driver, op, Cow::Borrowed(api));
    event.kind = Some(kind);
    event.addr = Some(addr);
    event.size = size;
    event
}

fn process(ts: u64, pid: u32, op: Op, ppid: u32) -> Event {
    let mut event = Event::new(ts, pid, pid, Source::Ebpf, Layer::Process, op, Cow::Borrowed("sched"));
    event.ppid = Some(ppid);
    event
}

fn ipc(ts: u64, pid: u32, op: Op, addr: u64, handle: u8) -> Event {
    let api = if op == Op::IpcExport { "cuIpcGetMemHandle" } else { "cuIpcOpenMemHandle_v2" };
    let mut event = driver(ts, pid, op, api, Kind::Device, addr, 0);
    event.handle = Some(vec![handle; 64]);
    event
}

#[test]
fn same_address_in_two_processes_is_two_allocations() {
    let mut tracker = Tracker::new();
    tracker.apply(&driver(1, 10, Op::Alloc, "cuMemAlloc_v2", Kind::Device, 0x7f00_0000_0000, 4096));
    tracker.apply(&driver(2, 11, Op::Alloc, "cuMemAlloc_v2", Kind::Device, 0x7f00_0000_0000, 8192));
    tracker.apply(&driver(3, 10, Op::Free, "cuMemFree_v2", Kind::Device, 0x7f00_0000_0000, 0));
    assert_eq!(tracker.process(10).unwrap().device_bytes(), 0);
    assert_eq!(tracker.process(11).unwrap().device_bytes(), 8192);
}

#[test]
fn failed_calls_change_nothing_and_kinds_are_summed() {
    let mut tracker = Tracker::new();
    let mut failed = driver(1, 10, Op::Alloc, "cuMemAlloc_v2", Kind::Device, 0, 1 << 40);
    failed.result = 2;
    tracker.apply(&failed);
    tracker.apply(&driver(2, 10, Op::Alloc, "cuMemAllocHost_v2", Kind::HostPinned, 0x5000, 100));
    tracker.apply(&driver(3, 10, Op::Alloc, "cuMemCreate", Kind::Vmm, 0x5000, 2 << 20));
    tracker.apply(&driver(4, 10, Op::Map, "cuMemMap", Kind::Vmm, 0x7f00_0000_0000, 2 << 20));
    let summary = tracker.process(10).unwrap().summary();
    assert_eq!(summary.by_kind[&Kind::HostPinned], KindTotal { bytes: 100, count: 1 });
    assert_eq!(summary.by_kind[&Kind::Vmm], KindTotal { bytes: 2 << 20, count: 1 });
    assert_eq!(summary.by_kind.get(&Kind::Device), None);
    assert_eq!(summary.mapped_bytes, 2 << 20);
    assert_eq!(summary.driver_calls, 4);
    // The VMM handle 0x5000 and the host pointer 0x5000 are different things.
    tracker.apply(&driver(5, 10, Op::Free, "cuMemRelease", Kind::Vmm, 0x5000, 0));
    let summary = tracker.process(10).unwrap().summary();
    assert_eq!(summary.by_kind[&Kind::HostPinned], KindTotal { bytes: 100, count: 1 });
    assert_eq!(summary.by_kind.get(&Kind::Vmm), None);
}

#[test]
fn exit_closes_the_table_and_a_reused_pid_starts_fresh() {
    let mut tracker = Tracker::new();
    tracker.apply(&process(1, 20, Op::Fork, 10));
    tracker.apply(&driver(2, 20, Op::Alloc, "cuMemAlloc_v2", Kind::Device, 0x7f00_0000_0000, 4096));
    let mut exit = process(3, 20, Op::Exit, 10);
    exit.exit_code = Some(3);
    tracker.apply(&exit);
    assert!(tracker.process(20).is_none());
    tracker.apply(&process(4, 20, Op::Fork, 10));
    let summaries = tracker.summaries();
    assert_eq!(summaries.len(), 2);
    assert_eq!(summaries[0].state, ProcessState::Exited { code: 3, signal: None, ts: 3 });
    assert_eq!(summaries[0].by_kind[&Kind::Device].bytes, 4096);
    assert_eq!(summaries[1].state, ProcessState::Running);
    assert!(summaries[1].by_kind.is_empty());
}

#[test]
fn imports_find_their_exporter_by_handle_and_die_with_it() {
    let mut tracker = Tracker::new();
    tracker.apply(&driver(1, 10, Op::Alloc, "cuMemAlloc_v2", Kind::Device, 0x7f00_0000_0000, 1 << 20));
    tracker.apply(&ipc(2, 10, Op::IpcExport, 0x7f00_0000_0000, 0xaa));
    let open = ipc(3, 11, Op::IpcOpen, 0x7fa0_0000_0000, 0xaa);
    let exporter = tracker.exporter_of(&open).unwrap().exporter;
    assert_eq!(exporter, ProcessRef { pid: 10, since: 1 });
    tracker.apply(&open);
    let import = tracker.process(11).unwrap().imports()[0].clone();
    assert_eq!(import.mapping.size, 1 << 20);
    assert_eq!(import.exporter, Some(exporter));
    let key = import.export.unwrap();
    assert_eq!(tracker.importers_of(&key, exporter).len(), 1);
    // An unknown handle has no exporter; the exporter's free retires its export.
    assert!(tracker.exporter_of(&ipc(4, 11, Op::IpcOpen, 0, 0xbb)).is_none());
    tracker.apply(&driver(5, 10, Op::Free, "cuMemFree_v2", Kind::Device, 0x7f00_0000_0000, 0));
    assert!(tracker.exports_of(exporter, None).is_empty());
}

#[test]
fn closed_tables_are_forgotten_after_they_ended_and_live_ones_kept() {
    let mut tracker = Tracker::new();
    tracker.apply(&process(1, 20, Op::Fork, 10));
    tracker.apply(&process(2, 21, Op::Fork, 10));
    tracker.apply(&process(5, 20, Op::Exit, 10));
    tracker.apply(&process(9, 21, Op::Exec, 10));
    tracker.apply(&driver(10, 22, Op::Alloc, "cuMemAlloc_v2", Kind::Device, 0x7f00_0000_0000, 4096));
    assert_eq!(tracker.forget_closed_before(5), 0);
    assert_eq!(tracker.forget_closed_before(6), 1);
    let left: Vec<(u32, u64)> = tracker.processes().iter().map(|p| (p.pid, p.first_ts)).collect();
    assert_eq!(left, vec![(21, 2), (21, 9), (22, 10)]);
    assert_eq!(tracker.forget_closed_before(100), 1);
    assert_eq!(tracker.processes().len(), 2);
}

fn block(ts: u64, pid: u32, op: Op, addr: u64, size: u64, allocated: u64, reserved: u64) -> Event {
    let mut event =
        Event::new(ts, pid, pid, Source::Ebpf, Layer::Allocator, op, Cow::Borrowed("c10::reportMemoryUsageToProfiler"));
    event.addr = Some(addr);
    event.size = size;
    event.allocated = Some(allocated);
    event.reserved = Some(reserved);
    event.device = Some(0);
    event
}

#[test]
fn live_bytes_follow_every_alloc_and_free_of_both_layers() {
    let mut tracker = Tracker::new();
    tracker.apply(&driver(1, 10, Op::Alloc, "cuMemAlloc_v2", Kind::Device, 0x7f00_0000_0000, 2 << 20));
    tracker.apply(&driver(2, 10, Op::Alloc, "cuMemAllocHost_v2", Kind::HostPinned, 0x5000, 100));
    tracker.apply(&block(3, 10, Op::Alloc, 0x7f00_0000_0000, 512, 512, 2 << 20));
    tracker.apply(&block(4, 10, Op::Alloc, 0x7f00_0000_0200, 1024, 1536, 2 << 20));
    let process = tracker.process(10).unwrap();
    assert_eq!((process.live_bytes(false), process.live_bytes(true)), ((2 << 20) + 100, 1536));
    // The same address allocated twice (a missed free) counts once, at its new size.
    tracker.apply(&block(5, 10, Op::Alloc, 0x7f00_0000_0200, 256, 768, 2 << 20));
    tracker.apply(&block(6, 10, Op::Free, 0x7f00_0000_0000, 512, 256, 2 << 20));
    // A free of a block never seen changes nothing.
    tracker.apply(&block(7, 10, Op::Free, 0x7f00_0000_9000, 64, 192, 2 << 20));
    tracker.apply(&driver(8, 10, Op::Free, "cuMemFreeHost", Kind::HostPinned, 0x5000, 0));
    let process = tracker.process(10).unwrap();
    assert_eq!((process.live_bytes(false), process.live_bytes(true)), (2 << 20, 256));
    // The blocks report device 0; a driver allocation on device 1 adds it.
    assert_eq!(process.summary().devices, [0]);
    let mut on_one = driver(9, 10, Op::Alloc, "cuMemAlloc_v2", Kind::Device, 0x7e00_0000_0000, 1 << 20);
    on_one.device = Some(1);
    tracker.apply(&on_one);
    let summary = tracker.process(10).unwrap().summary();
    assert_eq!(summary.devices, [0, 1]);
    // Device 0's segment was allocated with no device named; device 1's is counted.
    assert_eq!(summary.by_device.into_iter().collect::<Vec<_>>(), [(1, KindTotal { bytes: 1 << 20, count: 1 })]);
}

#[test]
fn memory_held_before_the_capture_is_the_first_report_less_what_was_seen() {
    // Attached to a running process: its first report says 27 MiB allocated, 40 MiB reserved.
    let mut tracker = Tracker::new();
    tracker.apply(&block(1, 10, Op::Alloc, 0x7f00_0000_0000, 1 << 20, 28 << 20, 40 << 20));
    assert_eq!(
        tracker.process(10).unwrap().before_capture(),
        Some(AllocatorTotals { allocated: 27 << 20, reserved: 40 << 20, ts: 1 })
    );
    assert_eq!(
        tracker.process(10).unwrap().summary().before_capture.map(|b| (b.allocated, b.reserved)),
        Some((27 << 20, 40 << 20))
    );
    // A process seen from its start: the segment was allocated in view, the block is the first.
    tracker.apply(&process(2, 11, Op::Fork, 10));
    tracker.apply(&driver(3, 11, Op::Alloc, "cuMemAlloc_v2", Kind::Device, 0x7e00_0000_0000, 2 << 20));
    tracker.apply(&block(4, 11, Op::Alloc, 0x7e00_0000_0000, 4096, 4096, 2 << 20));
    tracker.apply(&block(5, 11, Op::Alloc, 0x7e00_0000_1000, 4096, 8192, 2 << 20));
    assert_eq!(
        tracker.process(11).unwrap().before_capture(),
        Some(AllocatorTotals { allocated: 0, reserved: 0, ts: 4 })
    );
    assert_eq!(tracker.process(11).unwrap().summary().before_capture, None);
    // A first report that frees a block from before: it was allocated before, too.
    tracker.apply(&block(6, 12, Op::Free, 0x7d00_0000_0000, 1024, 0, 2 << 20));
    assert_eq!(tracker.process(12).unwrap().before_capture().map(|b| (b.allocated, b.reserved)), Some((1024, 2 << 20)));
}

#[test]
fn device_memory_is_kept_per_device_as_it_changes() {
    let mut tracker = Tracker::new();
    let on = |mut event: Event, device: Option<i32>| {
        event.device = device;
        event
    };
    tracker.apply(&on(driver(1, 10, Op::Alloc, "cuMemAlloc_v2", Kind::Device, 0x1000, 4096), Some(0)));
    tracker.apply(&on(driver(2, 10, Op::Alloc, "cuMemAlloc_v2", Kind::Device, 0x9000, 8192), Some(1)));
    tracker.apply(&on(driver(3, 10, Op::Alloc, "cuMemCreate", Kind::Vmm, 0x77, 2 << 20), Some(1)));
    tracker.apply(&on(driver(4, 10, Op::Alloc, "cuMemAllocHost_v2", Kind::HostPinned, 0x5000, 100), Some(0)));
    tracker.apply(&driver(5, 10, Op::Alloc, "cuMemAlloc_v2", Kind::Device, 0x20000, 512));
    let process = tracker.process(10).unwrap();
    assert_eq!(process.device_memory(Some(0)), 4096);
    assert_eq!(process.device_memory(Some(1)), 8192 + (2 << 20));
    assert_eq!(process.device_memory(None), 512);
    // The same address allocated again without a free replaces the old allocation.
    tracker.apply(&on(driver(6, 10, Op::Alloc, "cuMemAlloc_v2", Kind::Device, 0x1000, 1024), Some(0)));
    tracker.apply(&on(driver(7, 10, Op::Free, "cuMemRelease", Kind::Vmm, 0x77, 0), Some(1)));
    let process = tracker.process(10).unwrap();
    assert_eq!(process.device_memory(Some(0)), 1024);
    assert_eq!(process.device_memory(Some(1)), 8192);
    assert_eq!(process.summary().by_device[&1].bytes, 8192);
}
