//! `exit_with_live_allocations`: a process exited (or exec'd) while still holding device memory
//! it allocated. Pinned host memory is left out: it is not what runs a GPU out of memory.
//!
//! The driver takes everything back from a process that ends, so what matters is whose memory
//! it was. A process run by a framework allocator keeps its segments (live tensors and cache)
//! and its libraries' workspaces until the end on purpose: `info` (memory that grew while it ran
//! is reported by `growth`). A program that manages device memory itself and never freed some is
//! missing a free: `leak`. A parent that ends while its workers live on holding device memory
//! (a launcher killed with SIGKILL) is `info`: the driver takes back its own memory, and the
//! orphan findings that follow tell what is left.

use super::{wording, Finding, FindingKind, Severity};
use crate::event::{Event, Layer, Op};
use crate::track::{Allocation, ProcessMemory, Tracker};

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
    let held = format!(
        "{} {how} still holding {} of device memory in {}",
        wording::process(process.pid, &process.comm),
        wording::bytes(bytes),
        wording::count(count, "allocation", "allocations"),
    );
    let mut workers: Vec<u32> = super::orphan_holding_memory::descendants(process.as_ref(), world)
        .into_iter()
        .filter(|p| p.device_bytes() > 0 || p.contexts() > 0)
        .map(|p| p.pid)
        .collect();
    workers.sort();
    let (severity, detail) = match allocator_share(process, bytes) {
        _ if event.op == Op::Exit && !workers.is_empty() => (
            Severity::Info,
            format!(
                "{held}; the driver takes that back with it, but its workers ({}) live on with device memory or a context: whether they end by themselves is told by their orphan findings.",
                workers.iter().map(|pid| format!("pid {pid}")).collect::<Vec<_>>().join(", ")
            ),
        ),
        Some(share) => (Severity::Info, format!("{held}: {}; the driver takes it back with the process: nothing to do.", share.describe())),
        None => (
            Severity::Leak,
            format!(
                "{held}; the largest, {}, came from {} {}: release it once it is no longer needed (drop the tensor, torch.cuda.empty_cache()) instead of leaving it to the end of the process.",
                wording::bytes(largest.size),
                largest.api,
                wording::at(&largest.stack),
            ),
        ),
    };
    let first_ts = live.iter().map(|a| a.ts).min().unwrap_or(event.ts);
    let mut finding = Finding::new(
        FindingKind::ExitWithLiveAllocations,
        process.pid,
        &process.comm,
        bytes,
        count,
        first_ts,
        event.ts,
        &largest.stack,
        detail,
    );
    finding.severity = severity;
    finding.api = Some(largest.api.to_string());
    Some(finding)
}

/// What a process that used a framework allocator held at its end, by owner.
struct AllocatorShare {
    tensors: u64,
    cached: u64,
    /// Driver memory beside the allocator's segments: libraries' workspaces (cuBLAS, cuDNN)
    /// and direct driver calls, held for the process's lifetime.
    outside: u64,
}

impl AllocatorShare {
    fn describe(&self) -> String {
        let mut parts = format!(
            "its framework allocator's segments hold {} in live tensors and {} cached",
            wording::bytes(self.tensors),
            wording::bytes(self.cached)
        );
        if self.outside > 0 {
            parts.push_str(&format!(
                ", {} more was allocated outside the allocator (libraries' workspaces, direct driver calls)",
                wording::bytes(self.outside)
            ));
        }
        parts
    }
}

/// The share of the `held` bytes of a process whose framework allocator reported its totals;
/// `None` for a program that manages device memory itself, where memory never freed is a
/// missing free. A framework process keeps its tensors, its cache and its libraries'
/// workspaces to the end on purpose; memory that grew while it ran is `growth`'s finding,
/// not a second one at exit.
fn allocator_share(process: &ProcessMemory, held: u64) -> Option<AllocatorShare> {
    let totals = process.allocator_totals();
    if totals.is_empty() {
        return None;
    }
    let reserved: u64 = totals.values().map(|t| t.reserved).sum::<u64>().min(held);
    let tensors: u64 = totals.values().map(|t| t.allocated).sum::<u64>().min(reserved);
    Some(AllocatorShare { tensors, cached: reserved - tensors, outside: held - reserved })
}
