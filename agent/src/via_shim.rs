//! `gpuprof run --via shim -- CMD…`: capture without eBPF and without privileges. The command
//! runs with gpuprof's shim preloaded (`LD_PRELOAD`, inherited by every descendant); each of its
//! processes connects to a Unix socket this run listens on and sends its events as jsonl. They go
//! through the same flow as eBPF events (tracker, leak rules, output, OTLP). A process that goes
//! away without saying so (`os._exit` in a forked worker) is closed out when its connection ends.

use std::collections::{HashMap, HashSet};
use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use gpuprof_model::event::{wall_clock_ns, Event, Layer, Op, Source};

use crate::cli::CaptureArgs;
use crate::flow::EventFlow;
use crate::session::{duration_of, exit_code_of, find_program, flow_options, supervise};
use crate::shim_socket::{self, ShimCounters, ShimMessage};
use crate::{output, signals};

/// The shim's file name, looked for next to the gpuprof executable.
pub const SHIM_FILE: &str = "libgpuprof_shim.so";
/// How long the end of the run waits for the command's processes to hang up.
const LAST_WORDS: Duration = Duration::from_secs(3);

/// Returns CMD's exit code.
pub fn run(command: &[OsString], args: &CaptureArgs, shim: Option<&Path>) -> Result<u8> {
    let duration = duration_of(args)?;
    let shim = shim_library(shim)?;
    let (program, program_args) = command.split_first().ok_or_else(|| anyhow!("no command given after `--`"))?;
    let program = find_program(program)?;
    signals::install();

    let dir = socket_dir()?;
    let socket = dir.join("shim.sock");
    let received = shim_socket::listen(&socket)?;

    let sink = output::sink(args.format, output::open_writer(args.output.as_deref())?);
    let mut flow = EventFlow::new(flow_options(args)?, sink);
    flow.set_telemetry(args.otlp.start()?);
    let mut child = Command::new(&program)
        .args(program_args)
        .env("LD_PRELOAD", preload_with(&shim))
        .env("GPUPROF_SHIM_SOCKET", &socket)
        .spawn()
        .with_context(|| format!("cannot run `{}`", program.display()))?;
    eprintln!("gpuprof: capturing `{}` through {} (no eBPF)", program.display(), shim.display());

    let mut run = ShimRun::default();
    let deadline = duration.map(|d| Instant::now() + d);
    let status = supervise(&mut child, deadline, || run.receive(&received, &mut flow, Duration::from_millis(100)))?;
    // The command's processes send what they still hold as they exit.
    let waited = Instant::now();
    while !run.connections.is_empty() && waited.elapsed() < LAST_WORDS {
        run.receive(&received, &mut flow, Duration::from_millis(50))?;
    }
    run.receive(&received, &mut flow, Duration::ZERO)?;
    let _ = std::fs::remove_dir_all(&dir);
    let stats = run.stats_line(flow.events());
    flow.finish(&stats)?;
    Ok(match status {
        Some(status) => exit_code_of(status),
        None => {
            eprintln!("gpuprof: stopped before the command exited; it is still running as pid {}", child.id());
            0
        }
    })
}

/// What the run knows of the command's processes.
#[derive(Default)]
struct ShimRun {
    /// Open connections, and the pid each one speaks for (known from its first event).
    connections: HashMap<u64, Option<u32>>,
    /// Processes that said they exit.
    exited: HashSet<u32>,
    processes: HashSet<u32>,
    counters: ShimCounters,
    undecodable: u64,
    closed_without_exit: u64,
}

impl ShimRun {
    fn receive(&mut self, received: &Receiver<ShimMessage>, flow: &mut EventFlow, wait: Duration) -> Result<()> {
        let mut next = received.recv_timeout(wait).ok();
        while let Some(message) = next {
            match message {
                ShimMessage::Event { connection, event } => {
                    self.connections.insert(connection, Some(event.pid));
                    self.processes.insert(event.pid);
                    if event.layer == Layer::Process && event.op == Op::Exit {
                        self.exited.insert(event.pid);
                    }
                    flow.observe(event).context("cannot write the output")?;
                }
                ShimMessage::Counters(counters) => self.counters.add(&counters),
                ShimMessage::Undecodable => self.undecodable += 1,
                ShimMessage::Closed { connection } => self.closed(connection, flow)?,
            }
            next = received.try_recv().ok();
        }
        flow.flush()
    }

    /// A process hung up: if it never said it exits (os._exit, a signal), it has exited now.
    fn closed(&mut self, connection: u64, flow: &mut EventFlow) -> Result<()> {
        let Some(Some(pid)) = self.connections.remove(&connection) else { return Ok(()) };
        if self.exited.insert(pid) {
            self.closed_without_exit += 1;
            let mut exit = Event::new(wall_clock_ns(), pid, pid, Source::Cupti, Layer::Process, Op::Exit, "exit".into());
            exit.comm = crate::procfs::comm(pid);
            flow.observe(exit).context("cannot write the output")?;
        }
        Ok(())
    }

    fn stats_line(&self, events: u64) -> String {
        format!(
            "{events} events from {} processes via the shim; dropped {} (queue full in the process); stacks cut {}, unresolved {}; undecodable lines {}; processes closed out by hanging up {}",
            self.processes.len(),
            self.counters.dropped_queue_full,
            self.counters.stacks_cut,
            self.counters.stacks_unresolved,
            self.undecodable,
            self.closed_without_exit
        )
    }
}

/// `--shim`, else next to the gpuprof executable.
fn shim_library(given: Option<&Path>) -> Result<PathBuf> {
    let path = match given {
        Some(path) => path.to_path_buf(),
        None => std::env::current_exe().context("cannot find gpuprof's own path")?.with_file_name(SHIM_FILE),
    };
    if !path.is_file() {
        bail!(
            "the shim library {} does not exist: build it with `cargo build -p gpuprof-shim` (it is installed next to gpuprof), or name it with --shim PATH",
            path.display()
        );
    }
    // The dynamic loader resolves a relative LD_PRELOAD against each process's own directory.
    path.canonicalize().with_context(|| format!("cannot resolve {}", path.display()))
}

/// LD_PRELOAD with the shim first and what the environment already preloads after it.
fn preload_with(shim: &Path) -> OsString {
    let mut preload = shim.as_os_str().to_os_string();
    if let Some(existing) = std::env::var_os("LD_PRELOAD").filter(|v| !v.is_empty()) {
        preload.push(OsStr::new(":"));
        preload.push(existing);
    }
    preload
}

/// A private directory for the socket: under $XDG_RUNTIME_DIR when there is one.
fn socket_dir() -> Result<PathBuf> {
    let base = std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from).unwrap_or_else(std::env::temp_dir);
    let dir = base.join(format!("gpuprof-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    Ok(dir)
}
