//! The flags of `whatif`: one recording's what-if, or a plan from recordings at several sizes.

use std::path::PathBuf;

use super::views::WhatifFormat;

#[derive(Debug, clap::Args)]
#[command(group = clap::ArgGroup::new("file").required(true).args(["input", "input_flag"]))]
pub struct WhatifArgs {
    /// The event file (a recording or jsonl, captured at --level tensors).
    #[arg(value_name = "FILE", num_args = 1..)]
    pub input: Vec<PathBuf>,
    /// The event file, as a flag.
    #[arg(short = 'i', long = "input", value_name = "FILE")]
    pub input_flag: Option<PathBuf>,
    /// A PYTORCH_CUDA_ALLOC_CONF item to try on top of the settings the job ran with; each
    /// --setting is a run of its own (KEY:VALUE, e.g. expandable_segments:True).
    #[arg(short, long = "setting", value_name = "KEY:VALUE")]
    pub settings: Vec<String>,
    /// The device's memory for the replays, as nvidia-smi reports it (40GiB, 81559MiB, 80GB);
    /// default: the device the job ran on.
    #[arg(long, value_name = "SIZE", value_parser = device_memory_in)]
    pub device_memory: Option<u64>,
    /// Try the usual settings and rank them by out-of-memory and peak reserved; and find the
    /// smallest device the best one fits.
    #[arg(long, conflicts_with = "settings")]
    pub suggest: bool,
    /// PYTORCH_CUDA_ALLOC_CONF as the job ran (default: PyTorch's defaults, or
    /// expandable_segments:True where the recording shows expandable segments).
    #[arg(long, value_name = "CONF")]
    pub ran_with: Option<String>,
    /// Only this process.
    #[arg(short, long, value_name = "PID")]
    pub pid: Option<u32>,
    /// Recordings of one job at values of one size, in the order of the files: plan from
    /// them (NAME=V1,V2[,V3]; e.g. batch=4,8, or seq_len=512,1024,2048 for a size whose
    /// memory grows with its square).
    #[arg(long, value_name = "NAME=VALUES", value_parser = scale_in)]
    pub scale: Option<(String, Vec<u64>)>,
    /// With --scale: the values to predict (e.g. 16,32).
    #[arg(long, value_name = "VALUES", value_delimiter = ',', requires = "scale")]
    pub at: Vec<u64>,
    /// With --scale: the largest value that fits the device, under the job's settings and
    /// the best of the usual ones.
    #[arg(long, requires = "scale")]
    pub largest: bool,
    /// With --largest: only multiples of this value (default 1).
    #[arg(long, value_name = "N", default_value_t = 1, requires = "largest")]
    pub step: u64,
    /// Output format (default: a table on a terminal, JSON into a file or a pipe; html with
    /// --scale only).
    #[arg(short, long, value_enum)]
    pub format: Option<WhatifFormat>,
    /// Write the output here instead of stdout.
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,
}

/// `batch=4,8` → ("batch", [4, 8]).
fn scale_in(text: &str) -> Result<(String, Vec<u64>), String> {
    let usage = "write it as NAME=V1,V2 (e.g. batch=4,8), a value per recording, in their order";
    let (name, values) = text.split_once('=').ok_or_else(|| format!("`{text}`: {usage}"))?;
    if name.trim().is_empty() {
        return Err(format!("`{text}` names no size: {usage}"));
    }
    let values = values
        .split(',')
        .map(|v| v.trim().parse::<u64>().ok().filter(|&v| v > 0))
        .collect::<Option<Vec<u64>>>()
        .ok_or_else(|| format!("`{text}`: each value is a whole number, 1 or more; {usage}"))?;
    if values.len() < 2 {
        return Err(format!("`{text}` names one value: scaling needs recordings at two values at least; {usage}"));
    }
    Ok((name.trim().to_string(), values))
}

fn device_memory_in(text: &str) -> Result<u64, String> {
    gpuprof_model::bytes::parse_device_memory(text)
}
