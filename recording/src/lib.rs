//! gpuprof's recordings: what `attach` and `run` write for later (`report`, `export`, the fleet
//! replay), and how every reader gets the events back.
//!
//! A recording is compact: each distinct string, frame and stack is written once and referred
//! to by id, events are deltas from the one before (~20 bytes for a tensor event with a 40-frame
//! stack), and the whole is zstd-compressed by default (`format` has the layout). The readable
//! jsonl of docs/events.md is the other format a capture writes, and `EventFile` reads either,
//! streaming, telling them apart by their first bytes.

#![warn(unreachable_pub)]

mod format;
mod jsonl;
pub mod naming;
mod read;
mod varint;
mod write;

use std::cell::Cell;
use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::rc::Rc;

use gpuprof_model::Event;

#[cfg(test)]
use format::{HEADER_LEN, MAGIC};
pub(crate) use read::is_recording;
pub use read::{Ending, ReadError, Reader};
pub use write::{compress, Compressor, Writer};

/// An event file of either format, read in order.
pub struct EventFile {
    path: PathBuf,
    source: Source,
    /// Bytes taken from the file so far, and its size when opened: how far through it the
    /// reader is, for a person waiting on a long pass.
    read: Rc<Cell<u64>>,
    size: u64,
}

/// The file as read, each read counted: the readers above it (a buffer, zstd) take what they
/// need and need not know.
struct Counted {
    file: File,
    read: Rc<Cell<u64>>,
}

impl Read for Counted {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.file.read(buf)?;
        self.read.set(self.read.get() + n as u64);
        Ok(n)
    }
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
    #[error("{path} is {what}, not an event file: give the recording (.gpuprof) or jsonl it was made from")]
    NotEvents { path: PathBuf, what: &'static str },
}

/// What an export of gpuprof's (or another tool's) looks like by its first bytes, so that one
/// given where events are expected is named rather than read as a corrupt jsonl.
fn export_kind(head: &[u8]) -> Option<&'static str> {
    let text = String::from_utf8_lossy(&head[..head.len().min(512)]).trim_start().to_ascii_lowercase();
    if text.starts_with("<!doctype html") || text.starts_with("<html") {
        Some("an HTML page (open it in a browser)")
    } else if text.starts_with("<?xml") || text.starts_with("<svg") {
        Some("an SVG image (a flame graph: open it in a browser)")
    } else if text.starts_with('{') && text.contains("speedscope.app/file-format-schema") {
        // By its schema, not the word alone: an event's path or command may say "speedscope".
        Some("a speedscope profile (open it at https://www.speedscope.app)")
    } else if head.first() == Some(&0x80) && head.get(1).is_some_and(|v| (2..=5).contains(v)) {
        Some("a Python pickle (a memory_viz snapshot: open it at https://pytorch.org/memory_viz)")
    } else if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        Some("zstd-compressed data (decompress it with `zstd -d` first)")
    } else {
        None
    }
}

/// What kind of file an event file is.
#[cfg(test)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FileFormat {
    Recording,
    Jsonl,
}

impl EventFile {
    pub fn open(path: &Path) -> Result<EventFile, FileError> {
        let open_error = |error| FileError::Open { path: path.to_path_buf(), error };
        let file = File::open(path).map_err(open_error)?;
        let size = file.metadata().map_err(open_error)?.len();
        let read = Rc::new(Cell::new(0));
        let mut input = BufReader::with_capacity(1 << 16, Counted { file, read: Rc::clone(&read) });
        if let Some(what) = export_kind(input.fill_buf().map_err(open_error)?) {
            return Err(FileError::NotEvents { path: path.to_path_buf(), what });
        }
        let source = if is_recording(&mut input).map_err(open_error)? {
            let reader =
                Reader::new(input).map_err(|error| FileError::Recording { path: path.to_path_buf(), error })?;
            Source::Recording(Box::new(reader))
        } else {
            Source::Jsonl(jsonl::JsonlReader::new(Box::new(input) as Box<dyn BufRead>))
        };
        Ok(EventFile { path: path.to_path_buf(), source, read, size })
    }

    /// Bytes read from the file so far: ahead of the events returned by at most what its
    /// buffers hold (64 KiB, and a zstd frame's window), and its size at the end.
    pub fn bytes_read(&self) -> u64 {
        self.read.get()
    }

    /// The file's size when it was opened.
    pub fn size(&self) -> u64 {
        self.size
    }

    #[cfg(test)]
    pub(crate) fn format(&self) -> FileFormat {
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
