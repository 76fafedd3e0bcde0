//! One process instance's table — driver allocations and the segments they make, the
//! allocator's blocks (tensors) and totals, mappings, reservations, IPC imports, contexts, call
//! counts — and every change to it. The tracker hands each event of the instance to
//! `ProcessMemory::apply` once; what the event means beyond this table (an export made or
//! released, the instance's end) comes back as an `Outcome` for the tracker to act on, so no
//! rule about one process's memory lives anywhere else.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use super::ipc::{Export, ExportKey, ProcessRef};
use super::space::Space;
use crate::event::{Event, Frame, Kind, Layer, Op};
use crate::framework::Framework;

pub use crate::stack::Stack;

/// Memory a process allocated and has not released.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Allocation {
    pub addr: u64,
    pub size: u64,
    pub kind: Kind,
    pub api: Cow<'static, str>,
    pub ts: u64,
    pub tid: u32,
    pub stack: Stack,
    /// The CUDA device, when the call named one (allocator blocks always do).
    #[serde(default)]
    pub device: Option<i32>,
    /// A driver allocation a framework's caching allocator made for its segments.
    #[serde(default)]
    pub framework: Option<Framework>,
}

impl Allocation {
    /// Device memory (what runs a GPU out of memory), as opposed to pinned host memory.
    pub fn is_device_memory(&self) -> bool {
        self.kind != Kind::HostPinned
    }
}

/// Memory made reachable in a process without being allocated by it: a VMM mapping or
/// registered host memory.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Mapping {
    pub addr: u64,
    pub size: u64,
    pub kind: Kind,
    pub api: Cow<'static, str>,
    pub ts: u64,
    pub stack: Stack,
    /// Pages a framework's caching allocator mapped into one of its segments.
    #[serde(default)]
    pub framework: Option<Framework>,
}

/// Another process's memory opened here through an IPC handle.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Import {
    /// `addr` is where it was mapped here; `size` is the exported allocation's, when known.
    pub mapping: Mapping,
    pub export: Option<ExportKey>,
    /// The exporting process instance, when its export was seen.
    pub exporter: Option<ProcessRef>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum ProcessState {
    Running,
    /// The process exited; `code` is its exit status or 128 + signal.
    Exited {
        code: i32,
        signal: Option<i32>,
        ts: u64,
    },
    /// The program was replaced by exec (or the pid forked anew); a new table follows.
    Replaced {
        ts: u64,
    },
}

/// One process instance's table.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ProcessMemory {
    pub pid: u32,
    pub ppid: Option<u32>,
    pub comm: Arc<str>,
    pub first_ts: u64,
    pub last_ts: u64,
    pub state: ProcessState,
    allocations: HashMap<(Space, u64), Allocation>,
    mappings: HashMap<u64, Mapping>,
    imports: HashMap<(Space, u64), Import>,
    reservations: HashMap<u64, u64>,
    /// Where device memory lies (start → size): driver allocations and VMM mappings, the
    /// segments a framework allocator carves its blocks from.
    segments: BTreeMap<u64, u64>,
    /// A framework allocator's live blocks (tensors).
    blocks: HashMap<u64, Allocation>,
    /// The allocator's own totals per device: as last reported, less the segments it returned
    /// to the driver since (emptying its cache reports nothing).
    allocator_totals: BTreeMap<i32, AllocatorTotals>,
    /// Segments a block was carved from: the allocator's, whose return to the driver shrinks
    /// its reserved total.
    allocator_segments: HashMap<u64, i32>,
    contexts: u32,
    driver_calls: u64,
    /// Bytes of live driver allocations (every kind) and of live allocator blocks, kept as they
    /// change: views that look after every event (the peak) cannot sum the tables each time.
    allocation_bytes: u64,
    block_bytes: u64,
    /// Bytes of live driver allocations of device memory (pinned host memory left out), per
    /// device (None: the call named none), kept as they change for the timelines of a report.
    device_memory: BTreeMap<Option<i32>, u64>,
    /// What the allocator already held when gpuprof first heard from it (attached to a running
    /// process): its first report's totals less what gpuprof saw happen.
    before_capture: Option<AllocatorTotals>,
}

/// A framework allocator's view of one device.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct AllocatorTotals {
    /// Bytes in live blocks (tensors).
    pub allocated: u64,
    /// Bytes in segments the allocator holds (its cache included).
    pub reserved: u64,
    pub ts: u64,
}

impl ProcessMemory {
    /// Live bytes of the allocator's blocks (`tensors`) or of driver allocations, every kind.
    pub fn live_bytes(&self, tensors: bool) -> u64 {
        if tensors {
            self.block_bytes
        } else {
            self.allocation_bytes
        }
    }

    /// Bytes of live driver allocations of device memory on `device` (None: allocations whose
    /// call named no device); pinned host memory is not counted.
    pub fn device_memory(&self, device: Option<i32>) -> u64 {
        self.device_memory.get(&device).copied().unwrap_or(0)
    }

    /// What the allocator held before gpuprof saw its first report: allocated (live tensors)
    /// and reserved (its segments) that no captured event made. None before any report, and
    /// zeros for a process captured from its start.
    #[cfg(test)]
    pub(crate) fn before_capture(&self) -> Option<AllocatorTotals> {
        self.before_capture
    }

    /// The segment (driver allocation or VMM mapping) containing `addr`, by its start.
    pub(crate) fn segment_of(&self, addr: u64) -> Option<u64> {
        let (&start, &size) = self.segments.range(..=addr).next_back()?;
        (addr < start.saturating_add(size)).then_some(start)
    }

    /// Where device memory lies now (start, size), by address: driver allocations and VMM
    /// mappings.
    pub fn segments(&self) -> Vec<(u64, u64)> {
        self.segments.iter().map(|(&start, &size)| (start, size)).collect()
    }

    /// The size of the segment that starts at `start`, and when it was allocated or mapped.
    pub(crate) fn segment_at(&self, start: u64) -> Option<(u64, u64)> {
        let size = *self.segments.get(&start)?;
        let ts = match self.allocations.get(&(Space::Pointer, start)) {
            Some(allocation) => allocation.ts,
            None => self.mappings.get(&start)?.ts,
        };
        Some((size, ts))
    }

    /// The driver allocation or VMM mapping that starts at `start`, for its API and stack.
    pub fn segment_origin(&self, start: u64) -> Option<(&str, &[Frame])> {
        if let Some(a) = self.allocations.get(&(Space::Pointer, start)) {
            return Some((&a.api, &a.stack));
        }
        self.mappings.get(&start).map(|m| (&*m.api, &m.stack[..]))
    }

    /// The live allocator block at `addr`.
    pub fn block(&self, addr: u64) -> Option<&Allocation> {
        self.blocks.get(&addr)
    }

    /// Live allocator blocks and live driver allocations, in no order: for views that sum or
    /// rank them anyway (sorting every one of them costs more than the view).
    pub fn blocks_unordered(&self) -> impl Iterator<Item = &Allocation> {
        self.blocks.values()
    }

    pub fn allocations_unordered(&self) -> impl Iterator<Item = &Allocation> {
        self.allocations.values()
    }

    /// Live allocator blocks, oldest first.
    pub fn blocks(&self) -> Vec<&Allocation> {
        let mut live: Vec<&Allocation> = self.blocks.values().collect();
        live.sort_by_key(|a| (a.ts, a.addr));
        live
    }

    /// The `n` stacks holding the most live bytes, largest first (ties: the shorter stack
    /// first): over the allocator's blocks when `tensors`, else over driver allocations.
    pub(crate) fn top_stacks(&self, n: usize, tensors: bool) -> Vec<StackTotal<'_>> {
        let live: Box<dyn Iterator<Item = &Allocation>> =
            if tensors { Box::new(self.blocks.values()) } else { Box::new(self.allocations.values()) };
        let mut by_stack: std::collections::HashMap<&[Frame], KindTotal> = std::collections::HashMap::new();
        for allocation in live {
            let total = by_stack.entry(&allocation.stack).or_default();
            total.bytes += allocation.size;
            total.count += 1;
        }
        let mut top: Vec<StackTotal<'_>> =
            by_stack.into_iter().map(|(stack, total)| StackTotal { stack, total }).collect();
        top.sort_by(|a, b| {
            b.total
                .bytes
                .cmp(&a.total.bytes)
                .then_with(|| a.stack.len().cmp(&b.stack.len()))
                .then_with(|| a.stack.cmp(b.stack))
        });
        top.truncate(n);
        top
    }

    /// The framework whose caching allocator runs this process's device memory: PyTorch's when
    /// its allocator reported totals (the tensors' level), else the framework of a live segment
    /// its allocator took from the driver (the driver's level); None for a program that manages
    /// device memory itself.
    pub(crate) fn framework(&self) -> Option<Framework> {
        if !self.allocator_totals.is_empty() {
            return Some(Framework::Pytorch);
        }
        self.allocations
            .values()
            .filter_map(|a| a.framework)
            .chain(self.mappings.values().filter_map(|m| m.framework))
            .min()
    }

    /// True when a framework allocator reported blocks (a PyTorch process).
    pub fn has_blocks(&self) -> bool {
        !self.blocks.is_empty()
    }

    /// The allocator's last reported totals, per device.
    pub fn allocator_totals(&self) -> &BTreeMap<i32, AllocatorTotals> {
        &self.allocator_totals
    }

    pub fn as_ref(&self) -> ProcessRef {
        ProcessRef { pid: self.pid, since: self.first_ts }
    }

    /// Driver calls made by this process instance, failed ones included.
    pub fn driver_calls(&self) -> u64 {
        self.driver_calls
    }

    /// Whether this instance touched CUDA: a driver call, or a report of PyTorch's allocator
    /// (shells, launchers and helpers of a job do neither).
    pub fn uses_cuda(&self) -> bool {
        self.driver_calls > 0 || !self.allocator_totals.is_empty()
    }

    /// The live allocation at this address, if any.
    pub(crate) fn allocation(&self, space: Space, addr: u64) -> Option<&Allocation> {
        self.allocations.get(&(space, addr))
    }

    /// What a successful `free`/`ipc_close`-like event releases here: an allocation, if any.
    pub fn released_by(&self, event: &Event) -> Option<&Allocation> {
        if event.op != Op::Free || !event.succeeded() {
            return None;
        }
        self.allocation(Space::of(event.kind.unwrap_or(Kind::Device)), event.addr?)
    }

    /// Live allocations, oldest first.
    pub fn allocations(&self) -> Vec<&Allocation> {
        let mut live: Vec<&Allocation> = self.allocations.values().collect();
        live.sort_by_key(|a| (a.ts, a.addr));
        live
    }

    /// Open IPC imports, oldest first.
    pub fn imports(&self) -> Vec<&Import> {
        let mut open: Vec<&Import> = self.imports.values().collect();
        open.sort_by_key(|i| (i.mapping.ts, i.mapping.addr));
        open
    }

    /// Live mappings (VMM, registered host memory), oldest first.
    pub fn mappings(&self) -> Vec<&Mapping> {
        let mut live: Vec<&Mapping> = self.mappings.values().collect();
        live.sort_by_key(|m| (m.ts, m.addr));
        live
    }

    /// Bytes of live device memory (pinned host memory left out).
    pub fn device_bytes(&self) -> u64 {
        self.allocations.values().filter(|a| a.is_device_memory()).map(|a| a.size).sum()
    }

    pub fn contexts(&self) -> u32 {
        self.contexts
    }

    pub fn summary(&self) -> LiveSummary {
        let mut by_kind: BTreeMap<Kind, KindTotal> = BTreeMap::new();
        for allocation in self.allocations.values() {
            let total = by_kind.entry(allocation.kind).or_default();
            total.bytes += allocation.size;
            total.count += 1;
        }
        let mut frames: BTreeMap<(Option<&Frame>, Kind), KindTotal> = BTreeMap::new();
        for allocation in self.allocations.values() {
            let line = crate::user_frame(&allocation.stack).or(allocation.stack.first());
            let total = frames.entry((line, allocation.kind)).or_default();
            total.bytes += allocation.size;
            total.count += 1;
        }
        let mut by_frame: Vec<FrameTotal> = frames
            .into_iter()
            .map(|((frame, kind), total)| FrameTotal { frame: frame.cloned(), kind, total })
            .collect();
        by_frame.sort_by(|a, b| b.total.bytes.cmp(&a.total.bytes).then_with(|| a.frame.cmp(&b.frame)));
        let blocks = KindTotal { bytes: self.blocks.values().map(|b| b.size).sum(), count: self.blocks.len() as u64 };
        let allocator = (!self.allocator_totals.is_empty()).then(|| AllocatorTotals {
            allocated: self.allocator_totals.values().map(|t| t.allocated).sum(),
            reserved: self.allocator_totals.values().map(|t| t.reserved).sum(),
            ts: self.allocator_totals.values().map(|t| t.ts).max().unwrap_or(0),
        });
        let devices: std::collections::BTreeSet<i32> = self
            .allocations
            .values()
            .chain(self.blocks.values())
            .filter_map(|a| a.device)
            .chain(self.allocator_totals.keys().copied())
            .collect();
        let mut by_device: BTreeMap<i32, KindTotal> = BTreeMap::new();
        for allocation in self.allocations.values().filter(|a| a.is_device_memory()) {
            if let Some(device) = allocation.device {
                let total = by_device.entry(device).or_default();
                total.bytes += allocation.size;
                total.count += 1;
            }
        }
        LiveSummary {
            devices: devices.into_iter().collect(),
            by_device,
            by_frame,
            blocks,
            allocator,
            before_capture: self.before_capture.filter(|b| b.allocated > 0 || b.reserved > 0),
            pid: self.pid,
            ppid: self.ppid,
            comm: self.comm.to_string(),
            state: self.state,
            by_kind,
            mapped_bytes: self.mappings.values().map(|m| m.size).sum(),
            imports: self.imports.len() as u64,
            contexts: self.contexts,
            driver_calls: self.driver_calls,
        }
    }
}

/// What an event means beyond the table of the process it belongs to: the tracker keeps the
/// exports between processes and which instance a pid is now.
pub(super) enum Outcome {
    /// Nothing outside this table changed.
    Kept,
    /// An allocation went back to the driver: exports of it no longer lead anywhere.
    Released { exporter: ProcessRef, space: Space, addr: u64 },
    /// Memory was made available to other processes (the event names the key).
    Exported(Export),
    /// This instance is over (its state says how): its table closes, its exports go with it,
    /// and `next` (after fork or exec) holds the pid from now on.
    Ended { instance: ProcessRef, next: Option<Box<ProcessMemory>> },
}

impl ProcessMemory {
    pub(super) fn new(event: &Event) -> Self {
        ProcessMemory {
            pid: event.pid,
            ppid: event.ppid,
            comm: event.comm.clone(),
            first_ts: event.ts,
            last_ts: event.ts,
            state: ProcessState::Running,
            allocations: HashMap::new(),
            mappings: HashMap::new(),
            imports: HashMap::new(),
            reservations: HashMap::new(),
            segments: BTreeMap::new(),
            blocks: HashMap::new(),
            allocator_totals: BTreeMap::new(),
            allocator_segments: HashMap::new(),
            contexts: 0,
            driver_calls: 0,
            allocation_bytes: 0,
            block_bytes: 0,
            device_memory: BTreeMap::new(),
            before_capture: None,
        }
    }

    /// Folds in one event of this instance; events must come in capture order. Failed calls
    /// are counted and change nothing else.
    pub(super) fn apply(&mut self, event: &Event, import: Option<(ExportKey, Option<Export>)>) -> Outcome {
        match (event.layer, event.op) {
            (Layer::Process, Op::Fork | Op::Exec) => {
                // A forked child inherits no CUDA state, and exec discards it: a fresh table.
                // Exec keeps the parent: a spawned worker is still its launcher's child.
                self.state = ProcessState::Replaced { ts: event.ts };
                let mut next = ProcessMemory::new(event);
                if event.op == Op::Exec {
                    next.ppid = next.ppid.or(self.ppid);
                }
                Outcome::Ended { instance: self.as_ref(), next: Some(Box::new(next)) }
            }
            (Layer::Process, Op::Exit) => {
                self.touch(event);
                self.state =
                    ProcessState::Exited { code: event.exit_code.unwrap_or(0), signal: event.signal, ts: event.ts };
                Outcome::Ended { instance: self.as_ref(), next: None }
            }
            (Layer::Allocator, _) => {
                self.touch(event);
                self.apply_allocator(event);
                Outcome::Kept
            }
            _ => {
                self.touch(event);
                self.driver_calls += 1;
                if !event.succeeded() {
                    return Outcome::Kept;
                }
                self.apply_driver(event, import)
            }
        }
    }

    /// When this instance ended, if it has.
    pub(super) fn ended_at(&self) -> Option<u64> {
        match self.state {
            ProcessState::Exited { ts, .. } | ProcessState::Replaced { ts } => Some(ts),
            ProcessState::Running => None,
        }
    }

    fn touch(&mut self, event: &Event) {
        self.last_ts = event.ts;
        // A process is named by its main thread (its other threads have names of their own:
        // PyTorch's `pt_autograd_0`), or by the first name heard of until it speaks.
        let main_thread = event.tid == event.pid || event.tid == 0;
        if !event.comm.is_empty() && self.comm != event.comm && (main_thread || self.comm.is_empty()) {
            self.comm = event.comm.clone();
        }
        if self.ppid.is_none() {
            self.ppid = event.ppid;
        }
    }

    fn apply_allocator(&mut self, event: &Event) {
        // A request the allocator gave up on (out of memory) moves no block, only its totals.
        let block = event.addr.filter(|_| event.succeeded());
        match (event.op, block) {
            (_, None) => {}
            (Op::Alloc, Some(addr)) => {
                if let Some(segment) = self.segment_of(addr) {
                    self.allocator_segments.insert(segment, event.device.unwrap_or(0));
                }
                let stack = event.attributed_stack();
                self.block_bytes += event.size;
                if let Some(replaced) = self.blocks.insert(addr, allocation_of(event, addr, Kind::Device, stack)) {
                    self.block_bytes -= replaced.size;
                }
            }
            (Op::Free, Some(addr)) => {
                if let Some(freed) = self.blocks.remove(&addr) {
                    self.block_bytes -= freed.size;
                }
            }
            _ => {}
        }
        if let (Some(allocated), Some(reserved)) = (event.allocated, event.reserved) {
            if self.before_capture.is_none() {
                // The report's totals already count this event's block; segments gpuprof saw
                // allocated are not from before.
                let allocated_before = match (event.op, block) {
                    (Op::Alloc, Some(_)) => allocated.saturating_sub(event.size),
                    (Op::Free, Some(_)) => allocated + event.size,
                    _ => allocated,
                };
                let seen_segments: u64 =
                    self.allocations.values().filter(|a| a.is_device_memory()).map(|a| a.size).sum();
                self.before_capture = Some(AllocatorTotals {
                    allocated: allocated_before,
                    reserved: reserved.saturating_sub(seen_segments),
                    ts: event.ts,
                });
            }
            let device = event.device.unwrap_or(0);
            self.allocator_totals.insert(device, AllocatorTotals { allocated, reserved, ts: event.ts });
        }
    }

    fn apply_driver(&mut self, event: &Event, import: Option<(ExportKey, Option<Export>)>) -> Outcome {
        let Some(addr) = event.addr else { return Outcome::Kept };
        let kind = event.kind.unwrap_or(Kind::Device);
        let space = Space::of(kind);
        match event.op {
            Op::Alloc => {
                if space == Space::Pointer && kind != Kind::HostPinned {
                    self.segments.insert(addr, event.size);
                }
                let stack = event.attributed_stack();
                let allocation = allocation_of(event, addr, kind, stack);
                self.count_device_memory(&allocation, true);
                self.allocation_bytes += event.size;
                if let Some(replaced) = self.allocations.insert((space, addr), allocation) {
                    self.allocation_bytes -= replaced.size;
                    self.count_device_memory(&replaced, false);
                }
            }
            Op::Free => {
                if let Some(freed) = self.allocations.remove(&(space, addr)) {
                    self.allocation_bytes -= freed.size;
                    self.count_device_memory(&freed, false);
                    if space == Space::Pointer {
                        self.segments.remove(&addr);
                    }
                    self.segment_returned(addr, freed.size, event.ts);
                    return Outcome::Released { exporter: self.as_ref(), space, addr };
                }
                // Imported pool pointers are released with cuMemFree(Async), imported VMM
                // handles with cuMemRelease.
                self.imports.remove(&(space, addr));
            }
            Op::Reserve => {
                self.reservations.insert(addr, event.size);
            }
            Op::Unreserve => {
                self.reservations.remove(&addr);
            }
            Op::Map => {
                if kind == Kind::Vmm {
                    self.segments.insert(addr, event.size);
                }
                let stack = event.attributed_stack();
                self.mappings.insert(addr, mapping_of(event, addr, kind, event.size, stack));
            }
            Op::Unmap => {
                if let Some(unmapped) = self.mappings.remove(&addr).filter(|m| m.kind == Kind::Vmm) {
                    self.segments.remove(&addr);
                    self.segment_returned(addr, unmapped.size, event.ts);
                }
            }
            Op::IpcOpen => {
                let (export, exporter, size) = match import {
                    Some((key, Some(export))) => (Some(key), Some(export.exporter), export.size),
                    Some((key, None)) => (Some(key), None, event.size),
                    None => (None, None, event.size),
                };
                let mapping = mapping_of(event, addr, kind, size, event.attributed_stack());
                self.imports.insert((space, addr), Import { mapping, export, exporter });
            }
            Op::IpcClose => {
                self.imports.remove(&(space, addr));
            }
            Op::CtxCreate => self.contexts += 1,
            Op::CtxDestroy => self.contexts = self.contexts.saturating_sub(1),
            Op::IpcExport => {
                // An export of memory the capture never saw allocated still ties its importers
                // to this process; its size is just unknown.
                let size = self.allocation(space, addr).map(|a| a.size).unwrap_or(0);
                return Outcome::Exported(Export { exporter: self.as_ref(), space, addr, size, ts: event.ts });
            }
            Op::MemInfo | Op::Fork | Op::Exec | Op::Exit => {}
        }
        Outcome::Kept
    }

    fn count_device_memory(&mut self, allocation: &Allocation, live: bool) {
        if !allocation.is_device_memory() {
            return;
        }
        let bytes = self.device_memory.entry(allocation.device).or_default();
        if live {
            *bytes += allocation.size;
        } else {
            *bytes -= allocation.size;
            if *bytes == 0 {
                self.device_memory.remove(&allocation.device);
            }
        }
    }

    /// A segment went back to the driver: if it was the allocator's, it is no longer reserved.
    fn segment_returned(&mut self, start: u64, size: u64, ts: u64) {
        if let Some(device) = self.allocator_segments.remove(&start) {
            if let Some(totals) = self.allocator_totals.get_mut(&device) {
                totals.reserved = totals.reserved.saturating_sub(size);
                totals.ts = ts;
            }
        }
    }
}

/// The entry point's name without a copy of its text, for names gpuprof knows (events read back
/// from a file or OTLP own theirs).
#[allow(clippy::ptr_arg)] // the Cow is the point: a borrowed name is kept borrowed
fn api_name(api: &Cow<'static, str>) -> Cow<'static, str> {
    if let Cow::Owned(name) = api {
        if name == crate::event::PYTORCH_ALLOCATOR_API {
            return Cow::Borrowed(crate::event::PYTORCH_ALLOCATOR_API);
        }
        if name == crate::event::PYTORCH_OOM_API {
            return Cow::Borrowed(crate::event::PYTORCH_OOM_API);
        }
        if let Some((_, known)) = crate::driver_api::by_name(name) {
            return Cow::Borrowed(known.name);
        }
    }
    api.clone()
}

fn allocation_of(event: &Event, addr: u64, kind: Kind, stack: Stack) -> Allocation {
    Allocation {
        addr,
        size: event.size,
        kind,
        api: api_name(&event.api),
        ts: event.ts,
        tid: event.tid,
        stack,
        device: event.device,
        framework: event.allocator_segment,
    }
}

fn mapping_of(event: &Event, addr: u64, kind: Kind, size: u64, stack: Stack) -> Mapping {
    Mapping { addr, size, kind, api: api_name(&event.api), ts: event.ts, stack, framework: event.allocator_segment }
}

/// Bytes and count of live allocations of one kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KindTotal {
    pub bytes: u64,
    pub count: u64,
}

/// Live allocations of one kind whose user line (`crate::user_frame`, else the innermost Python
/// frame) is `frame` (None: no Python stack).
#[derive(Debug, Clone, PartialEq)]
pub struct FrameTotal {
    pub frame: Option<Frame>,
    pub kind: Kind,
    pub total: KindTotal,
}

/// Live bytes held by one stack.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StackTotal<'a> {
    pub stack: &'a [Frame],
    pub total: KindTotal,
}

/// What one process holds, for tables and summaries.
#[derive(Debug, Clone, PartialEq)]
pub struct LiveSummary {
    /// Live bytes by the user's line (else the innermost Python frame) and kind, largest first.
    pub by_frame: Vec<FrameTotal>,
    /// A framework allocator's live blocks as gpuprof saw them.
    pub blocks: KindTotal,
    /// The allocator's own totals (all devices), when it reported any: allocated vs reserved,
    /// whose gap is its cache.
    pub allocator: Option<AllocatorTotals>,
    /// What the allocator held before gpuprof first heard from it, when anything (attach, top).
    pub before_capture: Option<AllocatorTotals>,
    /// The CUDA devices its live memory is on (one per rank in a data-parallel job), ascending.
    pub devices: Vec<i32>,
    /// Live driver allocations of device memory (pinned host left out) per device, where the call's
    /// device is known.
    pub by_device: BTreeMap<i32, KindTotal>,
    pub pid: u32,
    pub ppid: Option<u32>,
    pub comm: String,
    pub state: ProcessState,
    pub by_kind: BTreeMap<Kind, KindTotal>,
    pub mapped_bytes: u64,
    pub imports: u64,
    pub contexts: u32,
    pub driver_calls: u64,
}
