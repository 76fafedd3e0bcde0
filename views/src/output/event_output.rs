//! A capture's event sink as one of its reporters: each event as it is tracked, the batch's end
//! as a flush, and the sink's own end of the run (a table's summary, a recording's count of what
//! was lost).
//!
//! A sink that cannot write (a full disk, a closed pipe) stops the output, not the capture: the
//! job is not left without its profiler halfway, and what the capture says at the end (tables,
//! findings) still covers every event. It is said when it happens, and the run ends in an error
//! that counts the events written and those that were not.

use std::io;
use std::path::{Path, PathBuf};

use gpuprof_model::report::{EndOfRun, Reporter};
use gpuprof_model::{Event, Finding, Tracker};

use super::EventSink;

pub struct EventOutput {
    sink: Box<dyn EventSink>,
    /// The file written (None: stdout), to name when it fails.
    file: Option<PathBuf>,
    written: u64,
    failed: Option<Failed>,
}

/// Why the output stopped, and how many events came after.
struct Failed {
    error: io::Error,
    not_written: u64,
}

impl EventOutput {
    pub fn new(sink: Box<dyn EventSink>, file: Option<&Path>) -> Self {
        EventOutput { sink, file: file.map(Path::to_path_buf), written: 0, failed: None }
    }

    fn output(&self) -> String {
        self.file.as_ref().map_or_else(|| "standard output".to_string(), |path| path.display().to_string())
    }

    fn stop(&mut self, error: io::Error, not_written: u64) {
        eprintln!(
            "gpuprof: error: cannot write {} ({error}): the output stops after {} events; the capture goes on, and what it says at the end covers every event",
            self.output(),
            self.written
        );
        self.failed = Some(Failed { error, not_written });
    }
}

impl Reporter for EventOutput {
    fn event(&mut self, event: &Event, _fired: &[Finding], _tracker: &Tracker) -> io::Result<()> {
        if let Some(failed) = &mut self.failed {
            failed.not_written += 1;
            return Ok(());
        }
        match self.sink.event(event) {
            Ok(()) => self.written += 1,
            Err(error) => self.stop(error, 1),
        }
        Ok(())
    }

    fn flush(&mut self, _tracker: &Tracker, _now: u64) -> io::Result<()> {
        if self.failed.is_none() {
            if let Err(error) = self.sink.flush() {
                self.stop(error, 0);
            }
        }
        Ok(())
    }

    fn finish(mut self: Box<Self>, end: &EndOfRun<'_>) -> io::Result<Option<String>> {
        let Some(failed) = self.failed.take() else {
            return self.sink.finish(end).map(|()| None);
        };
        // The sink's own ending (a recording's last block, its trailer) would meet the same
        // error: what was written reads back as a recording cut short.
        Err(io::Error::new(
            failed.error.kind(),
            format!(
                "{}: {}: it stopped after {} of the {} events captured (what reached it reads back, cut short)",
                self.output(),
                failed.error,
                self.written,
                self.written + failed.not_written
            ),
        ))
    }
}
