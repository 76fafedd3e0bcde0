//! Reading the jsonl contract (one event per line), streaming, each distinct stack kept once.
//! A last line cut short (no newline, not a whole event: a capture that was killed while
//! writing) ends the file as truncated; any other bad line is an error naming it.

use std::io::BufRead;

use gpuprof_model::{Event, StackTable};

use crate::read::Ending;

pub(crate) enum JsonlError {
    Io { line: u64, error: std::io::Error },
    NotAnEvent { line: u64, why: String },
}

pub(crate) struct JsonlReader {
    input: Box<dyn BufRead>,
    line: String,
    number: u64,
    events: u64,
    stacks: StackTable,
    ending: Option<Ending>,
}

impl JsonlReader {
    pub(crate) fn new(input: Box<dyn BufRead>) -> Self {
        JsonlReader { input, line: String::new(), number: 0, events: 0, stacks: StackTable::default(), ending: None }
    }

    pub(crate) fn ending(&self) -> Option<Ending> {
        self.ending
    }

    pub(crate) fn next_event(&mut self) -> Result<Option<Event>, JsonlError> {
        loop {
            if self.ending.is_some() {
                return Ok(None);
            }
            self.line.clear();
            self.number += 1;
            let read =
                self.input.read_line(&mut self.line).map_err(|error| JsonlError::Io { line: self.number, error })?;
            if read == 0 {
                self.ending = Some(Ending::Closed { events: self.events, lost: 0 });
                return Ok(None);
            }
            let text = self.line.trim();
            if text.is_empty() {
                continue;
            }
            match serde_json::from_str::<Event>(text) {
                Ok(mut event) => {
                    event.stack = self.stacks.intern(std::mem::take(&mut event.stack));
                    self.events += 1;
                    return Ok(Some(event));
                }
                Err(_) if !self.line.ends_with('\n') => {
                    self.ending = Some(Ending::Truncated { events: self.events });
                    return Ok(None);
                }
                Err(error) => return Err(JsonlError::NotAnEvent { line: self.number, why: error.to_string() }),
            }
        }
    }
}
