//! What one process holds — driver allocations, tensors (the allocator's blocks), mappings, IPC
//! exports and imports, contexts, the allocator's totals — and the events that rebuild it in a
//! fresh tracker. A post-mortem's recording opens with those events, stamped at the window's
//! first instant, so whoever replays it (the HTML report, `report`, `whatif`) holds what the
//! process held then: memory allocated long before the window is in the picture at the failure.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;

use gpuprof_model::event::{Event, Kind, Layer, Op, Source};
use gpuprof_model::track::{Allocation, Export, ExportKey, Mapping, ProcessMemory, Space, Tracker};

/// The entry point a synthetic context event names (what PyTorch and the runtime call).
const CONTEXT_API: &str = "cuDevicePrimaryCtxRetain";

/// One thing a process holds.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Held {
    /// A driver allocation (device, managed, pinned host, pool memory, a VMM handle).
    Allocation(Allocation),
    /// A framework allocator's block: a tensor.
    Block(Allocation),
    /// A VMM mapping or registered host memory.
    Mapping(Mapping),
    /// Another process's memory opened here (`exporter`: its pid, when its export was seen).
    Import { mapping: Mapping, export: Option<ExportKey>, exporter: Option<u32> },
    /// Memory of this process made available to others.
    Export { key: ExportKey, export: Export },
}

impl Held {
    /// When it was allocated, mapped, opened or exported.
    pub(crate) fn ts(&self) -> u64 {
        match self {
            Held::Allocation(a) | Held::Block(a) => a.ts,
            Held::Mapping(m) | Held::Import { mapping: m, .. } => m.ts,
            Held::Export { export, .. } => export.ts,
        }
    }

    /// Bytes it takes in memory here (its stack is shared with the tracker's).
    pub(crate) fn footprint(&self) -> u64 {
        let handle = match self {
            Held::Import {
                export: Some(ExportKey::Legacy(h) | ExportKey::Pool(h) | ExportKey::Shareable(h)), ..
            }
            | Held::Export { key: ExportKey::Legacy(h) | ExportKey::Pool(h) | ExportKey::Shareable(h), .. } => h.len(),
            _ => 0,
        };
        (std::mem::size_of::<Held>() + handle) as u64
    }

    /// An order that does not depend on hash tables: kind of thing, address space, address.
    fn order(&self) -> (u8, bool, u64) {
        match self {
            Held::Allocation(a) => (0, a.kind == Kind::Vmm, a.addr),
            Held::Block(a) => (1, false, a.addr),
            Held::Mapping(m) => (2, false, m.addr),
            Held::Import { mapping, .. } => (3, mapping.kind == Kind::Vmm, mapping.addr),
            Held::Export { export, .. } => (4, export.space == Space::VmmHandle, export.addr),
        }
    }

    #[cfg(test)]
    fn stamped_no_earlier_than(mut self, at: u64) -> Held {
        match &mut self {
            Held::Allocation(a) | Held::Block(a) => a.ts = a.ts.max(at),
            Held::Mapping(m) | Held::Import { mapping: m, .. } => m.ts = m.ts.max(at),
            Held::Export { export, .. } => {
                export.ts = export.ts.max(at);
                export.exporter.since = export.exporter.since.max(at);
            }
        }
        self
    }
}

/// What a successful `event` of `process` releases that was made by `made_by` (ns), looked up
/// before the tracker applies it: a post-mortem whose window begins after the thing was made
/// still needs it in its prologue. What was made later is the window's own event.
pub(crate) fn released_by(event: &Event, process: &ProcessMemory, tracker: &Tracker, made_by: u64) -> Vec<Held> {
    if !event.succeeded() || !matches!(event.op, Op::Free | Op::Unmap | Op::IpcClose) {
        return Vec::new();
    }
    let Some(addr) = event.addr else { return Vec::new() };
    let space = Space::of(event.kind.unwrap_or(Kind::Device));
    let import = || {
        process
            .imports()
            .into_iter()
            .find(|i| i.mapping.addr == addr && Space::of(i.mapping.kind) == space && i.mapping.ts <= made_by)
            .map(|i| Held::Import {
                mapping: i.mapping.clone(),
                export: i.export.clone(),
                exporter: i.exporter.map(|e| e.pid),
            })
    };
    match (event.layer, event.op) {
        (Layer::Allocator, Op::Free) => {
            process.block(addr).filter(|b| b.ts <= made_by).cloned().map(Held::Block).into_iter().collect()
        }
        (Layer::Driver, Op::Free) => match process.released_by(event) {
            Some(allocation) => {
                let exports = tracker
                    .exports_of(process.as_ref(), Some(addr))
                    .into_iter()
                    .filter(|(_, export)| export.space == space && export.ts <= made_by)
                    .map(|(key, export)| Held::Export { key: key.clone(), export: export.clone() });
                let allocation = (allocation.ts <= made_by).then(|| Held::Allocation(allocation.clone()));
                allocation.into_iter().chain(exports).collect()
            }
            // Imported pool pointers and VMM handles are released with a free.
            None => import().into_iter().collect(),
        },
        (Layer::Driver, Op::Unmap) => process
            .mappings()
            .into_iter()
            .find(|m| m.addr == addr && m.ts <= made_by)
            .cloned()
            .map(Held::Mapping)
            .into_iter()
            .collect(),
        (Layer::Driver, Op::IpcClose) => import().into_iter().collect(),
        _ => Vec::new(),
    }
}

/// Everything one process instance holds at one moment.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Holdings {
    pub pid: u32,
    pub ppid: Option<u32>,
    pub comm: Arc<str>,
    pub held: Vec<Held>,
    pub contexts: u32,
    /// The allocator's (allocated, reserved) bytes per device, as it last reported them.
    pub totals: BTreeMap<i32, (u64, u64)>,
}

/// The events that rebuild one process's holdings: its own, and its imports, which go after
/// every process's own so that each finds its exporter's export.
pub(crate) struct Prologue {
    pub own: Vec<Event>,
    pub imports: Vec<Event>,
}

impl Holdings {
    /// What `process` holds now; with `made_by`, only what it allocated, mapped, opened or
    /// exported by then (what came later is a window's own events).
    pub(crate) fn of(process: &ProcessMemory, tracker: &Tracker, made_by: Option<u64>) -> Holdings {
        let before = |ts: u64| made_by.is_none_or(|limit| ts <= limit);
        let mut held: Vec<Held> = Vec::new();
        held.extend(process.allocations_unordered().filter(|a| before(a.ts)).cloned().map(Held::Allocation));
        held.extend(process.blocks_unordered().filter(|a| before(a.ts)).cloned().map(Held::Block));
        held.extend(process.mappings().into_iter().filter(|m| before(m.ts)).cloned().map(Held::Mapping));
        held.extend(process.imports().into_iter().filter(|i| before(i.mapping.ts)).map(|i| Held::Import {
            mapping: i.mapping.clone(),
            export: i.export.clone(),
            exporter: i.exporter.map(|e| e.pid),
        }));
        held.extend(
            tracker
                .exports_of(process.as_ref(), None)
                .into_iter()
                .filter(|(_, e)| before(e.ts))
                .map(|(key, export)| Held::Export { key: key.clone(), export: export.clone() }),
        );
        Holdings {
            pid: process.pid,
            ppid: process.ppid,
            comm: process.comm.clone(),
            held,
            contexts: process.contexts(),
            totals: process.allocator_totals().iter().map(|(&d, t)| (d, (t.allocated, t.reserved))).collect(),
        }
    }

    /// The same holdings in a canonical order, every time no earlier than `at`: a replay of a
    /// recording that opens at `at` holds exactly this.
    #[cfg(test)]
    pub(crate) fn as_of(&self, at: u64) -> Holdings {
        let mut held: Vec<Held> = self.held.iter().cloned().map(|h| h.stamped_no_earlier_than(at)).collect();
        held.sort_by_key(Held::order);
        Holdings { held, ..self.clone() }
    }

    /// The events that rebuild these holdings in a tracker that has not seen the process, as
    /// `source` captured its events: stamped `at`, or with `as_made` each at the time it was
    /// made (a replay that goes on from there keeps when each thing was made).
    pub(crate) fn events(&self, at: u64, source: Source, as_made: bool) -> Prologue {
        let base = |ts: u64, tid: u32, layer: Layer, op: Op, api: Cow<'static, str>| {
            let ts = if as_made { ts } else { at };
            let mut event = Event::new(ts, self.pid, tid, source, layer, op, api);
            event.comm = self.comm.clone();
            event.ppid = self.ppid;
            event
        };
        let mut own = Vec::new();
        for _ in 0..self.contexts {
            let mut event = base(at, self.pid, Layer::Driver, Op::CtxCreate, Cow::Borrowed(CONTEXT_API));
            event.addr = Some(0);
            own.push(event);
        }
        let mut held: Vec<&Held> = self.held.iter().collect();
        held.sort_by_key(|h| (h.ts(), h.order()));
        for allocation in held.iter().filter_map(|h| if let Held::Allocation(a) = h { Some(a) } else { None }) {
            let mut event = base(allocation.ts, allocation.tid, Layer::Driver, Op::Alloc, allocation.api.clone());
            event.kind = Some(allocation.kind);
            event.device = allocation.device;
            event.addr = Some(allocation.addr);
            event.size = allocation.size;
            event.stack = allocation.stack.clone();
            event.allocator_segment = allocation.framework;
            own.push(event);
        }
        for mapping in held.iter().filter_map(|h| if let Held::Mapping(m) = h { Some(m) } else { None }) {
            let mut event = base(mapping.ts, self.pid, Layer::Driver, Op::Map, mapping.api.clone());
            event.kind = Some(mapping.kind);
            event.addr = Some(mapping.addr);
            event.size = mapping.size;
            event.stack = mapping.stack.clone();
            event.allocator_segment = mapping.framework;
            own.push(event);
        }
        own.extend(self.block_events(&held, &base));
        for (key, export) in
            held.iter().filter_map(|h| if let Held::Export { key, export } = h { Some((key, export)) } else { None })
        {
            let kind = match key {
                ExportKey::Pool(_) => Kind::Pool,
                ExportKey::Shareable(_) | ExportKey::FileObject(_) => Kind::Vmm,
                ExportKey::Legacy(_) => self
                    .held
                    .iter()
                    .find_map(|h| match h {
                        Held::Allocation(a) if a.addr == export.addr && a.kind != Kind::Vmm => Some(a.kind),
                        _ => None,
                    })
                    .unwrap_or(Kind::Device),
            };
            let mut event = base(export.ts, self.pid, Layer::Driver, Op::IpcExport, Cow::Borrowed(export_api(key)));
            event.kind = Some(kind);
            event.addr = Some(export.addr);
            name_handle(&mut event, key);
            own.push(event);
        }
        let mut imports = Vec::new();
        for held in held {
            let Held::Import { mapping, export, exporter } = held else { continue };
            let mut event = base(mapping.ts, self.pid, Layer::Driver, Op::IpcOpen, mapping.api.clone());
            event.kind = Some(mapping.kind);
            event.addr = Some(mapping.addr);
            event.size = mapping.size;
            event.stack = mapping.stack.clone();
            event.peer_pid = *exporter;
            if let Some(key) = export {
                name_handle(&mut event, key);
            }
            imports.push(event);
        }
        Prologue { own, imports }
    }

    /// Blocks device by device, the allocator's totals on them rising with each to what it last
    /// reported: the curves a replay draws start where the allocator stood.
    fn block_events(
        &self,
        held: &[&Held],
        base: &dyn Fn(u64, u32, Layer, Op, Cow<'static, str>) -> Event,
    ) -> Vec<Event> {
        let mut by_device: BTreeMap<i32, Vec<&Allocation>> = BTreeMap::new();
        for held in held {
            if let Held::Block(block) = held {
                by_device.entry(block.device.unwrap_or(0)).or_default().push(block);
            }
        }
        let mut events = Vec::new();
        for (device, blocks) in by_device {
            let in_blocks: u64 = blocks.iter().map(|b| b.size).sum();
            let totals = self.totals.get(&device).copied();
            // What the allocator counted that no block here accounts for (tensors made before
            // gpuprof heard from it).
            let mut allocated = totals.map_or(0, |(allocated, _)| allocated.saturating_sub(in_blocks));
            let last = blocks.len() - 1;
            for (n, block) in blocks.into_iter().enumerate() {
                let mut event = base(block.ts, block.tid, Layer::Allocator, Op::Alloc, block.api.clone());
                event.kind = Some(Kind::Device);
                event.device = Some(device);
                event.addr = Some(block.addr);
                event.size = block.size;
                event.stack = block.stack.clone();
                allocated += block.size;
                if let Some((reported, reserved)) = totals {
                    // The last says exactly what the allocator reported (blocks whose frees
                    // were not seen may add up to more).
                    event.allocated = Some(if n == last { reported } else { allocated.min(reported) });
                    event.reserved = Some(reserved);
                }
                events.push(event);
            }
        }
        events
    }
}

/// The entry point that makes an export of this key.
fn export_api(key: &ExportKey) -> &'static str {
    match key {
        ExportKey::Legacy(_) => "cuIpcGetMemHandle",
        ExportKey::Pool(_) => "cuMemPoolExportPointer",
        ExportKey::Shareable(_) | ExportKey::FileObject(_) => "cuMemExportToShareableHandle",
    }
}

/// The handle fields by which the tracker matches an import to its export.
fn name_handle(event: &mut Event, key: &ExportKey) {
    match key {
        ExportKey::Legacy(bytes) | ExportKey::Pool(bytes) | ExportKey::Shareable(bytes) => {
            event.handle = Some(bytes.clone());
        }
        ExportKey::FileObject(object) => {
            event.handle_type = Some(Cow::Borrowed("posix_fd"));
            event.handle_object = Some(*object);
        }
    }
}

#[cfg(test)]
mod tests {
    use gpuprof_model::event::{Frame, PYTORCH_ALLOCATOR_API};

    use super::*;

    const MIB: u64 = 1 << 20;

    /// An event of `pid` at `ts`; PyTorch's allocator's when `api` is its report.
    fn event(ts: u64, pid: u32, op: Op, api: &'static str, kind: Option<Kind>, addr: u64, size: u64) -> Event {
        let layer = if api == PYTORCH_ALLOCATOR_API { Layer::Allocator } else { Layer::Driver };
        let mut event = Event::new(ts, pid, pid + 100, Source::Ebpf, layer, op, Cow::Borrowed(api));
        event.comm = "python3".into();
        event.ppid = Some(1);
        event.kind = kind;
        event.addr = Some(addr);
        event.size = size;
        event.device = Some(0);
        event.stack = vec![Frame { function: api.into(), file: "/w/job.py".into(), line: ts as u32 }].into();
        event
    }

    /// Two processes holding one of everything: an exporter (device memory exported through an
    /// IPC handle, a VMM handle mapped, registered host memory, tensors on two devices) and an
    /// importer of its buffer.
    fn world() -> Tracker {
        let handle: Vec<u8> = (0..64).collect();
        let mut events = vec![
            event(1, 10, Op::CtxCreate, "cuDevicePrimaryCtxRetain", None, 0xc0, 0),
            event(2, 10, Op::Alloc, "cuMemAlloc_v2", Some(Kind::Device), 0x7f20_0000_0000, 64 * MIB),
            event(3, 10, Op::IpcExport, "cuIpcGetMemHandle", Some(Kind::Device), 0x7f20_0000_0000, 0),
            event(4, 10, Op::Alloc, "cuMemCreate", Some(Kind::Vmm), 0x1_0000_0001, 32 * MIB),
            event(5, 10, Op::Reserve, "cuMemAddressReserve", Some(Kind::Vmm), 0x7f60_0000_0000, 32 * MIB),
            event(6, 10, Op::Map, "cuMemMap", Some(Kind::Vmm), 0x7f60_0000_0000, 32 * MIB),
            event(7, 10, Op::Map, "cuMemHostRegister_v2", Some(Kind::HostPinned), 0x5555_0000, 4 * MIB),
            event(8, 10, Op::Alloc, PYTORCH_ALLOCATOR_API, Some(Kind::Device), 0x7f20_0000_0000, MIB),
            event(9, 10, Op::Alloc, PYTORCH_ALLOCATOR_API, Some(Kind::Device), 0x7f60_0000_0000, 2 * MIB),
            event(10, 11, Op::CtxCreate, "cuDevicePrimaryCtxRetain", None, 0xc1, 0),
            event(11, 11, Op::IpcOpen, "cuIpcOpenMemHandle_v2", Some(Kind::Device), 0x7fa0_0000_0000, 0),
        ];
        events[2].handle = Some(handle.clone());
        events[10].handle = Some(handle);
        events[5].vmm_handle = Some(0x1_0000_0001);
        // The second tensor is on device 1; each report carries the allocator's totals.
        events[8].device = Some(1);
        (events[7].allocated, events[7].reserved) = (Some(5 * MIB), Some(64 * MIB));
        (events[8].allocated, events[8].reserved) = (Some(2 * MIB), Some(32 * MIB));
        let mut tracker = Tracker::new();
        for event in &events {
            tracker.apply(event);
        }
        tracker
    }

    fn replay(tracker: &Tracker, at: u64) -> Tracker {
        let prologues: Vec<Prologue> = [10, 11]
            .iter()
            .map(|&pid| Holdings::of(tracker.process(pid).unwrap(), tracker, None).events(at, Source::Ebpf, false))
            .collect();
        let mut replayed = Tracker::new();
        for event in prologues.iter().flat_map(|p| &p.own).chain(prologues.iter().flat_map(|p| &p.imports)) {
            assert_eq!(event.ts, at);
            replayed.apply(event);
        }
        replayed
    }

    #[test]
    fn holdings_rebuilt_from_their_events_are_the_holdings() {
        let tracker = world();
        let replayed = replay(&tracker, 100);
        for pid in [10, 11] {
            let live = Holdings::of(tracker.process(pid).unwrap(), &tracker, None).as_of(100);
            let again = Holdings::of(replayed.process(pid).unwrap(), &replayed, None).as_of(100);
            assert_eq!(again, live, "pid {pid}");
        }
        let exporter = Holdings::of(tracker.process(10).unwrap(), &tracker, None);
        // The device allocation and the VMM handle, the VMM and host mappings, two tensors, the export.
        assert_eq!((exporter.held.len(), exporter.contexts), (7, 1));
        // The tensors' totals as the allocator reported them, per device (blocks gpuprof never saw
        // allocated included: 5 MiB on device 0, of which one block of 1 MiB).
        assert_eq!(exporter.totals, [(0, (5 * MIB, 64 * MIB)), (1, (2 * MIB, 32 * MIB))].into_iter().collect());
        // The importer found its exporter in the replay too.
        let import = replayed.process(11).unwrap().imports()[0].clone();
        assert_eq!((import.exporter.map(|e| e.pid), import.mapping.size), (Some(10), 64 * MIB));
        // Made by a moment: what came later is left out.
        assert_eq!(Holdings::of(tracker.process(10).unwrap(), &tracker, Some(6)).held.len(), 4);
    }

    #[test]
    fn what_an_event_releases_is_found_before_the_tracker_forgets_it() {
        let tracker = world();
        let exporter = tracker.process(10).unwrap();
        let free = event(20, 10, Op::Free, "cuMemFree_v2", Some(Kind::Device), 0x7f20_0000_0000, 0);
        let released = released_by(&free, exporter, &tracker, 19);
        assert!(matches!(&released[..], [Held::Allocation(a), Held::Export { .. }] if a.size == 64 * MIB));
        // Made after the chunk began: the window's own events have it.
        assert!(released_by(&free, exporter, &tracker, 1).is_empty());
        let unmap = event(20, 10, Op::Unmap, "cuMemUnmap", Some(Kind::Vmm), 0x7f60_0000_0000, 0);
        assert!(matches!(&released_by(&unmap, exporter, &tracker, 19)[..], [Held::Mapping(m)] if m.size == 32 * MIB));
        let tensor = event(20, 10, Op::Free, PYTORCH_ALLOCATOR_API, Some(Kind::Device), 0x7f60_0000_0000, 0);
        assert!(matches!(&released_by(&tensor, exporter, &tracker, 19)[..], [Held::Block(b)] if b.size == 2 * MIB));
        let close = event(20, 11, Op::IpcClose, "cuIpcCloseMemHandle", Some(Kind::Device), 0x7fa0_0000_0000, 0);
        let importer = tracker.process(11).unwrap();
        assert!(matches!(&released_by(&close, importer, &tracker, 19)[..], [Held::Import { exporter: Some(10), .. }]));
        let mut failed = free.clone();
        failed.result = 1;
        assert!(released_by(&failed, exporter, &tracker, 19).is_empty());
    }
}
