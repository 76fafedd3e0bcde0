//! `gpuprof attach PID`: an eBPF capture of a process that is already running and of its
//! descendants, until it exits (then of the processes it leaves holding GPU memory), the duration
//! passes or a signal arrives.

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::flags::CaptureArgs;
use gpuprof_capture::kernel::Capture;
use gpuprof_capture::libcuda::{self, LibraryFile};
use gpuprof_capture::session::{EbpfSource, Scope, Session, Until};
use gpuprof_capture::signals;
use gpuprof_procfs::process;

const WAIT_INTERVAL: Duration = Duration::from_millis(20);

/// Returns the exit code of gpuprof.
pub fn attach(pid: u32, wait: bool, args: &CaptureArgs) -> Result<u8> {
    let started = Instant::now();
    let duration = args.duration()?;
    args.rules.config()?;
    if !process::is_running(pid) {
        bail!("no process with pid {pid}: check the pid with `ps -p {pid}` (it may have exited)");
    }
    crate::doctor::check_ebpf_capture()?;
    signals::install();

    let mut libraries = target_libraries(pid, args)?;
    if libraries.is_empty() && !wait {
        bail!(
            "process {pid} ({}) has not loaded libcuda.so: it has not initialised CUDA yet; use --wait to wait until it does, or --libcuda PATH to probe a library it will load",
            process::comm(pid)
        );
    }
    let destination = args.destination(&format!("{}-{pid}", process::comm(pid)))?;
    let capture = Capture::load(args.capture_options()?)?;
    tracing::debug!(elapsed_ms = started.elapsed().as_millis() as u64, "probes loaded");
    let mut ebpf = EbpfSource::new(&capture, args.ebpf_options(), Some(pid));
    ebpf.add_process(pid)?;
    let session = Session::new(args.flow(&destination)?).with_ebpf(ebpf);
    let mut session = args.watched(session);
    let mut hooks = args.watching(&destination);
    session.follow(Scope::Tree(pid));
    tracing::debug!(elapsed_ms = started.elapsed().as_millis() as u64, "processes tracked, interpreters found");
    if libraries.is_empty() {
        eprintln!("gpuprof: waiting for process {pid} ({}) to load libcuda.so", process::comm(pid));
        // --duration bounds the wait too (then the capture, from when it starts).
        libraries = wait_for_libcuda(pid, duration.map(|d| (started + d, d)))?;
    }
    for library in &libraries {
        session.attach(library)?;
    }
    let followed = session.ebpf().map_or(1, |e| e.alive().len());
    eprintln!(
        "gpuprof: capturing pid {pid} ({}) and {}; probes attached in {} ms",
        process::comm(pid),
        gpuprof_model::findings::wording::count(followed as u64 - 1, "descendant", "descendants"),
        started.elapsed().as_millis()
    );

    let deadline = duration.map(|d| Instant::now() + d);
    if session.run(Until::RootExits, deadline, &mut hooks)? == gpuprof_capture::session::Ended::RootExited {
        gpuprof_capture::session::leftovers::follow(&mut session, deadline, "process", &mut hooks)?;
    }
    let findings = args.finish(session, &destination)?;
    Ok(args.exit_status(&findings, 0))
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
        if !process::is_running(pid) {
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
