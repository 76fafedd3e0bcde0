//! Where captured events go: a compact recording, one JSON object per line, or a readable table
//! with an end-of-run summary of live memory per process and kind.

pub mod colour;
mod cuda_only;
mod destination;
mod event_output;
pub mod findings;
mod jsonl;
pub mod live_line;
pub mod progress;
mod recording;
mod table;
mod terminal;
pub(crate) mod text;

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::Path;

use anyhow::{Context, Result};
use gpuprof_model::event::Event;

pub(crate) use cuda_only::CudaProcessesOnly;
pub(crate) use destination::ChosenFileSink;
pub use destination::{name_of_command, Destination};
pub use event_output::EventOutput;
pub(crate) use gpuprof_model::report::EndOfRun;
pub(crate) use jsonl::JsonlSink;
pub(crate) use recording::RecordingSink;
pub(crate) use table::{python_column, write_end_of_run, write_live_summary, TableSink};
pub use terminal::{Terminal, TerminalOptions};

/// The output formats of `attach` and `run`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// One event per line in the contract of docs/events.md.
    Jsonl,
    /// A readable row per event and, at the end, live memory per process and kind.
    Table,
    /// A compact recording for `report` and `export` (each stack once; ~20 bytes an event).
    Recording,
    /// No local output (what is captured goes to --otlp-endpoint, findings to stderr).
    None,
}

impl Format {
    /// `--format` when given; else what the `--output` name says (see `by_name`), jsonl for stdout.
    pub fn resolve(given: Option<Format>, output: Option<&Path>) -> Result<Format> {
        let format = given.unwrap_or_else(|| output.map_or(Format::Jsonl, |path| Format::by_name(path).0));
        if format == Format::Recording && output.is_none() && std::io::IsTerminal::is_terminal(&io::stdout()) {
            anyhow::bail!("--format recording is binary: give --output FILE.gpuprof (or redirect stdout)");
        }
        Ok(format)
    }
}

impl Format {
    /// What an output file's name asks for: a recording for `*.gpuprof`; jsonl for a text
    /// extension (`.jsonl`, `.ndjson`, `.json`, `.txt`, `.log`) and for what is not a plain file
    /// (`/dev/null`, a pipe); otherwise (`run.bin`, `events`) a recording, the compact default,
    /// with `true`: the name did not say, and the choice is worth saying.
    pub(crate) fn by_name(path: &Path) -> (Format, bool) {
        let extension = path.extension().map(|e| e.to_string_lossy().to_ascii_lowercase());
        match extension.as_deref() {
            Some(RECORDING_EXTENSION) => (Format::Recording, false),
            Some("jsonl" | "ndjson" | "json" | "txt" | "log") => (Format::Jsonl, false),
            _ if std::fs::metadata(path).is_ok_and(|m| !m.is_file()) => (Format::Jsonl, false),
            _ => (Format::Recording, true),
        }
    }
}

/// The file extension of recordings (`--output run.gpuprof` writes one).
pub(crate) const RECORDING_EXTENSION: &str = "gpuprof";

/// Where a stream of events is written: a recording, jsonl, a table. A capture's sink is one of
/// its reporters through `EventOutput`; `export` writes a recorded file's events through one.
pub trait EventSink {
    fn event(&mut self, event: &Event) -> io::Result<()>;
    /// Called after each batch so a reader of the stream sees events as they happen.
    fn flush(&mut self) -> io::Result<()>;
    fn finish(&mut self, end: &EndOfRun<'_>) -> io::Result<()>;
}

/// Discards events (views that keep only the tracker's state, like `top`).
pub(crate) struct NullSink;

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

/// The sink of `attach` and `run`: jsonl keeps to the processes that touch CUDA unless
/// `all_processes` (the table always does).
pub fn capture_sink(destination: &Destination, compress: bool, all_processes: bool) -> Result<Box<dyn EventSink>> {
    let colour = destination.file.is_none() && colour::on_stdout();
    let inner = sink(destination.format, open_writer(destination.file.as_deref())?, compress, colour)?;
    let inner: Box<dyn EventSink> = match &destination.file {
        Some(path) if destination.chosen => Box::new(ChosenFileSink::new(inner, path.clone())),
        _ => inner,
    };
    Ok(if destination.format == Format::Jsonl && !all_processes {
        Box::new(CudaProcessesOnly::new(inner))
    } else {
        inner
    })
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

/// `compress`: zstd, for recordings; `colour`: a table's findings painted (for a terminal).
pub fn sink(format: Format, writer: Box<dyn Write>, compress: bool, colour: bool) -> Result<Box<dyn EventSink>> {
    Ok(match format {
        Format::Jsonl => Box::new(JsonlSink::new(writer)),
        Format::Table => Box::new(TableSink::new(writer, colour)),
        Format::Recording => Box::new(RecordingSink::new(writer, compress).context("cannot start the recording")?),
        Format::None => Box::new(NullSink),
    })
}

/// What to run on the file a capture wrote.
pub(crate) fn write_next_steps(writer: &mut dyn Write, file: &Path, events: u64) -> io::Result<()> {
    let name = shell_word(&file.to_string_lossy());
    writeln!(writer, "gpuprof: wrote {events} events to {name}; next:")?;
    let steps = [
        (format!("gpuprof summary {name}"), "the lines holding the most, per process"),
        (format!("gpuprof report {name}"), "leak findings with their stacks"),
        (format!("gpuprof export {name} -f flamegraph"), "live memory by stack at the peak, as an SVG"),
        (format!("gpuprof export {name} -f html"), "one page: timelines, stacks at any instant, findings"),
    ];
    let width = steps.iter().map(|(command, _)| command.len()).max().unwrap_or(0);
    let fits = steps.iter().all(|(_, what)| 2 + width + 4 + what.len() <= text::COLUMNS);
    for (command, what) in steps {
        if fits {
            writeln!(writer, "  {command:<width$}  # {what}")?;
        } else {
            writeln!(writer, "  # {what}\n  {command}")?;
        }
    }
    Ok(())
}

/// Quoted for a POSIX shell when it needs to be.
fn shell_word(text: &str) -> String {
    if !text.is_empty() && text.chars().all(|c| c.is_ascii_alphanumeric() || "._-/+=:@%,".contains(c)) {
        text.to_string()
    } else {
        format!("'{}'", text.replace('\'', "'\\''"))
    }
}

/// Whether what a view writes goes to a person: to stdout, and stdout a terminal. Views default
/// to a table for a person and to JSON for a program (a file, a pipe).
pub fn for_a_person(output: Option<&std::path::Path>) -> bool {
    output.is_none() && std::io::IsTerminal::is_terminal(&std::io::stdout())
}
