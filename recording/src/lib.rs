//! gpuprof's recordings: what `attach` and `run` write for later (`report`, `export`, the fleet
//! replay), and how every reader gets the events back.
//!
//! A recording is compact: each distinct string, frame and stack is written once and referred
//! to by id, events are deltas from the one before (~20 bytes for a tensor event with a 40-frame
//! stack), and the whole is zstd-compressed by default (`format` has the layout). The readable
//! jsonl of docs/events.md is the other format a capture writes, and `EventFile` reads either,
//! streaming, telling them apart by their first bytes.

mod format;
mod jsonl;
mod read;
mod varint;
mod write;

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

use gpuprof_model::Event;

pub use format::{HEADER_LEN, MAGIC, VERSION};
pub use read::{is_recording, Ending, ReadError, Reader};
pub use write::Writer;

/// An event file of either format, read in order.
pub struct EventFile {
    path: PathBuf,
    source: Source,
}

enum Source {
    Recording(Box<Reader>),
    Jsonl(jsonl::JsonlReader),
}

/// Why an event file could not be read, naming the file and where in it.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    // Errors are named `error`, not `source`: the message already says it, once.
    #[error("cannot read {path}: {error}")]
    Open { path: PathBuf, error: std::io::Error },
    #[error("{path}: {error}")]
    Recording { path: PathBuf, error: ReadError },
    #[error("{path}:{line}: not a gpuprof event ({why}); the file is corrupt")]
    Jsonl { path: PathBuf, line: u64, why: String },
    #[error("cannot read {path} at line {line}: {error}")]
    JsonlIo { path: PathBuf, line: u64, error: std::io::Error },
}

/// What kind of file an event file is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileFormat {
    Recording,
    Jsonl,
}

impl EventFile {
    pub fn open(path: &Path) -> Result<EventFile, FileError> {
        let open_error = |error| FileError::Open { path: path.to_path_buf(), error };
        let mut input = BufReader::with_capacity(1 << 16, File::open(path).map_err(open_error)?);
        let source = if is_recording(&mut input).map_err(open_error)? {
            let reader =
                Reader::new(input).map_err(|error| FileError::Recording { path: path.to_path_buf(), error })?;
            Source::Recording(Box::new(reader))
        } else {
            Source::Jsonl(jsonl::JsonlReader::new(Box::new(input) as Box<dyn BufRead>))
        };
        Ok(EventFile { path: path.to_path_buf(), source })
    }

    pub fn format(&self) -> FileFormat {
        match self.source {
            Source::Recording(_) => FileFormat::Recording,
            Source::Jsonl(_) => FileFormat::Jsonl,
        }
    }

    /// The next event; None at the end (see [`EventFile::ending`]).
    pub fn next_event(&mut self) -> Result<Option<Event>, FileError> {
        match &mut self.source {
            Source::Recording(reader) => {
                reader.next_event().map_err(|error| FileError::Recording { path: self.path.clone(), error })
            }
            Source::Jsonl(reader) => reader.next_event().map_err(|error| match error {
                jsonl::JsonlError::Io { line, error } => FileError::JsonlIo { path: self.path.clone(), line, error },
                jsonl::JsonlError::NotAnEvent { line, why } => FileError::Jsonl { path: self.path.clone(), line, why },
            }),
        }
    }

    /// How the file ended, once read to its end: closed cleanly, or cut short (a capture that
    /// was killed) after some events — which were all read.
    pub fn ending(&self) -> Option<Ending> {
        match &self.source {
            Source::Recording(reader) => reader.ending(),
            Source::Jsonl(reader) => reader.ending(),
        }
    }

    /// Calls `each` with every event, in order, and returns how the file ended.
    pub fn for_each<E: From<FileError>>(mut self, mut each: impl FnMut(Event) -> Result<(), E>) -> Result<Ending, E> {
        while let Some(event) = self.next_event()? {
            each(event)?;
        }
        Ok(self.ending().unwrap_or(Ending::Truncated { events: 0 }))
    }
}

#[cfg(test)]
mod tests;
