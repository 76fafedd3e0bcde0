//! `--format jsonl`: the event stream itself, one contract object per line.

use std::io::{self, Write};

use gpuprof_model::event::Event;

use super::{EndOfRun, EventSink};

pub(crate) struct JsonlSink {
    writer: Box<dyn Write>,
}

impl JsonlSink {
    pub(crate) fn new(writer: Box<dyn Write>) -> Self {
        JsonlSink { writer }
    }
}

impl EventSink for JsonlSink {
    fn event(&mut self, event: &Event) -> io::Result<()> {
        serde_json::to_writer(&mut self.writer, event)?;
        self.writer.write_all(b"\n")
    }

    fn flush(&mut self) -> io::Result<()> {
        self.writer.flush()
    }

    fn finish(&mut self, _end: &EndOfRun<'_>) -> io::Result<()> {
        self.writer.flush()
    }
}
