//! What the person who runs a capture reads on stderr: notices as they come (a daemon logs
//! them), and at the end the findings (with what each process still held, when the events went
//! to a file), the findings file, what the capture took in and delivered, and what to run next.

use std::io;
use std::path::PathBuf;

use gpuprof_model::report::{EndOfRun, Notice, Reporter};
use gpuprof_model::{Event, Finding, Tracker};

use super::{colour, findings, live_line, write_end_of_run, write_next_steps, Format};

/// What the terminal says, and of which output.
pub struct TerminalOptions {
    /// The capture's output format and file (None: stdout).
    pub format: Format,
    pub output_file: Option<PathBuf>,
    /// `--findings`: the findings as JSON at the end.
    pub findings_file: Option<PathBuf>,
    /// Say notices on stderr (off under a full-screen view and a daemon, which log them).
    pub notices: bool,
    /// The findings were kept for the end of the run (a daemon's are said as they fire).
    pub findings_at_the_end: bool,
}

pub struct Terminal {
    options: TerminalOptions,
}

impl Terminal {
    pub fn new(options: TerminalOptions) -> Self {
        Terminal { options }
    }
}

impl Reporter for Terminal {
    fn event(&mut self, _event: &Event, _fired: &[Finding], _tracker: &Tracker) -> io::Result<()> {
        Ok(())
    }

    fn notice(&mut self, notice: &Notice) {
        match notice {
            Notice::Warning(text) => {
                live_line::clear();
                eprintln!("gpuprof: warning: {text}");
            }
            Notice::Info(text) if self.options.notices => {
                live_line::clear();
                eprintln!("gpuprof: {text}");
            }
            Notice::Info(text) => tracing::info!("{text}"),
        }
    }

    fn finish(self: Box<Self>, end: &EndOfRun<'_>) -> io::Result<Option<String>> {
        let TerminalOptions { format, output_file, findings_file, notices, findings_at_the_end } = self.options;
        live_line::clear();
        // A file gpuprof named is not kept when nothing was captured (its sink removed it).
        let to_file = output_file.as_deref().filter(|f| format != Format::None && f.exists());
        let stderr = &mut io::stderr();
        match to_file {
            // The events went to a file: the terminal gets what they add up to.
            Some(_) if format != Format::Table && findings_at_the_end => {
                write_end_of_run(stderr, end, colour::on_stderr())?
            }
            // The event stream stays pure jsonl; people read the findings on stderr.
            None if format != Format::Table && findings_at_the_end => {
                findings::write_table(stderr, end.findings, colour::on_stderr())?
            }
            _ => {}
        }
        if let Some(path) = &findings_file {
            findings::save_json(path, end.findings).map_err(|error| io::Error::other(format!("{error:#}")))?;
        }
        for line in end.closing {
            eprintln!("gpuprof: {line}");
        }
        // For files `summary`, `report` and `export` read; not for /dev/null and the like.
        let readable = matches!(format, Format::Recording | Format::Jsonl);
        if let Some(file) = to_file.filter(|f| notices && readable && f.is_file() && !end.output_failed) {
            write_next_steps(stderr, file, end.events)?;
        }
        Ok(None)
    }
}
