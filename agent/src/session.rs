//! One capture from start to summary, for `attach` (an existing process) and `run` (a command
//! started here): load the probes, track the process tree, stream decoded events to the output,
//! pick up libcuda files that tracked processes load later, and stop when the target ends, the
//! duration passes or a signal arrives.

use std::collections::{HashMap, HashSet};
use std::ffi::OsString;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use gpuprof_model::event::{Event, Op};
use gpuprof_model::{Analyzer, Finding};

use crate::capture::{Capture, CaptureOptions, DropCounters, Record};
use crate::cli::CaptureArgs;
use crate::clock::Clock;
use crate::decode::Decoder;
use crate::libcuda::{self, LibraryFile};
use crate::python::Pythons;
use crate::output::{self, EndOfRun, EventSink, Format};
use crate::{preflight, procfs, signals};

const POLL_INTERVAL: Duration = Duration::from_millis(100);
/// How often tracked processes' maps are checked for a libcuda not probed yet.
const DISCOVERY_INTERVAL: Duration = Duration::from_millis(200);
const WAIT_INTERVAL: Duration = Duration::from_millis(20);
/// Poll interval while a new program's interpreter is being looked for: it must be found before
/// the program gets to its first CUDA call.
const DISCOVERY_POLL: Duration = Duration::from_millis(2);

/// `gpuprof attach PID`: returns the exit code of gpuprof.
pub fn attach(pid: u32, wait: bool, args: &CaptureArgs) -> Result<u8> {
    let started = Instant::now();
    let duration = duration_of(args)?;
    args.rules.config()?;
    if !procfs::is_running(pid) {
        bail!("no process with pid {pid}: check the pid with `ps -p {pid}` (it may have exited)");
    }
    preflight::check_ebpf_capture()?;
    signals::install();

    let mut libraries = target_libraries(pid, args)?;
    if libraries.is_empty() && !wait {
        bail!(
            "process {pid} ({}) has not loaded libcuda.so: it has not initialised CUDA yet; use --wait to wait until it does, or --libcuda PATH to probe a library it will load",
            procfs::comm(pid)
        );
    }
    let capture = Capture::load(capture_options(args)?)?;
    tracing::debug!(elapsed_ms = started.elapsed().as_millis() as u64, "probes loaded");
    let sink = output::sink(args.format, output::open_writer(args.output.as_deref())?);
    let mut session = Session::new(&capture, args, sink, pid)?;
    capture.track(pid)?;
    session.python.look_for(pid);
    for child in procfs::descendants(pid) {
        // A descendant that exits meanwhile is simply not there to track.
        if capture.track(child).is_ok() {
            session.alive.insert(child);
            session.python.look_for(child);
        }
    }
    session.python.discover(&capture);
    session.discover_libraries();
    tracing::debug!(elapsed_ms = started.elapsed().as_millis() as u64, "processes tracked, interpreters found");
    if libraries.is_empty() {
        eprintln!("gpuprof: waiting for process {pid} ({}) to load libcuda.so", procfs::comm(pid));
        libraries = wait_for_libcuda(pid)?;
    }
    for library in &libraries {
        session.attach(library)?;
    }
    eprintln!(
        "gpuprof: capturing pid {pid} ({}) and {} descendant(s); probes attached in {} ms",
        procfs::comm(pid),
        session.alive.len() - 1,
        started.elapsed().as_millis()
    );

    let deadline = duration.map(|d| Instant::now() + d);
    loop {
        session.pump(POLL_INTERVAL)?;
        if session.root_exited || !procfs::is_running(pid) {
            session.pump(Duration::ZERO)?;
            break;
        }
        if deadline.is_some_and(|d| Instant::now() >= d) || signals::take().is_some() {
            break;
        }
        session.tick();
    }
    session.finish()?;
    Ok(0)
}

/// `gpuprof run -- CMD…`: returns CMD's exit code.
pub fn run(command: &[OsString], args: &CaptureArgs) -> Result<u8> {
    let duration = duration_of(args)?;
    args.rules.config()?;
    let (program, program_args) = command.split_first().ok_or_else(|| anyhow!("no command given after `--`"))?;
    let program = find_program(program)?;
    preflight::check_ebpf_capture()?;
    signals::install();

    let library = match &args.libcuda {
        Some(path) => Some(LibraryFile::open(path.clone()).with_context(|| format!("--libcuda {}", path.display()))?),
        None => libcuda::resolve_for_loader().and_then(|path| LibraryFile::open(path).ok()),
    };
    let capture = Capture::load(capture_options(args)?)?;
    let sink = output::sink(args.format, output::open_writer(args.output.as_deref())?);
    match &library {
        Some(library) => {
            let attachment = capture.attach_library(library)?;
            eprintln!("gpuprof: probing {} entry points of {}", attachment.probes, library.path.display());
        }
        None => eprintln!(
            "gpuprof: no {} where the dynamic loader looks; probes will be attached when a process of the command maps one",
            libcuda::SONAME
        ),
    }

    let mut child = spawn_tracked(&capture, &program, program_args)?;
    let mut session = Session::new(&capture, args, sink, child.id())?;
    let deadline = duration.map(|d| Instant::now() + d);
    let mut forwarded_signal = false;
    let status = loop {
        session.pump(POLL_INTERVAL)?;
        if let Some(status) = child.try_wait().context("cannot wait for the command")? {
            // The exit tracepoint fires before the parent is told: the records are all there.
            session.pump(Duration::ZERO)?;
            break Some(status);
        }
        if let Some(signal) = signals::take() {
            if forwarded_signal {
                break None;
            }
            // SAFETY: kill(2) on our own child's pid.
            unsafe { libc::kill(child.id() as i32, signal) };
            forwarded_signal = true;
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            break None;
        }
        session.tick();
    };
    session.finish()?;
    Ok(match status {
        Some(status) => exit_code_of(status),
        None => {
            eprintln!("gpuprof: stopped before the command exited; it is still running as pid {}", child.id());
            0
        }
    })
}

/// Starts the command so that it is tracked before its first instruction: the child adds its
/// own pid to the tracked map between fork and exec.
fn spawn_tracked(capture: &Capture, program: &Path, args: &[OsString]) -> Result<Child> {
    let tracked_fd = capture.tracked_map_fd();
    let mut command = Command::new(program);
    command.args(args);
    // SAFETY: the closure runs between fork and exec and only makes raw syscalls
    // (getpid, bpf), which are async-signal-safe.
    unsafe {
        command.pre_exec(move || {
            let pid = libc::getpid() as u32;
            let value = 1u8;
            let rc = libbpf_rs::libbpf_sys::bpf_map_update_elem(
                tracked_fd,
                (&pid as *const u32).cast(),
                (&value as *const u8).cast(),
                0,
            );
            if rc != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    command
        .spawn()
        .with_context(|| format!("cannot run `{}`", program.display()))
}

/// The executable a command names, looked up in PATH like a shell would, before anything is
/// loaded into the kernel.
fn find_program(program: &OsString) -> Result<PathBuf> {
    let name = Path::new(program);
    let is_executable = |path: &Path| {
        std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if name.components().count() > 1 {
        return match std::fs::metadata(name) {
            Ok(_) if is_executable(name) => Ok(name.to_path_buf()),
            Ok(_) => bail!("cannot run `{}`: it is not an executable file", name.display()),
            Err(error) => bail!("cannot run `{}`: {error}", name.display()),
        };
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| is_executable(candidate))
        .ok_or_else(|| anyhow!("cannot run `{}`: no such command in PATH", name.display()))
}

fn exit_code_of(status: std::process::ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(code), _) => code as u8,
        (None, Some(signal)) => (128 + signal) as u8,
        (None, None) => 1,
    }
}

fn duration_of(args: &CaptureArgs) -> Result<Option<Duration>> {
    args.duration
        .map(|secs| {
            if secs.is_finite() && secs > 0.0 {
                Ok(Duration::from_secs_f64(secs))
            } else {
                Err(anyhow!("--duration {secs}: give a positive number of seconds"))
            }
        })
        .transpose()
}

fn capture_options(args: &CaptureArgs) -> Result<CaptureOptions> {
    let mib = args.buffer_mib;
    if !mib.is_power_of_two() || mib > 1024 {
        bail!("--buffer-mib {mib}: give a power of two from 1 to 1024");
    }
    Ok(CaptureOptions { ring_buffer_bytes: mib << 20, python_stacks: !args.no_stacks, ..CaptureOptions::default() })
}

fn target_libraries(pid: u32, args: &CaptureArgs) -> Result<Vec<LibraryFile>> {
    match &args.libcuda {
        Some(path) => Ok(vec![LibraryFile::open(path.clone()).with_context(|| format!("--libcuda {}", path.display()))?]),
        None => libcuda::mapped_by(pid),
    }
}

fn wait_for_libcuda(pid: u32) -> Result<Vec<LibraryFile>> {
    loop {
        if !procfs::is_running(pid) {
            bail!("process {pid} exited before it loaded libcuda.so");
        }
        if signals::take().is_some() {
            bail!("interrupted while waiting for process {pid} to load libcuda.so");
        }
        let libraries = libcuda::mapped_by(pid)?;
        if !libraries.is_empty() {
            return Ok(libraries);
        }
        std::thread::sleep(WAIT_INTERVAL);
    }
}

/// Which libraries of one process are probed.
#[derive(Debug, Default, Clone, Copy)]
struct Probed {
    libcuda: bool,
    libc10: bool,
}

impl Probed {
    fn both(&self) -> bool {
        self.libcuda && self.libc10
    }
}

struct Session<'c> {
    capture: &'c Capture,
    decoder: Decoder,
    python: Pythons,
    analyzer: Analyzer,
    findings: Vec<Finding>,
    sink: Box<dyn EventSink>,
    format: Format,
    findings_file: Option<PathBuf>,
    root: u32,
    root_exited: bool,
    /// Tracked processes believed alive: the root and the descendants seen forking.
    alive: HashSet<u32>,
    /// Processes whose libcuda (and libc10, once a process has loaded PyTorch) are probed: their
    /// maps need no more scans for that library.
    probed: HashMap<u32, Probed>,
    events: u64,
    decode_errors: u64,
    started: Instant,
    print_stats: bool,
    last_stats: Instant,
    last_discovery: Instant,
}

impl<'c> Session<'c> {
    fn new(capture: &'c Capture, args: &CaptureArgs, sink: Box<dyn EventSink>, root: u32) -> Result<Self> {
        let now = Instant::now();
        let analyzer = Analyzer::new(args.rules.config()?);
        Ok(Session {
            capture,
            decoder: Decoder::new(Clock::new()),
            python: Pythons::default(),
            analyzer,
            findings: Vec::new(),
            sink,
            format: args.format,
            findings_file: args.findings.clone(),
            root,
            root_exited: false,
            alive: HashSet::from([root]),
            probed: HashMap::new(),
            events: 0,
            decode_errors: 0,
            started: now,
            print_stats: args.stats,
            last_stats: now,
            last_discovery: now,
        })
    }

    fn attach(&mut self, library: &LibraryFile) -> Result<()> {
        if self.capture.is_attached(library) {
            return Ok(());
        }
        let attachment = self.capture.attach_library(library)?;
        tracing::debug!(missing = ?attachment.missing, "entry points this libcuda does not export");
        eprintln!("gpuprof: probing {} entry points of {}", attachment.probes, library.path.display());
        Ok(())
    }

    /// Reads what the ring buffer has (waiting up to `timeout`) through to the output.
    fn pump(&mut self, timeout: Duration) -> Result<()> {
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
        self.sink.flush().context("cannot write the output")
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
        let fired = self.analyzer.observe(&mut event);
        self.findings.extend(fired);
        self.events += 1;
        self.sink.event(&event)
    }

    fn follow_process_tree(&mut self, event: &Event) {
        match event.op {
            Op::Fork => {
                self.alive.insert(event.pid);
                if let Some(parent) = event.ppid {
                    self.python.forked(event.pid, parent);
                }
            }
            Op::Exec => {
                self.probed.remove(&event.pid);
                self.python.look_for(event.pid);
            }
            Op::Exit => {
                self.alive.remove(&event.pid);
                self.probed.remove(&event.pid);
                self.python.forget(event.pid);
                if event.pid == self.root {
                    self.root_exited = true;
                }
            }
            _ => {}
        }
    }

    /// Periodic work between polls: new libcuda files, statistics.
    fn tick(&mut self) {
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
    fn discover_libraries(&mut self) {
        let pending: Vec<u32> =
            self.alive.iter().copied().filter(|pid| !self.probed.get(pid).is_some_and(Probed::both)).collect();
        for pid in pending {
            let mut probed = self.probed.get(&pid).copied().unwrap_or_default();
            if !probed.libcuda {
                let Ok(libraries) = libcuda::mapped_by(pid) else { continue };
                for library in &libraries {
                    if let Err(error) = self.attach(library) {
                        eprintln!("gpuprof: warning: {error:#}");
                    }
                }
                probed.libcuda = !libraries.is_empty();
            }
            if !probed.libc10 {
                let Ok(libraries) = libcuda::mapped_matching(pid, libcuda::is_libc10) else { continue };
                for library in &libraries {
                    if let Err(error) = self.attach_allocator(library) {
                        eprintln!("gpuprof: warning: {error:#}");
                    }
                }
                probed.libc10 = !libraries.is_empty();
            }
            self.probed.insert(pid, probed);
        }
    }

    fn attach_allocator(&mut self, library: &LibraryFile) -> Result<()> {
        if self.capture.is_attached(library) {
            return Ok(());
        }
        self.capture.attach_allocator(library)?;
        eprintln!("gpuprof: probing c10::reportMemoryUsageToProfiler of {}", library.path.display());
        Ok(())
    }

    fn drops(&self) -> DropCounters {
        self.capture.drop_counters().unwrap_or_default()
    }

    fn stats_line(&self) -> String {
        let drops = self.drops();
        let seconds = self.started.elapsed().as_secs_f64();
        format!(
            "{} events ({:.0}/s) from {} processes in {:.1} s; lost {} (ring buffer full {}, call table full {}); out-pointers unread {}, returns without entry {}, undecodable {}; Python stacks {} from {} interpreters, unresolved {} (unreadable in the kernel {}); allocator reports of other devices {}",
            self.events,
            self.events as f64 / seconds.max(1e-9),
            self.analyzer.tracker().processes().len(),
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
            drops.allocator_other_device
        )
    }

    fn finish(mut self) -> Result<()> {
        let ended = self.analyzer.finish();
        self.findings.extend(ended);
        let summaries = self.analyzer.tracker().summaries();
        self.sink
            .finish(&EndOfRun { processes: &summaries, findings: &self.findings })
            .context("cannot write the output")?;
        if self.format != Format::Table {
            // The event stream stays pure jsonl; people read the findings on stderr.
            output::findings::write_table(&mut io::stderr(), &self.findings).context("cannot write to stderr")?;
        }
        if let Some(path) = &self.findings_file {
            output::findings::save_json(path, &self.findings)?;
        }
        eprintln!("gpuprof: {}", self.stats_line());
        let drops = self.drops();
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
