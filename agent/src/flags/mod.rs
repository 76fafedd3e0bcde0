//! The command line: verbs that work on a pid or a command, with the same flags meaning the
//! same thing everywhere. Every clap type of `gpuprof` lives here, one file per group: the verbs
//! (this file), `capture` (attach and run), `otlp`, `views` (the values of report, export,
//! summary and whatif), `daemon`, `inject`. The libraries take plain settings and know no clap:
//! where a flag's values are a library's enum, a mirror here parses them and maps to it. What the
//! flags set up is `setup`'s.

/// A library's enum as a flag's values: the same variants in the same order, each one's doc
/// comment its help in `--help`, and a `From` into the library's type.
macro_rules! values_of {
    ($(#[$attr:meta])* $name:ident => $target:ty { $($(#[$vattr:meta])* $variant:ident,)* }) => {
        $(#[$attr])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
        pub enum $name {
            $($(#[$vattr])* $variant,)*
        }

        impl From<$name> for $target {
            fn from(value: $name) -> $target {
                type Target = $target;
                match value {
                    $($name::$variant => Target::$variant,)*
                }
            }
        }
    };
}

pub mod capture;
pub mod daemon;
pub mod inject;
pub mod otlp;
pub mod views;
pub mod whatif;

use std::ffi::OsString;
use std::path::PathBuf;

use clap::{Parser, Subcommand};

pub use capture::{CaptureArgs, Compression, RuleArgs, Via};
pub use daemon::DaemonArgs;
pub use inject::InjectArgs;
pub use otlp::{protocol_named, OtlpArgs};
use views::{ExportFormat, ReportFormat, StackLayer, SummaryFormat};
pub use whatif::WhatifArgs;

#[derive(Debug, Parser)]
#[command(
    name = "gpuprof",
    version,
    about = "GPU memory profiler: every CUDA allocation, free, mapping and IPC handle of a process tree, from outside, with eBPF",
    after_help = "Examples:\n  gpuprof doctor\n  sudo gpuprof run -- python3 train.py\n  sudo gpuprof attach 4711 --duration 30 --format table\n  sudo gpuprof run --output events.jsonl -- python3 -m torch.distributed.run train.py"
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
    #[command(
        after_help = "Examples:\n  gpuprof report run.gpuprof -f table\n  gpuprof report run.gpuprof --fail-on leak   # exit status 3 when it has a leak"
    )]
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
        /// Exit with status 3 when the recording has findings of this kind, for a CI job to gate
        /// on: leak (every finding that asks for action but an out-of-memory), oom, or any
        /// (never an info finding).
        #[arg(long, value_enum, value_name = "KIND")]
        fail_on: Option<views::FailOn>,
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
    /// What this machine can capture, and why not: the kernel's features and the privileges
    /// eBPF needs, the libcuda `run` would probe, PyTorch's libc10, NVML, the CUDA processes
    /// running and their CPython, the shim, the collector. Exits 1 when nothing can capture.
    #[command(
        after_help = "Each line: ✓ works, ✗ does not (its fix on the line), – does not apply here.\nExamples:\n  gpuprof doctor\n  sudo gpuprof doctor -f json"
    )]
    Doctor {
        /// Output format (default: a table on a terminal, JSON into a pipe).
        #[arg(short, long, value_enum)]
        format: Option<DoctorFormat>,
        /// The shim library to look at (default: libgpuprof_shim.so next to gpuprof, or $GPUPROF_SHIM).
        #[arg(long, value_name = "PATH", env = "GPUPROF_SHIM")]
        shim: Option<PathBuf>,
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
    /// Would it have fit? Replays a recording's requests to PyTorch's caching allocator under
    /// other settings or on another device, beside what happened (docs/whatif.md).
    #[command(
        after_help = "Examples:\n  gpuprof whatif run.gpuprof --setting expandable_segments:True\n  gpuprof whatif run.gpuprof --setting max_split_size_mb:128 --device-memory 40GiB\n  gpuprof whatif run.gpuprof --suggest\n  gpuprof whatif b4.gpuprof b8.gpuprof --scale batch=4,8 --at 16,32 --largest --device-memory 80GiB"
    )]
    Whatif {
        #[command(flatten)]
        whatif: WhatifArgs,
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
        format: Option<SummaryFormat>,
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
        daemon: DaemonArgs,
    },
    /// Add gpuprof's sidecar to Kubernetes manifests (Pod, Job, Deployment, StatefulSet,
    /// CronJob, PyTorchJob…): the profiled containers preload the shim from a volume it shares.
    #[command(
        after_help = "Examples:\n  gpuprof inject job.yaml | kubectl apply -f -\n  gpuprof inject train.yaml --collector http://gpuprof-collector.gpuprof:4317 --container trainer -o train.profiled.yaml"
    )]
    Inject {
        #[command(flatten)]
        inject: InjectArgs,
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
    /// Print the completion script of a shell to stdout (docs/install.md says where each goes).
    #[command(
        after_help = "Examples:\n  gpuprof completions bash > ~/.local/share/bash-completion/completions/gpuprof\n  gpuprof completions zsh > ~/.zfunc/_gpuprof    # with fpath=(~/.zfunc $fpath) before compinit\n  gpuprof completions fish > ~/.config/fish/completions/gpuprof.fish"
    )]
    Completions {
        /// The shell.
        #[arg(value_enum, value_name = "SHELL")]
        shell: clap_complete::Shell,
    },
    /// The manual pages: gpuprof.1 on stdout, or with --dir gpuprof.1 and gpuprof-VERB.1 for
    /// every verb, written into a folder.
    #[command(after_help = "Examples:\n  gpuprof man | man -l -\n  gpuprof man --dir ~/.local/share/man/man1")]
    Man {
        /// Write every page into this folder (made if missing) instead of gpuprof.1 to stdout.
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
    },
}

values_of! {
    /// Output formats of `doctor`.
    DoctorFormat => crate::doctor::DoctorFormat {
        /// A line per check, then the verdict.
        Table,
        /// One JSON document: every check's name, status, detail and fix, and the verdict.
        Json,
    }
}

/// The command line's definition, its help showing an environment variable's value only where
/// the variable is set (clap shows `[env: NAME=]` for one that is not, which reads as set empty).
pub fn command() -> clap::Command {
    env_shown_where_set(definition())
}

/// The command line's definition as written, whatever the environment: what completion scripts
/// and man pages are made from, the same wherever they are made.
pub fn definition() -> clap::Command {
    <Cli as clap::CommandFactory>::command()
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

/// A size as nvidia-smi and people write it (40GiB, 81559MiB, 80GB).
/// A moment in a recording: seconds after its first event, 0 or more.
fn seconds_in(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(secs) if secs.is_finite() && secs >= 0.0 => Ok(secs),
        _ => Err(format!("{text} is not a number of seconds from the first event (0 or more)")),
    }
}
