//! From a recording's events to what the caching allocator was asked, per process and device:
//! the requests in order, what the allocator reported after each, and what the driver calls
//! around them say that the allocator's own reports do not — `empty_cache`, a failed request,
//! and how much device memory the allocator could have had.
//!
//! What the recording holds: every block the allocator handed out and took back
//! (`c10::reportMemoryUsageToProfiler`: the block's address and size, and the device's allocated
//! and reserved totals after it), and the driver calls the allocator made for segments
//! (`cuMemAlloc_v2`/`cuMemFree_v2`, or `cuMemCreate`/`cuMemMap`/`cuMemUnmap` pages for expandable
//! segments), failed ones included. From them:
//! - a request's size is its block's size: the rounded request, or more when the allocator
//!   handed out a block whole (a large-pool remainder of 1 MiB or less). Under the settings the
//!   job ran with this asks for exactly the same block; under others it may ask for up to that
//!   remainder more than the job did.
//! - `empty_cache`: the allocator gives segments back to the driver on its own only after a
//!   failed device allocation (its retries), or through garbage collection. Segment frees with no
//!   failure before them since the allocator's last report are a `torch.cuda.empty_cache()`.
//! - out of memory: the allocator reports nothing for a request it failed; what shows is one or
//!   more failed device allocations, then `cuMemGetInfo` (the numbers of its error message),
//!   before its next report. The request is known by the segment it asked for: its size is the
//!   largest request that asks for that segment (with expandable segments, the pages mapped for
//!   it before the one that failed, and that one: the least it can have been). The free memory that call returned, plus what
//!   the allocator held, is what the device could give it (`budget`).

use std::collections::{BTreeMap, HashMap, HashSet};

use super::{Recorded, Request, K_LARGE_BUFFER, K_MIN_BLOCK_SIZE, K_MIN_LARGE_ALLOC, K_SMALL_BUFFER, K_SMALL_SIZE};
use crate::event::{Event, Kind, Layer, Op};

/// Where in the recording a request came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Origin {
    /// The event's position in the recording (the allocator's report; for a failed request, the
    /// first failed device allocation).
    pub event: usize,
    pub ts: u64,
}

/// One process's requests on one device.
#[derive(Debug, Clone, PartialEq)]
pub struct AllocatorTrace {
    pub pid: u32,
    pub device: i32,
    pub requests: Vec<Request>,
    /// What the allocator reported after each request.
    pub recorded: Vec<Recorded>,
    pub origins: Vec<Origin>,
    /// The allocator took its memory as pages of expandable segments (`cuMemCreate` and
    /// `cuMemMap`), not as `cuMemAlloc` segments: the job ran with `expandable_segments:True`.
    pub expandable: bool,
    /// Device allocations the allocator made for its segments (pages, for expandable segments).
    pub segments_allocated: u64,
    /// Its `cuMemAlloc` segments, address and size, in the order it made them.
    pub segment_addresses: Vec<(u64, u64)>,
    /// What the device could give the allocator: at an out-of-memory, what it held then plus the
    /// free memory the driver reported; where device allocations failed but a retry after giving
    /// back cached segments served the request, the most it was seen to hold (the budget lies
    /// between that and the failed request). `None` when the device never refused it.
    pub budget: Option<u64>,
    /// The device's memory: NVML's total from the capture's own readings, else `cuMemGetInfo`'s
    /// total where the job asked the driver.
    pub device_memory: Option<u64>,
    /// The most the device held beyond what this allocator had reserved, over the device
    /// readings: the capture's NVML readings (while this process held the most of the followed
    /// ones) and the job's own `cuMemGetInfo` calls: the CUDA context, libraries' own buffers,
    /// other processes.
    pub beyond_allocator: Option<u64>,
    /// PyTorch's allocator settings in the environment the process was started with, where the
    /// capture read them (`Event::allocator_settings`).
    pub started_with: Option<String>,
    /// Why the recording does not begin at the job's first allocation (it was attached to a
    /// running job, or lost events): a replay cannot start from the allocator's unknown state.
    pub incomplete: Option<String>,
}

impl AllocatorTrace {
    fn new(pid: u32, device: i32) -> Self {
        AllocatorTrace {
            pid,
            device,
            requests: Vec::new(),
            recorded: Vec::new(),
            origins: Vec::new(),
            expandable: false,
            segments_allocated: 0,
            segment_addresses: Vec::new(),
            budget: None,
            device_memory: None,
            beyond_allocator: None,
            started_with: None,
            incomplete: None,
        }
    }

    /// A trace of `requests` alone, nothing reported after them and no segment known: a job made
    /// up rather than recorded, as tests and benchmarks make one.
    pub fn of_requests(pid: u32, device: i32, requests: Vec<Request>) -> Self {
        let mut trace = AllocatorTrace::new(pid, device);
        trace.recorded = vec![Recorded::default(); requests.len()];
        trace.origins = vec![Origin { event: 0, ts: 0 }; requests.len()];
        trace.requests = requests;
        trace
    }

    fn push(&mut self, request: Request, recorded: Recorded, origin: Origin) {
        self.requests.push(request);
        self.recorded.push(recorded);
        self.origins.push(origin);
    }

    /// A reading of the device's free memory (`event.size`) and total, while the allocator had
    /// `reserved`.
    fn device_reading(&mut self, event: &Event, reserved: u64) {
        let used = event.total.unwrap_or(0).saturating_sub(event.size);
        let beyond = used.saturating_sub(reserved);
        self.beyond_allocator = Some(self.beyond_allocator.map_or(beyond, |b| b.max(beyond)));
    }

    fn mark_incomplete(&mut self, why: String) {
        self.incomplete.get_or_insert(why);
    }
}

/// A failed device allocation not yet followed by the allocator's next report.
#[derive(Debug, Clone, Copy)]
struct Failure {
    segment_size: u64,
    origin: Origin,
}

#[derive(Debug, Default)]
struct Allocator {
    /// The highest reserved total reported.
    most_reserved: u64,
    /// A device allocation failed at some point.
    refused: bool,
    /// Live blocks by address: the request id each is.
    live: HashMap<u64, u64>,
    next_id: u64,
    /// The reserved total of the last report, less what the driver was given back since.
    reserved_now: u64,
    failure: Option<Failure>,
    /// Pages created for expandable segments since the last report: a request that fails part
    /// way asked for at least these and the one that failed.
    pages_since_report: u64,
    /// An `empty_cache` was already inferred for the frees since the last report.
    emptied: bool,
}

#[derive(Debug, Default)]
struct Process {
    /// The device of the process's latest allocator report, for driver calls that name none.
    device: Option<i32>,
    /// Segments the allocator's blocks lay in (the `segment` of its reports), with their sizes
    /// from the driver calls that made them.
    allocator_segments: HashSet<u64>,
    /// Device allocations not yet known to be the allocator's, by address: their size.
    driver_allocations: HashMap<u64, u64>,
    /// NVML's total memory of the device, from the capture's readings.
    nvml_total: Option<u64>,
    started_with: Option<String>,
}

/// Builds the traces from a recording's events, in order.
#[derive(Debug, Default)]
pub struct TraceBuilder {
    traces: BTreeMap<(u32, i32), (AllocatorTrace, Allocator)>,
    processes: HashMap<u32, Process>,
    index: usize,
}

impl TraceBuilder {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn push(&mut self, event: &Event) {
        let origin = Origin { event: self.index, ts: event.ts };
        self.index += 1;
        if let Some(settings) = &event.allocator_settings {
            self.started_with(event.pid, settings);
        }
        match event.layer {
            Layer::Allocator if event.succeeded() => self.allocator_report(event, origin),
            // The allocator's own out-of-memory report: the failure is read from the driver's
            // calls and PyTorch's error message (above), as before the report was recorded.
            Layer::Allocator => {}
            Layer::Driver => self.driver_call(event, origin),
            Layer::Process => {
                if matches!(event.op, Op::Exec | Op::Exit) {
                    // A pid reused by a new program is a new allocator (its settings, read at its
                    // first call, come after its exec).
                    self.processes.remove(&event.pid);
                }
            }
        }
    }

    /// The traces, by pid and device.
    pub fn finish(self) -> Vec<AllocatorTrace> {
        self.traces
            .into_values()
            .filter(|(trace, _)| !trace.requests.is_empty())
            .map(|(mut trace, state)| {
                if state.refused && trace.budget.is_none() {
                    trace.budget = Some(state.most_reserved);
                }
                trace
            })
            .collect()
    }

    fn trace(&mut self, pid: u32, device: i32) -> &mut (AllocatorTrace, Allocator) {
        let process = self.processes.get(&pid);
        let (nvml_total, started_with) =
            (process.and_then(|p| p.nvml_total), process.and_then(|p| p.started_with.clone()));
        self.traces.entry((pid, device)).or_insert_with(|| {
            let mut trace = AllocatorTrace::new(pid, device);
            trace.device_memory = nvml_total;
            trace.started_with = started_with;
            (trace, Allocator::default())
        })
    }

    fn started_with(&mut self, pid: u32, settings: &str) {
        self.processes.entry(pid).or_default().started_with = Some(settings.to_string());
        for (_, (trace, _)) in self.traces.range_mut((pid, i32::MIN)..=(pid, i32::MAX)) {
            trace.started_with = Some(settings.to_string());
        }
    }

    fn allocator_report(&mut self, event: &Event, origin: Origin) {
        let device = event.device.unwrap_or(0);
        let process = self.processes.entry(event.pid).or_default();
        process.device = Some(device);
        let new_segment = event.segment.and_then(|segment| {
            let new = process.allocator_segments.insert(segment);
            process.driver_allocations.get(&segment).filter(|_| new).map(|&size| (segment, size))
        });
        let (trace, state) = self.trace(event.pid, device);
        if let Some(segment) = new_segment {
            trace.segments_allocated += 1;
            trace.segment_addresses.push(segment);
        }
        state.failure = None;
        state.emptied = false;
        state.pages_since_report = 0;
        if let Some(reserved) = event.reserved {
            state.reserved_now = reserved;
            state.most_reserved = state.most_reserved.max(reserved);
        }
        let recorded = Recorded { allocated: event.allocated, reserved: event.reserved, out_of_memory: false };
        let Some(addr) = event.addr else { return };
        match event.op {
            Op::Alloc => {
                if trace.requests.is_empty() && event.allocated.is_some_and(|a| a != event.size) {
                    trace.mark_incomplete(format!(
                        "its first block report already has {} bytes allocated: the recording began after the job's first allocation",
                        event.allocated.unwrap_or(0)
                    ));
                }
                let id = state.next_id;
                state.next_id += 1;
                state.live.insert(addr, id);
                trace.push(Request::Alloc { id, size: event.size }, recorded, origin);
            }
            Op::Free => match state.live.remove(&addr) {
                Some(id) => trace.push(Request::Free { id }, recorded, origin),
                None => trace.mark_incomplete(format!(
                    "it frees a block at {addr:#x} it never saw allocated: the recording began after the job's first allocation"
                )),
            },
            _ => {}
        }
    }

    fn driver_call(&mut self, event: &Event, origin: Origin) {
        let process = self.processes.entry(event.pid).or_default();
        if event.op == Op::MemInfo && event.api.starts_with("nvml") {
            process.nvml_total = event.total;
            if let Some((trace, state)) = event.device.and_then(|d| self.traces.get_mut(&(event.pid, d))) {
                trace.device_memory = event.total;
                trace.device_reading(event, state.reserved_now);
            }
            return;
        }
        let Some(device) = event.device.or(process.device) else { return };
        let is_segment_call = matches!(event.kind, Some(Kind::Device | Kind::Vmm));
        // A segment the allocator gives back, and its size.
        let given_back = match (event.op, event.result) {
            (Op::Free, 0) => event.addr.and_then(|a| {
                let size = process.driver_allocations.remove(&a);
                process.allocator_segments.remove(&a).then(|| size.unwrap_or(0))
            }),
            (Op::Unmap, 0) if event.kind == Some(Kind::Vmm) => Some(event.size),
            _ => None,
        };
        if let (Op::Alloc, 0, Some(Kind::Device), Some(addr)) = (event.op, event.result, event.kind, event.addr) {
            process.driver_allocations.insert(addr, event.size);
        }
        let (trace, state) = self.trace(event.pid, device);
        match (event.op, event.result) {
            (Op::Alloc, 0) if event.kind == Some(Kind::Vmm) => state.pages_since_report += 1,
            (Op::Map, 0) if event.kind == Some(Kind::Vmm) => {
                trace.expandable = true;
                trace.segments_allocated += 1;
            }
            // cuMemCreate failing with "not permitted" is the allocator probing for a handle type
            // it then goes without; only out of memory (2) fails a request.
            (Op::Alloc, 2) if is_segment_call => {
                let segment_size = match event.kind {
                    Some(Kind::Vmm) => (state.pages_since_report + 1) * event.size,
                    _ => event.size,
                };
                state.failure.get_or_insert(Failure { segment_size, origin });
                state.refused = true;
            }
            (Op::MemInfo, 0) if event.api.starts_with("cuMemGetInfo") => {
                trace.device_memory = trace.device_memory.or(event.total);
                let Some(failure) = state.failure.take() else {
                    // The job asked (torch.cuda.mem_get_info()): a reading of the device like NVML's.
                    trace.device_reading(event, state.reserved_now);
                    return;
                };
                // The allocator gave up: this is its error message's free memory.
                let budget = state.reserved_now + event.size;
                trace.budget = Some(trace.budget.map_or(budget, |b| b.min(budget)));
                let id = state.next_id;
                state.next_id += 1;
                trace.push(
                    Request::Alloc { id, size: largest_request_for(failure.segment_size, trace.expandable) },
                    Recorded { allocated: None, reserved: None, out_of_memory: true },
                    failure.origin,
                );
            }
            _ => {}
        }
        if let Some(size) = given_back {
            state.reserved_now = state.reserved_now.saturating_sub(size);
            if state.failure.is_none() && !state.emptied {
                state.emptied = true;
                trace.push(Request::EmptyCache, Recorded::default(), origin);
            }
        }
    }
}

/// The largest request that makes the allocator ask the device for `segment` bytes
/// (`get_allocation_size` read backwards); for expandable segments, which ask page by page, the
/// pages it got before the one that failed, and that one: a request at least that large.
fn largest_request_for(segment: u64, expandable: bool) -> u64 {
    if expandable {
        segment
    } else if segment == K_SMALL_BUFFER {
        K_SMALL_SIZE
    } else if segment == K_LARGE_BUFFER {
        K_MIN_LARGE_ALLOC - K_MIN_BLOCK_SIZE
    } else {
        segment
    }
}

/// The traces of a recording's events.
pub fn traces<'e>(events: impl IntoIterator<Item = &'e Event>) -> Vec<AllocatorTrace> {
    let mut builder = TraceBuilder::new();
    for event in events {
        builder.push(event);
    }
    builder.finish()
}
