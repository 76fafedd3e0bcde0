//! eBPF capture: loads the driver and process programs into the kernel with one shared ring
//! buffer, tracks the processes to record, attaches the driver probes to each libcuda file and
//! the allocator probe to each libc10 file (for every process, or for one process while its
//! capture level is raised), and reads the drop counters. Nothing outside this module touches
//! BPF objects. Each probe goes where the kernel can run the probed instruction without a second
//! trap (`placement`).

mod placement;
mod probes;
mod record;

pub use record::{flags, Record, HANDLE_LEN};

use std::cell::RefCell;
use std::mem::MaybeUninit;
use std::os::fd::AsFd;
use std::rc::Rc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{Link, MapCore, MapFlags, OpenObject, RingBuffer, RingBufferBuilder, UprobeMultiOpts, UprobeOpts};

use gpuprof_ebpf::allocator::types::gp_phase;
use gpuprof_ebpf::allocator::{AllocatorSkel, AllocatorSkelBuilder};
use gpuprof_ebpf::driver::{DriverSkel, DriverSkelBuilder};
use gpuprof_ebpf::process::{ProcessSkel, ProcessSkelBuilder};
use gpuprof_ebpf::types::gp_counter;
// PyTorch's allocator report, probed here and interposed by the shim: spelled once, in the model.
use gpuprof_model::framework::PYTORCH_SEGMENT_FUNCTIONS;
use gpuprof_model::shim::{ALLOCATOR_SYMBOL, OOM_REPORT_SYMBOL};
use gpuprof_procfs::elf;

use crate::libcuda::LibraryFile;

/// How the driver probes are put on a library.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeLinks {
    /// One uprobe-multi link per library and direction (kernel 6.6+): attached and detached in
    /// one step each.
    Multi,
    /// One perf-event link per probe (older kernels); each detach waits for a grace period.
    PerfEvent,
}

impl ProbeLinks {
    /// Multi where the running kernel has it; `GPUPROF_PROBE_LINKS=perf-event|multi` overrides.
    pub(crate) fn for_this_kernel() -> Self {
        match std::env::var("GPUPROF_PROBE_LINKS").as_deref() {
            Ok("perf-event") => return ProbeLinks::PerfEvent,
            Ok("multi") => return ProbeLinks::Multi,
            _ => {}
        }
        if kernel_version() >= (6, 6) {
            ProbeLinks::Multi
        } else {
            ProbeLinks::PerfEvent
        }
    }
}

/// (major, minor) of the running kernel; (0, 0) when unreadable.
fn kernel_version() -> (u32, u32) {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut parts = release.trim().split(|c: char| !c.is_ascii_digit()).map(|p| p.parse().unwrap_or(0));
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0))
}

/// Settings fixed at load time.
#[derive(Debug, Clone, Copy)]
pub struct CaptureOptions {
    pub ring_buffer_bytes: u32,
    pub probe_links: ProbeLinks,
    /// Walk the Python stack of every call.
    pub python_stacks: bool,
    /// Node daemon: every process that calls a probed function is tracked from that call on,
    /// not only the processes given to `track` and their descendants.
    pub track_callers: bool,
    /// A pod's sidecar: ids are this pid namespace's (the kernel's device and inode of
    /// /proc/self/ns/pid), and tasks outside it are not seen. None: the host's ids.
    pub pid_namespace: Option<PidNamespace>,
    /// Where on a function its probes go (`Entry` only to measure what placement saves).
    pub placement: Placement,
    /// The allocator probe runs an empty program (to measure the trap alone: the floor).
    pub empty_allocator_probe: bool,
    /// The allocator probe stamps its phases (`phase_profile`: where its time goes).
    pub profile_phases: bool,
}

/// Where on a function its probes go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// On the first instruction the kernel runs without a second trap, past `endbr64`
    /// (`placement`): the default.
    Placed,
    /// On the function's first instruction, as a naive uprobe goes.
    Entry,
}

/// A pid namespace as the kernel names it: the nsfs device (encoded as the kernel's dev_t) and
/// inode of its /proc/PID/ns/pid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PidNamespace {
    pub dev: u64,
    pub ino: u64,
}

impl PidNamespace {
    /// This process's own.
    pub fn own() -> Result<PidNamespace> {
        use std::os::unix::fs::MetadataExt;
        let path = "/proc/self/ns/pid";
        let meta = std::fs::metadata(path).with_context(|| format!("cannot read {path}: is /proc mounted?"))?;
        let dev = meta.dev();
        // stat(2) encodes the device for user space; the kernel's dev_t is MKDEV(major, minor).
        let (major, minor) = (libc::major(dev) as u64, libc::minor(dev) as u64);
        Ok(PidNamespace { dev: (major << 20) | minor, ino: meta.ino() })
    }
}

impl Default for CaptureOptions {
    fn default() -> Self {
        CaptureOptions {
            ring_buffer_bytes: 16 << 20,
            probe_links: ProbeLinks::for_this_kernel(),
            python_stacks: true,
            track_callers: false,
            pid_namespace: None,
            placement: Placement::Placed,
            empty_allocator_probe: false,
            profile_phases: false,
        }
    }
}

/// Points a skeleton's copies of the shared maps (ring buffer, tracked pids, counters, Python
/// and autograd tables) at the driver skeleton's: the skeletons are separate objects, one
/// set of maps. (A macro: each skeleton's maps are a type of their own.)
macro_rules! share_maps {
    ($from:expr, $to:expr, $skeleton:literal) => {
        for (name, result) in [
            ("ring buffer", $to.events.reuse_fd($from.events.as_fd())),
            ("tracked map", $to.tracked.reuse_fd($from.tracked.as_fd())),
            ("counters", $to.counters.reuse_fd($from.counters.as_fd())),
            ("Python map", $to.python_procs.reuse_fd($from.python_procs.as_fd())),
            ("autograd map", $to.torch_procs.reuse_fd($from.torch_procs.as_fd())),
        ] {
            result.map_err(|e| load_error(&format!("share the {name} with {}", $skeleton), e))?;
        }
    };
}

/// Where the allocator probe's time goes, per report (`--profile-probes`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct PhaseProfile {
    pub reports: u64,
    pub entry_ns: f64,
    pub autograd_ns: f64,
    pub thread_ns: f64,
    pub data_stack_ns: f64,
    pub frames_ns: f64,
    pub output_ns: f64,
}

impl std::fmt::Display for PhaseProfile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "allocator probe per report, by phase: entry {:.0} ns, autograd {:.0} ns, thread state {:.0} ns, data stack {:.0} ns, frames {:.0} ns, output {:.0} ns ({} reports, each phase's clock read included)",
            self.entry_ns, self.autograd_ns, self.thread_ns, self.data_stack_ns, self.frames_ns, self.output_ns, self.reports
        )
    }
}

/// What attaching to one library did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attachment {
    pub library: LibraryFile,
    pub probes: usize,
    /// Entry points of the table that this library does not export (older drivers lack some).
    pub missing: Vec<&'static str>,
}

/// Everything dropped or unmatched in the kernel, summed over CPUs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DropCounters {
    pub ring_buffer_full: u64,
    pub pending_full: u64,
    pub read_failed: u64,
    pub return_unmatched: u64,
    pub stack_unreadable: u64,
    pub allocator_other_device: u64,
    /// Callers the node daemon could not add to the tracked map (their calls were still recorded).
    pub tracked_full: u64,
}

impl DropCounters {
    /// Records lost: events that never reached user space.
    pub(crate) fn lost_events(&self) -> u64 {
        self.ring_buffer_full + self.pending_full
    }
}

/// Where one probe goes in a library: the file offset, the cookie, the symbol (for errors).
type ProbePoint<'s> = (usize, u64, &'s str);

/// The allocator probe on one libc10 file for one process only (a raised capture level):
/// dropping it takes the probe off, and the process's breakpoint with it.
pub(crate) struct ProcessProbe {
    _link: Link,
}

pub struct Capture {
    driver: DriverSkel<'static>,
    allocator: AllocatorSkel<'static>,
    /// Kept alive with the driver object: its programs write to the shared maps.
    _process: ProcessSkel<'static>,
    _tracepoints: Vec<Link>,
    probe_links: ProbeLinks,
    placement: Placement,
    empty_allocator_probe: bool,
    ring: RingBuffer<'static>,
    /// Records the ring buffer callback copied out, handed to the caller after each poll.
    received: Rc<RefCell<Received>>,
    uprobes: RefCell<Vec<Link>>,
    attached: RefCell<Vec<Attachment>>,
    /// libc10 files whose out-of-memory report is probed (beside their allocator report, or not).
    oom_reports: RefCell<Vec<(u64, u64)>>,
}

impl Capture {
    /// Loads and verifies the programs and attaches the process tracepoints.
    pub fn load(options: CaptureOptions) -> Result<Capture> {
        // The skeletons borrow their objects for as long as they live; a capture lives for the
        // whole run of the agent, so the objects are given a static home.
        let driver_object: &'static mut MaybeUninit<OpenObject> = Box::leak(Box::new(MaybeUninit::uninit()));
        let process_object: &'static mut MaybeUninit<OpenObject> = Box::leak(Box::new(MaybeUninit::uninit()));

        let mut open_driver =
            DriverSkelBuilder::default().open(driver_object).map_err(|e| load_error("open the driver probes", e))?;
        open_driver
            .maps
            .events
            .set_max_entries(options.ring_buffer_bytes)
            .map_err(|e| load_error("size the ring buffer", e))?;
        // Wake the reader when an eighth of the buffer waits; it drains on its timer otherwise.
        let wakeup_bytes = u64::from(options.ring_buffer_bytes / 8);
        let (pidns_dev, pidns_ino) = options.pid_namespace.map_or((0, 0), |ns| (ns.dev, ns.ino));
        if let Some(rodata) = open_driver.maps.rodata_data.as_deref_mut() {
            rodata.wakeup_bytes = wakeup_bytes;
            rodata.python_stacks = options.python_stacks;
            rodata.track_callers = options.track_callers;
            rodata.pidns_dev = pidns_dev;
            rodata.pidns_ino = pidns_ino;
        }
        let multi = options.probe_links == ProbeLinks::Multi;
        open_driver.progs.driver_entry_multi.set_autoload(multi);
        open_driver.progs.driver_return_multi.set_autoload(multi);
        open_driver.progs.driver_entry.set_autoload(!multi);
        open_driver.progs.driver_return.set_autoload(!multi);
        open_driver.progs.segment_entry_multi.set_autoload(multi);
        open_driver.progs.segment_entry.set_autoload(!multi);
        let driver = open_driver.load().map_err(|e| load_error("load the driver probes", e))?;

        let mut open_process = ProcessSkelBuilder::default()
            .open(process_object)
            .map_err(|e| load_error("open the process tracepoints", e))?;
        if let Some(rodata) = open_process.maps.rodata_data.as_deref_mut() {
            rodata.wakeup_bytes = wakeup_bytes;
            rodata.pidns_dev = pidns_dev;
            rodata.pidns_ino = pidns_ino;
        }
        share_maps!(driver.maps, open_process.maps, "the process tracepoints");
        let process = open_process.load().map_err(|e| load_error("load the process tracepoints", e))?;

        let allocator_object: &'static mut MaybeUninit<OpenObject> = Box::leak(Box::new(MaybeUninit::uninit()));
        let mut open_allocator = AllocatorSkelBuilder::default()
            .open(allocator_object)
            .map_err(|e| load_error("open the allocator probe", e))?;
        if let Some(rodata) = open_allocator.maps.rodata_data.as_deref_mut() {
            rodata.profile_phases = options.profile_phases;
            rodata.wakeup_bytes = wakeup_bytes;
            rodata.python_stacks = options.python_stacks;
            rodata.track_callers = options.track_callers;
            rodata.pidns_dev = pidns_dev;
            rodata.pidns_ino = pidns_ino;
        }
        let (real, empty) = (!options.empty_allocator_probe, options.empty_allocator_probe);
        open_allocator.progs.allocator_report_multi.set_autoload(multi && real);
        open_allocator.progs.allocator_report.set_autoload(!multi && real);
        open_allocator.progs.allocator_empty_multi.set_autoload(multi && empty);
        open_allocator.progs.allocator_empty.set_autoload(!multi && empty);
        open_allocator.progs.allocator_oom_multi.set_autoload(multi);
        open_allocator.progs.allocator_oom.set_autoload(!multi);
        share_maps!(driver.maps, open_allocator.maps, "the allocator probe");
        let allocator = open_allocator.load().map_err(|e| load_error("load the allocator probe", e))?;

        let tracepoints = vec![
            process.progs.on_fork.attach().map_err(|e| load_error("attach sched_process_fork", e))?,
            process.progs.on_exec.attach().map_err(|e| load_error("attach sched_process_exec", e))?,
            process.progs.on_exit.attach().map_err(|e| load_error("attach sched_process_exit", e))?,
        ];

        let received = Rc::new(RefCell::new(Received::default()));
        let queue = Rc::clone(&received);
        let mut builder = RingBufferBuilder::new();
        builder
            .add(&driver.maps.events, move |data: &[u8]| {
                // A record too short to read still reaches the decoder (empty), which counts it.
                queue.borrow_mut().push(data);
                0
            })
            .map_err(|e| load_error("open the ring buffer", e))?;
        let ring = builder.build().map_err(|e| load_error("open the ring buffer", e))?;

        Ok(Capture {
            driver,
            allocator,
            _process: process,
            _tracepoints: tracepoints,
            probe_links: options.probe_links,
            placement: options.placement,
            empty_allocator_probe: options.empty_allocator_probe,
            ring,
            received,
            uprobes: RefCell::new(Vec::new()),
            attached: RefCell::new(Vec::new()),
            oom_reports: RefCell::new(Vec::new()),
        })
    }

    /// Records this process's calls from now on (its later children follow by fork).
    pub(crate) fn track(&self, pid: u32) -> Result<()> {
        self.driver
            .maps
            .tracked
            .update(&pid.to_ne_bytes(), &[1u8], MapFlags::ANY)
            .with_context(|| format!("cannot track pid {pid}"))
    }

    /// Tells the stack walk where a process's CPython keeps its threads and frames.
    pub(crate) fn set_python(&self, pid: u32, config: &gpuprof_ebpf::types::gp_python) -> Result<()> {
        self.driver
            .maps
            .python_procs
            .update(&pid.to_ne_bytes(), bytes_of(config), MapFlags::ANY)
            .with_context(|| format!("cannot configure Python stacks of pid {pid}"))
    }

    /// Tells the allocator probe where a process's PyTorch keeps autograd's thread-locals.
    pub(crate) fn set_autograd(&self, pid: u32, config: &gpuprof_ebpf::types::gp_autograd) -> Result<()> {
        self.driver
            .maps
            .torch_procs
            .update(&pid.to_ne_bytes(), bytes_of(config), MapFlags::ANY)
            .with_context(|| format!("cannot configure backward attribution of pid {pid}"))
    }

    /// The raw fd of the tracked-process map, for a child to add itself before exec.
    pub fn tracked_map_fd(&self) -> i32 {
        use std::os::fd::AsRawFd;
        self.driver.maps.tracked.as_fd().as_raw_fd()
    }

    /// True when probes are already on this file.
    pub(crate) fn is_attached(&self, library: &LibraryFile) -> bool {
        self.attached.borrow().iter().any(|a| a.library.identity == library.identity)
    }

    /// The file offsets to probe `symbols` at in `library` (placed, unless told otherwise), and
    /// the ones it does not export.
    fn probe_offsets<'s>(
        &self,
        library: &LibraryFile,
        symbols: impl IntoIterator<Item = (&'s str, u64)>,
    ) -> Result<(Vec<ProbePoint<'s>>, Vec<&'s str>)> {
        let placement = self.placement;
        Ok(elf::read(&library.path, |elf| {
            let functions = elf.exported_functions();
            let (mut found, mut missing) = (Vec::new(), Vec::new());
            for (symbol, cookie) in symbols {
                match functions.get(symbol) {
                    Some(&offset) => {
                        let shift = match placement {
                            Placement::Placed => placement::probe_offset(elf.bytes_at(offset, 16)),
                            Placement::Entry => 0,
                        };
                        found.push((offset as usize + shift, cookie, symbol));
                    }
                    None => missing.push(symbol),
                }
            }
            (found, missing)
        })?)
    }

    /// The allocator probe on `library`, for every process (`pid` None) or for one.
    fn allocator_link(&self, library: &LibraryFile, pid: Option<u32>) -> Result<Link> {
        let (found, _) = self.probe_offsets(library, [(ALLOCATOR_SYMBOL, 0)])?;
        let Some(&(offset, _, _)) = found.first() else {
            bail!(
                "{} does not export c10::reportMemoryUsageToProfiler: no tensor-level events from it",
                library.path.display()
            );
        };
        let pid = pid.map_or(-1, |pid| pid as i32);
        let progs = &self.allocator.progs;
        match (self.probe_links, self.empty_allocator_probe) {
            (ProbeLinks::Multi, empty) => {
                let opts = UprobeMultiOpts { offsets: vec![offset], cookies: vec![0], ..Default::default() };
                let program = if empty { &progs.allocator_empty_multi } else { &progs.allocator_report_multi };
                program.attach_uprobe_multi_with_opts(pid, &library.path, "", opts)
            }
            (ProbeLinks::PerfEvent, empty) => {
                let program = if empty { &progs.allocator_empty } else { &progs.allocator_report };
                program.attach_uprobe(false, pid, &library.path, offset)
            }
        }
        .with_context(|| {
            format!("cannot attach a uprobe to c10::reportMemoryUsageToProfiler in {}", library.path.display())
        })
    }

    /// Puts the allocator-report probe on a libc10 file, for every process using it.
    pub(crate) fn attach_allocator(&self, library: &LibraryFile) -> Result<Attachment> {
        let link = self.allocator_link(library, None)?;
        let attachment = Attachment { library: library.clone(), probes: 1, missing: Vec::new() };
        self.uprobes.borrow_mut().push(link);
        self.attached.borrow_mut().push(attachment.clone());
        Ok(attachment)
    }

    /// Puts the allocator-report probe on a libc10 file for process `pid` only (its other users
    /// get no breakpoint, so they pay nothing), until the returned probe is dropped.
    pub(crate) fn attach_allocator_for(&self, library: &LibraryFile, pid: u32) -> Result<ProcessProbe> {
        Ok(ProcessProbe { _link: self.allocator_link(library, Some(pid))? })
    }

    /// Puts an entry probe on the caching allocator's segment functions of a libc10_cuda file
    /// (`model::framework::PYTORCH_SEGMENT_FUNCTIONS`, local symbols of its static table), for
    /// every process using it: the driver calls made inside them are marked as the allocator's.
    /// Called once per segment, not per tensor: the driver's level keeps its cost.
    pub(crate) fn attach_segment_functions(&self, library: &LibraryFile) -> Result<Attachment> {
        let placement = self.placement;
        let targets: Vec<(usize, String)> = elf::read(&library.path, |elf| {
            elf.static_functions_containing(&PYTORCH_SEGMENT_FUNCTIONS)
                .into_iter()
                .map(|(name, offset)| {
                    let shift = match placement {
                        Placement::Placed => placement::probe_offset(elf.bytes_at(offset, 16)),
                        Placement::Entry => 0,
                    };
                    (offset as usize + shift, name)
                })
                .collect()
        })?;
        if targets.is_empty() {
            bail!(
                "{} has no symbol table naming PyTorch's caching allocator (a stripped build): its segments count as the program's own at the driver's level",
                library.path.display()
            );
        }
        let progs = &self.driver.progs;
        let links = match self.probe_links {
            ProbeLinks::Multi => {
                let opts = UprobeMultiOpts {
                    offsets: targets.iter().map(|t| t.0).collect(),
                    cookies: vec![0; targets.len()],
                    ..Default::default()
                };
                vec![progs
                    .segment_entry_multi
                    .attach_uprobe_multi_with_opts(-1, &library.path, "", opts)
                    .with_context(|| {
                        format!("cannot attach uprobes to the caching allocator of {}", library.path.display())
                    })?]
            }
            ProbeLinks::PerfEvent => targets
                .iter()
                .map(|(offset, name)| {
                    progs
                        .segment_entry
                        .attach_uprobe(false, -1, &library.path, *offset)
                        .with_context(|| format!("cannot attach a uprobe to {name} in {}", library.path.display()))
                })
                .collect::<Result<Vec<Link>>>()?,
        };
        let attachment = Attachment { library: library.clone(), probes: targets.len(), missing: Vec::new() };
        self.uprobes.borrow_mut().extend(links);
        self.attached.borrow_mut().push(attachment.clone());
        Ok(attachment)
    }

    /// Puts the out-of-memory report's probe on a libc10 file for every process using it, once
    /// (`c10::reportOutOfMemoryToProfiler`, called when PyTorch's caching allocator gives up on
    /// a request): every level records it. Ok(false) for a libc10 that does not export it.
    pub(crate) fn attach_oom_report(&self, library: &LibraryFile) -> Result<bool> {
        if self.oom_reports.borrow().contains(&library.identity) {
            return Ok(true);
        }
        let (found, _) = self.probe_offsets(library, [(OOM_REPORT_SYMBOL, 0)])?;
        let Some(&(offset, _, _)) = found.first() else { return Ok(false) };
        let progs = &self.allocator.progs;
        let link = match self.probe_links {
            ProbeLinks::Multi => {
                let opts = UprobeMultiOpts { offsets: vec![offset], cookies: vec![0], ..Default::default() };
                progs.allocator_oom_multi.attach_uprobe_multi_with_opts(-1, &library.path, "", opts)
            }
            ProbeLinks::PerfEvent => progs.allocator_oom.attach_uprobe(false, -1, &library.path, offset),
        }
        .with_context(|| {
            format!("cannot attach a uprobe to c10::reportOutOfMemoryToProfiler in {}", library.path.display())
        })?;
        self.uprobes.borrow_mut().push(link);
        self.oom_reports.borrow_mut().push(library.identity);
        Ok(true)
    }

    /// Puts an entry and a return probe on every table entry point the library exports.
    pub fn attach_library(&self, library: &LibraryFile) -> Result<Attachment> {
        let (targets, missing) =
            self.probe_offsets(library, probes::driver_probes().into_iter().map(|probe| (probe.symbol, probe.cookie)))?;
        if targets.is_empty() {
            return Err(anyhow!(
                "{} exports none of the CUDA memory entry points gpuprof probes (is it libcuda?)",
                library.path.display()
            ));
        }
        let links = match self.probe_links {
            ProbeLinks::Multi => self.attach_multi(library, &targets)?,
            ProbeLinks::PerfEvent => self.attach_each(library, &targets)?,
        };
        let attachment = Attachment { library: library.clone(), probes: targets.len(), missing };
        self.uprobes.borrow_mut().extend(links);
        self.attached.borrow_mut().push(attachment.clone());
        Ok(attachment)
    }

    fn attach_multi(&self, library: &LibraryFile, targets: &[(usize, u64, &str)]) -> Result<Vec<Link>> {
        let programs = [(&self.driver.progs.driver_entry_multi, false), (&self.driver.progs.driver_return_multi, true)];
        programs
            .into_iter()
            .map(|(program, retprobe)| {
                let opts = UprobeMultiOpts {
                    offsets: targets.iter().map(|t| t.0).collect(),
                    cookies: targets.iter().map(|t| t.1).collect(),
                    retprobe,
                    ..Default::default()
                };
                program
                    .attach_uprobe_multi_with_opts(-1, &library.path, "", opts)
                    .with_context(|| format!("cannot attach uprobes to {}", library.path.display()))
            })
            .collect()
    }

    fn attach_each(&self, library: &LibraryFile, targets: &[(usize, u64, &str)]) -> Result<Vec<Link>> {
        let mut links = Vec::with_capacity(targets.len() * 2);
        for &(offset, cookie, symbol) in targets {
            for (program, retprobe) in
                [(&self.driver.progs.driver_entry, false), (&self.driver.progs.driver_return, true)]
            {
                let opts = UprobeOpts { cookie, retprobe, ..Default::default() };
                let link = program
                    .attach_uprobe_with_opts(-1, &library.path, offset, opts)
                    .with_context(|| format!("cannot attach a uprobe to {symbol} in {}", library.path.display()))?;
                links.push(link);
            }
        }
        Ok(links)
    }

    /// Waits up to `timeout` for records, then hands every available one to `sink`, in order.
    pub(crate) fn poll(&self, timeout: Duration, sink: &mut dyn FnMut(&Record)) -> Result<()> {
        // A signal (Ctrl-C, SIGCONT after a stop) interrupts the wait; what is there is still read.
        let waited = self.ring.poll_raw(timeout);
        if waited < 0 && waited != -libc::EINTR {
            bail!("reading the ring buffer failed: {}", std::io::Error::from_raw_os_error(-waited));
        }
        self.ring.consume().map_err(|e| anyhow!("reading the ring buffer failed: {e}"))?;
        let mut batch = std::mem::take(&mut *self.received.borrow_mut());
        for record in batch.records() {
            sink(record);
        }
        batch.len = 0;
        *self.received.borrow_mut() = batch;
        Ok(())
    }

    pub(crate) fn drop_counters(&self) -> Result<DropCounters> {
        let map = &self.driver.maps.counters;
        let read = |counter: gp_counter| -> Result<u64> {
            let values = map
                .lookup_percpu(&counter.0.to_ne_bytes(), MapFlags::ANY)
                .context("cannot read the drop counters")?
                .unwrap_or_default();
            Ok(values.iter().map(|v| u64::from_ne_bytes(v[..8].try_into().unwrap_or([0; 8]))).sum())
        };
        Ok(DropCounters {
            ring_buffer_full: read(gp_counter::GP_COUNTER_RINGBUF_FULL)?,
            pending_full: read(gp_counter::GP_COUNTER_PENDING_FULL)?,
            read_failed: read(gp_counter::GP_COUNTER_READ_FAILED)?,
            return_unmatched: read(gp_counter::GP_COUNTER_RETURN_UNMATCHED)?,
            stack_unreadable: read(gp_counter::GP_COUNTER_STACK_UNREADABLE)?,
            allocator_other_device: read(gp_counter::GP_COUNTER_ALLOCATOR_OTHER_DEVICE)?,
            tracked_full: read(gp_counter::GP_COUNTER_TRACKED_FULL)?,
        })
    }

    /// Where the allocator probe's time went per report, when its phases are profiled (ns, by
    /// `gp_phase`, over the reports counted); None otherwise or before any report.
    pub(crate) fn phase_profile(&self) -> Option<PhaseProfile> {
        let map = &self.allocator.maps.phases;
        let read = |phase: gp_phase| -> u64 {
            map.lookup_percpu(&phase.0.to_ne_bytes(), MapFlags::ANY)
                .ok()
                .flatten()
                .map(|values| values.iter().map(|v| u64::from_ne_bytes(v[..8].try_into().unwrap_or([0; 8]))).sum())
                .unwrap_or(0)
        };
        let reports = read(gp_phase::GP_PHASE_REPORTS);
        if reports == 0 {
            return None;
        }
        let per = |phase| read(phase) as f64 / reports as f64;
        Some(PhaseProfile {
            reports,
            entry_ns: per(gp_phase::GP_PHASE_ENTRY),
            autograd_ns: per(gp_phase::GP_PHASE_AUTOGRAD),
            thread_ns: per(gp_phase::GP_PHASE_THREAD),
            data_stack_ns: per(gp_phase::GP_PHASE_DATA_STACK),
            frames_ns: per(gp_phase::GP_PHASE_FRAMES),
            output_ns: per(gp_phase::GP_PHASE_OUTPUT),
        })
    }

    pub(crate) fn attachments(&self) -> Vec<Attachment> {
        self.attached.borrow().clone()
    }
}

/// The records of one poll, kept between polls with their buffers so that reading a record
/// allocates nothing once the buffers have grown.
#[derive(Default)]
struct Received {
    slots: Vec<Record>,
    len: usize,
}

impl Received {
    fn push(&mut self, data: &[u8]) {
        if self.len == self.slots.len() {
            self.slots.push(Record::default());
        }
        self.slots[self.len].parse_into(data);
        self.len += 1;
    }

    fn records(&self) -> &[Record] {
        &self.slots[..self.len]
    }
}

fn load_error(what: &str, error: libbpf_rs::Error) -> anyhow::Error {
    anyhow!("cannot {what} into the kernel: {error} (run with RUST_LOG=debug for libbpf's log)")
}

/// The bytes of a map value: one of the kernel contract's plain-old-data #[repr(C)] structs
/// (generated from gpuprof.h, `Copy`, no pointers).
fn bytes_of<T: Copy>(value: &T) -> &[u8] {
    // SAFETY: T is a #[repr(C)] value type from gpuprof.h; its bytes are read, never written.
    unsafe { std::slice::from_raw_parts((value as *const T).cast::<u8>(), std::mem::size_of::<T>()) }
}
