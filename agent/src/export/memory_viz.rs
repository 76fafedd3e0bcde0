//! A snapshot in the format of `torch.cuda.memory._snapshot()`, which PyTorch's memory_viz
//! (`python -m torch.cuda._memory_viz trace_plot`, pytorch.org/memory_viz) opens:
//! `segments` (each with its blocks tiling it, live ones `active_allocated`, the rest `inactive`)
//! and `device_traces` (the alloc/free and segment events that led there, with Python frames).

use std::collections::{HashMap, HashSet};

use anyhow::{bail, Result};
use gpuprof_model::event::{Event, Frame, Kind, Layer, Op, CUDA_ERROR_OUT_OF_MEMORY};
use gpuprof_model::track::{ProcessMemory, Tracker};
use serde_json::{json, Value};

pub fn snapshot(events: &[Event], tracker: &Tracker, pid: Option<u32>, at_end: bool) -> Result<Value> {
    let process = choose_process(events, tracker, pid, at_end)?;
    let own: Vec<&Event> = events.iter().filter(|e| e.pid == process.pid && e.ts >= process.first_ts).collect();
    // PyTorch's snapshot shows the allocator's segments, not every driver allocation (cuBLAS's
    // workspace, say): where the process reported blocks, a segment is one that held a block.
    let allocator_segments: HashSet<u64> = own.iter().filter(|e| e.layer == Layer::Allocator).filter_map(|e| e.segment).collect();
    let is_ours = |start: u64| allocator_segments.is_empty() || allocator_segments.contains(&start);
    let device_count = events.iter().filter_map(|e| e.device).max().unwrap_or(0).max(0) as usize + 1;
    let mut traces: Vec<Vec<Value>> = vec![Vec::new(); device_count];
    let mut segment_sizes: HashMap<u64, u64> = HashMap::new();
    for event in own {
        let device = (event.device.unwrap_or(0).max(0) as usize).min(device_count - 1);
        let entry = match (event.layer, event.op) {
            (Layer::Driver, Op::Alloc | Op::Map) if event.succeeded() && is_segment(event) => {
                let start = event.addr.unwrap_or(0);
                if !is_ours(start) {
                    continue;
                }
                segment_sizes.insert(start, event.size);
                trace_entry(event, if event.op == Op::Map { "segment_map" } else { "segment_alloc" }, event.size)
            }
            // A free carries no size: the segment's is the one it was allocated with.
            (Layer::Driver, Op::Free | Op::Unmap) if event.succeeded() => {
                let Some(size) = event.addr.and_then(|a| segment_sizes.remove(&a)) else { continue };
                trace_entry(event, if event.op == Op::Unmap { "segment_unmap" } else { "segment_free" }, size)
            }
            (Layer::Driver, Op::Alloc) if event.result == CUDA_ERROR_OUT_OF_MEMORY => {
                let mut oom = trace_entry(event, "oom", event.size);
                oom["device_free"] = json!(0);
                oom
            }
            (Layer::Allocator, Op::Alloc) => trace_entry(event, "alloc", event.size),
            (Layer::Allocator, Op::Free) => {
                // PyTorch records a free as requested, then completed once the stream is done.
                traces[device].push(trace_entry(event, "free_requested", event.size));
                trace_entry(event, "free_completed", event.size)
            }
            _ => continue,
        };
        traces[device].push(entry);
    }
    let segments: Vec<Value> = process
        .segments()
        .into_iter()
        .filter(|(start, _)| is_ours(*start))
        .map(|(start, size)| segment(process, start, size))
        .collect();
    Ok(json!({
        "segments": segments,
        "device_traces": traces,
        "allocator_settings": {},
        "external_annotations": [],
    }))
}

/// The process asked for, else the one with the most allocator events, else the most driver calls.
fn choose_process<'t>(events: &[Event], tracker: &'t Tracker, pid: Option<u32>, at_end: bool) -> Result<&'t ProcessMemory> {
    let candidates: Vec<&ProcessMemory> = if at_end { tracker.processes() } else { tracker.live_processes() };
    if let Some(pid) = pid {
        return match candidates.into_iter().rev().find(|p| p.pid == pid) {
            Some(process) => Ok(process),
            None => bail!("pid {pid} made no CUDA call in the recording (at that moment): nothing to export"),
        };
    }
    let weight = |p: &&ProcessMemory| {
        let blocks = events.iter().filter(|e| e.pid == p.pid && e.layer == Layer::Allocator).count();
        (blocks, p.driver_calls())
    };
    match candidates.into_iter().filter(|p| p.driver_calls() > 0 || !p.allocator_totals().is_empty()).max_by_key(weight) {
        Some(process) => Ok(process),
        None => bail!("the recording has no CUDA memory events: nothing to export"),
    }
}

fn frames(stack: &[Frame]) -> Vec<Value> {
    stack.iter().map(|f| json!({"filename": f.file, "line": f.line, "name": f.function})).collect()
}

fn trace_entry(event: &Event, action: &str, size: u64) -> Value {
    json!({
        "action": action,
        "addr": event.addr.unwrap_or(0),
        "size": size,
        "stream": 0,
        "time_us": event.ts / 1000,
        "frames": frames(&event.stack),
    })
}

/// Device memory that a caching allocator could carve blocks from: driver allocations, and VMM
/// mappings (expandable segments).
fn is_segment(event: &Event) -> bool {
    match event.op {
        Op::Map => event.kind == Some(Kind::Vmm),
        _ => matches!(event.kind, Some(Kind::Device | Kind::Managed | Kind::Pool)),
    }
}

/// One segment with blocks tiling it: live blocks in address order, gaps between them inactive.
fn segment(process: &ProcessMemory, start: u64, size: u64) -> Value {
    let end = start + size;
    let mut live: Vec<_> = process.blocks().into_iter().filter(|b| b.addr >= start && b.addr < end).collect();
    live.sort_by_key(|b| b.addr);
    let mut blocks = Vec::new();
    let mut at = start;
    let mut allocated = 0;
    for block in live {
        if block.addr > at {
            blocks.push(json!({"address": at, "size": block.addr - at, "requested_size": 0, "state": "inactive", "frames": []}));
        }
        let block_size = block.size.min(end - block.addr);
        blocks.push(json!({
            "address": block.addr,
            "size": block_size,
            "requested_size": block_size,
            "state": "active_allocated",
            "frames": frames(&block.stack),
        }));
        allocated += block_size;
        at = block.addr + block_size;
    }
    if at < end {
        blocks.push(json!({"address": at, "size": end - at, "requested_size": 0, "state": "inactive", "frames": []}));
    }
    let origin = process.segment_origin(start);
    json!({
        "device": 0,
        "address": start,
        "total_size": size,
        "allocated_size": allocated,
        "active_size": allocated,
        "requested_size": allocated,
        "stream": 0,
        "segment_type": if size >= 1 << 20 { "large" } else { "small" },
        "segment_pool_id": [0, 0],
        "is_expandable": origin.is_some_and(|(api, _)| api == "cuMemMap"),
        "frames": frames(origin.map(|(_, stack)| stack).unwrap_or(&[])),
        "blocks": blocks,
    })
}
