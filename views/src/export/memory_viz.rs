//! A snapshot in the format of `torch.cuda.memory._snapshot()`, which PyTorch's memory_viz
//! (`python -m torch.cuda._memory_viz trace_plot`, pytorch.org/memory_viz) opens:
//! `segments` (each with its blocks tiling it, live ones `active_allocated`, the rest `inactive`)
//! and `device_traces` (the alloc/free and segment events that led there, with Python frames).
//!
//! Made in two streaming passes over the file — which process, and what it held at the moment;
//! then its trace entries — keeping at most `--max-entries` of them (the most recent, as
//! PyTorch's own `max_entries` does), each pointing at its shared stack: memory stays bounded
//! however long the recording, and the pickle is written as it is serialized.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::io::Write;

use anyhow::{bail, Context, Result};
use gpuprof_model::event::{Event, Frame, Kind, Layer, Op, CUDA_ERROR_OUT_OF_MEMORY};
use gpuprof_model::track::{ProcessMemory, Tracker};
use gpuprof_model::Stack;
use serde::ser::{SerializeMap, SerializeSeq};
use serde::{Serialize, Serializer};

use super::replay::{replay_to, resolve};
use super::request::{ExportRequest, Moment, StackLayer};
use crate::output;

pub(crate) fn export(request: &ExportRequest<'_>) -> Result<u8> {
    // Pass 1: the moment's state, and what choosing the process and its segments needs.
    let mut allocator_events: HashMap<u32, u64> = HashMap::new();
    let mut allocator_segments: HashMap<u32, HashSet<u64>> = HashMap::new();
    let mut first_ts = None;
    let mut devices = 1usize;
    let moment = resolve(request.input, request.moment, StackLayer::Allocator)?.moment;
    let analyzer = replay_to(request.input, moment, |event| {
        first_ts.get_or_insert(event.ts);
        devices = devices.max(event.device.unwrap_or(0).max(0) as usize + 1);
        if event.layer == Layer::Allocator {
            *allocator_events.entry(event.pid).or_default() += 1;
            if let Some(segment) = event.segment {
                allocator_segments.entry(event.pid).or_default().insert(segment);
            }
        }
    })?;
    let at_end = request.moment == Moment::End;
    let process = choose_process(analyzer.tracker(), &allocator_events, request.pid, at_end)?;
    // PyTorch's snapshot shows the allocator's segments, not every driver allocation (cuBLAS's
    // workspace, say): where the process reported blocks, a segment is one that held a block.
    let ours = allocator_segments.remove(&process.pid).unwrap_or_default();

    // Pass 2: the process's trace entries within the window, the most recent kept.
    let first_ts = first_ts.unwrap_or(0);
    let window = request.window;
    let since = |secs: Option<f64>, default: u64| secs.map_or(default, |s| first_ts.saturating_add((s * 1e9) as u64));
    let (from, to) = (since(window.from, 0), since(window.to, u64::MAX));
    let mut traces = Traces { devices: vec![VecDeque::new(); devices], max_entries: window.max_entries, dropped: 0 };
    let mut segment_sizes: HashMap<u64, u64> = HashMap::new();
    let (pid, instance_start) = (process.pid, process.first_ts);
    replay_to(request.input, moment, |event| {
        if event.pid != pid || event.ts < instance_start {
            return;
        }
        let device = (event.device.unwrap_or(0).max(0) as usize).min(devices - 1);
        let in_window = event.ts >= from && event.ts <= to;
        for (action, size) in actions(event, &ours, &mut segment_sizes) {
            if in_window {
                traces.push(device, TraceEntry::of(event, action, size));
            }
        }
    })?;
    if traces.dropped > 0 {
        eprintln!(
            "gpuprof: memory_viz: kept the last {} trace entries of pid {pid}, left out {} older ones (--max-entries, --from, --to choose)",
            window.max_entries, traces.dropped
        );
    }

    let segments: Vec<SegmentView<'_>> = process
        .segments()
        .into_iter()
        .filter(|(start, _)| ours.is_empty() || ours.contains(start))
        .map(|(start, size)| SegmentView::of(process, start, size))
        .collect();
    let snapshot = Snapshot {
        segments,
        device_traces: &traces,
        allocator_settings: BTreeMap::new(),
        external_annotations: Vec::new(),
    };
    let mut writer = output::open_writer(request.output.as_deref())?;
    serde_pickle::to_writer(&mut writer, &snapshot, serde_pickle::SerOptions::new())
        .context("cannot write the memory_viz snapshot")?;
    writer.flush().context("cannot write the memory_viz snapshot")?;
    Ok(0)
}

/// The trace entries an event makes, with their sizes (a free's is its segment's).
fn actions(event: &Event, ours: &HashSet<u64>, segment_sizes: &mut HashMap<u64, u64>) -> Vec<(&'static str, u64)> {
    let is_ours = |start: u64| ours.is_empty() || ours.contains(&start);
    match (event.layer, event.op) {
        (Layer::Driver, Op::Alloc | Op::Map) if event.succeeded() && is_segment(event) => {
            let start = event.addr.unwrap_or(0);
            if !is_ours(start) {
                return Vec::new();
            }
            segment_sizes.insert(start, event.size);
            vec![(if event.op == Op::Map { "segment_map" } else { "segment_alloc" }, event.size)]
        }
        // A free carries no size: the segment's is the one it was allocated with.
        (Layer::Driver, Op::Free | Op::Unmap) if event.succeeded() => {
            match event.addr.and_then(|a| segment_sizes.remove(&a)) {
                Some(size) => vec![(if event.op == Op::Unmap { "segment_unmap" } else { "segment_free" }, size)],
                None => Vec::new(),
            }
        }
        (Layer::Driver, Op::Alloc) if event.result == CUDA_ERROR_OUT_OF_MEMORY => vec![("oom", event.size)],
        (Layer::Allocator, Op::Alloc) if event.succeeded() => vec![("alloc", event.size)],
        // PyTorch records a free as requested, then completed once the stream is done.
        (Layer::Allocator, Op::Free) => vec![("free_requested", event.size), ("free_completed", event.size)],
        _ => Vec::new(),
    }
}

/// The process asked for, else the one with the most allocator events, else the most driver calls.
fn choose_process<'t>(
    tracker: &'t Tracker,
    allocator_events: &HashMap<u32, u64>,
    pid: Option<u32>,
    at_end: bool,
) -> Result<&'t ProcessMemory> {
    let candidates: Vec<&ProcessMemory> = if at_end { tracker.processes() } else { tracker.live_processes() };
    if let Some(pid) = pid {
        return match candidates.into_iter().rev().find(|p| p.pid == pid) {
            Some(process) => Ok(process),
            None => bail!("pid {pid} made no CUDA call in the recording (at that moment): nothing to export"),
        };
    }
    let weight = |p: &&ProcessMemory| (allocator_events.get(&p.pid).copied().unwrap_or(0), p.driver_calls());
    match candidates.into_iter().filter(|p| p.driver_calls() > 0 || !p.allocator_totals().is_empty()).max_by_key(weight)
    {
        Some(process) => Ok(process),
        None => bail!("the recording has no CUDA memory events: nothing to export"),
    }
}

/// Device memory that a caching allocator could carve blocks from: driver allocations, and VMM
/// mappings (expandable segments).
fn is_segment(event: &Event) -> bool {
    match event.op {
        Op::Map => event.kind == Some(Kind::Vmm),
        _ => matches!(event.kind, Some(Kind::Device | Kind::Managed | Kind::Pool)),
    }
}

#[derive(Serialize)]
struct Snapshot<'a> {
    segments: Vec<SegmentView<'a>>,
    device_traces: &'a Traces,
    allocator_settings: BTreeMap<String, u8>,
    external_annotations: Vec<u8>,
}

#[derive(Clone)]
struct TraceEntry {
    action: &'static str,
    addr: u64,
    size: u64,
    time_us: u64,
    stack: Stack,
}

impl TraceEntry {
    fn of(event: &Event, action: &'static str, size: u64) -> Self {
        TraceEntry {
            action,
            addr: event.addr.unwrap_or(0),
            size,
            time_us: event.ts / 1000,
            stack: event.attributed_stack(),
        }
    }
}

/// Per device, the most recent `max_entries` entries in all.
struct Traces {
    devices: Vec<VecDeque<TraceEntry>>,
    max_entries: usize,
    dropped: u64,
}

impl Traces {
    fn push(&mut self, device: usize, entry: TraceEntry) {
        if self.max_entries == 0 {
            self.dropped += 1;
            return;
        }
        let held: usize = self.devices.iter().map(VecDeque::len).sum();
        if held >= self.max_entries {
            // The oldest entry of any device goes (devices are few: a scan of their fronts).
            let oldest = (0..self.devices.len())
                .filter(|&d| !self.devices[d].is_empty())
                .min_by_key(|&d| self.devices[d][0].time_us)
                .unwrap_or(device);
            self.devices[oldest].pop_front();
            self.dropped += 1;
        }
        self.devices[device].push_back(entry);
    }
}

impl Serialize for Traces {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut devices = serializer.serialize_seq(Some(self.devices.len()))?;
        for entries in &self.devices {
            devices.serialize_element(&EntriesView(entries))?;
        }
        devices.end()
    }
}

struct EntriesView<'a>(&'a VecDeque<TraceEntry>);

impl Serialize for EntriesView<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut entries = serializer.serialize_seq(Some(self.0.len()))?;
        for entry in self.0 {
            entries.serialize_element(entry)?;
        }
        entries.end()
    }
}

impl Serialize for TraceEntry {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let oom = self.action == "oom";
        let mut map = serializer.serialize_map(Some(if oom { 7 } else { 6 }))?;
        map.serialize_entry("action", self.action)?;
        map.serialize_entry("addr", &self.addr)?;
        map.serialize_entry("size", &self.size)?;
        map.serialize_entry("stream", &0)?;
        map.serialize_entry("time_us", &self.time_us)?;
        map.serialize_entry("frames", &FramesView(&self.stack))?;
        if oom {
            map.serialize_entry("device_free", &0)?;
        }
        map.end()
    }
}

/// Frames as memory_viz names them: filename, line, name.
struct FramesView<'a>(&'a [Frame]);

impl Serialize for FramesView<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut frames = serializer.serialize_seq(Some(self.0.len()))?;
        for frame in self.0 {
            frames.serialize_element(&FrameView(frame))?;
        }
        frames.end()
    }
}

struct FrameView<'a>(&'a Frame);

impl Serialize for FrameView<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(3))?;
        map.serialize_entry("filename", &self.0.file)?;
        map.serialize_entry("line", &self.0.line)?;
        map.serialize_entry("name", &self.0.function)?;
        map.end()
    }
}

/// One segment with blocks tiling it: live blocks in address order, gaps between them inactive.
#[derive(Serialize)]
struct SegmentView<'a> {
    device: u32,
    address: u64,
    total_size: u64,
    allocated_size: u64,
    active_size: u64,
    requested_size: u64,
    stream: u32,
    segment_type: &'static str,
    segment_pool_id: (u32, u32),
    is_expandable: bool,
    frames: FramesView<'a>,
    blocks: Vec<BlockView<'a>>,
}

#[derive(Serialize)]
struct BlockView<'a> {
    address: u64,
    size: u64,
    requested_size: u64,
    state: &'static str,
    frames: FramesView<'a>,
}

impl<'a> SegmentView<'a> {
    fn of(process: &'a ProcessMemory, start: u64, size: u64) -> Self {
        let end = start + size;
        let mut live: Vec<_> = process.blocks().into_iter().filter(|b| b.addr >= start && b.addr < end).collect();
        live.sort_by_key(|b| b.addr);
        let inactive = |address: u64, size: u64| BlockView {
            address,
            size,
            requested_size: 0,
            state: "inactive",
            frames: FramesView(&[]),
        };
        let mut blocks = Vec::new();
        let mut at = start;
        let mut allocated = 0;
        for block in live {
            if block.addr > at {
                blocks.push(inactive(at, block.addr - at));
            }
            let block_size = block.size.min(end - block.addr);
            blocks.push(BlockView {
                address: block.addr,
                size: block_size,
                requested_size: block_size,
                state: "active_allocated",
                frames: FramesView(&block.stack),
            });
            allocated += block_size;
            at = block.addr + block_size;
        }
        if at < end {
            blocks.push(inactive(at, end - at));
        }
        let origin = process.segment_origin(start);
        SegmentView {
            device: 0,
            address: start,
            total_size: size,
            allocated_size: allocated,
            active_size: allocated,
            requested_size: allocated,
            stream: 0,
            segment_type: if size >= 1 << 20 { "large" } else { "small" },
            segment_pool_id: (0, 0),
            is_expandable: origin.is_some_and(|(api, _)| api == "cuMemMap"),
            frames: FramesView(origin.map(|(_, stack)| stack).unwrap_or(&[])),
            blocks,
        }
    }
}
