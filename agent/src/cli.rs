//! The command line: verbs that work on a pid or a command, with the same flags meaning the
//! same thing everywhere.

use std::ffi::OsString;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::export::{ExportFormat, StackLayer};
use crate::output::Format;

#[derive(Debug, Parser)]
#[command(
    name = "gpuprof",
    version,
    about = "GPU memory profiler: every CUDA allocation, free, mapping and IPC handle of a process tree, from outside, with eBPF",
    after_help = "Examples:\n  sudo gpuprof run -- python3 train.py\n  sudo gpuprof attach 4711 --duration 30 --format table\n  sudo gpuprof run --output events.jsonl -- python3 -m torch.distributed.run train.py"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

// One command line is parsed per run: the variants' sizes do not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Capture a running process (and its children) until it exits or --duration passes.
    #[command(after_help = "Example:\n  sudo gpuprof attach 4711 --duration 60 --format table")]
    #[command(group = clap::ArgGroup::new("target").required(true).args(["pid", "pid_flag"]))]
    Attach {
        /// The process to capture.
        #[arg(value_name = "PID")]
        pid: Option<u32>,
        /// The process to capture (as `top --pid` and `export --pid` spell it).
        #[arg(short = 'p', long = "pid", value_name = "PID")]
        pid_flag: Option<u32>,
        /// If the process has not loaded libcuda yet, wait until it does (at most --duration).
        #[arg(long)]
        wait: bool,
        #[command(flatten)]
        capture: CaptureArgs,
    },
    /// Leak findings of a recorded event file (a recording or jsonl, as `attach`/`run` write them).
    #[command(after_help = "Example:\n  gpuprof report run.gpuprof -f table")]
    #[command(group = clap::ArgGroup::new("file").required(true).args(["input", "input_flag"]))]
    Report {
        /// The event file (a recording or jsonl).
        #[arg(value_name = "FILE", num_args = 1..)]
        input: Vec<PathBuf>,
        /// The event file, as a flag.
        #[arg(short = 'i', long = "input", value_name = "FILE")]
        input_flag: Option<PathBuf>,
        /// Output format (default: a table on a terminal, JSON into a file or a pipe).
        #[arg(short, long, value_enum)]
        format: Option<ReportFormat>,
        /// Write the output here instead of stdout.
        #[arg(short, long, value_name = "FILE")]
        output: Option<PathBuf>,
        #[command(flatten)]
        rules: RuleArgs,
    },
    /// A live view of every CUDA process on the machine (or one process tree).
    #[command(
        after_help = "Keys: q quit, ↑/↓ select a process, s change the sort, PgUp/PgDn scroll the findings.\nExited processes stay a minute, dimmed. BEFORE: what the allocator held before top started.\nExample:\n  sudo gpuprof top"
    )]
    Top {
        /// Only this process and its descendants.
        #[arg(short, long, value_name = "PID")]
        pid: Option<u32>,
        /// Seconds between redraws.
        #[arg(long, value_name = "SECS", default_value_t = 0.5)]
        interval: f64,
    },
    /// Views of a recorded event file: an HTML report, folded stacks, a flame graph, speedscope,
    /// a PyTorch memory_viz snapshot, or the events themselves as jsonl (or jsonl as a recording).
    #[command(
        after_help = "Examples:\n  gpuprof export run.gpuprof -f html                # writes run-report.html\n  gpuprof export run.gpuprof -f flamegraph          # writes run-peak.svg\n  gpuprof export run.gpuprof -f folded | flamegraph.pl > peak.svg\n  gpuprof export run.gpuprof -f speedscope -o peak.speedscope.json\n  gpuprof export run.gpuprof -f memory-viz -o snap.pickle --from 60 --to 90\n  gpuprof export run.gpuprof -f folded --oom 1\n  gpuprof export run.gpuprof -f jsonl -o run.jsonl"
    )]
    #[command(group = clap::ArgGroup::new("file").required(true).args(["input", "input_flag"]))]
    Export {
        /// The event file (a recording or jsonl).
        #[arg(value_name = "FILE", num_args = 1..)]
        input: Vec<PathBuf>,
        /// The event file, as a flag.
        #[arg(short = 'i', long = "input", value_name = "FILE")]
        input_flag: Option<PathBuf>,
        /// What to write.
        #[arg(short, long, value_enum)]
        format: ExportFormat,
        /// Write the view here (`-`: stdout) [default: on a terminal, a file named after the input
        /// and the moment, e.g. run-peak.svg; through a pipe, stdout].
        #[arg(short, long, value_name = "FILE")]
        output: Option<PathBuf>,
        /// memory-viz: the process to snapshot (default: the one with the most tensor events);
        /// html: the process the page shows first (default: all).
        #[arg(short, long, value_name = "PID")]
        pid: Option<u32>,
        /// Take the view when the processes held the most memory together (the default, but
        /// for memory-viz, whose default is the end).
        #[arg(long, group = "moment")]
        peak: bool,
        /// Take the view at the end of the recording.
        #[arg(long, group = "moment")]
        end: bool,
        /// Take the view this many seconds after the first event.
        #[arg(long, value_name = "SECS", group = "moment", value_parser = seconds_in)]
        at: Option<f64>,
        /// Take the view at the N-th out-of-memory failure (1 = the first).
        #[arg(long, value_name = "N", group = "moment", value_parser = clap::value_parser!(u64).range(1..))]
        oom: Option<u64>,
        /// Folded/flamegraph: count tensors (allocator blocks), driver allocations, or pick per process.
        #[arg(long, value_enum, default_value = "auto")]
        layer: StackLayer,
        /// memory-viz: leave out trace entries before this many seconds after the first event.
        #[arg(long, value_name = "SECS")]
        from: Option<f64>,
        /// memory-viz: leave out trace entries after this many seconds after the first event.
        #[arg(long, value_name = "SECS")]
        to: Option<f64>,
        /// memory-viz: keep the most recent N trace entries (PyTorch's viewer slows past a few
        /// hundred thousand).
        #[arg(long, value_name = "N", default_value_t = 100_000)]
        max_entries: usize,
        /// recording: compress with zstd, or write it plain.
        #[arg(long, value_enum, default_value = "zstd")]
        compress: Compression,
    },
    /// The lines that held the most GPU memory, per process: at the peak, at the end, and
    /// allocated over the whole recording.
    #[command(after_help = "Examples:\n  gpuprof summary run.gpuprof\n  gpuprof summary run.gpuprof -p 4711 --top 25")]
    #[command(group = clap::ArgGroup::new("file").required(true).args(["input", "input_flag"]))]
    Summary {
        /// The event file (a recording or jsonl).
        #[arg(value_name = "FILE", num_args = 1..)]
        input: Vec<PathBuf>,
        /// The event file, as a flag.
        #[arg(short = 'i', long = "input", value_name = "FILE")]
        input_flag: Option<PathBuf>,
        /// Only this process.
        #[arg(short, long, value_name = "PID")]
        pid: Option<u32>,
        /// Lines shown per process.
        #[arg(short = 'n', long, value_name = "N", default_value_t = 10)]
        top: usize,
        /// Count tensors (allocator blocks), driver allocations, or pick per process.
        #[arg(long, value_enum, default_value = "auto")]
        layer: StackLayer,
        /// Output format (default: a table on a terminal, JSON into a file or a pipe).
        #[arg(short, long, value_enum)]
        format: Option<crate::export::summary::SummaryFormat>,
        /// Write the output here instead of stdout.
        #[arg(short, long, value_name = "FILE")]
        output: Option<PathBuf>,
    },
    /// Capture every CUDA process of this node, for as long as it runs (the Kubernetes DaemonSet),
    /// or of one pod, as its sidecar (--sidecar DIR: no privileges, the shim's events).
    #[command(
        after_help = "Settings come from flags, then GPUPROF_* environment variables, then the --config TOML file.\nExamples:\n  sudo gpuprof daemon --otlp-endpoint http://gpuprof-collector:4317\n  sudo gpuprof daemon --config /etc/gpuprof/daemon.toml\n  gpuprof daemon --sidecar /gpuprof --otlp-endpoint http://gpuprof-collector.gpuprof:4317"
    )]
    Daemon {
        #[command(flatten)]
        daemon: crate::daemon::DaemonArgs,
    },
    /// Add gpuprof's sidecar to Kubernetes manifests (Pod, Job, Deployment, StatefulSet,
    /// CronJob, PyTorchJob…): the profiled containers preload the shim from a volume it shares.
    #[command(
        after_help = "Examples:\n  gpuprof inject job.yaml | kubectl apply -f -\n  gpuprof inject train.yaml --collector http://gpuprof-collector.gpuprof:4317 --container trainer -o train.profiled.yaml"
    )]
    Inject {
        #[command(flatten)]
        inject: crate::inject::InjectArgs,
    },
    /// Start a command and capture it and every descendant from its first CUDA call.
    #[command(after_help = "Example:\n  sudo gpuprof run --format table -- python3 train.py --epochs 1")]
    Run {
        #[command(flatten)]
        capture: CaptureArgs,
        /// How to capture: eBPF probes (root or CAP_BPF/CAP_PERFMON/CAP_SYS_PTRACE), or gpuprof's
        /// shim preloaded into the command (no privileges: PyTorch's allocator, and the driver's
        /// memory calls through CUPTI; docs/shim.md).
        #[arg(help_heading = "Capture", display_order = 0, long, value_enum, default_value = "ebpf")]
        via: Via,
        /// The shim library (default: libgpuprof_shim.so next to gpuprof, or $GPUPROF_SHIM).
        #[arg(help_heading = "Advanced", long, value_name = "PATH", env = "GPUPROF_SHIM")]
        shim: Option<PathBuf>,
        /// The command and its arguments (after `--`).
        #[arg(required = true, trailing_var_arg = true, value_name = "CMD", help_heading = None::<&str>)]
        command: Vec<OsString>,
    },
}

/// The command line's definition, its help showing an environment variable's value only where
/// the variable is set (clap shows `[env: NAME=]` for one that is not, which reads as set empty).
pub fn command() -> clap::Command {
    env_shown_where_set(<Cli as clap::CommandFactory>::command())
}

fn env_shown_where_set(command: clap::Command) -> clap::Command {
    command
        .mut_args(|arg| {
            let unset = arg.get_env().is_some_and(|name| std::env::var_os(name).is_none());
            if unset {
                arg.hide_env(true)
            } else {
                arg
            }
        })
        .mut_subcommands(env_shown_where_set)
}

/// The one event file a view reads. Several (a shell pattern that matched more than one) are
/// refused with the newest named, rather than clap's "unexpected argument".
pub fn one_input(verb: &str, positional: Vec<PathBuf>, flag: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    let mut given: Vec<PathBuf> = positional.into_iter().chain(flag).collect();
    if given.len() == 1 {
        return Ok(given.remove(0));
    }
    let modified = |p: &PathBuf| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    let newest = given.iter().max_by_key(|p| modified(p)).map(|p| p.display().to_string()).unwrap_or_default();
    let names: Vec<String> = given.iter().map(|p| p.display().to_string()).collect();
    anyhow::bail!(
        "{verb} reads one event file, and {} were given ({}): name one, e.g. the newest: gpuprof {verb} {newest}",
        given.len(),
        names.join(", ")
    )
}

/// Whether what a view writes goes to a person: to stdout, and stdout a terminal. Views default
/// to a table for a person and to JSON for a program (a file, a pipe).
pub fn for_a_person(output: Option<&std::path::Path>) -> bool {
    output.is_none() && std::io::IsTerminal::is_terminal(&std::io::stdout())
}

/// How `run` captures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Via {
    Ebpf,
    Shim,
}

/// How a recording is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Compression {
    Zstd,
    None,
}

/// Flags shared by `attach` and `run`.
#[derive(Debug, Args)]
pub struct CaptureArgs {
    /// Stop after this many seconds.
    #[arg(help_heading = "Capture", short, long, value_name = "SECS", allow_negative_numbers = true)]
    pub duration: Option<f64>,
    /// Output format [default: a recording to a file named after the job; with --output, what
    /// its name says: jsonl for *.jsonl, a recording for *.gpuprof or a name that says nothing].
    #[arg(help_heading = "Output", short, long, value_enum)]
    pub format: Option<Format>,
    /// Write the output here (`-`: stdout) [default: gpuprof-NAME-YYYYMMDD-HHMMSS.gpuprof in
    /// the current directory; stdout when only --format is given].
    #[arg(help_heading = "Output", short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// jsonl: also write the fork, exec and exit of processes that never make a CUDA call
    /// (shells, launchers), which are left out otherwise.
    #[arg(help_heading = "Output", long)]
    pub all_processes: bool,
    /// Recordings: compress with zstd (`none` writes them plain, ~2x larger, a little cheaper).
    #[arg(help_heading = "Output", long, value_enum, default_value = "zstd")]
    pub compress: Compression,
    /// Print the capture's counters (events/s, drops, stacks resolved, agent CPU) to stderr every
    /// second and at the end (at the end they are printed anyway when events were lost).
    #[arg(help_heading = "Capture", long)]
    pub stats: bool,
    /// What to record (docs/levels.md): `tensors`, every tensor block of PyTorch's allocator with
    /// its Python stack and the driver's calls; `driver`, only the driver's memory calls
    /// (segments, VMM, IPC, contexts, failed calls), which a warm training step does not make.
    #[arg(help_heading = "Capture", long, value_name = "LEVEL", default_value = "tensors", value_parser = capture_level)]
    pub level: gpuprof_model::Level,
    /// Benchmarks only: where probes go on a function (`entry`: its first instruction, as a
    /// naive uprobe; docs/benchmarks.md).
    #[arg(long, value_enum, default_value = "placed", hide = true)]
    pub probe_at: crate::capture::Placement,
    /// Benchmarks only: the allocator probe runs an empty program (the trap's own cost).
    #[arg(long, hide = true)]
    pub empty_probes: bool,
    /// Benchmarks only: the allocator probe times its phases; said at the end.
    #[arg(long, hide = true)]
    pub profile_probes: bool,
    /// Also write the leak findings, as a JSON array, to this file.
    #[arg(help_heading = "Output", long, value_name = "FILE")]
    pub findings: Option<PathBuf>,
    /// When the capture ends, also write its HTML report here (as `export --format html`):
    /// timelines, the stacks behind any instant, the findings; one file that opens offline.
    #[arg(help_heading = "Output", long, value_name = "FILE")]
    pub html: Option<PathBuf>,
    #[command(flatten, next_help_heading = "Findings")]
    pub rules: RuleArgs,
    #[command(flatten, next_help_heading = "Fleet (OTLP)")]
    pub otlp: OtlpArgs,
    /// Probe this libcuda instead of the one found (attach: in the process's maps; run: where
    /// the dynamic loader would find libcuda.so.1).
    #[arg(help_heading = "Advanced", long, value_name = "PATH")]
    pub libcuda: Option<PathBuf>,
    /// Ring buffer size in MiB (a power of two); a full buffer drops events, which are counted.
    #[arg(help_heading = "Advanced", long, value_name = "MIB", default_value_t = 16)]
    pub buffer_mib: u32,
    /// Do not walk Python stacks (events get an empty `stack`).
    #[arg(help_heading = "Advanced", long)]
    pub no_stacks: bool,
    /// Do not read PyTorch's autograd state: backward-pass blocks keep no forward line.
    #[arg(help_heading = "Advanced", long)]
    pub no_autograd: bool,
}

/// Where to send the capture over OpenTelemetry's protocol (docs/otlp.md).
#[derive(Debug, Args)]
pub struct OtlpArgs {
    /// Also send the capture, summarized (driver and process events, findings, gauges, memory
    /// profiles, spans: docs/otlp.md), to this OTLP endpoint, e.g. http://collector:4317 (gRPC)
    /// or http://collector:4318 (--otlp-protocol http).
    #[arg(long, value_name = "URL")]
    pub otlp_endpoint: Option<String>,
    #[arg(long, value_enum, default_value = "grpc", requires = "otlp_endpoint")]
    pub otlp_protocol: crate::telemetry::Protocol,
    /// Bearer token the collector asks for.
    #[arg(long, value_name = "TOKEN", env = "GPUPROF_OTLP_TOKEN", hide_env_values = true)]
    pub otlp_token: Option<String>,
    /// The node's name in `host.name` (default: $K8S_NODE_NAME, else the host name).
    #[arg(long, value_name = "NAME")]
    pub node_name: Option<String>,
    #[command(flatten, next_help_heading = "Fleet (OTLP)")]
    pub tuning: crate::telemetry::OtlpTuning,
}

impl CaptureArgs {
    /// Where the capture goes; `name` names the file when gpuprof chooses it.
    pub fn destination(&self, name: &str) -> anyhow::Result<crate::output::Destination> {
        let destination = crate::output::Destination::resolve(self.format, self.output.as_deref(), name)?;
        let readable = matches!(destination.format, Format::Recording | Format::Jsonl) && destination.file.is_some();
        if let Some(html) = self.html.as_deref().filter(|_| !readable) {
            anyhow::bail!(
                "--html {} reads the events from the file the capture writes: leave --output and --format out (a recording named after the job) or give --output FILE.gpuprof or FILE.jsonl",
                html.display()
            );
        }
        Ok(destination)
    }

    /// `--html`: the report of the file the capture wrote (none when it kept no file).
    pub fn write_html(&self, destination: &crate::output::Destination) -> anyhow::Result<()> {
        let (Some(html), Some(events)) = (self.html.as_deref(), destination.file.as_deref()) else { return Ok(()) };
        if !events.is_file() {
            return Ok(());
        }
        // The capture is done and kept: a report that fails is said, not the run's outcome.
        match crate::export::html::write_file(events, html) {
            Ok(()) => eprintln!("gpuprof: wrote the report to {}; open it in a browser", html.display()),
            Err(error) => eprintln!(
                "gpuprof: warning: no report written to {}: {error:#}; the events are in {}",
                html.display(),
                events.display()
            ),
        }
        Ok(())
    }

    pub fn sink(&self, destination: &crate::output::Destination) -> anyhow::Result<Box<dyn crate::output::EventSink>> {
        crate::output::capture_sink(destination, self.compress == Compression::Zstd, self.all_processes)
    }

    /// The flow the capture's events go through: rules, output, findings, OTLP.
    pub fn flow(&self, destination: &crate::output::Destination) -> anyhow::Result<crate::flow::EventFlow> {
        let options = crate::flow::FlowOptions {
            rules: self.rules.config()?,
            format: destination.format,
            output_file: destination.file.clone(),
            findings_file: self.findings.clone(),
            notices: true,
            keep_findings: true,
            pids_are_ours: true,
        };
        let mut flow = crate::flow::EventFlow::new(options, self.sink(destination)?);
        flow.set_telemetry(self.otlp.start()?);
        Ok(flow)
    }

    /// How a person sees the capture go: the live line on a terminal (unless the events
    /// themselves stream to stdout), the counters at the end with `--stats`.
    pub fn watched<'c>(
        &self,
        session: crate::session::Session<'c>,
        destination: &crate::output::Destination,
    ) -> crate::session::Session<'c> {
        let events_on_stdout = destination.file.is_none() && destination.format != Format::None;
        let session = session.with_counters(self.stats);
        if events_on_stdout {
            session
        } else {
            session.with_live_line()
        }
    }

    /// `--duration`, checked.
    pub fn duration(&self) -> anyhow::Result<Option<std::time::Duration>> {
        self.duration
            .map(|secs| {
                if secs.is_finite() && secs > 0.0 {
                    Ok(std::time::Duration::from_secs_f64(secs))
                } else {
                    Err(anyhow::anyhow!("--duration {secs}: give a positive number of seconds"))
                }
            })
            .transpose()
    }

    /// The kernel side of an eBPF capture.
    pub fn capture_options(&self) -> anyhow::Result<crate::capture::CaptureOptions> {
        let mib = self.buffer_mib;
        if !mib.is_power_of_two() || mib > 1024 {
            anyhow::bail!("--buffer-mib {mib}: give a power of two from 1 to 1024");
        }
        Ok(crate::capture::CaptureOptions {
            ring_buffer_bytes: mib << 20,
            python_stacks: !self.no_stacks,
            placement: self.probe_at,
            empty_allocator_probe: self.empty_probes,
            profile_phases: self.profile_probes,
            ..crate::capture::CaptureOptions::default()
        })
    }

    /// The user-space side of an eBPF capture.
    pub fn ebpf_options(&self) -> crate::session::EbpfOptions {
        crate::session::EbpfOptions {
            print_stats: self.stats,
            autograd: !self.no_stacks && !self.no_autograd,
            level: self.level,
        }
    }
}

impl OtlpArgs {
    pub fn start(&self) -> anyhow::Result<Option<crate::telemetry::Telemetry>> {
        let Some(endpoint) = &self.otlp_endpoint else { return Ok(None) };
        let options =
            self.tuning.options(endpoint, self.otlp_protocol, self.otlp_token.clone(), self.node_name.clone())?;
        crate::telemetry::Telemetry::start(options).map(Some)
    }
}

/// Thresholds of the leak rules, the same for live capture and `report`.
#[derive(Debug, Args)]
pub struct RuleArgs {
    /// Growth: window length; live bytes of a stack are compared at each window's end.
    #[arg(long, value_name = "SECS", default_value_t = 10.0)]
    pub growth_window: f64,
    /// Growth: consecutive rising windows that make a finding.
    #[arg(long, value_name = "N", default_value_t = 3)]
    pub growth_rises: u32,
    /// Orphans: seconds a CUDA process's descendants may still hold GPU memory after it ends
    /// before they are orphans holding memory.
    #[arg(long, value_name = "SECS", default_value_t = 5.0)]
    pub orphan_grace: f64,
}

impl RuleArgs {
    pub fn config(&self) -> anyhow::Result<gpuprof_model::RuleConfig> {
        if !(self.growth_window.is_finite() && self.growth_window > 0.0) {
            anyhow::bail!("--growth-window {}: give a positive number of seconds", self.growth_window);
        }
        if self.growth_rises == 0 {
            anyhow::bail!("--growth-rises 0: give at least 1");
        }
        if !(self.orphan_grace.is_finite() && self.orphan_grace >= 0.0) {
            anyhow::bail!("--orphan-grace {}: give a number of seconds, 0 or more", self.orphan_grace);
        }
        Ok(gpuprof_model::RuleConfig {
            growth_window_ns: (self.growth_window * 1e9) as u64,
            growth_rises: self.growth_rises,
            orphan_grace_ns: (self.orphan_grace * 1e9) as u64,
        })
    }
}

/// Output formats of `report`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ReportFormat {
    /// A JSON array of findings (docs/findings.md).
    Json,
    /// A readable list of findings.
    Table,
}

/// A capture level a capture can start at: driver or tensors (off would record nothing).
fn capture_level(text: &str) -> Result<gpuprof_model::Level, String> {
    match text.parse::<gpuprof_model::Level>() {
        Ok(gpuprof_model::Level::Off) => Err(
            "off records nothing: give driver or tensors (a running capture pauses through its daemon: docs/levels.md)"
                .into(),
        ),
        Ok(level) => Ok(level),
        Err(error) => Err(error.to_string()),
    }
}

/// A moment in a recording: seconds after its first event, 0 or more.
fn seconds_in(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(secs) if secs.is_finite() && secs >= 0.0 => Ok(secs),
        _ => Err(format!("{text} is not a number of seconds from the first event (0 or more)")),
    }
}
