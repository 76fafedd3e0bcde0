//! `oom`: an allocation failed for lack of memory. The finding is the picture at that moment:
//! the failing call and its stack; for every process seen, live bytes by kind, the stacks
//! holding the most and its framework allocator's cache (reserved but not in tensors); whether
//! the failing process's own cache was large enough (fragmentation), and which neighbours'
//! caches would have made room.
//!
//! One finding per incident: PyTorch's allocator answers a failed `cuMemAlloc` by returning its
//! cache to the driver and trying again, and a second failure of the same request (its size, at
//! its line) is the same OutOfMemoryError. The incident ends when that process next allocates
//! from the driver successfully; a failure of another size or at another line is another
//! incident.
//!
//! PyTorch's allocator then tells the failure itself (`c10::reportOutOfMemoryToProfiler`, probed
//! at every level): the request the program made, at its line, and the allocator's totals at that
//! moment — what it had cached, which the driver's calls alone do not say. A failed driver call of
//! a PyTorch process waits for that report (`REPORT_WAIT_NS`); a retry that made room ends it
//! with no finding; without a report (an older PyTorch) the driver's call is told.
//!
//! Its diagnosis says what would have made room: the process's own cache (`fragmentation`), a
//! neighbour's (`neighbour_cache`), or nothing cached anywhere (`device_full`: the largest
//! holders, at their lines).

use std::collections::{BTreeMap, HashMap};

use super::{wording, Diagnosis, Finding, FindingKind, ProcessSnapshot, StackBytes};
use crate::event::{Event, Frame, Kind, Layer, Op, CUDA_ERROR_OUT_OF_MEMORY};
use crate::framework::Framework;
use crate::track::{ProcessMemory, ProcessRef, Tracker};

/// Stacks listed per process.
const TOP_STACKS: usize = 3;

/// How long a failed driver allocation of a PyTorch process waits for its allocator's own
/// out-of-memory report (which follows within microseconds, once its cache is emptied and the
/// driver asked again); past it the failure is told from the driver's call alone.
pub(crate) const REPORT_WAIT_NS: u64 = 2_000_000_000;

#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
pub(crate) struct Rule {
    /// Processes in an out-of-memory incident already reported: the request that failed (its
    /// size and the user's line that made it; the allocator's retry may come from another line of
    /// its own).
    failing: HashMap<ProcessRef, (u64, Option<Frame>)>,
    /// A failed driver allocation of a process whose caching allocator reports its out-of-memory
    /// failures itself (PyTorch's `c10::reportOutOfMemoryToProfiler`): held for that report,
    /// which names the request the program made, at its line, and the allocator's totals at the
    /// failure (what it had cached: fragmentation or not), or for the allocator's retry to
    /// succeed (no OutOfMemoryError: nothing to tell), or for `REPORT_WAIT_NS`.
    #[serde(default)]
    held: HashMap<ProcessRef, Event>,
}

impl Rule {
    /// Drops what is kept of processes the tracker no longer knows.
    pub(crate) fn forget_unless(&mut self, known: impl Fn(ProcessRef) -> bool) {
        self.failing.retain(|process, _| known(*process));
        self.held.retain(|process, _| known(*process));
    }

    pub(crate) fn check(&mut self, event: &Event, world: &Tracker) -> Option<Finding> {
        let process =
            world.process(event.pid).map(|p| p.as_ref()).unwrap_or(ProcessRef { pid: event.pid, since: event.ts });
        match (event.layer, event.op) {
            (Layer::Driver, Op::Alloc) if event.succeeded() => {
                // A new segment: the incident is over. The same request again is the allocator's
                // retry once it emptied its cache, which made room (no OutOfMemoryError: nothing
                // to tell); another one comes after a failure no report followed (a PyTorch
                // without it): the held failure is told.
                self.failing.remove(&process);
                let held = self.held.remove(&process)?;
                if held.size == event.size {
                    return None;
                }
                self.incident(process, &held, world)
            }
            (Layer::Driver, Op::Alloc) if event.result == CUDA_ERROR_OUT_OF_MEMORY => {
                let pytorch = world.process(event.pid).and_then(|p| p.framework()) == Some(Framework::Pytorch);
                if pytorch {
                    self.held.entry(process).or_insert_with(|| event.clone());
                    return None;
                }
                self.incident(process, event, world)
            }
            (Layer::Allocator, Op::Alloc) if event.result == CUDA_ERROR_OUT_OF_MEMORY => {
                // PyTorch gave up on the request: the failure its program sees.
                self.held.remove(&process);
                self.failing.remove(&process);
                self.incident(process, event, world)
            }
            (Layer::Process, Op::Exit | Op::Exec) => {
                let held = self.held.remove(&process)?;
                self.incident(process, &held, world)
            }
            _ => None,
        }
    }

    /// Held failures whose report did not come by `now` (None: the capture ends), told from the
    /// driver's calls.
    pub(crate) fn due(&mut self, now: Option<u64>, world: &Tracker) -> Vec<Finding> {
        let due: Vec<ProcessRef> = self
            .held
            .iter()
            .filter(|(_, event)| now.is_none_or(|now| now >= event.ts.saturating_add(REPORT_WAIT_NS)))
            .map(|(process, _)| *process)
            .collect();
        let mut found = Vec::new();
        for process in due {
            if let Some(event) = self.held.remove(&process) {
                found.extend(self.incident(process, &event, world));
            }
        }
        found.sort_by_key(|f| (f.first_ts, f.pid));
        found
    }

    fn incident(&mut self, process: ProcessRef, event: &Event, world: &Tracker) -> Option<Finding> {
        let request = (event.size, super::user_frame(&event.attributed_stack()).cloned());
        if self.failing.get(&process) == Some(&request) {
            // The allocator's retry of the same request.
            return None;
        }
        self.failing.insert(process, request);
        Some(picture(event, world))
    }
}

fn picture(event: &Event, world: &Tracker) -> Finding {
    let mut processes: Vec<ProcessSnapshot> = world
        .live_processes()
        .into_iter()
        .filter(|p| p.pid == event.pid || !p.allocations().is_empty())
        .map(|p| snapshot(p, event.device))
        .collect();
    if let (Some(allocated), Some(reserved)) = (event.allocated, event.reserved) {
        // The allocator's own totals at the failure (its out-of-memory report).
        if let Some(failing) = processes.iter_mut().find(|p| p.pid == event.pid) {
            (failing.allocated, failing.reserved) = (Some(allocated), Some(reserved));
        }
    }
    processes.sort_by_key(|p| std::cmp::Reverse(device_bytes(p)));
    let total: u64 = processes.iter().map(device_bytes).sum();
    let holders: Vec<String> = processes
        .iter()
        .filter(|p| device_bytes(p) > 0)
        .take(3)
        .map(|p| {
            let most =
                p.top_stacks.first().map(|top| format!(", most {}", wording::at(&top.stack))).unwrap_or_default();
            format!("{} {}{most}", wording::process(p.pid, &p.comm), wording::bytes(device_bytes(p)))
        })
        .collect();
    let holders = if holders.is_empty() { "no process held any".to_string() } else { holders.join("; ") };
    let own_cache = processes.iter().find(|p| p.pid == event.pid).and_then(cache);
    let fragmentation = own_cache.is_some_and(|cached| cached >= event.size);
    let mut advice = Vec::new();
    if let Some(cached) = own_cache.filter(|_| fragmentation) {
        advice.push(format!(
            "its allocator had {} cached (reserved, not in tensors), enough for the request but in pieces too small for it: fragmentation; set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, or call torch.cuda.empty_cache() between phases",
            wording::bytes(cached)
        ));
    }
    let neighbours: Vec<(&ProcessSnapshot, u64)> = processes
        .iter()
        .filter(|p| p.pid != event.pid)
        .filter_map(|p| cache(p).filter(|c| *c > 0).map(|c| (p, c)))
        .collect();
    let sufficing: Vec<String> = neighbours
        .iter()
        .filter(|(_, cached)| *cached >= event.size)
        .map(|(p, cached)| format!("{} caches {}", wording::process(p.pid, &p.comm), wording::bytes(*cached)))
        .collect();
    let neighbours_cached: u64 = neighbours.iter().map(|(_, cached)| cached).sum();
    if !sufficing.is_empty() {
        advice.push(format!(
            "{} it does not use, enough on its own: torch.cuda.empty_cache() there would have made room",
            sufficing.join(", ")
        ));
    } else if neighbours_cached >= event.size {
        advice.push(format!(
            "the other processes' allocators cache {} between them, enough together: torch.cuda.empty_cache() there would have made room",
            wording::bytes(neighbours_cached)
        ));
    }
    // A framework process recorded at the driver's level with no report of its allocator's
    // totals: what it had cached is not known, so neither is whether the device was full.
    let own_unknown = own_cache.is_none() && world.process(event.pid).and_then(|p| p.framework()).is_some();
    let diagnosis = if fragmentation {
        Some(Diagnosis::Fragmentation)
    } else if neighbours_cached >= event.size {
        Some(Diagnosis::NeighbourCache)
    } else if own_unknown {
        None
    } else {
        Some(Diagnosis::DeviceFull)
    };
    let advice = match (advice.is_empty(), own_unknown) {
        (false, _) => advice.join("; "),
        (true, true) => "its allocator's segments hold its tensors and its cache, which its driver calls do not tell apart, and its allocator reported no totals: whether a cache in pieces (fragmentation) or live memory filled the device is not known; free or shrink the largest holders, or allocate less at once".to_string(),
        (true, false) => "nothing was cached to give back: the device was full of live memory; free or shrink the largest holders, or allocate less at once".to_string(),
    };
    let stack = event.attributed_stack();
    let request = match event.layer {
        // The allocator's own report: the request the program made of it.
        Layer::Allocator => format!("A request of {} to PyTorch's caching allocator", wording::bytes(event.size)),
        _ => format!("{} of {}", event.api, wording::bytes(event.size)),
    };
    let detail = format!(
        "{request} failed with out of memory in {} {}; at that moment gpuprof saw {} of device memory live in the processes it follows ({holders}): {advice}.",
        wording::process(event.pid, &event.comm),
        wording::at(&stack),
        wording::bytes(total),
    );
    let mut finding =
        Finding::new(FindingKind::Oom, event.pid, &event.comm, event.size, 1, event.ts, event.ts, &stack, detail);
    finding.api = Some(event.api.to_string());
    finding.processes = processes;
    finding.fragmentation = fragmentation;
    finding.diagnosis = diagnosis;
    finding
}

/// Live device memory of a snapshot (pinned host memory left out).
fn device_bytes(snapshot: &ProcessSnapshot) -> u64 {
    snapshot.live.iter().filter(|(kind, _)| **kind != Kind::HostPinned).map(|(_, bytes)| bytes).sum()
}

/// What a framework allocator holds without using it.
fn cache(snapshot: &ProcessSnapshot) -> Option<u64> {
    Some(snapshot.reserved?.saturating_sub(snapshot.allocated?))
}

/// `device`: the failing call's, when it named one; otherwise the allocator's totals of every
/// device.
fn snapshot(process: &ProcessMemory, device: Option<i32>) -> ProcessSnapshot {
    let mut live: BTreeMap<_, u64> = BTreeMap::new();
    for allocation in process.allocations() {
        *live.entry(allocation.kind).or_default() += allocation.size;
    }
    let top_stacks = process
        .top_stacks(TOP_STACKS, false)
        .into_iter()
        .map(|top| StackBytes { stack: top.stack.to_vec(), bytes: top.total.bytes, count: top.total.count })
        .collect();
    let totals: Vec<_> = process
        .allocator_totals()
        .iter()
        .filter(|(d, _)| device.is_none_or(|device| **d == device))
        .map(|(_, t)| *t)
        .collect();
    let (allocated, reserved) = if totals.is_empty() {
        (None, None)
    } else {
        (Some(totals.iter().map(|t| t.allocated).sum()), Some(totals.iter().map(|t| t.reserved).sum()))
    };
    ProcessSnapshot { pid: process.pid, comm: process.comm.to_string(), live, top_stacks, allocated, reserved }
}
