//! `exit_with_live_allocations`: a process exited (or exec'd) while still holding device memory
//! it allocated. Pinned host memory is left out: it is not what runs a GPU out of memory.

use super::{wording, Finding, FindingKind};
use crate::event::{Event, Layer, Op};
use crate::track::{Allocation, Tracker};

/// Looks at a process transition before the tracker closes the process's table.
pub fn check(event: &Event, world: &Tracker) -> Option<Finding> {
    if event.layer != Layer::Process || !matches!(event.op, Op::Exit | Op::Exec) {
        return None;
    }
    let process = world.process(event.pid)?;
    let live: Vec<&Allocation> = process.allocations().into_iter().filter(|a| a.is_device_memory()).collect();
    let largest = live.iter().copied().max_by(|a, b| a.size.cmp(&b.size).then(b.ts.cmp(&a.ts)))?;
    let bytes: u64 = live.iter().map(|a| a.size).sum();
    let count = live.len() as u64;
    let how = if event.op == Op::Exit { "exited" } else { "replaced its program (exec)" };
    Some(Finding {
        kind: FindingKind::ExitWithLiveAllocations,
        pid: process.pid,
        comm: process.comm.to_string(),
        bytes,
        count,
        peer_pid: None,
        first_ts: live.iter().map(|a| a.ts).min().unwrap_or(event.ts),
        last_ts: event.ts,
        stack: largest.stack.to_vec(),
        detail: format!(
            "{} {how} still holding {} of device memory in {}; the largest, {}, came from {} {}: release it once it is no longer needed (drop the tensor, torch.cuda.empty_cache()) instead of leaving it to the end of the process.",
            wording::process(process.pid, &process.comm),
            wording::bytes(bytes),
            wording::count(count, "allocation", "allocations"),
            wording::bytes(largest.size),
            largest.api,
            wording::at(&largest.stack),
        ),
        api: Some(largest.api.to_string()),
        processes: Vec::new(),
    })
}
