//! Where captured events go: one JSON object per line, or a readable table with an end-of-run
//! summary of live memory per process and kind.

pub mod findings;
mod jsonl;
mod table;

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::Path;

use anyhow::{Context, Result};
use gpuprof_model::event::Event;
use gpuprof_model::track::LiveSummary;
use gpuprof_model::Finding;

pub use jsonl::JsonlSink;
pub use table::{write_live_summary, TableSink};

/// The output formats of `attach` and `run`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// One event per line in the contract of docs/events.md.
    Jsonl,
    /// A readable row per event and, at the end, live memory per process and kind.
    Table,
}

/// What the run ended with, for sinks that print a summary.
pub struct EndOfRun<'a> {
    pub processes: &'a [LiveSummary],
    pub findings: &'a [Finding],
}

pub trait EventSink {
    fn event(&mut self, event: &Event) -> io::Result<()>;
    /// Called after each batch so a reader of the stream sees events as they happen.
    fn flush(&mut self) -> io::Result<()>;
    fn finish(&mut self, end: &EndOfRun<'_>) -> io::Result<()>;
}

/// Discards events (views that keep only the tracker's state, like `top`).
pub struct NullSink;

impl EventSink for NullSink {
    fn event(&mut self, _event: &Event) -> io::Result<()> {
        Ok(())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }

    fn finish(&mut self, _end: &EndOfRun<'_>) -> io::Result<()> {
        Ok(())
    }
}

/// Stdout, or the file named by `--output` (created or truncated).
pub fn open_writer(output: Option<&Path>) -> Result<Box<dyn Write>> {
    Ok(match output {
        Some(path) => Box::new(BufWriter::new(
            File::create(path).with_context(|| format!("cannot create output file {}", path.display()))?,
        )),
        None => Box::new(BufWriter::new(io::stdout())),
    })
}

pub fn sink(format: Format, writer: Box<dyn Write>) -> Box<dyn EventSink> {
    match format {
        Format::Jsonl => Box::new(JsonlSink::new(writer)),
        Format::Table => Box::new(TableSink::new(writer)),
    }
}
