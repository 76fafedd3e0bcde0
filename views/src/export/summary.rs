//! `gpuprof summary`: per process, the lines that held the most memory at the peak, at the end,
//! and allocated over the whole run (memray's `summary`, for GPU memory). Two streaming passes:
//! the peak and the totals, then the state at the peak.

use std::collections::HashMap;
use std::io::Write;
use std::path::Path;

use anyhow::{Context, Result};
use gpuprof_model::bytes::human;
use gpuprof_model::event::{Layer, Op};
use gpuprof_model::rank::Ranks;
use gpuprof_model::track::Tracker;
use serde::Serialize;

use super::peak;
use super::replay::replay_to;
use super::request::{Moment, StackLayer};
use crate::output::python_column;
use crate::output::text::{fit, COLUMNS};

/// Output formats of `summary`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SummaryFormat {
    /// Aligned columns, 120 wide.
    Table,
    /// One JSON document (the same numbers).
    Json,
}

pub struct SummaryRequest<'a> {
    pub input: &'a Path,
    pub output: Option<&'a Path>,
    pub pid: Option<u32>,
    pub layer: StackLayer,
    /// Lines per process.
    pub top: usize,
    pub format: SummaryFormat,
}

/// Bytes and blocks.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize)]
pub(crate) struct Amount {
    pub bytes: u64,
    pub count: u64,
}

impl Amount {
    fn add(&mut self, bytes: u64) {
        self.bytes += bytes;
        self.count += 1;
    }
}

/// One line of the program (the user's line and the call it made).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Row {
    #[serde(rename = "where")]
    pub place: String,
    pub at_peak: Amount,
    pub at_end: Amount,
    pub allocated: Amount,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct ProcessSummary {
    pub pid: u32,
    /// Its rank in a distributed job, as the capture read it (the newest instance of the pid's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rank: Option<u32>,
    pub comm: String,
    /// "tensors" (the allocator's blocks) or "driver" (driver allocations).
    pub counts: &'static str,
    pub at_peak: Amount,
    pub at_end: Amount,
    pub allocated: Amount,
    /// Largest at the peak first; at most the requested number.
    pub rows: Vec<Row>,
    /// Lines not shown.
    pub more: usize,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct Summary {
    pub peak_secs: f64,
    pub peak_bytes: u64,
    pub processes: Vec<ProcessSummary>,
}

pub fn run(request: &SummaryRequest<'_>) -> Result<u8> {
    let summary = summarize(request)?;
    let mut writer = crate::output::open_writer(request.output)?;
    match request.format {
        SummaryFormat::Json => {
            serde_json::to_writer_pretty(&mut writer, &summary)?;
            writeln!(writer)?;
        }
        SummaryFormat::Table => write_table(&mut writer, &summary, request.input)?,
    }
    writer.flush().context("cannot write the summary")?;
    Ok(0)
}

/// Per process and line: (tensors, driver) amounts, before choosing which one the process counts.
type Allocated = HashMap<u32, HashMap<String, (Amount, Amount)>>;

pub(crate) fn summarize(request: &SummaryRequest<'_>) -> Result<Summary> {
    let mut allocated: Allocated = HashMap::new();
    let mut ranks = Ranks::default();
    let (peak, end) = peak::find_with(request.input, request.layer, |event, _| {
        ranks.observe(event);
        let allocates = event.op == Op::Alloc && event.succeeded() && event.addr.is_some();
        if !allocates || !matches!(event.layer, Layer::Allocator | Layer::Driver) {
            return;
        }
        let place = place_of(&event.attributed_stack());
        let both = allocated.entry(event.pid).or_default().entry(place).or_default();
        if event.layer == Layer::Allocator {
            both.0.add(event.size)
        } else {
            both.1.add(event.size)
        }
    })?;
    let at_peak = replay_to(request.input, Moment::AfterEvents(peak.events), |_| ())?;
    let mut processes = Vec::new();
    let mut pids: Vec<u32> = allocated.keys().copied().collect();
    pids.sort_unstable();
    for pid in pids.into_iter().filter(|pid| request.pid.is_none_or(|p| p == *pid)) {
        let rank = ranks.of(pid);
        processes.push(process_summary(pid, rank, end.tracker(), at_peak.tracker(), &allocated[&pid], request));
    }
    processes.sort_by(|a, b| b.at_peak.bytes.cmp(&a.at_peak.bytes).then(a.pid.cmp(&b.pid)));
    if let Some(pid) = request.pid.filter(|_| processes.is_empty()) {
        anyhow::bail!(
            "pid {pid} allocated no GPU memory in {}: `gpuprof report {}` lists the processes",
            request.input.display(),
            request.input.display()
        );
    }
    Ok(Summary { peak_secs: peak.secs, peak_bytes: peak.bytes, processes })
}

fn process_summary(
    pid: u32,
    rank: Option<u32>,
    end: &Tracker,
    peak: &Tracker,
    allocated: &HashMap<String, (Amount, Amount)>,
    request: &SummaryRequest<'_>,
) -> ProcessSummary {
    // The newest instance of the pid decides its name and what it counts.
    let last = end.processes().into_iter().rfind(|p| p.pid == pid);
    let tensors = match last {
        Some(process) => request.layer.counts_tensors(process),
        None => request.layer == StackLayer::Allocator,
    };
    let mut rows: HashMap<String, Row> = HashMap::new();
    for (place, (by_tensors, by_driver)) in allocated {
        let amount = if tensors { *by_tensors } else { *by_driver };
        if amount.count > 0 {
            row_for(&mut rows, place).allocated = amount;
        }
    }
    // At the peak what the pid's live instance held; at the end also what exited instances
    // still held when they ended.
    let live_at_peak = peak.process(pid).into_iter().collect::<Vec<_>>();
    let held_at_end = end.processes().into_iter().filter(|p| p.pid == pid).collect::<Vec<_>>();
    for (processes, at_end) in [(live_at_peak, false), (held_at_end, true)] {
        for process in processes {
            let live = if tensors { process.blocks() } else { process.allocations() };
            for allocation in live {
                let row = row_for(&mut rows, &place_of(&allocation.stack));
                if at_end {
                    row.at_end.add(allocation.size)
                } else {
                    row.at_peak.add(allocation.size)
                }
            }
        }
    }
    let mut rows: Vec<Row> = rows.into_values().collect();
    rows.sort_by(|a, b| {
        (b.at_peak.bytes, b.at_end.bytes, b.allocated.bytes)
            .cmp(&(a.at_peak.bytes, a.at_end.bytes, a.allocated.bytes))
            .then_with(|| a.place.cmp(&b.place))
    });
    let sum = |pick: fn(&Row) -> Amount| {
        rows.iter()
            .map(pick)
            .fold(Amount::default(), |t, a| Amount { bytes: t.bytes + a.bytes, count: t.count + a.count })
    };
    let (at_peak, at_end, total) = (sum(|r| r.at_peak), sum(|r| r.at_end), sum(|r| r.allocated));
    let more = rows.len().saturating_sub(request.top);
    rows.truncate(request.top);
    ProcessSummary {
        pid,
        rank,
        comm: last.map(|p| p.comm.to_string()).unwrap_or_default(),
        counts: if tensors { "tensors" } else { "driver" },
        at_peak,
        at_end,
        allocated: total,
        rows,
        more,
    }
}

fn row_for<'a>(rows: &'a mut HashMap<String, Row>, place: &str) -> &'a mut Row {
    rows.entry(place.to_string()).or_insert_with(|| Row {
        place: place.to_string(),
        at_peak: Amount::default(),
        at_end: Amount::default(),
        allocated: Amount::default(),
    })
}

/// The user's line and the call it made, as the event table's PYTHON column says it.
fn place_of(stack: &[gpuprof_model::event::Frame]) -> String {
    match python_column(stack) {
        place if place.is_empty() => "(no Python stack)".to_string(),
        place => place,
    }
}

const PLACE_WIDTH: usize = COLUMNS - 2 - 3 * (10 + 1 + 8 + 2);

fn write_table(writer: &mut dyn Write, summary: &Summary, input: &Path) -> Result<()> {
    writeln!(
        writer,
        "{}: peak {} live, {:.3} s in (all processes together)",
        fit(&input.display().to_string(), 50),
        human(summary.peak_bytes),
        summary.peak_secs
    )?;
    for process in &summary.processes {
        writeln!(writer)?;
        let what = if process.counts == "tensors" { "tensors (allocator blocks)" } else { "driver allocations" };
        let rank = process.rank.map(|r| format!(" (rank {r})")).unwrap_or_default();
        writeln!(
            writer,
            "pid {}{rank} {}, {what}: {} at the peak, {} at the end, {} allocated",
            process.pid,
            process.comm,
            human(process.at_peak.bytes),
            human(process.at_end.bytes),
            human(process.allocated.bytes)
        )?;
        writeln!(
            writer,
            "  {:>10} {:>8}  {:>10} {:>8}  {:>10} {:>8}  WHERE",
            "AT PEAK", "COUNT", "AT END", "COUNT", "ALLOCATED", "COUNT"
        )?;
        for row in &process.rows {
            writeln!(
                writer,
                "  {:>10} {:>8}  {:>10} {:>8}  {:>10} {:>8}  {}",
                human(row.at_peak.bytes),
                row.at_peak.count,
                human(row.at_end.bytes),
                row.at_end.count,
                human(row.allocated.bytes),
                row.allocated.count,
                fit(&row.place, PLACE_WIDTH)
            )?;
        }
        if process.more > 0 {
            writeln!(writer, "  ({} more lines: --top N shows more)", process.more)?;
        }
    }
    Ok(())
}
