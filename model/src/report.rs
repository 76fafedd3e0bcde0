//! The end of the capture's path. Whatever consumes what a capture sees — the views' outputs (a
//! recording, jsonl, a table, the lines a person reads on the terminal) and the OTLP reporter —
//! is a `Reporter`, and the capture's flow hands each event, finding, notice and moment to all of
//! them alike, in one order. It lives with the event and finding types so that every consumer
//! stands below the capture that feeds it.

use std::collections::BTreeMap;
use std::io;
use std::path::PathBuf;

use crate::event::Event;
use crate::findings::{Finding, FindingKind};
use crate::nvml::Reconciled;
use crate::track::LiveSummary;
use crate::track::Tracker;

/// One consumer of a capture.
pub trait Reporter {
    /// An event before the tracker takes it: what it ends is still in the tracker.
    fn before(&mut self, _event: &Event, _tracker: &Tracker) {}
    /// The event once tracked (its peer and segment filled in), with the findings it fired.
    fn event(&mut self, event: &Event, fired: &[Finding], tracker: &Tracker) -> io::Result<()>;
    /// Findings that fired without an event (time passed, the run ended).
    fn findings(&mut self, _fired: &[Finding]) {}
    /// A post-mortem written; its finding went out already, naming it.
    fn postmortem(&mut self, _report: &PostmortemReport) {}
    /// A line for the person who runs the capture.
    fn notice(&mut self, _notice: &Notice) {}
    /// Device memory each followed process uses as the driver accounts it (NVML), by pid.
    fn device_used(&mut self, _used: &BTreeMap<u32, u64>) {}
    /// A batch is over: what is buffered goes on (`now`: wall-clock ns).
    fn flush(&mut self, _tracker: &Tracker, _now: u64) -> io::Result<()> {
        Ok(())
    }
    /// The end of the run. Returns what it delivered, in words, when it has something to say:
    /// the flow finishes the last reporter first and adds that sentence to `end.closing` for the
    /// ones before it, so the lines a person reads come last and say everything.
    fn finish(self: Box<Self>, end: &EndOfRun<'_>) -> io::Result<Option<String>>;
    /// What an export has delivered so far (none for an output that is not one).
    fn health(&self) -> Option<ExportHealth> {
        None
    }
}

/// A line for the person who runs the capture.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notice {
    /// Said on a terminal, logged under a daemon.
    Info(String),
    /// Said on stderr whoever runs it.
    Warning(String),
}

/// What the run ended with.
pub struct EndOfRun<'a> {
    /// The tracker as the run left it.
    pub tracker: &'a Tracker,
    pub processes: &'a [LiveSummary],
    pub findings: &'a [Finding],
    /// Events the capture lost (a recording keeps the count).
    pub lost_events: u64,
    /// Events the capture took in.
    pub events: u64,
    /// NVML's used memory per process, last seen while it ran, beside what the probes saw.
    pub nvml: &'a BTreeMap<u32, Reconciled>,
    /// What the capture took in, in words, and what the reporters finished so far delivered.
    pub closing: &'a [String],
    /// A reporter finished before could not write its output (a full disk): its file is
    /// incomplete, and no one should point at it as whole.
    pub output_failed: bool,
}

/// What an export has delivered so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ExportHealth {
    pub sent: u64,
    pub lost: u64,
    /// Encoded bytes waiting to be sent.
    pub queued_bytes: u64,
}

/// A post-mortem written: its files, and its report gzipped for the collector.
#[derive(Debug, Clone)]
pub struct PostmortemReport {
    pub finding_id: String,
    pub kind: FindingKind,
    pub pid: u32,
    pub recording: PathBuf,
    pub report: PathBuf,
    /// The recording's events (the prologue's included) and processes, the window's length (ns).
    pub events: u64,
    pub processes: usize,
    pub span_ns: u64,
    /// The report's size, and the report gzipped.
    pub html_bytes: u64,
    pub gzip: Vec<u8>,
}
