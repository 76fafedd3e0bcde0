//! What a capture has taken in, followed, dropped and delivered so far: one account, read by the
//! `--stats` line and the end of a run, the daemon's health snapshot (`/metrics`) and `top`.

use std::fmt;

use gpuprof_model::findings::wording::count;

pub use crate::enrich::python_stacks::StackCounts;
use crate::kernel::DropCounters;
use crate::postmortem::PostmortemStats;
use crate::shim_socket::ShimTotals;
use gpuprof_model::report::ExportHealth;

#[derive(Debug, Clone, Default)]
pub struct CaptureStats {
    /// Since the session started.
    pub seconds: f64,
    /// Events through the flow (second copies of a call left out).
    pub events: u64,
    /// Processes the tracker keeps a table of (followed, and exited ones not yet forgotten).
    pub processes_tracked: u64,
    pub findings_fired: u64,
    /// Second copies of calls both captures saw, dropped.
    pub duplicates_dropped: u64,
    /// Events lost on the way: in the kernel when eBPF captures, else in the shims' queues
    /// (beside eBPF a shim's drop loses nothing: the probes saw the call).
    pub lost: u64,
    /// This agent's own CPU time.
    pub agent_cpu_seconds: f64,
    pub kernel: Option<KernelStats>,
    pub shim: Option<ShimStats>,
    pub export: Option<ExportHealth>,
    /// A daemon's post-mortems: windows kept, events a cap dropped, post-mortems written.
    pub postmortems: Option<PostmortemStats>,
}

/// The eBPF source's part.
#[derive(Debug, Clone, Default)]
pub struct KernelStats {
    pub drops: DropCounters,
    /// Records that named an API or kind this agent does not know.
    pub undecodable: u64,
    pub stacks: StackCounts,
    /// Processes followed now, since the start, and those of them seen to exit.
    pub processes_followed: u64,
    pub processes_followed_total: u64,
    pub processes_exited_total: u64,
    /// libcuda and libc10 files with probes on them.
    pub libraries_probed: u64,
}

/// The shims' part (`run --via shim`, a pod's sidecar, or beside eBPF).
#[derive(Debug, Clone, Default)]
pub struct ShimStats {
    /// Events the shims sent, second copies included.
    pub events: u64,
    /// Processes connected now.
    pub processes_open: u64,
    pub totals: ShimTotals,
}

/// The counters line (`--stats`, the end of a run): the kernel's when eBPF captures (the shim
/// only adds second copies of its calls then), else the shims'.
impl fmt::Display for CaptureStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.kernel, &self.shim) {
            (Some(kernel), _) => self.kernel_line(f, kernel),
            (None, Some(shim)) => shim_line(f, shim),
            (None, None) => Ok(()),
        }
    }
}

impl CaptureStats {
    fn kernel_line(&self, f: &mut fmt::Formatter<'_>, kernel: &KernelStats) -> fmt::Result {
        let drops = &kernel.drops;
        write!(
            f,
            "{} events ({:.0}/s) from {} in {:.1} s; lost {} (ring buffer full {}, call table full {}); out-pointers unread {}, returns without entry {}, undecodable {}; Python stacks {} from {} interpreters, unresolved {} (unreadable in the kernel {}); allocator reports of other devices {}; agent CPU {:.2} s ({:.2} µs an event)",
            self.events,
            self.events as f64 / self.seconds.max(1e-9),
            count(self.processes_tracked, "process", "processes"),
            self.seconds,
            drops.lost_events(),
            drops.ring_buffer_full,
            drops.pending_full,
            drops.read_failed,
            drops.return_unmatched,
            kernel.undecodable,
            kernel.stacks.symbolized,
            kernel.stacks.interpreters,
            kernel.stacks.unresolved,
            drops.stack_unreadable,
            drops.allocator_other_device,
            self.agent_cpu_seconds,
            self.agent_cpu_seconds * 1e6 / self.events.max(1) as f64
        )
    }
}

fn shim_line(f: &mut fmt::Formatter<'_>, shim: &ShimStats) -> fmt::Result {
    let totals = &shim.totals;
    let counters = &totals.counters;
    write!(
        f,
        "{} events from {} via the shim; dropped {} (queue full in the process); waited for room {} times ({:.1} ms in all); stacks cut {}, unresolved {}; undecodable lines {}; refused (naming another process) {}; processes closed out by hanging up {}; CUPTI driver callbacks in {} (slot held by another subscriber {}, handed to a profiler {}, no libcupti {}, activity cross-check disagreed {})",
        shim.events,
        count(totals.processes_seen, "process", "processes"),
        counters.dropped_queue_full,
        counters.waits,
        counters.wait_ns as f64 / 1e6,
        counters.stacks_cut,
        counters.stacks_unresolved,
        totals.undecodable,
        totals.refused,
        totals.closed_without_exit,
        counters.cupti.subscribed,
        counters.cupti.slot_taken,
        counters.cupti.handed_over,
        counters.cupti.no_libcupti,
        counters.cross_check_disagreed
    )
}
