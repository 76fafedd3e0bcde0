//! The flags of the verbs that capture, `attach` and `run`: where the events go, what is
//! recorded, the leak rules' thresholds, OTLP (`otlp`'s) and the kernel's options.

use std::path::PathBuf;

use clap::Args;

use super::otlp::OtlpArgs;

values_of! {
    /// The output formats of `attach` and `run`.
    Format => gpuprof_views::output::Format {
        /// One event per line in the contract of docs/events.md.
        Jsonl,
        /// A readable row per event and, at the end, live memory per process and kind.
        Table,
        /// A compact recording for `report` and `export` (each stack once; ~20 bytes an event).
        Recording,
        /// No local output (what is captured goes to --otlp-endpoint, findings to stderr).
        None,
    }
}

values_of! {
    /// Where on a function its probes go.
    Placement => gpuprof_capture::kernel::Placement {
        /// On the first instruction the kernel runs without a second trap, past `endbr64`
        /// (`placement`): the default.
        Placed,
        /// On the function's first instruction, as a naive uprobe goes.
        Entry,
    }
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
    pub probe_at: Placement,
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
    /// Exit with status 3 when findings of this kind were made (and the command exited 0), for
    /// a CI job to gate on: leak (every finding that asks for action but an out-of-memory),
    /// oom, or any (never an info finding).
    #[arg(help_heading = "Findings", long, value_enum, value_name = "KIND")]
    pub fail_on: Option<super::views::FailOn>,
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
