//! `--format recording`: the compact recording (each stack once, events as deltas, zstd) that
//! `report`, `export` and the fleet replay read back; `export --format jsonl` turns it into the
//! readable contract.

use std::io::{self, Write};

use gpuprof_model::event::Event;
use gpuprof_recording::Writer;

use super::{EndOfRun, EventSink};

pub(crate) struct RecordingSink {
    writer: Option<Writer<Box<dyn Write>>>,
}

impl RecordingSink {
    pub(crate) fn new(out: Box<dyn Write>, compress: bool) -> io::Result<Self> {
        Ok(RecordingSink { writer: Some(Writer::new(out, compress)?) })
    }
}

impl EventSink for RecordingSink {
    fn event(&mut self, event: &Event) -> io::Result<()> {
        match &mut self.writer {
            Some(writer) => writer.write(event),
            None => Ok(()),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match &mut self.writer {
            Some(writer) => writer.flush(),
            None => Ok(()),
        }
    }

    fn finish(&mut self, end: &EndOfRun<'_>) -> io::Result<()> {
        match self.writer.take() {
            Some(writer) => writer.finish(end.lost_events).map(drop),
            None => Ok(()),
        }
    }
}
