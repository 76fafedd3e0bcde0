//! `gpuprof export --format html`: one self-contained page per capture (scripts, styles and data
//! inside; it opens offline). Timelines of what each process held — the allocator's allocated
//! and reserved bytes, live driver allocations — per device, with markers for processes
//! starting and exiting, findings and out-of-memory failures; the stacks behind any instant as
//! an icicle graph and tables; the findings, each linked to its instant.
//!
//! The capture is summarized here, not in the browser, so that the page's size and opening time
//! do not grow with the number of events: curves keep every change up to a bound and then four
//! points a slice of the run (timeline.rs), and live memory by stack is kept at a grid of
//! instants and at the ones that matter (the peak, each finding, the end; snapshots.rs). Two
//! streaming passes: the peak and the run's span, then everything else.

mod page;
mod snapshots;
mod timeline;

use std::collections::HashMap;
use std::io::Write;
use std::path::Path;

use anyhow::{bail, Context, Result};
use gpuprof_model::event::{Event, Layer, Op};
use gpuprof_model::forward_stacks::ForwardStacks;
use gpuprof_model::rank::Ranks;
use gpuprof_model::track::ProcessMemory;
use gpuprof_model::{Analyzer, Finding, FindingKind, RuleConfig};
use serde::Serialize;

use crate::export::peak;
use crate::export::request::{ExportRequest, Moment, StackLayer};
use snapshots::{Snapshot, Stacks};
use timeline::{Curve, Metric};

/// Instants of the regular grid (besides the peak, the findings and the end).
const GRID: u64 = 200;
/// Findings that get a snapshot of their own (the rest point at the grid's).
const FINDING_SNAPSHOTS: usize = 100;

/// What the page is made of (its embedded JSON; report.js reads it).
#[derive(Debug, Serialize)]
struct Report {
    generator: &'static str,
    input: String,
    events: u64,
    /// Events the capture lost (the recording says), or None when it was cut short.
    lost: Option<u64>,
    truncated: bool,
    /// The first event's time (nanoseconds since the Unix epoch): every other time is counted
    /// from it.
    first_ts: u64,
    /// Nanoseconds from the first event to the last.
    span: u64,
    /// Sentences the page shows first, from whoever wrote the recording (a daemon's post-mortem
    /// says what its window is and which part of it has tensor detail).
    notes: Vec<String>,
    /// The first instant the processes held the most together, as the stack views count.
    peak: Option<PeakOut>,
    processes: Vec<ProcessOut>,
    curves: Vec<Curve>,
    markers: Vec<Marker>,
    findings: Vec<FindingOut>,
    kinds: Vec<&'static str>,
    stacks: Stacks,
    snapshots: Vec<Snapshot>,
    /// The "what if" panel: the allocator's requests replayed under the usual settings.
    whatif: WhatifPanel,
    /// What the page shows first.
    initial: Initial,
}

#[derive(Debug, Serialize)]
struct WhatifPanel {
    processes: Vec<crate::whatif::ProcessWhatif>,
    /// Why there is nothing to show, when there is not.
    #[serde(skip_serializing_if = "Option::is_none")]
    note: Option<String>,
}

impl WhatifPanel {
    /// Every process's requests under the usual settings, as `gpuprof whatif --suggest` ranks
    /// them (without its device search, which replays the best one some 25 times more).
    fn of(input: &Path, pid: Option<u32>) -> WhatifPanel {
        let request = crate::whatif::WhatifRequest {
            input,
            output: None,
            pid,
            settings: Vec::new(),
            ran_with: None,
            device_memory: None,
            suggest: true,
            smallest_device: false,
            format: crate::whatif::WhatifFormat::Json,
        };
        match crate::whatif::answer(&request) {
            Ok(answer) => WhatifPanel { processes: answer.processes, note: None },
            Err(error) => WhatifPanel { processes: Vec::new(), note: Some(format!("{error:#}")) },
        }
    }
}

#[derive(Debug, Serialize)]
struct PeakOut {
    t: u64,
    bytes: u64,
}

#[derive(Debug, Serialize)]
struct ProcessOut {
    pid: u32,
    ppid: Option<u32>,
    comm: String,
    /// Nanoseconds after the first event.
    start: u64,
    exit: Option<u64>,
    /// It made a CUDA call (launchers and helpers that never did are listed but not drawn).
    cuda: bool,
    /// Its rank and job in a distributed job, as its first call said (the ranks are shown side
    /// by side).
    #[serde(skip_serializing_if = "Option::is_none")]
    rank: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    job: Option<String>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "snake_case")]
enum MarkerKind {
    Start,
    Exit,
    Oom,
    Finding,
}

#[derive(Debug, Serialize)]
struct Marker {
    t: u64,
    kind: MarkerKind,
    process: u32,
    /// Index into `findings`.
    finding: Option<u32>,
}

#[derive(Debug, Serialize)]
struct FindingOut {
    /// When it fired, nanoseconds after the first event (the end for findings the end gives).
    t: u64,
    process: Option<u32>,
    #[serde(flatten)]
    finding: Finding,
}

#[derive(Debug, Serialize)]
struct Initial {
    /// An instant (nanoseconds after the first event).
    t: u64,
    pid: Option<u32>,
    layer: &'static str,
}

/// Writes the report of `request.input`. Returns gpuprof's exit code.
pub(crate) fn export(request: &ExportRequest<'_>) -> Result<u8> {
    let report = build(request.input, request.moment, request.layer, request.pid, Vec::new())?;
    let mut writer = crate::output::open_writer(request.output.as_deref())?;
    page::write(&report, &mut writer).context("cannot write the report")?;
    writer.flush().context("cannot write the report")?;
    Ok(0)
}

/// The report of a capture just written (`run`/`attach --html FILE`, a daemon's post-mortem):
/// its peak, every process, with `notes` shown first.
pub fn write_file(input: &Path, output: &Path, notes: &[String]) -> Result<()> {
    let report = build(input, Moment::Peak, StackLayer::Auto, None, notes.to_vec())?;
    let mut writer = crate::output::open_writer(Some(output))?;
    page::write(&report, &mut writer)
        .and_then(|_| writer.flush())
        .with_context(|| format!("cannot write {}", output.display()))
}

fn build(input: &Path, moment: Moment, layer: StackLayer, pid: Option<u32>, notes: Vec<String>) -> Result<Report> {
    let (mut first_ts, mut last_ts) = (None, 0u64);
    let (peak, _, events) = peak::scan(input, layer, |event, _| {
        first_ts.get_or_insert(event.ts);
        last_ts = last_ts.max(event.ts);
    })?;
    let Some(first_ts) = first_ts else {
        bail!(
            "{} holds no events: nothing to report; check that the capture ran (`gpuprof run -- CMD` writes one)",
            input.display()
        )
    };
    let span = last_ts.saturating_sub(first_ts);
    let mut builder = Builder::new(first_ts, span, peak);
    let mut file = crate::input::Reading::open(input)?;
    let mut forward_stacks = ForwardStacks::default();
    let mut analyzer = Analyzer::new(RuleConfig::default());
    // Findings name ranks as the live capture did: the file has each on its process's first call.
    let mut ranks = Ranks::default();
    let mut read = 0u64;
    while let Some(mut event) = file.next_event()? {
        read += 1;
        builder.grid_before(&event, &analyzer);
        forward_stacks.follow(&mut event);
        ranks.observe(&event);
        let freed_device = freed_device(&event, &analyzer);
        let mut found = analyzer.observe(&mut event);
        ranks.name(&mut found);
        builder.event(&event, freed_device, &analyzer, read);
        builder.findings(found, event.ts, &analyzer);
    }
    let mut ended = analyzer.finish();
    ranks.name(&mut ended);
    builder.findings(ended, last_ts, &analyzer);
    builder.end(last_ts, &analyzer);

    let (lost, truncated) = match file.ending() {
        Some(gpuprof_recording::Ending::Closed { lost, .. }) => (Some(lost), false),
        Some(gpuprof_recording::Ending::Truncated { .. }) => (None, true),
        None => (Some(0), false),
    };
    let initial_t = match moment {
        Moment::End => span,
        Moment::At(secs) => {
            let at = (secs * 1e9) as u64;
            if at > span {
                bail!(
                    "--at {secs} is past the end of {}: its events span {:.3} s; give at most that",
                    input.display(),
                    span as f64 / 1e9
                );
            }
            at
        }
        Moment::Oom(n) => {
            let ooms: Vec<u64> =
                builder.findings.iter().filter(|f| f.finding.kind == FindingKind::Oom).map(|f| f.t).collect();
            match ooms.get(n.max(1) - 1) {
                Some(&t) => t,
                None => bail!("{} has {} out-of-memory failures, fewer than {n}", input.display(), ooms.len()),
            }
        }
        Moment::Peak | Moment::AfterEvents(_) => builder.peak.as_ref().map_or(span, |p| p.t),
    };
    // Launchers and helpers that never called CUDA are listed, but their lives are not marked.
    let cuda: Vec<bool> = builder.processes.iter().map(|p| p.cuda).collect();
    builder.markers.retain(|m| cuda[m.process as usize] || !matches!(m.kind, MarkerKind::Start | MarkerKind::Exit));
    let mut curves = builder.curves;
    curves.iter_mut().for_each(Curve::finish);
    debug_assert_eq!(read, events);
    Ok(Report {
        generator: concat!("gpuprof ", env!("CARGO_PKG_VERSION")),
        input: input.display().to_string(),
        events,
        lost,
        truncated,
        first_ts,
        span,
        notes,
        peak: builder.peak,
        processes: builder.processes,
        curves,
        markers: builder.markers,
        findings: builder.findings,
        kinds: snapshots::kind_names(),
        stacks: builder.stacks,
        snapshots: builder.snapshots,
        whatif: WhatifPanel::of(input, pid),
        initial: Initial {
            t: initial_t,
            pid,
            layer: match layer {
                StackLayer::Auto => "auto",
                StackLayer::Allocator => "tensors",
                StackLayer::Driver => "driver",
            },
        },
    })
}

/// The device of the driver allocation a free releases, looked up before the tracker forgets it.
fn freed_device(event: &Event, analyzer: &Analyzer) -> Option<Option<i32>> {
    if event.layer != Layer::Driver {
        return None;
    }
    let process = analyzer.tracker().process(event.pid)?;
    process.released_by(event).map(|allocation| allocation.device)
}

struct Builder {
    first_ts: u64,
    span: u64,
    /// Where the peak lies (the event after which it is reached, and the bytes then).
    peak_found: Option<peak::Peak>,
    peak: Option<PeakOut>,
    /// Per pid, the index of its current instance and when that began.
    current: HashMap<u32, (u32, u64)>,
    processes: Vec<ProcessOut>,
    curves: Vec<Curve>,
    curve_of: HashMap<(u32, Option<i32>, Metric), usize>,
    markers: Vec<Marker>,
    findings: Vec<FindingOut>,
    stacks: Stacks,
    snapshots: Vec<Snapshot>,
    /// The next instant of the grid, by number.
    next_grid: u64,
    /// The latest instant replayed: a driver call's record carries when it began but comes when
    /// it returned, so a recording's times may step back a little; the report's never do.
    now: u64,
    /// The event just replayed reached the peak or fired findings: its snapshot's label.
    pending: Option<String>,
}

impl Builder {
    fn new(first_ts: u64, span: u64, peak_found: Option<peak::Peak>) -> Builder {
        Builder {
            first_ts,
            span,
            peak_found,
            peak: None,
            now: 0,
            current: HashMap::new(),
            processes: Vec::new(),
            curves: Vec::new(),
            curve_of: HashMap::new(),
            markers: Vec::new(),
            findings: Vec::new(),
            stacks: Stacks::new(),
            snapshots: Vec::new(),
            next_grid: 0,
            pending: None,
        }
    }

    /// Nanoseconds after the first event, never before an instant already replayed.
    fn instant(&mut self, ts: u64) -> u64 {
        self.now = self.now.max(ts.saturating_sub(self.first_ts));
        self.now
    }

    fn grid_instant(&self, n: u64) -> u64 {
        (self.span as u128 * n as u128 / GRID as u128) as u64
    }

    /// Snapshots of the grid's instants this event lies past (the state before it).
    fn grid_before(&mut self, event: &Event, analyzer: &Analyzer) {
        let t = self.instant(event.ts);
        while self.next_grid < GRID && self.grid_instant(self.next_grid) < t {
            let instant = self.grid_instant(self.next_grid);
            self.snapshot(instant, String::new(), analyzer);
            self.next_grid += 1;
        }
    }

    fn snapshot(&mut self, t: u64, label: String, analyzer: &Analyzer) {
        let live: Vec<(u32, &ProcessMemory)> = analyzer
            .tracker()
            .live_processes()
            .into_iter()
            .filter_map(|process| {
                self.current
                    .get(&process.pid)
                    .filter(|(_, since)| *since == process.first_ts)
                    .map(|(index, _)| (*index, process))
            })
            .collect();
        let snapshot = snapshots::take(t, label, &live, self.first_ts, &mut self.stacks);
        self.snapshots.push(snapshot);
        for curve in &mut self.curves {
            curve.pin(t);
        }
    }

    fn process_index(&mut self, process: &ProcessMemory, t: u64) -> u32 {
        match self.current.get(&process.pid).copied() {
            Some((index, since)) if since == process.first_ts => index,
            previous => {
                // Another program under the same pid (exec): the one before holds nothing now.
                if let Some((replaced, _)) =
                    previous.filter(|(index, _)| self.processes[*index as usize].exit.is_none())
                {
                    self.exited(replaced, t);
                }
                let index = self.processes.len() as u32;
                self.current.insert(process.pid, (index, process.first_ts));
                self.processes.push(ProcessOut {
                    pid: process.pid,
                    ppid: process.ppid,
                    comm: process.comm.to_string(),
                    start: t,
                    exit: None,
                    cuda: false,
                    rank: None,
                    job: None,
                });
                self.markers.push(Marker { t, kind: MarkerKind::Start, process: index, finding: None });
                index
            }
        }
    }

    fn set(&mut self, process: u32, device: Option<i32>, metric: Metric, t: u64, value: u64) {
        let span = self.span;
        let index = match self.curve_of.get(&(process, device, metric)) {
            Some(&index) => index,
            // A device the process never held anything on gets no curve.
            None if value == 0 => return,
            None => {
                self.curves.push(Curve::new(process, device, metric, span));
                self.curve_of.insert((process, device, metric), self.curves.len() - 1);
                self.curves.len() - 1
            }
        };
        self.curves[index].set(t, value);
    }

    /// The event was replayed: its process's curves move, exits and the peak are marked.
    fn event(&mut self, event: &Event, freed_device: Option<Option<i32>>, analyzer: &Analyzer, read: u64) {
        let t = self.instant(event.ts);
        if event.layer == Layer::Process && event.op == Op::Exit {
            // The tracker closed the process: its instance is the one last seen.
            if let Some(&(index, _)) = self.current.get(&event.pid) {
                self.exited(index, t);
            }
        }
        self.after(event, freed_device, analyzer, t);
        if let Some(peak) = self.peak_found.filter(|p| p.events == read) {
            self.peak = Some(PeakOut { t, bytes: peak.bytes });
            self.pending = Some("peak".to_string());
        }
    }

    /// What a process held is returned when it exits.
    fn exited(&mut self, index: u32, t: u64) {
        self.processes[index as usize].exit = Some(t);
        self.markers.push(Marker { t, kind: MarkerKind::Exit, process: index, finding: None });
        let held: Vec<(Option<i32>, Metric)> =
            self.curve_of.keys().filter(|(p, _, _)| *p == index).map(|&(_, d, m)| (d, m)).collect();
        for (device, metric) in held {
            self.set(index, device, metric, t, 0);
        }
    }

    /// The curves of the event's process move.
    fn after(&mut self, event: &Event, freed_device: Option<Option<i32>>, analyzer: &Analyzer, t: u64) {
        let Some(process) =
            analyzer.tracker().process(event.pid).filter(|p| p.state == gpuprof_model::ProcessState::Running)
        else {
            return;
        };
        let index = self.process_index(process, t);
        if event.rank.is_some() || event.job.is_some() {
            let shown = &mut self.processes[index as usize];
            shown.rank = event.rank.or(shown.rank);
            shown.job = event.job.as_deref().map(String::from).or(shown.job.take());
        }
        match event.layer {
            Layer::Process => {}
            Layer::Allocator => {
                self.processes[index as usize].cuda = true;
                if event.allocated.is_some() {
                    let device = event.device.unwrap_or(0);
                    if let Some(totals) = process.allocator_totals().get(&device).copied() {
                        self.set(index, Some(device), Metric::Allocated, t, totals.allocated);
                        self.set(index, Some(device), Metric::Reserved, t, totals.reserved);
                    }
                }
            }
            Layer::Driver => {
                self.processes[index as usize].cuda = true;
                if event.succeeded() && matches!(event.op, Op::Alloc | Op::Free | Op::Unmap) {
                    let device = freed_device.unwrap_or(event.device);
                    let bytes = process.device_memory(device);
                    // A segment returned to the driver shrinks what the allocator reserves.
                    let returned: Vec<(i32, u64, u64)> = process
                        .allocator_totals()
                        .iter()
                        .filter(|(_, totals)| totals.ts == event.ts && event.op != Op::Alloc)
                        .map(|(&device, totals)| (device, totals.allocated, totals.reserved))
                        .collect();
                    self.set(index, device, Metric::Driver, t, bytes);
                    for (device, allocated, reserved) in returned {
                        self.set(index, Some(device), Metric::Allocated, t, allocated);
                        self.set(index, Some(device), Metric::Reserved, t, reserved);
                    }
                }
            }
        }
    }

    /// Findings the event fired (or the end gave), marked at `ts`; the event's snapshot is
    /// taken here, after the findings are known.
    fn findings(&mut self, found: Vec<Finding>, ts: u64, analyzer: &Analyzer) {
        let t = self.instant(ts);
        for finding in found {
            let process = self.current.get(&finding.pid).map(|(index, _)| *index);
            let number = self.findings.len() as u32;
            if let Some(process) = process {
                let kind = if finding.kind == FindingKind::Oom { MarkerKind::Oom } else { MarkerKind::Finding };
                self.markers.push(Marker { t, kind, process, finding: Some(number) });
            }
            if self.pending.is_none() && (number as usize) < FINDING_SNAPSHOTS && t < self.span {
                self.pending = Some(format!("finding {}", number + 1));
            }
            self.findings.push(FindingOut { t, process, finding });
        }
        if let Some(label) = self.pending.take() {
            self.snapshot(t, label, analyzer);
        }
    }

    /// The grid's remaining instants and the end share one snapshot.
    fn end(&mut self, last_ts: u64, analyzer: &Analyzer) {
        let t = self.instant(last_ts);
        self.snapshot(t, "end".to_string(), analyzer);
    }
}
