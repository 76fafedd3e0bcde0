//! The one capture loop. A session takes events from its sources — the kernel's ring buffer
//! (`ebpf`), the shim's socket (`shim`), or both — into one flow (tracker, leak rules, outputs,
//! OTLP), and turns until a stop condition holds (`Until`), a signal arrives or the deadline
//! passes, running periodic hooks (`Every`) between polls. `attach`, `run`, `run --via shim`,
//! `daemon` and `top` are configurations of it: which sources, which stop condition, which hooks.

mod ebpf_source;
pub mod leftovers;
mod shim_source;
mod stats;

use std::ops::ControlFlow;
use std::process::{Child, ExitStatus};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use crate::flow::EventFlow;
use crate::{libcuda, signals};
pub use ebpf_source::{EbpfOptions, EbpfSource};
use gpuprof_procfs::process;
pub use shim_source::ShimSource;
pub use stats::{CaptureStats, KernelStats, ShimStats, StackCounts};

/// How long a turn waits for events unless the session is told otherwise.
const POLL: Duration = Duration::from_millis(100);

/// When a capture ends, besides a signal (SIGINT/SIGTERM), the deadline or a hook.
pub enum Until<'a> {
    /// A command started here exits. The first signal is passed on to it; a second stops the
    /// capture.
    CommandExits(&'a mut Child),
    /// The root process of the eBPF source (the one attached to) exits.
    RootExits,
    /// The condition holds (checked each turn).
    Holds(&'a dyn Fn(&Session<'_>) -> bool),
    /// Nothing else: a daemon, a terminal view.
    Stopped,
}

/// Why a capture loop ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    CommandExited(ExitStatus),
    RootExited,
    Held,
    Deadline,
    Signal,
    /// A hook said stop (`top`'s q).
    Hook,
}

/// What a hook does with the session; `Break` stops the loop.
type HookAction<'h, 'c> = Box<dyn FnMut(&mut Session<'c>) -> Result<ControlFlow<()>> + 'h>;

/// A hook run every `period` (each turn when zero) with the session; it may stop the loop.
pub struct Every<'h, 'c> {
    period: Duration,
    last: Instant,
    action: HookAction<'h, 'c>,
}

impl<'h, 'c> Every<'h, 'c> {
    pub fn new(period: Duration, action: impl FnMut(&mut Session<'c>) -> Result<ControlFlow<()>> + 'h) -> Self {
        Every { period, last: Instant::now(), action: Box::new(action) }
    }
}

/// Which processes a session looks for, besides those its sources report.
#[derive(Debug, Clone, Copy)]
pub enum Scope {
    /// One process and its descendants.
    Tree(u32),
    /// Every process on the node that maps libcuda or libc10.
    Node,
}

/// One capture: its sources, the flow their events go through, the loop.
pub struct Session<'c> {
    flow: EventFlow,
    ebpf: Option<EbpfSource<'c>>,
    shim: Option<ShimSource>,
    poll: Duration,
    started: Instant,
    /// The capture's counters at the end (`--stats`); said anyway when events were lost.
    counters: bool,
}

impl<'c> Session<'c> {
    pub fn new(flow: EventFlow) -> Self {
        Session { flow, ebpf: None, shim: None, poll: POLL, started: Instant::now(), counters: false }
    }

    /// The counters at the end of the run, always (`--stats`, a daemon's log).
    pub fn with_counters(mut self, counters: bool) -> Self {
        self.counters = counters;
        self
    }

    pub fn with_ebpf(mut self, source: EbpfSource<'c>) -> Self {
        self.ebpf = Some(source);
        self.arrange_two_captures();
        self
    }

    pub fn with_shim(mut self, source: ShimSource) -> Self {
        self.shim = Some(source);
        self.arrange_two_captures();
        self
    }

    /// With both, the shim's process transitions are left to the kernel and a call both capture
    /// is kept once.
    fn arrange_two_captures(&mut self) {
        if let (Some(_), Some(shim)) = (&self.ebpf, &mut self.shim) {
            shim.beside_the_kernel();
            self.flow.keep_one_event_per_call();
        }
    }

    /// How long a turn waits for events.
    pub fn with_poll(mut self, poll: Duration) -> Self {
        self.poll = poll;
        self
    }

    pub fn flow(&self) -> &EventFlow {
        &self.flow
    }

    pub fn ebpf(&self) -> Option<&EbpfSource<'c>> {
        self.ebpf.as_ref()
    }

    pub fn shim(&self) -> Option<&ShimSource> {
        self.shim.as_ref()
    }

    /// Turns until `until` holds, a signal arrives or `deadline` passes, running `hooks` as they
    /// fall due.
    pub fn run(
        &mut self,
        mut until: Until<'_>,
        deadline: Option<Instant>,
        hooks: &mut [Every<'_, 'c>],
    ) -> Result<Ended> {
        self.turn_until(&mut until, deadline, hooks)
    }

    fn turn_until(
        &mut self,
        until: &mut Until<'_>,
        deadline: Option<Instant>,
        hooks: &mut [Every<'_, 'c>],
    ) -> Result<Ended> {
        let mut signal_passed_on = false;
        loop {
            self.pump(self.poll)?;
            self.tick();
            for hook in hooks.iter_mut() {
                if hook.last.elapsed() >= hook.period {
                    hook.last = Instant::now();
                    if (hook.action)(self)?.is_break() {
                        self.pump(Duration::ZERO)?;
                        return Ok(Ended::Hook);
                    }
                }
            }
            let mut ended = match until {
                Until::CommandExits(child) => {
                    child.try_wait().context("cannot wait for the command")?.map(Ended::CommandExited)
                }
                Until::RootExits => {
                    self.ebpf.as_ref().is_some_and(EbpfSource::root_exited).then_some(Ended::RootExited)
                }
                Until::Holds(condition) => condition(self).then_some(Ended::Held),
                Until::Stopped => None,
            };
            if ended.is_none() {
                if let Some(signal) = signals::take() {
                    match until {
                        Until::CommandExits(child) if !signal_passed_on => {
                            // SAFETY: kill(2) on our own child's pid.
                            unsafe { libc::kill(child.id() as i32, signal) };
                            signal_passed_on = true;
                        }
                        _ => ended = Some(Ended::Signal),
                    }
                }
            }
            if ended.is_none() && deadline.is_some_and(|d| Instant::now() >= d) {
                ended = Some(Ended::Deadline);
            }
            if let Some(ended) = ended {
                // What the ring buffer still holds is the capture's too (after an exit: the
                // exit tracepoint fires before the parent is told, so the records are all there).
                self.pump(Duration::ZERO)?;
                return Ok(ended);
            }
        }
    }

    /// Takes what the sources have (the first waiting up to `timeout`) through the flow.
    pub fn pump(&mut self, timeout: Duration) -> Result<()> {
        let mut shim_wait = timeout;
        if let Some(ebpf) = &mut self.ebpf {
            ebpf.pump(&mut self.flow, timeout)?;
            shim_wait = Duration::ZERO;
        }
        if let Some(shim) = &mut self.shim {
            let mut ebpf = self.ebpf.as_mut();
            shim.pump(&mut self.flow, shim_wait, &mut |pid| {
                if let Some(ebpf) = ebpf.as_mut() {
                    ebpf.heard_of(pid);
                }
            })?;
        }
        self.flow.flush()
    }

    /// Periodic work between polls: the sources' (new libraries).
    fn tick(&mut self) {
        if let Some(ebpf) = &mut self.ebpf {
            ebpf.tick(&mut self.flow);
        }
    }

    /// Follows the processes in `scope` not followed yet, their interpreters and libraries: the
    /// one way a session finds processes besides what its sources report.
    /// Returns the processes it followed anew.
    pub fn follow(&mut self, scope: Scope) -> Vec<u32> {
        let Some(ebpf) = &mut self.ebpf else { return Vec::new() };
        let candidates: Vec<u32> = match scope {
            Scope::Tree(root) => std::iter::once(root).chain(process::descendants(root)).collect(),
            Scope::Node => libcuda::cuda_processes_on_node(ebpf.alive()),
        };
        let mut followed = Vec::new();
        for pid in candidates {
            // A process that exits meanwhile is simply not there to follow.
            if !ebpf.alive().contains(&pid) && ebpf.add_process(pid).is_ok() {
                followed.push(pid);
            }
        }
        // Now rather than at the next poll: a process found by a scan may make its first call
        // at any moment.
        ebpf.discover_interpreters();
        ebpf.discover_libraries(&mut self.flow);
        followed
    }

    /// Records process `pid` at `level` from now on, in whichever capture follows it: the kernel's
    /// own probes for it, or a word to its shim. False when neither follows it.
    pub fn set_level(&mut self, pid: u32, level: gpuprof_model::Level) -> Result<bool> {
        let mut known = false;
        if let Some(ebpf) = &mut self.ebpf {
            known |= ebpf.set_level(&mut self.flow, pid, level)?;
        }
        if let Some(shim) = &mut self.shim {
            known |= shim.set_level(pid, level);
        }
        Ok(known)
    }

    pub fn flow_mut(&mut self) -> &mut EventFlow {
        &mut self.flow
    }

    /// Probes a libcuda file (no-op without eBPF, or when it is probed already).
    pub fn attach(&mut self, library: &libcuda::LibraryFile) -> Result<()> {
        match &mut self.ebpf {
            Some(ebpf) => ebpf.attach(&mut self.flow, library),
            None => Ok(()),
        }
    }

    /// See `EventFlow::forget_exited`.
    pub fn forget_exited(&mut self, age: Duration) -> usize {
        self.flow.forget_exited(age)
    }

    /// Events lost on the way (see `CaptureStats::lost`).
    pub fn lost_events(&self) -> u64 {
        match (&self.ebpf, &self.shim) {
            (Some(ebpf), _) => ebpf.drops().lost_events(),
            (None, Some(shim)) => shim.processes().dropped(),
            (None, None) => 0,
        }
    }

    /// What the capture has taken in, followed, dropped and delivered so far.
    pub fn stats(&self) -> CaptureStats {
        CaptureStats {
            seconds: self.started.elapsed().as_secs_f64(),
            events: self.flow.events(),
            processes_tracked: self.flow.analyzer().tracker().processes().len() as u64,
            findings_fired: self.flow.findings_fired(),
            duplicates_dropped: self.flow.duplicates_dropped(),
            lost: self.lost_events(),
            agent_cpu_seconds: process::own_cpu_seconds(),
            kernel: self.ebpf.as_ref().map(EbpfSource::stats),
            shim: self.shim.as_ref().map(ShimSource::stats),
            export: self.flow.export_health(),
            postmortems: self.flow.postmortem_stats(),
        }
    }

    /// What the capture took in, in words: "captured 140 events from 3 CUDA processes in 0.2 s,
    /// none lost".
    fn account(&self, lost: u64) -> String {
        let processes = self.flow.analyzer().tracker().processes().into_iter().filter(|p| p.uses_cuda()).count();
        format!(
            "captured {} from {} in {:.1} s, {}",
            gpuprof_model::findings::wording::count(self.flow.events(), "event", "events"),
            gpuprof_model::findings::wording::count(processes as u64, "CUDA process", "CUDA processes"),
            self.started.elapsed().as_secs_f64(),
            if lost == 0 { "none lost".to_string() } else { format!("{lost} lost (the counters follow)") }
        )
    }

    /// The end of the run: the flow's last findings, and its reporters finished with what was
    /// captured in words (and the counters, with `--stats` or when something was lost; the
    /// phases' costs when they were measured; a warning when the kernel lost events).
    /// Ends the capture (`EventFlow::finish`); the run's findings, where they were kept.
    pub fn finish(self) -> Result<Vec<gpuprof_model::Finding>> {
        let lost = self.lost_events();
        let mut closing = vec![self.account(lost)];
        if self.counters || lost > 0 {
            closing.push(self.stats().to_string());
        }
        if let Some(phases) = self.ebpf.as_ref().and_then(EbpfSource::phase_profile) {
            closing.push(phases.to_string());
        }
        let drops = self.ebpf.as_ref().map(EbpfSource::drops).unwrap_or_default();
        if drops.lost_events() > 0 {
            closing.push(format!(
                "warning: {} events were lost; give a larger --buffer-mib (ring buffer full {}, call table full {})",
                drops.lost_events(),
                drops.ring_buffer_full,
                drops.pending_full
            ));
        }
        self.flow.finish(closing, lost)
    }
}
