//! `exit_with_live_allocations`: a process exited (or exec'd) while still holding device memory
//! it allocated. Pinned host memory is left out: it is not what runs a GPU out of memory.
//!
//! The driver takes everything back from a process that ends, so what matters is whose memory
//! it was. A process run by a framework's caching allocator keeps its segments (live tensors and
//! cache) and its libraries' workspaces until the end on purpose: `info`, at the tensors' level
//! (the allocator reported its totals) as at the driver's (its segments were made by the
//! allocator: `model::framework`); memory that grew while it ran is reported by `growth`. A
//! program that manages device memory itself and never freed some is missing a free: `leak`.
//! A parent that ends while its workers live on holding device memory (a launcher killed with
//! SIGKILL) is `info`: the driver takes back its own memory, and the orphan findings that
//! follow tell what is left.
//!
//! One finding per problem: what another finding of the same process instance already reported
//! (an orphan's memory, the stacks of a growth) is not said again as a leak at its exit.

use super::reported::Reported;
use super::{wording, Finding, FindingKind, Severity};
use crate::event::{Event, Layer, Op};
use crate::framework::Framework;
use crate::track::{Allocation, ProcessMemory, Tracker};

/// Looks at a process transition before the tracker closes the process's table; `reported`:
/// what the process's other findings already said.
pub(crate) fn check(event: &Event, world: &Tracker, reported: &Reported) -> Option<Finding> {
    if event.layer != Layer::Process || !matches!(event.op, Op::Exit | Op::Exec) {
        return None;
    }
    let process = world.process(event.pid)?;
    let live: Vec<&Allocation> = process.allocations().into_iter().filter(|a| a.is_device_memory()).collect();
    if live.is_empty() {
        return None;
    }
    let how = if event.op == Op::Exit { "exited" } else { "replaced its program (exec)" };
    let instance = process.as_ref();
    let (severity, about, detail) = match why_held(event, process, world, reported) {
        Some(reason) => (Severity::Info, live.clone(), format!("{}{reason}", held(process, how, &live))),
        None => {
            let unreported: Vec<&Allocation> =
                live.iter().copied().filter(|a| !reported.grew(instance, &a.stack)).collect();
            if unreported.is_empty() {
                let reason =
                    "; its growth finding reported these allocations; the driver takes them back with the process.";
                (Severity::Info, live.clone(), format!("{}{reason}", held(process, how, &live)))
            } else {
                let largest = representative(&unreported)?;
                let grown = live.len() - unreported.len();
                let besides = if grown > 0 {
                    format!(
                        " besides the {} its growth finding reported",
                        wording::count(grown as u64, "allocation", "allocations")
                    )
                } else {
                    String::new()
                };
                // Named by the best stack: said so when a larger one had none.
                let which = if unreported.iter().any(|a| a.size > largest.size) {
                    "the largest made from Python"
                } else {
                    "the largest"
                };
                let detail = format!(
                    "{}{besides}; {which}, {}, came from {} {}: release it once it is no longer needed (drop the tensor, torch.cuda.empty_cache()) instead of leaving it to the end of the process.",
                    held(process, how, &unreported),
                    wording::bytes(largest.size),
                    largest.api,
                    wording::at(&largest.stack),
                );
                (Severity::Leak, unreported, detail)
            }
        }
    };
    let largest = representative(&about)?;
    let first_ts = about.iter().map(|a| a.ts).min().unwrap_or(event.ts);
    let mut finding = Finding::new(
        FindingKind::ExitWithLiveAllocations,
        process.pid,
        &process.comm,
        about.iter().map(|a| a.size).sum(),
        about.len() as u64,
        first_ts,
        event.ts,
        &largest.stack,
        detail,
    );
    finding.severity = severity;
    finding.api = Some(largest.api.to_string());
    Some(finding)
}

/// "pid 4711 (python3) exited still holding 12.0 MiB of device memory in 3 allocations".
fn held(process: &ProcessMemory, how: &str, allocations: &[&Allocation]) -> String {
    format!(
        "{} {how} still holding {} of device memory in {}",
        wording::process(process.pid, &process.comm),
        wording::bytes(allocations.iter().map(|a| a.size).sum()),
        wording::count(allocations.len() as u64, "allocation", "allocations"),
    )
}

/// Why what a process held at its end is no leak, in the rest of the sentence; None when it is
/// one: its orphan finding said it, its workers live on, or its framework's allocator held it.
fn why_held(event: &Event, process: &ProcessMemory, world: &Tracker, reported: &Reported) -> Option<String> {
    if reported.orphaned(process.as_ref()) {
        return Some(
            "; its orphan finding reported it (its parent ended first); the driver takes it back with the process."
                .to_string(),
        );
    }
    let mut workers: Vec<u32> = super::orphan_holding_memory::descendants(process.as_ref(), world)
        .into_iter()
        .filter(|p| p.device_bytes() > 0 || p.contexts() > 0)
        .map(|p| p.pid)
        .collect();
    workers.sort();
    if event.op == Op::Exit && !workers.is_empty() {
        return Some(format!(
            "; the driver takes that back with it, but its workers ({}) live on with device memory or a context: whether they end by themselves is told by their orphan findings.",
            workers.iter().map(|pid| format!("pid {pid}")).collect::<Vec<_>>().join(", ")
        ));
    }
    let share = allocator_share(process)?;
    Some(format!(": {}; the driver takes it back with the process: nothing to do.", share.describe()))
}

/// The allocation a finding names: the one with the best stack (the user's line, else any
/// Python frame, else the module that called the driver), the largest of those, the oldest of
/// equals. A PyTorch process's largest segment is often made on an autograd thread with no
/// Python frame while the rest have one.
fn representative<'a>(allocations: &[&'a Allocation]) -> Option<&'a Allocation> {
    allocations.iter().copied().max_by(|a, b| {
        stack_quality(&a.stack).cmp(&stack_quality(&b.stack)).then(a.size.cmp(&b.size)).then(b.ts.cmp(&a.ts))
    })
}

/// 3: the user's own line; 2: Python frames; 1: the calling module only; 0: nothing.
fn stack_quality(stack: &[crate::event::Frame]) -> u8 {
    match stack.first() {
        None => 0,
        Some(frame) if frame.native_module().is_some() => 1,
        Some(_) if super::user_frame(stack).is_some() => 3,
        Some(_) => 2,
    }
}

/// What a process run by a framework's caching allocator held at its end, by owner.
struct AllocatorShare {
    framework: Framework,
    /// The allocator's segments: with its totals (the tensors' level), split into live tensors
    /// and cache.
    segments: u64,
    tensors: Option<u64>,
    /// Driver memory beside the allocator's segments: libraries' workspaces (cuBLAS, cuDNN,
    /// NCCL) and direct driver calls, held for the process's lifetime.
    outside: u64,
}

impl AllocatorShare {
    fn describe(&self) -> String {
        let allocator = self.framework.allocator();
        let mut parts = match self.tensors {
            Some(tensors) => format!(
                "{allocator}'s segments hold {} in live tensors and {} cached",
                wording::bytes(tensors),
                wording::bytes(self.segments - tensors)
            ),
            None => format!(
                "{allocator}'s segments hold {} (its cache and the tensors in it, which the driver's level does not tell apart)",
                wording::bytes(self.segments)
            ),
        };
        if self.outside > 0 {
            parts.push_str(&format!(
                ", {} more was allocated outside the allocator (libraries' workspaces, direct driver calls)",
                wording::bytes(self.outside)
            ));
        }
        parts
    }
}

/// The share of what a process run by a framework's caching allocator held (`framework()`);
/// `None` for a program that manages device memory itself, where memory never freed is a
/// missing free. A framework process keeps its tensors, its cache and its libraries'
/// workspaces to the end on purpose; memory that grew while it ran is `growth`'s finding,
/// not a second one at exit.
fn allocator_share(process: &ProcessMemory) -> Option<AllocatorShare> {
    let framework = process.framework()?;
    let held = process.device_bytes();
    let totals = process.allocator_totals();
    if !totals.is_empty() {
        let reserved: u64 = totals.values().map(|t| t.reserved).sum::<u64>().min(held);
        let tensors: u64 = totals.values().map(|t| t.allocated).sum::<u64>().min(reserved);
        return Some(AllocatorShare {
            framework,
            segments: reserved,
            tensors: Some(tensors),
            outside: held - reserved,
        });
    }
    let segments: u64 = process
        .allocations()
        .into_iter()
        .filter(|a| a.is_device_memory() && a.framework.is_some())
        .map(|a| a.size)
        .sum::<u64>()
        .min(held);
    Some(AllocatorShare { framework, segments, tensors: None, outside: held - segments })
}
