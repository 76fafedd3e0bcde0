//! Reading a recorded event file — a recording or jsonl, as `attach`/`run` write them —
//! streaming, in order, with a person at a terminal told how far each pass is
//! (`output::progress`). A corrupt file is an error naming the line or byte; a file cut short
//! (a capture that was killed) is read up to its last whole event, with a warning saying so.

use std::path::Path;

use anyhow::Result;
use gpuprof_model::Event;
use gpuprof_recording::{Ending, EventFile, FileError};

use crate::output::progress::{grouped, ProgressLine};

/// Events between two looks at the clock: a look costs more than reading an event does.
const TICK_EVERY: u64 = 256;

/// A pass over an event file.
pub(crate) struct Reading {
    file: EventFile,
    events: u64,
    /// Gone once the file is read to its end: the line is erased before what follows is said.
    line: Option<ProgressLine>,
}

impl Reading {
    pub(crate) fn open(input: &Path) -> Result<Reading, FileError> {
        let file = EventFile::open(input)?;
        Ok(Reading { file, events: 0, line: ProgressLine::reading(input) })
    }

    /// The next event; None at the end (see [`Reading::ending`]).
    pub(crate) fn next_event(&mut self) -> Result<Option<Event>, FileError> {
        let event = self.file.next_event()?;
        if event.is_none() {
            self.line = None;
            return Ok(None);
        }
        self.events += 1;
        if let Some(line) = self.line.as_mut().filter(|_| self.events % TICK_EVERY == 0) {
            let (read, size) = (self.file.bytes_read(), self.file.size().max(1));
            let events = self.events;
            line.tick(read as f64 / size as f64, |secs| format!("{} events/s", grouped((events as f64 / secs) as u64)));
        }
        Ok(event)
    }

    /// How the file ended, once read to its end.
    pub(crate) fn ending(&self) -> Option<Ending> {
        self.file.ending()
    }

    /// Calls `each` with every event, in order, and returns how the file ended.
    pub(crate) fn for_each<E: From<FileError>>(
        mut self,
        mut each: impl FnMut(Event) -> Result<(), E>,
    ) -> Result<Ending, E> {
        while let Some(event) = self.next_event()? {
            each(event)?;
        }
        Ok(self.ending().unwrap_or(Ending::Truncated { events: 0 }))
    }
}

/// Calls `each` with every event of the file, in order.
pub(crate) fn for_each_event(input: &Path, each: impl FnMut(Event) -> Result<()>) -> Result<()> {
    let ending = Reading::open(input)?.for_each(each)?;
    say_how_it_ended(input, Some(ending));
    Ok(())
}

/// A warning when the file was cut short or its capture lost events (nothing otherwise).
pub(crate) fn say_how_it_ended(input: &Path, ending: Option<Ending>) {
    let Some(ending) = ending else { return };
    match ending {
        Ending::Truncated { events } => eprintln!(
            "gpuprof: warning: {} is cut short after {events} events (its capture did not finish); what follows covers those",
            input.display()
        ),
        Ending::Closed { lost, .. } if lost > 0 => {
            eprintln!("gpuprof: warning: the capture of {} lost {lost} events; what follows lacks them", input.display())
        }
        Ending::Closed { .. } => {}
    }
}
