//! The eBPF source of a capture session: records from the ring buffer are decoded (`decode`),
//! enriched from their processes (`enrich`: callers, Python stacks, autograd nodes, /proc), then
//! handed to the session's flow; between polls, the processes followed
//! are searched for libraries to probe (libcuda, libc10) and interpreters to read.

use std::collections::{HashMap, HashSet};
use std::io;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use gpuprof_model::event::{Event, Op};
use gpuprof_model::Level;

use super::KernelStats;
use crate::clock::Clock;
use crate::decode::Decoder;
use crate::enrich::autograd_nodes::{AutogradConfig, Configured};
use crate::enrich::Enricher;
use crate::flow::EventFlow;
use crate::kernel::{Capture, DropCounters, ProcessProbe, Record};
use crate::libcuda::{self, LibraryFile};

/// How often followed processes' maps are checked for a library not probed yet.
const DISCOVERY_INTERVAL: Duration = Duration::from_millis(200);
/// Poll interval while a new program's interpreter is being looked for: it must be found before
/// the program gets to its first CUDA call.
const DISCOVERY_POLL: Duration = Duration::from_millis(2);

/// What the eBPF source does besides capturing.
pub struct EbpfOptions {
    /// Read PyTorch's autograd state at each allocator event: backward-pass blocks get the
    /// forward line of their node.
    pub autograd: bool,
    /// What is recorded of every process: below `Tensors`, no libc10 is probed (a process's
    /// level is raised on its own with `raise`).
    pub level: Level,
}

/// Which libraries of one process are probed.
#[derive(Debug, Default, Clone, Copy)]
struct Probed {
    libcuda: bool,
    libc10: bool,
    /// The caching allocator's segment functions of its libc10_cuda (every level).
    segments: bool,
    /// PyTorch's out-of-memory report in its libc10 (every level).
    oom_report: bool,
    /// Backward attribution configured (or known impossible) for the process's libtorch_cpu.
    autograd: bool,
}

impl Probed {
    fn all(&self) -> bool {
        self.libcuda && self.libc10 && self.segments && self.oom_report && self.autograd
    }
}

/// The kernel's events: ring buffer → decode → enrich → flow, and the discovery of libraries and
/// interpreters in the processes it follows.
pub struct EbpfSource<'c> {
    capture: &'c Capture,
    decoder: Decoder,
    enricher: Enricher,
    /// None when backward attribution is off.
    autograd: Option<AutogradConfig>,
    /// What every process gets recorded at.
    level: Level,
    /// The process whose exit ends an `attach`, and whether the kernel said it exited.
    root: Option<u32>,
    root_exited: bool,
    /// Tracked processes believed alive: the root and the descendants seen forking.
    alive: HashSet<u32>,
    /// Processes whose libcuda (and libc10, once a process has loaded PyTorch) are probed: their
    /// maps need no more scans for that library.
    probed: HashMap<u32, Probed>,
    /// Processes raised above `level`: their own allocator probes.
    raised: HashMap<u32, Vec<ProcessProbe>>,
    /// libc10_cuda files whose caching allocator could not be probed (said once each).
    unprobed_allocators: HashSet<(u64, u64)>,
    /// Processes ever followed (given, forked, or tracked by the kernel at their first call)
    /// and seen to exit.
    followed_total: u64,
    exited_total: u64,
    decode_errors: u64,
    last_discovery: Instant,
}

impl<'c> EbpfSource<'c> {
    /// `root`: the process attached to, whose exit ends an `attach` (`Until::RootExits`), or the
    /// command `run` started (it ends on the command's exit); none for `top` and `daemon`.
    pub fn new(capture: &'c Capture, options: EbpfOptions, root: Option<u32>) -> Self {
        let now = Instant::now();
        EbpfSource {
            capture,
            decoder: Decoder::new(Clock::new()),
            enricher: Enricher::default(),
            autograd: options.autograd.then(AutogradConfig::default),
            level: options.level,
            root,
            root_exited: false,
            alive: root.into_iter().collect(),
            probed: HashMap::new(),
            raised: HashMap::new(),
            unprobed_allocators: HashSet::new(),
            followed_total: root.map_or(0, |_| 1),
            exited_total: 0,
            decode_errors: 0,
            last_discovery: now,
        }
    }

    /// The root process (see `new`) exited: the kernel said so, or it is gone.
    pub(crate) fn root_exited(&self) -> bool {
        self.root_exited || self.root.is_some_and(|pid| !gpuprof_procfs::process::is_running(pid))
    }

    /// A process another capture (the shim) speaks for: followed from now on.
    pub(crate) fn heard_of(&mut self, pid: u32) {
        if !self.alive.contains(&pid) {
            self.follow(pid);
        }
    }

    /// Looks for the interpreters of processes just followed now, rather than at the next poll:
    /// a process found by a scan may make its first call at any moment.
    pub(crate) fn discover_interpreters(&mut self) {
        self.enricher.pythons.discover(self.capture);
    }

    /// Follows one more process (and, by fork, its future children).
    pub fn add_process(&mut self, pid: u32) -> Result<()> {
        self.capture.track(pid)?;
        self.follow(pid);
        Ok(())
    }

    fn follow(&mut self, pid: u32) {
        if self.alive.insert(pid) {
            self.followed_total += 1;
        }
        self.enricher.pythons.look_for(pid);
    }

    /// Processes followed and believed alive.
    pub fn alive(&self) -> &HashSet<u32> {
        &self.alive
    }

    pub(crate) fn attach(&mut self, flow: &mut EventFlow, library: &LibraryFile) -> Result<()> {
        if self.capture.is_attached(library) {
            return Ok(());
        }
        let attachment = self.capture.attach_library(library)?;
        tracing::debug!(missing = ?attachment.missing, "entry points this libcuda does not export");
        flow.notice(format!("probing {} entry points of {}", attachment.probes, library.path.display()));
        Ok(())
    }

    /// Reads what the ring buffer has (waiting up to `timeout`) into `flow`.
    pub(crate) fn pump(&mut self, flow: &mut EventFlow, timeout: Duration) -> Result<()> {
        let capture = self.capture;
        let timeout = if self.enricher.pythons.is_looking() { timeout.min(DISCOVERY_POLL) } else { timeout };
        let mut failure: Option<io::Error> = None;
        capture.poll(timeout, &mut |record| {
            if failure.is_none() {
                failure = self.handle(flow, record).err();
            }
        })?;
        if let Some(error) = failure {
            return Err(error).context("cannot write the output");
        }
        self.enricher.pythons.refresh_epochs(capture);
        if self.enricher.pythons.is_looking() {
            self.enricher.pythons.discover(capture);
            for warning in self.enricher.pythons.take_warnings() {
                flow.warn(warning);
            }
            // A new program maps its libraries now: probe them before its first calls.
            self.discover_libraries(flow);
        }
        Ok(())
    }

    fn handle(&mut self, flow: &mut EventFlow, record: &Record) -> io::Result<()> {
        if record.code.is_some() {
            self.enricher.pythons.remember(record);
            return Ok(());
        }
        let mut event = match self.decoder.decode(record) {
            Ok(event) => event,
            Err(error) => {
                if self.decode_errors == 0 {
                    tracing::warn!("skipping an undecodable record: {error}");
                }
                self.decode_errors += 1;
                return Ok(());
            }
        };
        self.follow_process_tree(&event);
        self.enricher.enrich(record, &mut event);
        flow.observe(event)
    }

    fn follow_process_tree(&mut self, event: &Event) {
        match event.op {
            Op::Fork => {
                if self.alive.insert(event.pid) {
                    self.followed_total += 1;
                }
                if let Some(parent) = event.ppid {
                    self.enricher.pythons.forked(event.pid, parent);
                }
            }
            Op::Exec => {
                self.probed.remove(&event.pid);
                // The new program's libraries are others: raised again if still asked to.
                self.raised.remove(&event.pid);
                self.enricher.pythons.look_for(event.pid);
            }
            Op::Exit => {
                if self.alive.remove(&event.pid) {
                    self.exited_total += 1;
                }
                self.probed.remove(&event.pid);
                self.raised.remove(&event.pid);
                self.enricher.pythons.forget(event.pid);
                if Some(event.pid) == self.root {
                    self.root_exited = true;
                }
            }
            // The kernel tracked this process at its first probed call (node daemon): follow
            // it like one found by a scan, its interpreter and libc10 included.
            _ if !self.alive.contains(&event.pid) => self.follow(event.pid),
            _ => {}
        }
    }

    /// Periodic work between polls: new libcuda files.
    pub(crate) fn tick(&mut self, flow: &mut EventFlow) {
        if self.last_discovery.elapsed() >= DISCOVERY_INTERVAL {
            self.last_discovery = Instant::now();
            self.discover_libraries(flow);
        }
    }

    /// A tracked process may load a libcuda other than the one probed (another path, a
    /// container's copy): probe it as soon as it appears in the process's maps.
    pub(crate) fn discover_libraries(&mut self, flow: &mut EventFlow) {
        let pending: Vec<u32> =
            self.alive.iter().copied().filter(|pid| !self.probed.get(pid).is_some_and(Probed::all)).collect();
        for pid in pending {
            let mut probed = self.probed.get(&pid).copied().unwrap_or_default();
            if !probed.libcuda {
                let Ok(libraries) = libcuda::mapped_by(pid) else { continue };
                for library in &libraries {
                    if let Err(error) = self.attach(flow, library) {
                        flow.notice(format!("warning: {error:#}"));
                    }
                }
                probed.libcuda = !libraries.is_empty();
            }
            if !probed.segments {
                let Ok(libraries) = libcuda::mapped_matching(pid, libcuda::is_libc10_cuda) else { continue };
                for library in &libraries {
                    self.attach_segment_functions(flow, library);
                }
                probed.segments = !libraries.is_empty();
            }
            if !probed.oom_report {
                let Ok(libraries) = libcuda::mapped_matching(pid, libcuda::is_libc10) else { continue };
                for library in &libraries {
                    match self.capture.attach_oom_report(library) {
                        Ok(true) => {}
                        Ok(false) => {
                            tracing::debug!(path = %library.path.display(), "no out-of-memory report to probe")
                        }
                        Err(error) => flow.notice(format!("warning: {error:#}")),
                    }
                }
                probed.oom_report = !libraries.is_empty();
            }
            if !probed.libc10 && !self.level.tensors() {
                // Tensor events are not recorded at this level: libc10 stays unprobed (and its
                // users untrapped).
                probed.libc10 = true;
            }
            if !probed.libc10 {
                let Ok(libraries) = libcuda::mapped_matching(pid, libcuda::is_libc10) else { continue };
                for library in &libraries {
                    if let Err(error) = self.attach_allocator(flow, library) {
                        flow.notice(format!("warning: {error:#}"));
                    }
                }
                probed.libc10 = !libraries.is_empty();
            }
            // Autograd's state names the backward pass of a driver call too (the thread that runs
            // it): read once PyTorch's CUDA library is loaded, at every level.
            let torch_loaded = probed.segments || (self.level.tensors() && probed.libc10);
            if torch_loaded && !probed.autograd {
                probed.autograd = self.configure_autograd(flow, pid, self.level.tensors());
            }
            self.probed.insert(pid, probed);
        }
    }

    /// True once there is nothing more to do for this process's autograd (configured, off, or
    /// impossible: said once); false to look again (libtorch_cpu not loaded yet).
    /// `say`: a failure is a warning (where tensor events are recorded); else it is logged only
    /// (at the driver's level autograd's state only names the line running a backward pass).
    fn configure_autograd(&mut self, flow: &mut EventFlow, pid: u32, say: bool) -> bool {
        let Some(autograd) = self.autograd.as_mut() else { return true };
        match autograd.configure(self.capture, pid) {
            Configured::Yes => {
                tracing::debug!(pid, "reading autograd state");
                true
            }
            Configured::NoLibrary => false,
            Configured::No(reason) => {
                match reason {
                    Some(reason) if say => flow.notice(format!("warning: {reason}")),
                    Some(reason) => tracing::debug!(pid, "{reason}"),
                    None => {}
                }
                true
            }
        }
    }

    /// Records process `pid` at `level` from now on, whatever the source's own level: tensor
    /// events through allocator probes of its own on the libc10 files it maps (no other process
    /// gets a breakpoint), dropped again at a lower level. Returns false for a process this
    /// source does not follow.
    pub(crate) fn set_level(&mut self, flow: &mut EventFlow, pid: u32, level: Level) -> Result<bool> {
        if !self.alive.contains(&pid) {
            return Ok(false);
        }
        if !level.tensors() || self.level.tensors() {
            self.raised.remove(&pid);
            return Ok(true);
        }
        if self.raised.contains_key(&pid) {
            return Ok(true);
        }
        let libraries = libcuda::mapped_matching(pid, libcuda::is_libc10)
            .with_context(|| format!("cannot read the libraries of pid {pid}"))?;
        let mut probes = Vec::with_capacity(libraries.len());
        for library in &libraries {
            probes.push(self.capture.attach_allocator_for(library, pid)?);
        }
        if !probes.is_empty() {
            // Backward attribution, as for a process probed from the start.
            let mut probed = self.probed.get(&pid).copied().unwrap_or_default();
            probed.autograd = self.configure_autograd(flow, pid, true);
            self.probed.insert(pid, probed);
        }
        self.raised.insert(pid, probes);
        Ok(true)
    }

    /// The caching allocator's segment probes on a libc10_cuda file, once; a file without them
    /// (stripped) is said once.
    fn attach_segment_functions(&mut self, flow: &mut EventFlow, library: &LibraryFile) {
        if self.capture.is_attached(library) || self.unprobed_allocators.contains(&library.identity) {
            return;
        }
        match self.capture.attach_segment_functions(library) {
            Ok(attachment) => flow.notice(format!(
                "probing {} segment functions of PyTorch's caching allocator in {}",
                attachment.probes,
                library.path.display()
            )),
            Err(error) => {
                self.unprobed_allocators.insert(library.identity);
                flow.notice(format!("warning: {error:#}"));
            }
        }
    }

    fn attach_allocator(&mut self, flow: &mut EventFlow, library: &LibraryFile) -> Result<()> {
        if self.capture.is_attached(library) {
            return Ok(());
        }
        self.capture.attach_allocator(library)?;
        flow.notice(format!("probing c10::reportMemoryUsageToProfiler of {}", library.path.display()));
        Ok(())
    }

    /// Where the allocator probe's time went (`--profile-probes`).
    pub(crate) fn phase_profile(&self) -> Option<crate::kernel::PhaseProfile> {
        self.capture.phase_profile()
    }

    pub(crate) fn drops(&self) -> DropCounters {
        self.capture.drop_counters().unwrap_or_default()
    }

    /// This source's part of the capture's statistics.
    pub(crate) fn stats(&self) -> KernelStats {
        KernelStats {
            drops: self.drops(),
            undecodable: self.decode_errors,
            stacks: self.enricher.pythons.counts,
            processes_followed: self.alive.len() as u64,
            processes_followed_total: self.followed_total,
            processes_exited_total: self.exited_total,
            libraries_probed: self.capture.attachments().len() as u64,
        }
    }
}
