//! `oom`: an allocation failed for lack of memory. The finding is the picture at that moment:
//! the failing call and its stack, and for every process seen, live bytes by kind and the
//! stacks holding the most.

use std::collections::BTreeMap;

use super::{wording, Finding, FindingKind, ProcessSnapshot, StackBytes};
use crate::event::{Event, Kind, Op, CUDA_ERROR_OUT_OF_MEMORY};
use crate::track::{ProcessMemory, Tracker};

/// Stacks listed per process.
const TOP_STACKS: usize = 3;

pub fn check(event: &Event, world: &Tracker) -> Option<Finding> {
    if event.op != Op::Alloc || event.result != CUDA_ERROR_OUT_OF_MEMORY {
        return None;
    }
    let mut processes: Vec<ProcessSnapshot> = world
        .live_processes()
        .into_iter()
        .filter(|p| p.pid == event.pid || !p.allocations().is_empty())
        .map(snapshot)
        .collect();
    processes.sort_by_key(|p| std::cmp::Reverse(device_bytes(p)));
    let total: u64 = processes.iter().map(device_bytes).sum();
    let holders: Vec<String> = processes
        .iter()
        .filter(|p| device_bytes(p) > 0)
        .take(3)
        .map(|p| format!("{} {}", wording::process(p.pid, &p.comm), wording::bytes(device_bytes(p))))
        .collect();
    let holders = if holders.is_empty() { "no process held any".to_string() } else { holders.join(", ") };
    Some(Finding {
        kind: FindingKind::Oom,
        pid: event.pid,
        comm: event.comm.to_string(),
        bytes: event.size,
        count: 1,
        peer_pid: None,
        first_ts: event.ts,
        last_ts: event.ts,
        stack: event.stack.to_vec(),
        detail: format!(
            "{} of {} failed with out of memory in {} {}; at that moment gpuprof saw {} of device memory live in the processes it follows ({holders}): free or shrink the largest holders, or allocate less at once.",
            event.api,
            wording::bytes(event.size),
            wording::process(event.pid, &event.comm),
            wording::at(&event.stack),
            wording::bytes(total),
        ),
        api: Some(event.api.to_string()),
        processes,
    })
}

/// Live device memory of a snapshot (pinned host memory left out).
fn device_bytes(snapshot: &ProcessSnapshot) -> u64 {
    snapshot.live.iter().filter(|(kind, _)| **kind != Kind::HostPinned).map(|(_, bytes)| bytes).sum()
}

fn snapshot(process: &ProcessMemory) -> ProcessSnapshot {
    let mut live: BTreeMap<_, u64> = BTreeMap::new();
    for allocation in process.allocations() {
        *live.entry(allocation.kind).or_default() += allocation.size;
    }
    let top_stacks = process
        .top_stacks(TOP_STACKS, false)
        .into_iter()
        .map(|top| StackBytes { stack: top.stack.to_vec(), bytes: top.total.bytes, count: top.total.count })
        .collect();
    ProcessSnapshot { pid: process.pid, comm: process.comm.to_string(), live, top_stacks }
}
