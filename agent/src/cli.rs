//! The command line: verbs that work on a pid or a command, with the same flags meaning the
//! same thing everywhere.

use std::ffi::OsString;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

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

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Capture a running process (and its children) until it exits or --duration passes.
    #[command(after_help = "Example:\n  sudo gpuprof attach 4711 --duration 60 --format table")]
    Attach {
        /// The process to capture.
        pid: u32,
        /// If the process has not loaded libcuda yet, wait until it does.
        #[arg(long)]
        wait: bool,
        #[command(flatten)]
        capture: CaptureArgs,
    },
    /// Start a command and capture it and every descendant from its first CUDA call.
    #[command(after_help = "Example:\n  sudo gpuprof run --format table -- python3 train.py --epochs 1")]
    Run {
        #[command(flatten)]
        capture: CaptureArgs,
        /// The command and its arguments (after `--`).
        #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true, value_name = "CMD")]
        command: Vec<OsString>,
    },
}

/// Flags shared by `attach` and `run`.
#[derive(Debug, Args)]
pub struct CaptureArgs {
    /// Stop after this many seconds.
    #[arg(long, value_name = "SECS")]
    pub duration: Option<f64>,
    /// Output format.
    #[arg(long, value_enum, default_value = "jsonl")]
    pub format: Format,
    /// Write the output here instead of stdout.
    #[arg(long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Print capture statistics (events/s, drops) to stderr every second.
    #[arg(long)]
    pub stats: bool,
    /// Probe this libcuda instead of the one found (attach: in the process's maps; run: where
    /// the dynamic loader would find libcuda.so.1).
    #[arg(long, value_name = "PATH")]
    pub libcuda: Option<PathBuf>,
    /// Ring buffer size in MiB (a power of two); a full buffer drops events, which are counted.
    #[arg(long, value_name = "MIB", default_value_t = 16)]
    pub buffer_mib: u32,
}
