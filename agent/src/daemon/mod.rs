//! `gpuprof daemon`: the node sidecar. It captures every CUDA process on the node: the kernel
//! tracks a process from its first probed call (so nothing it does is missed while it is being
//! discovered), and a scan of /proc every `scan_interval` picks up processes that mapped libcuda
//! or libc10 but have not called it yet, and library files not probed yet (a container's own
//! copy). Exits close processes out; their tables are dropped `retain_exited` later, so memory
//! stays bounded under churn. Everything goes out over OTLP (and/or to a jsonl file); health,
//! readiness and the daemon's own counters are served over HTTP. SIGTERM flushes and exits 0.

pub mod config;
mod health;

use std::collections::HashSet;
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use gpuprof_model::Layer;

use crate::capture::{Capture, CaptureOptions};
use crate::flow::EventFlow;
use crate::flow::FlowOptions;
use crate::libcuda::{self, LibraryFile};
use crate::output::{self, Format, NullSink};
use crate::pipeline::{Pipeline, PipelineOptions};
use crate::shim_socket::{self, ShimCounters, ShimMessage, ShimProcesses};
use crate::telemetry::Telemetry;
use crate::{preflight, signals};

pub use config::{CaptureMode, DaemonArgs, DaemonConfig};

const POLL: Duration = Duration::from_millis(100);
const PUBLISH_INTERVAL: Duration = Duration::from_secs(1);

/// Runs until SIGTERM/SIGINT; returns gpuprof's exit code.
pub fn run(args: &DaemonArgs) -> Result<u8> {
    let config = args.resolve()?;
    if config.capture == CaptureMode::Shim {
        return run_shim_only(&config);
    }
    preflight::check_ebpf_capture()?;
    signals::install();
    let health = health::Health::new();
    let listening = health::serve(config.listen, config.metrics_token.clone(), health.clone())?;

    // A pod's sidecar sees its own pid namespace only (the pod's, shared by its containers).
    let pid_namespace = config.sidecar.as_ref().map(|_| crate::capture::PidNamespace::own()).transpose()?;
    if let Some(dir) = &config.sidecar {
        share_the_shim(dir)?;
    }
    let capture = Capture::load(CaptureOptions {
        ring_buffer_bytes: config.ring_buffer_bytes,
        python_stacks: config.python_stacks,
        track_callers: true,
        pid_namespace,
        ..CaptureOptions::default()
    })?;
    let options = PipelineOptions { flow: flow_options(&config), print_stats: false, autograd: config.python_stacks };
    let mut pipeline = Pipeline::new(&capture, options, sink_of(&config)?, None)
        .with_telemetry(config.otlp.clone().map(Telemetry::start).transpose()?);
    let shim = match &config.shim_socket {
        Some(_) => {
            pipeline = pipeline.with_dedup();
            Some(listen_for_shims(&config)?)
        }
        None => None,
    };
    let mut shim_counts = ShimCounts::default();

    if let Some(path) = &config.libcuda {
        let library = LibraryFile::open(path.clone()).with_context(|| format!("--libcuda {}", path.display()))?;
        pipeline.attach(&library)?;
    }
    // The node's own driver, so processes that load it later are captured from their first call.
    if let Some(library) = libcuda::resolve_for_loader().and_then(|path| LibraryFile::open(path).ok()) {
        if let Err(error) = pipeline.attach(&library) {
            eprintln!("gpuprof: warning: {error:#}");
        }
    }
    let mut forgotten_total = 0u64;
    scan(&mut pipeline);
    publish(&health, &pipeline, forgotten_total, &shim_counts);
    health.set_ready(true);
    match &config.sidecar {
        Some(dir) => eprintln!(
            "gpuprof: sidecar of pod {} on node {} with eBPF, following {} CUDA process(es) of its pid namespace; the shim is in {}; /healthz /readyz /metrics on {listening}; exporting to {}",
            pod_name(&config),
            crate::telemetry::node_name(config.node_name.as_deref()),
            pipeline.alive().len(),
            dir.display(),
            destinations(&config)
        ),
        None => eprintln!(
            "gpuprof: daemon on node {} following {} CUDA process(es); /healthz /readyz /metrics on {listening}; exporting to {}",
            crate::telemetry::node_name(config.node_name.as_deref()),
            pipeline.alive().len(),
            destinations(&config)
        ),
    }

    let mut last_scan = Instant::now();
    let mut last_publish = Instant::now();
    loop {
        pipeline.pump(POLL)?;
        if let Some(received) = &shim {
            shim_counts.receive(received, &mut pipeline)?;
        }
        pipeline.tick();
        if last_scan.elapsed() >= config.scan_interval {
            last_scan = Instant::now();
            scan(&mut pipeline);
        }
        if last_publish.elapsed() >= PUBLISH_INTERVAL {
            last_publish = Instant::now();
            forgotten_total += pipeline.forget_exited(config.retain_exited) as u64;
            publish(&health, &pipeline, forgotten_total, &shim_counts);
        }
        if signals::take().is_some() {
            break;
        }
    }
    health.set_ready(false);
    eprintln!("gpuprof: daemon stopping: flushing what was captured");
    pipeline.finish()?;
    Ok(0)
}

/// `--capture shim`: no eBPF (a node that forbids it). Processes running gpuprof's shim send their
/// events to the socket; everything else — OTLP, rules, retention, health — is as with eBPF.
fn run_shim_only(config: &DaemonConfig) -> Result<u8> {
    signals::install();
    let health = health::Health::new();
    let listening = health::serve(config.listen, config.metrics_token.clone(), health.clone())?;
    let path = config.shim_socket.as_ref().expect("checked by the config");
    if let Some(dir) = &config.sidecar {
        // Before the socket listens: readiness (the workload's start) means the shim is there.
        share_the_shim(dir)?;
    }
    let received = listen_for_shims(config)?;
    let mut flow = EventFlow::new(flow_options(config), sink_of(config)?);
    flow.set_telemetry(config.otlp.clone().map(Telemetry::start).transpose()?);
    let mut processes = ShimProcesses::new(!shim_sidecar(config));
    let mut forgotten_total = 0u64;
    let publish = |flow: &EventFlow, processes: &ShimProcesses, forgotten_total: u64| {
        health.publish(health::Snapshot {
            processes_followed: processes.open() as u64,
            processes_followed_total: processes.processes_seen,
            processes_exited_total: processes.processes_closed,
            processes_retained: flow.analyzer().tracker().processes().len() as u64,
            processes_forgotten_total: forgotten_total,
            events_total: flow.events(),
            events_lost_total: processes.counters.dropped_queue_full,
            stacks_unreadable_total: processes.counters.stacks_unresolved,
            findings_total: flow.findings_fired(),
            otlp_sent_total: flow.telemetry().map_or(0, |t| t.delivery().sent()),
            otlp_lost_total: flow.telemetry().map_or(0, |t| t.delivery().lost()),
            otlp_queued_bytes: flow.telemetry().map_or(0, |t| t.queued_bytes() as u64),
            resident_bytes: crate::procfs::own_resident_bytes(),
            shim_events_total: flow.events(),
            shim_dropped_total: processes.counters.dropped_queue_full,
            shim_undecodable_total: processes.undecodable,
            shim_refused_total: processes.refused,
            ..Default::default()
        })
    };
    publish(&flow, &processes, 0);
    health.set_ready(true);
    match &config.sidecar {
        Some(dir) => eprintln!(
            "gpuprof: sidecar of pod {} on node {}: the shim is in {}, events taken at {}; /healthz /readyz /metrics on {listening}; exporting to {}",
            pod_name(config),
            crate::telemetry::node_name(config.node_name.as_deref()),
            dir.display(),
            path.display(),
            destinations(config)
        ),
        None => eprintln!(
            "gpuprof: daemon on node {} without eBPF, taking events from shims at {}; /healthz /readyz /metrics on {listening}; exporting to {}",
            crate::telemetry::node_name(config.node_name.as_deref()),
            path.display(),
            destinations(config)
        ),
    }
    let mut last_publish = Instant::now();
    loop {
        processes.receive(&received, POLL, &mut |event| flow.observe(event).context("cannot write the output"))?;
        flow.flush()?;
        if last_publish.elapsed() >= PUBLISH_INTERVAL {
            last_publish = Instant::now();
            forgotten_total += flow.forget_exited(config.retain_exited) as u64;
            publish(&flow, &processes, forgotten_total);
        }
        if signals::take().is_some() {
            break;
        }
    }
    health.set_ready(false);
    eprintln!("gpuprof: daemon stopping: flushing what was captured");
    let stats = processes.stats_line(flow.events());
    flow.finish(&stats, processes.dropped())?;
    Ok(0)
}

/// Copies the shim into the pod's shared directory, whole or not at all (a workload starting
/// meanwhile never preloads half a library).
fn share_the_shim(dir: &std::path::Path) -> Result<()> {
    if !dir.is_dir() {
        anyhow::bail!("the sidecar's directory {} does not exist: mount the volume the pod's containers share there (gpuprof inject does)", dir.display());
    }
    let shim = crate::via_shim::shim_library(None)?;
    let target = dir.join(crate::via_shim::SHIM_FILE);
    let partial = dir.join(format!(".{}.partial", crate::via_shim::SHIM_FILE));
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
        .unwrap_or_else(crate::telemetry::PodIdentity::from_environment);
    match (pod.namespace, pod.name) {
        (Some(namespace), Some(name)) => format!("{namespace}/{name}"),
        (None, Some(name)) => name,
        _ => "(unnamed: no K8S_POD_NAME)".to_string(),
    }
}

fn flow_options(config: &DaemonConfig) -> FlowOptions {
    FlowOptions {
        rules: config.rules,
        format: Format::Jsonl,
        output_file: None,
        findings_file: None,
        notices: true,
        keep_findings: false,
        pids_are_ours: !shim_sidecar(config),
    }
}

/// A pod's sidecar taking the shim's events: its processes are in other pid namespaces.
fn shim_sidecar(config: &DaemonConfig) -> bool {
    config.sidecar.is_some() && config.capture == CaptureMode::Shim
}

fn sink_of(config: &DaemonConfig) -> Result<Box<dyn output::EventSink>> {
    Ok(match &config.output {
        Some(path) => output::sink(Format::resolve(None, Some(path))?, output::open_writer(Some(path))?, true)?,
        None => Box::new(NullSink),
    })
}

/// The shims' socket, open to whom the configuration says (each connection speaks only for its
/// own process).
fn listen_for_shims(config: &DaemonConfig) -> Result<Receiver<ShimMessage>> {
    let path = config.shim_socket.as_ref().expect("checked by the config");
    shim_socket::listen(path, config.shim_access)
}

/// Follows CUDA processes not followed yet and probes the libraries they map.
fn scan(pipeline: &mut Pipeline<'_>) {
    let known: HashSet<u32> = pipeline.alive().clone();
    for pid in libcuda::cuda_processes_on_node(&known) {
        // A process that exits meanwhile is simply not there to follow.
        let _ = pipeline.add_process(pid);
    }
    pipeline.discover_interpreters();
    pipeline.discover_libraries();
}

/// What came in from shims.
#[derive(Default)]
struct ShimCounts {
    events: u64,
    undecodable: u64,
    refused: u64,
    counters: ShimCounters,
}

impl ShimCounts {
    fn receive(&mut self, received: &Receiver<ShimMessage>, pipeline: &mut Pipeline<'_>) -> Result<()> {
        while let Ok(message) = received.try_recv() {
            match message {
                // Exits and forks: the kernel reports them for every tracked process.
                ShimMessage::Event { event, .. } if event.layer == Layer::Process => {}
                ShimMessage::Event { event, .. } => {
                    self.events += 1;
                    pipeline.observe_from_shim(event)?;
                }
                ShimMessage::Counters(counters) => self.counters.add(&counters),
                ShimMessage::Undecodable => self.undecodable += 1,
                ShimMessage::Refused { first, claimed, peer, uid } => {
                    self.refused += 1;
                    if first {
                        eprintln!("gpuprof: warning: {}", ShimMessage::refusal_text(claimed, peer, uid));
                    }
                }
                ShimMessage::Closed { .. } => {}
            }
        }
        Ok(())
    }
}

fn publish(health: &health::Health, pipeline: &Pipeline<'_>, forgotten_total: u64, shim: &ShimCounts) {
    let drops = pipeline.drops();
    let (followed_total, exited_total) = pipeline.process_counts();
    health.publish(health::Snapshot {
        processes_followed: pipeline.alive().len() as u64,
        processes_followed_total: followed_total,
        processes_exited_total: exited_total,
        processes_retained: pipeline.analyzer().tracker().processes().len() as u64,
        processes_forgotten_total: forgotten_total,
        libraries_probed: pipeline.libraries_probed() as u64,
        events_total: pipeline.events(),
        events_lost_total: drops.lost_events(),
        callers_untracked_total: drops.tracked_full,
        stacks_unreadable_total: drops.stack_unreadable,
        findings_total: pipeline.findings_fired(),
        otlp_sent_total: pipeline.telemetry().map_or(0, |t| t.delivery().sent()),
        otlp_lost_total: pipeline.telemetry().map_or(0, |t| t.delivery().lost()),
        otlp_queued_bytes: pipeline.telemetry().map_or(0, |t| t.queued_bytes() as u64),
        resident_bytes: crate::procfs::own_resident_bytes(),
        shim_events_total: shim.events,
        shim_dropped_total: shim.counters.dropped_queue_full,
        shim_undecodable_total: shim.undecodable,
        shim_refused_total: shim.refused,
        duplicates_dropped_total: pipeline.duplicates_dropped(),
    });
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
