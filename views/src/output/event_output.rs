//! A capture's event sink as one of its reporters: each event as it is tracked, the batch's end
//! as a flush, and the sink's own end of the run (a table's summary, a recording's count of what
//! was lost).

use std::io;

use gpuprof_model::report::{EndOfRun, Reporter};
use gpuprof_model::{Event, Finding, Tracker};

use super::EventSink;

pub struct EventOutput {
    sink: Box<dyn EventSink>,
}

impl EventOutput {
    pub fn new(sink: Box<dyn EventSink>) -> Self {
        EventOutput { sink }
    }
}

impl Reporter for EventOutput {
    fn event(&mut self, event: &Event, _fired: &[Finding], _tracker: &Tracker) -> io::Result<()> {
        self.sink.event(event)
    }

    fn flush(&mut self, _tracker: &Tracker, _now: u64) -> io::Result<()> {
        self.sink.flush()
    }

    fn finish(mut self: Box<Self>, end: &EndOfRun<'_>) -> io::Result<Option<String>> {
        self.sink.finish(end).map(|()| None)
    }
}
