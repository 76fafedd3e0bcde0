//! The live path of a capture, shared by `attach`, `run` and `top`: records from the ring buffer
//! are decoded, given their Python stacks, folded into the tracker and the leak rules, and
//! written out; between polls, the processes followed are searched for libraries to probe
//! (libcuda, libc10) and interpreters to read.

use std::collections::{HashMap, HashSet};
use std::io;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use gpuprof_model::dedup::Dedup;
use gpuprof_model::event::{Event, Op};
use gpuprof_model::{Analyzer, Finding};

use crate::autograd::{AutogradConfig, Configured};
use crate::capture::{Capture, DropCounters, Record};
use crate::clock::Clock;
use crate::decode::Decoder;
use crate::flow::{EventFlow, FlowOptions};
use crate::libcuda::{self, LibraryFile};
use crate::output::EventSink;
use crate::python::Pythons;
use crate::telemetry::Telemetry;

/// How often followed processes' maps are checked for a library not probed yet.
const DISCOVERY_INTERVAL: Duration = Duration::from_millis(200);
/// Poll interval while a new program's interpreter is being looked for: it must be found before
/// the program gets to its first CUDA call.
const DISCOVERY_POLL: Duration = Duration::from_millis(2);

/// What a pipeline does besides capturing.
pub struct PipelineOptions {
    pub flow: FlowOptions,
    pub print_stats: bool,
    /// Read PyTorch's autograd state at each allocator event: backward-pass blocks get the
    /// forward line of their node.
    pub autograd: bool,
}

/// Which libraries of one process are probed.
#[derive(Debug, Default, Clone, Copy)]
struct Probed {
    libcuda: bool,
    libc10: bool,
    /// Backward attribution configured (or known impossible) for the process's libtorch_cpu.
    autograd: bool,
}

impl Probed {
    fn all(&self) -> bool {
        self.libcuda && self.libc10 && self.autograd
    }
}

/// The live path of a capture: ring buffer → decode → Python stacks → tracker and leak rules
/// → output, and the discovery of libraries and interpreters in the processes it follows.
pub struct Pipeline<'c> {
    capture: &'c Capture,
    decoder: Decoder,
    pub(crate) python: Pythons,
    /// None when backward attribution is off.
    autograd: Option<AutogradConfig>,
    flow: EventFlow,
    /// With a second capture feeding the flow (the shim): one event per call.
    dedup: Option<Dedup>,
    root: Option<u32>,
    pub(crate) root_exited: bool,
    /// Tracked processes believed alive: the root and the descendants seen forking.
    alive: HashSet<u32>,
    /// Processes whose libcuda (and libc10, once a process has loaded PyTorch) are probed: their
    /// maps need no more scans for that library.
    probed: HashMap<u32, Probed>,
    /// Processes ever followed (given, forked, or tracked by the kernel at their first call)
    /// and seen to exit.
    followed_total: u64,
    exited_total: u64,
    decode_errors: u64,
    started: Instant,
    print_stats: bool,
    last_stats: Instant,
    last_discovery: Instant,
}

impl<'c> Pipeline<'c> {
    /// `root`: the process whose exit ends an `attach` (none for `top`).
    pub fn new(capture: &'c Capture, options: PipelineOptions, sink: Box<dyn EventSink>, root: Option<u32>) -> Self {
        let now = Instant::now();
        Pipeline {
            capture,
            decoder: Decoder::new(Clock::new()),
            python: Pythons::default(),
            autograd: options.autograd.then(AutogradConfig::default),
            flow: EventFlow::new(options.flow, sink),
            dedup: None,
            root,
            root_exited: false,
            alive: root.into_iter().collect(),
            probed: HashMap::new(),
            followed_total: root.map_or(0, |_| 1),
            exited_total: 0,
            decode_errors: 0,
            started: now,
            print_stats: options.print_stats,
            last_stats: now,
            last_discovery: now,
        }
    }

    /// Also sends everything over OTLP.
    pub fn with_telemetry(mut self, telemetry: Option<Telemetry>) -> Self {
        self.flow.set_telemetry(telemetry);
        self
    }

    /// Events also come from the shim: a call both captures see is kept once.
    pub fn with_dedup(mut self) -> Self {
        self.dedup = Some(Dedup::new(gpuprof_model::dedup::DEFAULT_WINDOW_NS));
        self
    }

    /// Second copies of calls dropped so far.
    pub fn duplicates_dropped(&self) -> u64 {
        self.dedup.as_ref().map_or(0, Dedup::dropped)
    }

    /// An event the shim sent (its process transitions are the kernel's to report, so none
    /// come here).
    pub fn observe_from_shim(&mut self, event: Event) -> Result<()> {
        if !self.alive.contains(&event.pid) {
            self.follow(event.pid);
        }
        if self.dedup.as_mut().is_some_and(|d| !d.admit(&event)) {
            return Ok(());
        }
        self.flow.observe(event).context("cannot write the output")
    }

    /// Looks for the interpreters of processes just followed now, rather than at the next poll:
    /// a process found by a scan may make its first call at any moment.
    pub fn discover_interpreters(&mut self) {
        self.python.discover(self.capture);
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
        self.python.look_for(pid);
    }

    /// Processes followed since the start, and those of them seen to exit.
    pub fn process_counts(&self) -> (u64, u64) {
        (self.followed_total, self.exited_total)
    }

    /// See `EventFlow::forget_exited`: a long-running daemon stays bounded under churn.
    pub fn forget_exited(&mut self, age: Duration) -> usize {
        self.flow.forget_exited(age)
    }

    /// Events captured so far.
    pub fn events(&self) -> u64 {
        self.flow.events()
    }

    /// Processes followed and believed alive.
    pub fn alive(&self) -> &HashSet<u32> {
        &self.alive
    }

    /// The OTLP export, when there is one.
    pub fn telemetry(&self) -> Option<&Telemetry> {
        self.flow.telemetry()
    }

    /// libcuda and libc10 files with probes on them.
    pub fn libraries_probed(&self) -> usize {
        self.capture.attachments().len()
    }

    pub fn analyzer(&self) -> &Analyzer {
        self.flow.analyzer()
    }

    /// Findings so far, in the order they fired (none kept without `keep_findings`).
    pub fn findings(&self) -> &[Finding] {
        self.flow.findings()
    }

    /// What NVML says the followed processes use.
    pub fn nvml(&self) -> &crate::nvml::NvmlView {
        self.flow.nvml()
    }

    /// Findings fired so far, kept or not.
    pub fn findings_fired(&self) -> u64 {
        self.flow.findings_fired()
    }

    fn notice(&self, text: String) {
        self.flow.notice(text);
    }

    pub fn attach(&mut self, library: &LibraryFile) -> Result<()> {
        if self.capture.is_attached(library) {
            return Ok(());
        }
        let attachment = self.capture.attach_library(library)?;
        tracing::debug!(missing = ?attachment.missing, "entry points this libcuda does not export");
        self.notice(format!("probing {} entry points of {}", attachment.probes, library.path.display()));
        Ok(())
    }

    /// Reads what the ring buffer has (waiting up to `timeout`) through to the output.
    pub fn pump(&mut self, timeout: Duration) -> Result<()> {
        let capture = self.capture;
        let timeout = if self.python.is_looking() { timeout.min(DISCOVERY_POLL) } else { timeout };
        let mut failure: Option<io::Error> = None;
        capture.poll(timeout, &mut |record| {
            if failure.is_none() {
                failure = self.handle(record).err();
            }
        })?;
        if let Some(error) = failure {
            return Err(error).context("cannot write the output");
        }
        if self.python.is_looking() {
            self.python.discover(capture);
            // A new program maps its libraries now: probe them before its first calls.
            self.discover_libraries();
        }
        self.flow.flush()
    }

    fn handle(&mut self, record: &Record) -> io::Result<()> {
        if record.code.is_some() {
            self.python.remember(record);
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
        self.python.symbolize(record, &mut event);
        if self.dedup.as_mut().is_some_and(|d| !d.admit(&event)) {
            return Ok(());
        }
        self.flow.observe(event)
    }

    fn follow_process_tree(&mut self, event: &Event) {
        match event.op {
            Op::Fork => {
                if self.alive.insert(event.pid) {
                    self.followed_total += 1;
                }
                if let Some(parent) = event.ppid {
                    self.python.forked(event.pid, parent);
                }
            }
            Op::Exec => {
                self.probed.remove(&event.pid);
                self.python.look_for(event.pid);
            }
            Op::Exit => {
                if self.alive.remove(&event.pid) {
                    self.exited_total += 1;
                }
                self.probed.remove(&event.pid);
                self.python.forget(event.pid);
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

    /// Periodic work between polls: new libcuda files, statistics.
    pub fn tick(&mut self) {
        if self.last_discovery.elapsed() >= DISCOVERY_INTERVAL {
            self.last_discovery = Instant::now();
            self.discover_libraries();
        }
        if self.print_stats && self.last_stats.elapsed() >= Duration::from_secs(1) {
            self.last_stats = Instant::now();
            eprintln!("gpuprof: {}", self.stats_line());
        }
    }

    /// A tracked process may load a libcuda other than the one probed (another path, a
    /// container's copy): probe it as soon as it appears in the process's maps.
    pub fn discover_libraries(&mut self) {
        let pending: Vec<u32> =
            self.alive.iter().copied().filter(|pid| !self.probed.get(pid).is_some_and(Probed::all)).collect();
        for pid in pending {
            let mut probed = self.probed.get(&pid).copied().unwrap_or_default();
            if !probed.libcuda {
                let Ok(libraries) = libcuda::mapped_by(pid) else { continue };
                for library in &libraries {
                    if let Err(error) = self.attach(library) {
                        self.notice(format!("warning: {error:#}"));
                    }
                }
                probed.libcuda = !libraries.is_empty();
            }
            if !probed.libc10 {
                let Ok(libraries) = libcuda::mapped_matching(pid, libcuda::is_libc10) else { continue };
                for library in &libraries {
                    if let Err(error) = self.attach_allocator(library) {
                        self.notice(format!("warning: {error:#}"));
                    }
                }
                probed.libc10 = !libraries.is_empty();
            }
            if probed.libc10 && !probed.autograd {
                probed.autograd = self.configure_autograd(pid);
            }
            self.probed.insert(pid, probed);
        }
    }

    /// True once there is nothing more to do for this process's autograd (configured, off, or
    /// impossible: said once); false to look again (libtorch_cpu not loaded yet).
    fn configure_autograd(&mut self, pid: u32) -> bool {
        let Some(autograd) = self.autograd.as_mut() else { return true };
        match autograd.configure(self.capture, pid) {
            Configured::Yes => {
                tracing::debug!(pid, "reading autograd state");
                true
            }
            Configured::NoLibrary => false,
            Configured::No(reason) => {
                if let Some(reason) = reason {
                    self.notice(format!("warning: {reason}"));
                }
                true
            }
        }
    }

    fn attach_allocator(&mut self, library: &LibraryFile) -> Result<()> {
        if self.capture.is_attached(library) {
            return Ok(());
        }
        self.capture.attach_allocator(library)?;
        self.notice(format!("probing c10::reportMemoryUsageToProfiler of {}", library.path.display()));
        Ok(())
    }

    pub fn drops(&self) -> DropCounters {
        self.capture.drop_counters().unwrap_or_default()
    }

    pub fn stats_line(&self) -> String {
        let drops = self.drops();
        let seconds = self.started.elapsed().as_secs_f64();
        let cpu_seconds = crate::procfs::own_cpu_seconds();
        format!(
            "{} events ({:.0}/s) from {} processes in {:.1} s; lost {} (ring buffer full {}, call table full {}); out-pointers unread {}, returns without entry {}, undecodable {}; Python stacks {} from {} interpreters, unresolved {} (unreadable in the kernel {}); allocator reports of other devices {}; agent CPU {:.2} s ({:.2} µs an event)",
            self.events(),
            self.events() as f64 / seconds.max(1e-9),
            self.analyzer().tracker().processes().len(),
            seconds,
            drops.lost_events(),
            drops.ring_buffer_full,
            drops.pending_full,
            drops.read_failed,
            drops.return_unmatched,
            self.decode_errors,
            self.python.counts.symbolized,
            self.python.counts.interpreters,
            self.python.counts.unresolved,
            drops.stack_unreadable,
            drops.allocator_other_device,
            cpu_seconds,
            cpu_seconds * 1e6 / self.events().max(1) as f64
        )
    }

    pub fn finish(self) -> Result<()> {
        let stats = self.stats_line();
        let drops = self.drops();
        self.flow.finish(&stats, drops.lost_events())?;
        if drops.lost_events() > 0 {
            eprintln!(
                "gpuprof: warning: {} events were lost; give a larger --buffer-mib (ring buffer full {}, call table full {})",
                drops.lost_events(),
                drops.ring_buffer_full,
                drops.pending_full
            );
        }
        Ok(())
    }
}
