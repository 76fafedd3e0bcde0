//! Where a report's time goes on the calling thread, measured by the shim itself when
//! `GPUPROF_SHIM_TIMING` is set (for the overhead breakdown in docs/benchmarks.md; a machine
//! without `perf`, such as a GPU machine, still gets one). Each phase is stamped with the CPU's
//! time-stamp counter and summed; the sender turns the sums into nanoseconds per report, with the
//! counter's rate measured against the monotonic clock, for the counters line. Unset, each stamp
//! is one predictable branch.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use gpuprof_model::shim::{PhaseTimes, TIMING_VAR};

static ENABLED: AtomicBool = AtomicBool::new(false);

/// What is summed: reports timed, then the ticks of each phase.
static REPORTS: AtomicU64 = AtomicU64::new(0);
static TICKS: [AtomicU64; PHASES] = [const { AtomicU64::new(0) }; PHASES];
const PHASES: usize = 5;

/// The phases of a report on the calling thread, in order.
#[derive(Debug, Clone, Copy)]
pub enum Phase {
    /// Reading autograd's thread-locals.
    Autograd = 0,
    /// Walking the Python stack into the ring's slot.
    Walk = 1,
    /// The rest of recording: the clock, the slot's reservation and publication, the counters.
    Record = 2,
    /// Forwarding to libc10's own function.
    Forward = 3,
    /// The whole hook, from entry to return.
    Hook = 4,
}

/// Reads `GPUPROF_SHIM_TIMING` once, at start.
pub fn from_environment() {
    if std::env::var_os(TIMING_VAR).is_some() {
        ENABLED.store(true, Ordering::Relaxed);
        clock();
    }
}

/// A stamp: the time-stamp counter when timing, else 0.
#[inline(always)]
pub fn stamp() -> u64 {
    if ENABLED.load(Ordering::Relaxed) {
        ticks()
    } else {
        0
    }
}

/// Adds the time since `since` to `phase`; returns the stamp taken now (the next phase's start).
#[inline(always)]
pub fn lap(phase: Phase, since: u64) -> u64 {
    if !ENABLED.load(Ordering::Relaxed) {
        return 0;
    }
    let now = ticks();
    TICKS[phase as usize].fetch_add(now.wrapping_sub(since), Ordering::Relaxed);
    now
}

/// One more report timed (a recorded one: a paused hook's calls are not timed).
#[inline(always)]
pub fn counted() {
    if ENABLED.load(Ordering::Relaxed) {
        REPORTS.fetch_add(1, Ordering::Relaxed);
    }
}

#[inline(always)]
fn ticks() -> u64 {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: rdtsc has no preconditions on x86-64.
    unsafe {
        std::arch::x86_64::_rdtsc()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        clock().0.elapsed().as_nanos() as u64
    }
}

/// The monotonic clock and the counter when timing started: the counter's rate is measured
/// between it and now.
fn clock() -> &'static (Instant, u64) {
    static CLOCK: std::sync::OnceLock<(Instant, u64)> = std::sync::OnceLock::new();
    CLOCK.get_or_init(|| (Instant::now(), ticks()))
}

/// Nanoseconds per report of each phase so far; None when not timing (or nothing timed).
pub fn report() -> Option<PhaseTimes> {
    let reports = REPORTS.load(Ordering::Relaxed);
    if !ENABLED.load(Ordering::Relaxed) || reports == 0 {
        return None;
    }
    let (started, at) = clock();
    let ns = started.elapsed().as_nanos() as f64;
    let ticks_per_ns = (ticks().wrapping_sub(*at)) as f64 / ns.max(1.0);
    let per_report =
        |phase: Phase| TICKS[phase as usize].load(Ordering::Relaxed) as f64 / ticks_per_ns / reports as f64;
    Some(PhaseTimes {
        reports,
        autograd_ns: per_report(Phase::Autograd),
        walk_ns: per_report(Phase::Walk),
        record_ns: per_report(Phase::Record),
        forward_ns: per_report(Phase::Forward),
        hook_ns: per_report(Phase::Hook),
    })
}
