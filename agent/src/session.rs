//! One capture from start to summary, for `attach` (an existing process) and `run` (a command
//! started here): load the probes, track the process tree, stream decoded events to the output,
//! pick up libcuda files that tracked processes load later, and stop when the target ends, the
//! duration passes or a signal arrives.

use std::ffi::OsString;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};

use crate::capture::{Capture, CaptureOptions};
use crate::cli::CaptureArgs;
use crate::flow::FlowOptions;
use crate::libcuda::{self, LibraryFile};
use crate::output::Destination;
use crate::pipeline::{Pipeline, PipelineOptions};
use crate::{preflight, procfs, signals};

const POLL_INTERVAL: Duration = Duration::from_millis(100);
const WAIT_INTERVAL: Duration = Duration::from_millis(20);

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
    let destination = args.destination(&format!("{}-{pid}", procfs::comm(pid)))?;
    let capture = Capture::load(capture_options(args)?)?;
    tracing::debug!(elapsed_ms = started.elapsed().as_millis() as u64, "probes loaded");
    let sink = args.sink(&destination)?;
    let mut session = Pipeline::new(&capture, pipeline_options(args, &destination)?, sink, Some(pid))
        .with_telemetry(args.otlp.start()?);
    session.add_process(pid)?;
    for child in procfs::descendants(pid) {
        // A descendant that exits meanwhile is simply not there to track.
        let _ = session.add_process(child);
    }
    session.python.discover(&capture);
    session.discover_libraries();
    tracing::debug!(elapsed_ms = started.elapsed().as_millis() as u64, "processes tracked, interpreters found");
    if libraries.is_empty() {
        eprintln!("gpuprof: waiting for process {pid} ({}) to load libcuda.so", procfs::comm(pid));
        // --duration bounds the wait too (then the capture, from when it starts).
        libraries = wait_for_libcuda(pid, duration.map(|d| (started + d, d)))?;
    }
    for library in &libraries {
        session.attach(library)?;
    }
    eprintln!(
        "gpuprof: capturing pid {pid} ({}) and {} descendant(s); probes attached in {} ms",
        procfs::comm(pid),
        session.alive().len() - 1,
        started.elapsed().as_millis()
    );

    let deadline = duration.map(|d| Instant::now() + d);
    loop {
        session.pump(POLL_INTERVAL)?;
        if session.root_exited || !procfs::is_running(pid) {
            session.pump(Duration::ZERO)?;
            follow_leftovers(&mut session, deadline, "process")?;
            break;
        }
        if deadline.is_some_and(|d| Instant::now() >= d) || signals::take().is_some() {
            break;
        }
        session.tick();
    }
    session.finish()?;
    args.write_html(&destination)?;
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
    let destination = args.destination(&crate::output::name_of_command(command))?;
    let capture = Capture::load(capture_options(args)?)?;
    let sink = args.sink(&destination)?;
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
    let mut session = Pipeline::new(&capture, pipeline_options(args, &destination)?, sink, Some(child.id()))
        .with_telemetry(args.otlp.start()?);
    let deadline = duration.map(|d| Instant::now() + d);
    let status = supervise(&mut child, deadline, || {
        session.pump(POLL_INTERVAL)?;
        session.tick();
        Ok(())
    })?;
    // The exit tracepoint fires before the parent is told: the records are all there.
    session.pump(Duration::ZERO)?;
    if status.is_some() {
        follow_leftovers(&mut session, deadline, "command")?;
    }
    session.finish()?;
    args.write_html(&destination)?;
    Ok(match status {
        Some(status) => exit_code_of(status),
        None => {
            eprintln!("gpuprof: stopped before the command exited; it is still running as pid {}", child.id());
            0
        }
    })
}

/// The target ended, but processes it started may still hold GPU memory (workers left behind):
/// say who holds what and follow them until they end, the deadline passes or a signal says
/// stop.
fn follow_leftovers(session: &mut Pipeline<'_>, deadline: Option<Instant>, what: &str) -> Result<()> {
    let holders = leftovers(session);
    if holders.is_empty() {
        return Ok(());
    }
    eprintln!(
        "gpuprof: the {what} exited, but {} still {}: following until they exit (Ctrl-C stops gpuprof and leaves them running; `kill {}` ends them)",
        describe(&holders),
        if holders.len() == 1 { "holds GPU memory" } else { "hold GPU memory" },
        pids(&holders),
    );
    loop {
        session.pump(POLL_INTERVAL)?;
        session.tick();
        let holders = leftovers(session);
        if holders.is_empty() {
            eprintln!("gpuprof: the processes left behind have exited");
            return Ok(());
        }
        if deadline.is_some_and(|d| Instant::now() >= d) || signals::take().is_some() {
            eprintln!(
                "gpuprof: stopped following; still running and holding GPU memory: {} (follow them with `gpuprof attach PID`, end them with `kill {}`)",
                describe(&holders),
                pids(&holders)
            );
            return Ok(());
        }
    }
}

/// Live followed processes holding device memory or a CUDA context: (pid, comm, bytes, contexts).
fn leftovers(session: &Pipeline<'_>) -> Vec<(u32, String, u64, u32)> {
    session
        .analyzer()
        .tracker()
        .live_processes()
        .into_iter()
        .filter(|p| (p.device_bytes() > 0 || p.contexts() > 0) && procfs::is_running(p.pid))
        .map(|p| (p.pid, p.comm.to_string(), p.device_bytes(), p.contexts()))
        .collect()
}

/// "pid 12 (python3) 1.0 GiB and a CUDA context, pid 13 (python3) a CUDA context".
fn describe(holders: &[(u32, String, u64, u32)]) -> String {
    let one = |(pid, comm, bytes, contexts): &(u32, String, u64, u32)| {
        let held = match (*bytes, *contexts) {
            (0, _) => "a CUDA context".to_string(),
            (bytes, 0) => gpuprof_model::bytes::human(bytes),
            (bytes, _) => format!("{} and a CUDA context", gpuprof_model::bytes::human(bytes)),
        };
        format!("pid {pid} ({comm}) {held}")
    };
    holders.iter().map(one).collect::<Vec<_>>().join(", ")
}

fn pids(holders: &[(u32, String, u64, u32)]) -> String {
    holders.iter().map(|(pid, ..)| pid.to_string()).collect::<Vec<_>>().join(" ")
}

/// Runs `step` until the command exits (its status), or a second SIGINT/SIGTERM or the deadline
/// ends the run first (none); the first signal is forwarded to the command.
pub(crate) fn supervise(
    child: &mut Child,
    deadline: Option<Instant>,
    mut step: impl FnMut() -> Result<()>,
) -> Result<Option<std::process::ExitStatus>> {
    let mut forwarded_signal = false;
    loop {
        step()?;
        if let Some(status) = child.try_wait().context("cannot wait for the command")? {
            return Ok(Some(status));
        }
        if let Some(signal) = signals::take() {
            if forwarded_signal {
                return Ok(None);
            }
            // SAFETY: kill(2) on our own child's pid.
            unsafe { libc::kill(child.id() as i32, signal) };
            forwarded_signal = true;
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Ok(None);
        }
    }
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
    command.spawn().with_context(|| format!("cannot run `{}`", program.display()))
}

/// The executable a command names, looked up in PATH like a shell would, before anything is
/// loaded into the kernel.
pub(crate) fn find_program(program: &OsString) -> Result<PathBuf> {
    let name = Path::new(program);
    let is_executable =
        |path: &Path| std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0);
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

pub(crate) fn exit_code_of(status: std::process::ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(code), _) => code as u8,
        (None, Some(signal)) => (128 + signal) as u8,
        (None, None) => 1,
    }
}

pub(crate) fn duration_of(args: &CaptureArgs) -> Result<Option<Duration>> {
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

fn pipeline_options(args: &CaptureArgs, destination: &Destination) -> Result<PipelineOptions> {
    Ok(PipelineOptions {
        flow: flow_options(args, destination)?,
        print_stats: args.stats,
        autograd: !args.no_stacks && !args.no_autograd,
    })
}

/// What `attach` and `run` do with their events, whichever capture makes them.
pub(crate) fn flow_options(args: &CaptureArgs, destination: &Destination) -> Result<FlowOptions> {
    Ok(FlowOptions {
        rules: args.rules.config()?,
        format: destination.format,
        output_file: destination.file.clone(),
        findings_file: args.findings.clone(),
        notices: true,
        keep_findings: true,
        pids_are_ours: true,
    })
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
        Some(path) => {
            Ok(vec![LibraryFile::open(path.clone()).with_context(|| format!("--libcuda {}", path.display()))?])
        }
        None => libcuda::mapped_by(pid),
    }
}

/// Waits for `pid` to map libcuda, until `limit` (its deadline and the --duration it came from).
fn wait_for_libcuda(pid: u32, limit: Option<(Instant, Duration)>) -> Result<Vec<LibraryFile>> {
    loop {
        if !procfs::is_running(pid) {
            bail!("process {pid} exited before it loaded libcuda.so");
        }
        if let Some((_, duration)) = limit.filter(|(deadline, _)| Instant::now() >= *deadline) {
            bail!(
                "process {pid} did not load libcuda.so within --duration {} s: nothing was captured",
                duration.as_secs_f64()
            );
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
