//! `gpuprof whatif`: a recording's allocator requests replayed through the model of PyTorch's
//! caching allocator (`gpuprof_model::allocator`) under other settings or on another device,
//! side by side with what happened. Two passes over the file: the requests, then the user's
//! lines of the few events the answer names (peaks, out-of-memory requests).

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::path::Path;

use anyhow::{Context, Result};
use gpuprof_model::allocator::{AllocatorTrace, Budget, Prediction, RecordedRun, TraceBuilder, WhatifError, MIB};
use serde::Serialize;

use crate::input::for_each_event;
use crate::output::progress::ProgressLine;
use crate::output::python_column;

pub mod plan;

/// Output formats of `whatif`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WhatifFormat {
    /// A column per setting, for a person.
    Table,
    /// One JSON document: the same numbers, and each run's reserved curve.
    Json,
    /// A plan's page (`plan::PlanFormat::Html`); a single recording's what-if is on the page of
    /// `export -f html`.
    Html,
}

pub struct WhatifRequest<'a> {
    pub input: &'a Path,
    pub output: Option<&'a Path>,
    pub pid: Option<u32>,
    /// KEY:VALUE items added to the settings the job ran with.
    pub settings: Vec<String>,
    /// The settings the job ran with, when the recording cannot tell (only expandable segments
    /// show in it).
    pub ran_with: Option<String>,
    pub device_memory: Option<u64>,
    /// Try the usual settings (`USUAL_SETTINGS`), ranked.
    pub suggest: bool,
    /// With `suggest`: also search the smallest device the best one fits (about 25 replays more).
    pub smallest_device: bool,
    pub format: WhatifFormat,
}

/// Points of a reserved curve in the JSON: enough for a chart, not one per request.
const CURVE_POINTS: usize = 400;

#[derive(Debug, Serialize)]
pub(crate) struct Whatif {
    pub processes: Vec<ProcessWhatif>,
}

#[derive(Debug, Serialize)]
pub(crate) struct ProcessWhatif {
    pub pid: u32,
    pub device: i32,
    pub requests: usize,
    pub ran_with: String,
    /// Where `ran_with` comes from.
    pub ran_with_source: &'static str,
    /// "exact", or why no prediction is made.
    pub check: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_memory: Option<u64>,
    /// Bytes the allocator may have in the replays (none: no limit), and where that comes from.
    pub budget: Option<u64>,
    pub budget_source: String,
    /// What happened (the replay under the recorded settings, equal to the recording when the
    /// check passed), then each asked setting; with --suggest, the usual ones, best first.
    pub runs: Vec<Run>,
    /// With --suggest: the least device memory on which the best run never runs out.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub smallest_device: Option<SmallestDevice>,
    /// `--device-memory`, where given: the runs after the first are on that device.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub asked_device: Option<u64>,
}

#[derive(Debug, Serialize)]
pub(crate) struct SmallestDevice {
    pub setting: String,
    pub device_memory: u64,
    pub allocator_budget: u64,
}

#[derive(Debug, Serialize)]
pub(crate) struct Run {
    pub setting: String,
    pub peak_reserved: u64,
    pub peak_at: Option<Place>,
    pub peak_allocated: u64,
    /// Reserved less allocated at the reserved peak, and the largest piece of it.
    pub cache_at_peak: u64,
    pub largest_free_at_peak: u64,
    pub out_of_memory: Vec<OutOfMemoryAt>,
    /// (seconds from the recording's first event, reserved bytes): the highest of each stretch of requests,
    /// at the stretch's first request, so that every run of a process has the same times.
    pub curve: Vec<(f64, u64)>,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct Place {
    /// The request's position among the process's requests.
    pub step: usize,
    /// The event's position in the recording.
    pub event: usize,
    pub seconds: f64,
    /// The user's line and the call it made.
    #[serde(rename = "where")]
    pub place: String,
}

#[derive(Debug, Serialize)]
pub(crate) struct OutOfMemoryAt {
    pub at: Place,
    pub request: u64,
    pub reserved: u64,
    pub reserved_unallocated: u64,
    pub largest_free_block: u64,
    /// Every segment (page) held a live block: no setting that only changes how the cache is
    /// cut can make room.
    pub every_segment_holds_a_live_block: bool,
}

pub fn run(request: &WhatifRequest<'_>) -> Result<u8> {
    let whatif = answer(request)?;
    let mut writer = crate::output::open_writer(request.output)?;
    match request.format {
        WhatifFormat::Json => {
            serde_json::to_writer_pretty(&mut writer, &whatif)?;
            writeln!(writer)?;
        }
        WhatifFormat::Table => write_table(&mut writer, &whatif, request.input)?,
        WhatifFormat::Html => anyhow::bail!(
            "whatif -f html draws a plan (--scale); the what-if of one recording is on its page: gpuprof export {} -f html",
            request.input.display()
        ),
    }
    writer.flush().context("cannot write the what-if")?;
    Ok(if whatif.processes.iter().all(|p| p.check == "exact") { 0 } else { 1 })
}

/// A recording's allocator traces (`pid`: only that process's), and the time of its first
/// event: the zero of every moment named, as `summary` and `export --at` count.
pub(crate) struct Traces {
    pub traces: Vec<AllocatorTrace>,
    pub first_ts: u64,
}

pub(crate) fn traces_of(input: &Path, pid: Option<u32>) -> Result<Traces> {
    let mut builder = TraceBuilder::new();
    let mut first_ts = None;
    for_each_event(input, |event| {
        first_ts.get_or_insert(event.ts);
        builder.push(&event);
        Ok(())
    })?;
    let traces: Vec<AllocatorTrace> = builder.finish().into_iter().filter(|t| pid.is_none_or(|p| p == t.pid)).collect();
    if traces.is_empty() {
        anyhow::bail!(
            "{} has no allocator requests{}: a what-if replays PyTorch's allocator, whose reports a capture at --level tensors (the default of `run` and `attach`) records from a job using PyTorch",
            input.display(),
            pid.map(|p| format!(" of pid {p}")).unwrap_or_default()
        );
    }
    Ok(Traces { traces, first_ts: first_ts.unwrap_or(0) })
}

pub(crate) fn answer(request: &WhatifRequest<'_>) -> Result<Whatif> {
    let Traces { traces, first_ts } = traces_of(request.input, request.pid)?;
    let mut processes = Vec::new();
    for trace in &traces {
        processes.push(process_whatif(trace, first_ts, request)?);
    }
    name_places(request.input, places_of(processes.iter_mut().flat_map(|p| p.runs.iter_mut())))?;
    Ok(Whatif { processes })
}

/// Where the replays' device memory comes from, in words.
pub(crate) fn budget_source(budget: Budget) -> String {
    match budget {
        Budget::Unbounded => "no limit: the recording says nothing of the device (give --device-memory)".to_string(),
        Budget::Recorded(_) => "what the device gave the allocator when the job ran out of memory".to_string(),
        Budget::Device { device_memory, non_allocator, source } => format!(
            "{} device less {} that was not the allocator's ({})",
            gib(device_memory),
            gib(non_allocator),
            source.describe()
        ),
    }
}

fn process_whatif(trace: &AllocatorTrace, first_ts: u64, request: &WhatifRequest<'_>) -> Result<ProcessWhatif> {
    let recorded = RecordedRun::new(trace, request.ran_with.as_deref());
    let budget = Budget::for_device(trace, request.device_memory);
    let budget_source = budget_source(budget);
    let mut out = ProcessWhatif {
        pid: trace.pid,
        device: trace.device,
        requests: trace.requests.len(),
        ran_with: shown(&recorded.ran_with),
        ran_with_source: recorded.ran_with_source.describe(),
        check: "exact".to_string(),
        device_memory: request.device_memory.or(trace.device_memory),
        budget: budget.bytes(),
        budget_source,
        runs: Vec::new(),
        smallest_device: None,
        asked_device: request.device_memory,
    };
    let as_it_ran = match recorded.as_it_ran() {
        Ok(as_it_ran) => as_it_ran,
        Err(error @ (WhatifError::Diverged(_) | WhatifError::Incomplete(_))) => {
            out.check = error.to_string();
            return Ok(out);
        }
        Err(error) => return Err(error).context("the settings the job ran with (--ran-with)"),
    };
    out.runs.push(run_of(trace, first_ts, &as_it_ran));
    let predictions = if request.suggest {
        let mut line = ProgressLine::doing(format!("replaying pid {}'s requests under the usual settings", trace.pid));
        recorded.suggest(budget, |done, of| replayed(&mut line, format!("{done} of {of} replays"), done, of))?
    } else {
        let mut asked = Vec::new();
        // On another device, the job's own settings there come first: the setting asked about
        // is weighed against them on the same device.
        if request.device_memory.is_some() {
            asked.push(recorded.predict(&[], budget)?);
        }
        for setting in &request.settings {
            asked.push(recorded.predict(std::slice::from_ref(setting), budget).context("--setting")?);
        }
        asked
    };
    out.runs.extend(predictions.iter().map(|p| run_of(trace, first_ts, p)));
    if request.suggest && request.smallest_device {
        if let Some(best) = predictions.first() {
            let mut line = ProgressLine::doing(format!("finding the least device memory pid {} fits in", trace.pid));
            let allocator_budget = recorded.smallest_budget(&best.extra, |done, most| {
                replayed(&mut line, format!("{done} of at most {most} replays"), done, most)
            })?;
            let (non_allocator, _) = Budget::non_allocator(trace);
            out.smallest_device = Some(SmallestDevice {
                setting: shown(&best.setting),
                device_memory: allocator_budget + non_allocator,
                allocator_budget,
            });
        }
    }
    Ok(out)
}

/// A person waiting on replays is told how many are done (`count`, in words).
fn replayed(line: &mut Option<ProgressLine>, count: String, done: usize, of: usize) {
    if let Some(line) = line {
        line.tick(done as f64 / of as f64, |_| count);
    }
}

/// A replay as the views show it; moments counted from `first_ts`, the recording's first event.
pub(crate) fn run_of(trace: &AllocatorTrace, first_ts: u64, prediction: &Prediction) -> Run {
    let replay = &prediction.replay;
    let start = first_ts;
    let place = |step: usize| Place {
        step,
        event: trace.origins[step].event,
        seconds: trace.origins[step].ts.saturating_sub(start) as f64 / 1e9,
        place: String::new(),
    };
    let per_point = replay.reserved.len().div_ceil(CURVE_POINTS).max(1);
    let curve = replay
        .reserved
        .chunks(per_point)
        .enumerate()
        .map(|(chunk, values)| {
            let most = values.iter().copied().max().expect("chunks are not empty");
            (place(chunk * per_point).seconds, most)
        })
        .collect();
    Run {
        setting: shown(&prediction.setting),
        peak_reserved: replay.peak_reserved,
        peak_at: replay.peak_step.map(place),
        peak_allocated: replay.peak_allocated,
        cache_at_peak: replay.peak_reserved - replay.allocated_at_peak,
        largest_free_at_peak: replay.largest_free_at_peak,
        out_of_memory: replay
            .out_of_memory
            .iter()
            .map(|(step, oom)| OutOfMemoryAt {
                at: place(*step),
                request: oom.request,
                reserved: oom.reserved,
                reserved_unallocated: oom.reserved_unallocated,
                largest_free_block: oom.largest_free_block,
                every_segment_holds_a_live_block: oom.every_unit_pinned(),
            })
            .collect(),
        curve,
    }
}

/// The places runs name: their peaks and out-of-memory requests.
pub(crate) fn places_of<'r>(runs: impl Iterator<Item = &'r mut Run>) -> Vec<&'r mut Place> {
    let mut places: Vec<&mut Place> = Vec::new();
    for run in runs {
        places.extend(run.peak_at.as_mut());
        places.extend(run.out_of_memory.iter_mut().map(|oom| &mut oom.at));
    }
    places
}

/// Fills in the user's line of every place named, from a second pass over the file.
pub(crate) fn name_places(input: &Path, places: Vec<&mut Place>) -> Result<()> {
    let wanted: HashSet<usize> = places.iter().map(|p| p.event).collect();
    let mut named: HashMap<usize, String> = HashMap::new();
    let mut index = 0;
    // The first pass said how the file ended; this one need not again.
    crate::input::Reading::open(input)?.for_each(|event| {
        if wanted.contains(&index) {
            named.insert(index, python_column(&event.attributed_stack()));
        }
        index += 1;
        anyhow::Ok(())
    })?;
    for place in places {
        place.place = named.get(&place.event).cloned().unwrap_or_default();
    }
    Ok(())
}

/// Settings as people read them: PyTorch's defaults by name.
pub(crate) fn shown(setting: &str) -> String {
    if setting.is_empty() {
        "default".to_string()
    } else {
        setting.to_string()
    }
}

pub(crate) fn gib(bytes: u64) -> String {
    format!("{:.2} GiB", bytes as f64 / (1024 * MIB) as f64)
}

fn write_table(writer: &mut dyn Write, whatif: &Whatif, input: &Path) -> Result<()> {
    for process in &whatif.processes {
        writeln!(
            writer,
            "{}: pid {}, device {}: {} requests to PyTorch's caching allocator, settings {} ({})",
            input.display(),
            process.pid,
            process.device,
            process.requests,
            process.ran_with,
            process.ran_with_source
        )?;
        if process.check != "exact" {
            writeln!(writer, "  no prediction: {}", process.check)?;
            continue;
        }
        writeln!(writer, "  replay check: exact at every request, and every segment the driver saw")?;
        match process.budget {
            Some(budget) => writeln!(writer, "  the allocator may have {}: {}", gib(budget), process.budget_source)?,
            None => writeln!(writer, "  the allocator may have any amount: {}", process.budget_source)?,
        }
        if process.smallest_device.is_some() {
            write_ranking(writer, process)?;
        } else {
            write_columns(writer, process)?;
        }
        let as_it_ran = process.runs.first().into_iter().map(|run| ("as it ran".to_string(), run));
        let asked = process.runs.iter().enumerate().skip(1).map(|(i, run)| (column_name(process, i), run));
        let shown: Vec<(String, &Run)> =
            if process.smallest_device.is_some() { as_it_ran.collect() } else { as_it_ran.chain(asked).collect() };
        for (name, run) in shown {
            for oom in run.out_of_memory.iter().take(3) {
                writeln!(
                    writer,
                    "  {name}: out of memory asking for {} at {} with {} reserved, {} of it free in pieces (largest {}){}",
                    gib(oom.request),
                    if oom.at.place.is_empty() { "(no Python stack)" } else { &oom.at.place },
                    gib(oom.reserved),
                    gib(oom.reserved_unallocated),
                    gib(oom.largest_free_block),
                    if oom.every_segment_holds_a_live_block {
                        "; every segment holds a live block, so emptying the cache cannot make room (a setting that lays blocks out otherwise, as expandable segments do, may: the other columns say)"
                    } else {
                        ""
                    }
                )?;
            }
        }
        if let Some(smallest) = &process.smallest_device {
            writeln!(
                writer,
                "  smallest device it fits: {} with {} ({} for the allocator)",
                gib(smallest.device_memory),
                smallest.setting,
                gib(smallest.allocator_budget)
            )?;
        }
        writeln!(writer)?;
    }
    Ok(())
}

/// What happened, then each asked setting, a column each.
fn write_columns(writer: &mut dyn Write, process: &ProcessWhatif) -> Result<()> {
    let width = 30;
    let mut header = format!("  {:<24}", "");
    for (i, run) in process.runs.iter().enumerate() {
        let title = if i == 0 { format!("as it ran ({})", run.setting) } else { column_name(process, i) };
        header.push_str(&format!("{:<width$}", fit_to(&title, width - 2)));
    }
    writeln!(writer, "{}", header.trim_end())?;
    let row = |label: &str, cell: &dyn Fn(&Run) -> String| {
        let mut line = format!("  {label:<24}");
        for run in &process.runs {
            line.push_str(&format!("{:<width$}", fit_to(&cell(run), width - 2)));
        }
        line.trim_end().to_string()
    };
    writeln!(writer, "{}", row("peak reserved", &|r| gib(r.peak_reserved)))?;
    writeln!(
        writer,
        "{}",
        row("  at", &|r| r.peak_at.as_ref().map_or("-".into(), |p| format!("request {} ({:.3} s)", p.step, p.seconds)))
    )?;
    writeln!(writer, "{}", row("peak allocated", &|r| gib(r.peak_allocated)))?;
    writeln!(writer, "{}", row("cache at the peak", &|r| gib(r.cache_at_peak)))?;
    writeln!(writer, "{}", row("  largest free block", &|r| gib(r.largest_free_at_peak)))?;
    writeln!(writer, "{}", row("out of memory", &|r| out_of_memory_cell(r)))?;
    Ok(())
}

/// A run's name: its setting, and for the job's own settings on an asked device, which.
fn column_name(process: &ProcessWhatif, i: usize) -> String {
    let run = &process.runs[i];
    match process.asked_device {
        Some(device) if i > 0 && run.setting == process.runs[0].setting => {
            format!("{} on {}", run.setting, gib(device))
        }
        _ => run.setting.clone(),
    }
}

/// --suggest: what happened, then the settings tried, best first, a row each.
fn write_ranking(writer: &mut dyn Write, process: &ProcessWhatif) -> Result<()> {
    writeln!(writer, "  {:<4}{:<52}{:>14}{:>14}  out of memory", "", "setting", "peak reserved", "cache at peak")?;
    for (i, run) in process.runs.iter().enumerate() {
        let rank = if i == 0 { "ran".to_string() } else { format!("{i}.") };
        writeln!(
            writer,
            "  {rank:<4}{:<52}{:>14}{:>14}  {}",
            fit_to(&run.setting, 50),
            gib(run.peak_reserved),
            gib(run.cache_at_peak),
            out_of_memory_cell(run)
        )?;
    }
    Ok(())
}

fn out_of_memory_cell(run: &Run) -> String {
    match run.out_of_memory.first() {
        None => "no".to_string(),
        Some(oom) => format!("request {} ({:.3} s)", oom.at.step, oom.at.seconds),
    }
}

pub(crate) fn fit_to(text: &str, width: usize) -> String {
    if text.chars().count() <= width {
        text.to_string()
    } else {
        let mut short: String = text.chars().take(width - 1).collect();
        short.push('…');
        short
    }
}
