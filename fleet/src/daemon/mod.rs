//! `gpuprof daemon`: the node sidecar. It captures every CUDA process on the node: the kernel
//! tracks a process from its first probed call (so nothing it does is missed while it is being
//! discovered), and a scan of /proc every `scan_interval` picks up processes that mapped libcuda
//! or libc10 but have not called it yet, and library files not probed yet (a container's own
//! copy). Exits close processes out; their tables are dropped `retain_exited` later, so memory
//! stays bounded under churn. Everything goes out over OTLP (and/or to a jsonl file); health,
//! readiness and the daemon's own counters are served over HTTP. The last seconds of each
//! process's events are kept, and written as a post-mortem when one runs out of memory or a leak
//! finding fires (`gpuprof_capture::postmortem`). SIGTERM flushes and exits 0.

pub(crate) mod config;
mod health;
mod levels;

use std::ops::ControlFlow;
use std::time::Duration;

use anyhow::{Context, Result};

use gpuprof_capture::flow::{EventFlow, FlowOptions};
use gpuprof_capture::kernel::{Capture, CaptureOptions};
use gpuprof_capture::libcuda::{self, LibraryFile};
use gpuprof_capture::postmortem::Postmortems;
use gpuprof_capture::session::{EbpfOptions, EbpfSource, Every, Scope, Session, ShimSource, Until};
use gpuprof_capture::{preflight, shim_socket, signals};
use gpuprof_model::Reporter;
use gpuprof_otlp::reporter::Telemetry;
use gpuprof_views::output::{self, EventOutput, Format, Terminal, TerminalOptions};

pub use config::{CaptureMode, DaemonConfig, DEFAULT_POSTMORTEM_DIR};

const PUBLISH_INTERVAL: Duration = Duration::from_secs(1);
/// How often raises, level requests and due lowerings are looked at.
const LEVELS_INTERVAL: Duration = Duration::from_millis(50);

/// Runs until SIGTERM/SIGINT; returns gpuprof's exit code.
pub fn run(config: DaemonConfig) -> Result<u8> {
    let with_ebpf = config.capture != CaptureMode::Shim;
    if with_ebpf {
        preflight::check_ebpf_capture()?;
    }
    signals::install();
    let health = health::Health::new();
    let (levels, control) = levels::Levels::new(config.level, config.detail);
    // Turned by one hook, read by the one that publishes.
    let levels = std::cell::RefCell::new(levels);
    let listening = health::serve(config.listen, config.metrics_token.clone(), health.clone(), control)?;
    if let Some(dir) = &config.sidecar {
        // Before the socket listens: readiness (the workload's start) means the shim is there.
        share_the_shim(dir)?;
    }
    // A pod's sidecar sees its own pid namespace only (the pod's, shared by its containers).
    let pid_namespace = config
        .sidecar
        .as_ref()
        .filter(|_| with_ebpf)
        .map(|_| gpuprof_capture::kernel::PidNamespace::own())
        .transpose()?;
    let capture = with_ebpf
        .then(|| {
            Capture::load(CaptureOptions {
                ring_buffer_bytes: config.ring_buffer_bytes,
                python_stacks: config.python_stacks,
                track_callers: true,
                pid_namespace,
                ..CaptureOptions::default()
            })
        })
        .transpose()?;

    // The shims' socket, open to whom the configuration says (each connection speaks only for
    // its own process): before the output is opened, so a socket that cannot be made leaves it be.
    let received = config.shim_socket.as_ref().map(|path| shim_socket::listen(path, config.shim_access)).transpose()?;
    let mut flow = EventFlow::new(flow_options(&config), reporters(&config)?);
    if let Some(escalation) = config.escalation {
        flow.escalate(escalation);
    }
    let postmortems_in = match &config.postmortems {
        Some(settings) => match Postmortems::start(settings.clone(), gpuprof_views::export::html::write_file) {
            Ok(postmortems) => {
                flow.keep_postmortems(postmortems);
                Some(settings.dir.clone())
            }
            // The default directory on a host that has none to give: the capture goes on.
            Err(error) if !config.postmortem_dir_given => {
                eprintln!("gpuprof: warning: {error:#}; post-mortems are off");
                None
            }
            Err(error) => return Err(error),
        },
        None => None,
    };
    // Its log keeps the counters: an operator reads them there.
    let mut session = Session::new(flow).with_counters(true);
    if let Some(capture) = &capture {
        let options = EbpfOptions { autograd: config.python_stacks, level: config.level };
        session = session.with_ebpf(EbpfSource::new(capture, options, None));
        if let Some(path) = &config.libcuda {
            let library = LibraryFile::open(path.clone()).with_context(|| format!("--libcuda {}", path.display()))?;
            session.attach(&library)?;
        }
        // The node's own driver, so processes that load it later are captured from their first call.
        if let Some(library) = libcuda::resolve_for_loader().and_then(|path| LibraryFile::open(path).ok()) {
            if let Err(error) = session.attach(&library) {
                eprintln!("gpuprof: warning: {error:#}");
            }
        }
    }
    if let Some(received) = received {
        let mut shim = ShimSource::new(received, !shim_sidecar(&config));
        shim.start_processes_at(config.level);
        session = session.with_shim(shim);
    }
    let already_running = session.follow(Scope::Node);
    let mut forgotten_total = 0u64;
    health.publish(health::Snapshot::of(&session, forgotten_total, &levels.borrow()));
    health.set_ready(true);
    eprintln!("gpuprof: {}", started_line(&config, &session, listening, postmortems_in.as_deref()));
    say_what_came_before(&mut session, &already_running);

    let mut hooks = [
        Every::new(config.scan_interval, |session: &mut Session<'_>| {
            session.follow(Scope::Node);
            Ok(ControlFlow::Continue(()))
        }),
        Every::new(LEVELS_INTERVAL, |session: &mut Session<'_>| {
            levels.borrow_mut().turn(session)?;
            Ok(ControlFlow::Continue(()))
        }),
        Every::new(PUBLISH_INTERVAL, |session: &mut Session<'_>| {
            forgotten_total += session.forget_exited(config.retain_exited) as u64;
            health.publish(health::Snapshot::of(session, forgotten_total, &levels.borrow()));
            Ok(ControlFlow::Continue(()))
        }),
    ];
    session.run(Until::Stopped, None, &mut hooks)?;
    health.set_ready(false);
    eprintln!("gpuprof: daemon stopping: flushing what was captured");
    session.finish()?;
    Ok(0)
}

/// The processes already using CUDA when the daemon starts (it was restarted, or deployed under
/// running jobs): what each allocated before is not known, and that is said, each with how long
/// it had run, so a reader weighs its figures and findings (an exit's live memory, a growth)
/// knowing they count from now.
fn say_what_came_before(session: &mut Session<'_>, already_running: &[u32]) {
    let daemon = std::process::id();
    for &pid in already_running {
        let Some(ran) = gpuprof_procfs::process::started_before(pid, daemon) else { continue };
        let comm = gpuprof_procfs::process::comm(pid);
        session.flow_mut().notice(format!(
            "pid {pid} ({comm}) was already using CUDA, running for {:.1} s, when the daemon started: what it allocated before now is not known to gpuprof; its memory and findings count from now on",
            ran.as_secs_f64()
        ));
    }
}

/// What the daemon says when it is ready: what it captures, from where, where it sends it and
/// where its post-mortems go.
fn started_line(
    config: &DaemonConfig,
    session: &Session<'_>,
    listening: std::net::SocketAddr,
    postmortems_in: Option<&std::path::Path>,
) -> String {
    let node = gpuprof_otlp::reporter::node_name(config.node_name.as_deref());
    let followed = session.ebpf().map_or(0, |e| e.alive().len());
    let postmortems = match (postmortems_in, &config.postmortems) {
        (Some(dir), Some(settings)) => {
            format!("; post-mortems of the last {:.0} s in {}", settings.window.as_secs_f64(), dir.display())
        }
        _ => "; no post-mortems".to_string(),
    };
    let endpoints =
        format!("/healthz /readyz /metrics on {listening}; exporting to {}{postmortems}", destinations(config));
    match (&config.sidecar, config.capture, &config.shim_socket) {
        (Some(dir), CaptureMode::Shim, Some(path)) => format!(
            "sidecar of pod {} on node {node}: the shim is in {}, events taken at {}; {endpoints}",
            pod_name(config),
            dir.display(),
            path.display()
        ),
        (Some(dir), _, _) => format!(
            "sidecar of pod {} on node {node} with eBPF, following {followed} CUDA process(es) of its pid namespace; the shim is in {}; {endpoints}",
            pod_name(config),
            dir.display()
        ),
        (None, CaptureMode::Shim, Some(path)) => {
            format!("daemon on node {node} without eBPF, taking events from shims at {}; {endpoints}", path.display())
        }
        (None, _, _) => format!("daemon on node {node} following {followed} CUDA process(es); {endpoints}"),
    }
}

/// Copies the shim into the pod's shared directory, whole or not at all (a workload starting
/// meanwhile never preloads half a library).
fn share_the_shim(dir: &std::path::Path) -> Result<()> {
    if !dir.is_dir() {
        anyhow::bail!("the sidecar's directory {} does not exist: mount the volume the pod's containers share there (gpuprof inject does)", dir.display());
    }
    let shim = gpuprof_capture::shim_library::find(None)?;
    let target = dir.join(gpuprof_capture::shim_library::LIBRARY_FILE);
    let partial = dir.join(format!(".{}.partial", gpuprof_capture::shim_library::LIBRARY_FILE));
    std::fs::copy(&shim, &partial)
        .with_context(|| format!("cannot copy the shim {} into {}", shim.display(), dir.display()))?;
    std::fs::set_permissions(&partial, std::os::unix::fs::PermissionsExt::from_mode(0o644))
        .with_context(|| format!("cannot make {} readable", partial.display()))?;
    std::fs::rename(&partial, &target).with_context(|| format!("cannot put the shim at {}", target.display()))
}

/// "ml/train-x7k2p", as the downward API names the pod, or "(unnamed)".
fn pod_name(config: &DaemonConfig) -> String {
    let pod = config
        .otlp
        .as_ref()
        .and_then(|o| o.pod.clone())
        .unwrap_or_else(gpuprof_otlp::reporter::PodIdentity::from_environment);
    match (pod.namespace, pod.name) {
        (Some(namespace), Some(name)) => format!("{namespace}/{name}"),
        (None, Some(name)) => name,
        _ => "(unnamed: no K8S_POD_NAME)".to_string(),
    }
}

fn flow_options(config: &DaemonConfig) -> FlowOptions {
    FlowOptions { rules: config.rules, keep_findings: false, pids_are_ours: !shim_sidecar(config) }
}

/// What the daemon's capture goes to: its log (findings as they fire, notices), the events'
/// file when it writes one, the OTLP reporter when it exports.
fn reporters(config: &DaemonConfig) -> Result<Vec<Box<dyn Reporter>>> {
    let log = TerminalOptions {
        format: Format::Jsonl,
        output_file: None,
        findings_file: None,
        notices: true,
        findings_at_the_end: false,
    };
    let mut reporters: Vec<Box<dyn Reporter>> = vec![Box::new(Terminal::new(log))];
    if let Some(path) = &config.output {
        let format = Format::resolve(None, Some(path))?;
        let sink = output::sink(format, output::open_writer(Some(path))?, true, false)?;
        reporters.push(Box::new(EventOutput::new(sink, Some(path))));
    }
    if let Some(otlp) = config.otlp.clone() {
        reporters.push(Box::new(Telemetry::start(otlp)?));
    }
    Ok(reporters)
}

/// A pod's sidecar taking the shim's events: its processes are in other pid namespaces.
fn shim_sidecar(config: &DaemonConfig) -> bool {
    config.sidecar.is_some() && config.capture == CaptureMode::Shim
}

fn destinations(config: &DaemonConfig) -> String {
    let mut to = Vec::new();
    if let Some(otlp) = &config.otlp {
        to.push(otlp.client.endpoint.clone());
    }
    if let Some(path) = &config.output {
        to.push(path.display().to_string());
    }
    to.join(" and ")
}
