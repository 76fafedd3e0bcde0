//! `gpuprof whatif A B --scale batch=4,8 --at 16,32 [--largest]`: recordings of one job at two or
//! more values of a size, aligned request by request (`gpuprof_model::allocator::Scaling`), each
//! checked against the model first; then the peak reserved at the values asked and the largest
//! value that fits the device, under the job's settings and others.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use gpuprof_model::allocator::{
    AllocatorConfig, AllocatorTrace, Budget, Largest, PlanError, Prediction, RecordedRun, ScaleError, ScalePoint,
    Scaling, WhatifError, USUAL_SETTINGS,
};
use serde::Serialize;

mod page;

use super::{budget_source, gib, name_places, places_of, run_of, shown, traces_of, Place, Run};

/// Output formats of a plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlanFormat {
    Table,
    Json,
    /// One page: peak reserved against the size, a line per setting, the device's memory.
    Html,
}

pub struct PlanRequest<'a> {
    /// One recording per value of the size, in the order of `values`.
    pub inputs: &'a [PathBuf],
    /// What the size is called (`batch`, `seq_len`): the table's and the chart's word for it.
    pub size: String,
    pub values: Vec<u64>,
    /// Values to predict.
    pub at: Vec<u64>,
    /// Search the largest value that fits, in steps of `step`.
    pub largest: bool,
    pub step: u64,
    /// KEY:VALUE items, each a setting of its own beside the job's.
    pub settings: Vec<String>,
    pub ran_with: Option<String>,
    pub device_memory: Option<u64>,
    pub format: PlanFormat,
    pub output: Option<&'a Path>,
}

#[derive(Debug, Serialize)]
pub(crate) struct Plan {
    pub size: String,
    pub recorded: Vec<RecordedAt>,
    pub processes: Vec<ProcessPlan>,
}

#[derive(Debug, Serialize)]
pub(crate) struct RecordedAt {
    pub value: u64,
    pub input: String,
}

#[derive(Debug, Serialize)]
pub(crate) struct ProcessPlan {
    /// The process in each recording, in the order of `recorded`.
    pub pids: Vec<u32>,
    pub device: i32,
    pub requests: Vec<usize>,
    pub ran_with: String,
    pub ran_with_source: &'static str,
    /// "exact", or why nothing is predicted: a recording the model does not reproduce, or
    /// recordings that do not align.
    pub check: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_memory: Option<u64>,
    pub budget: Option<u64>,
    pub budget_source: String,
    /// The settings of the columns: the job's own first.
    pub settings: Vec<String>,
    /// The recorded values and those asked, smallest first; a run per setting each.
    pub points: Vec<PlanPoint>,
    /// With --largest: per setting tried, the largest value that fits.
    pub largest: Vec<LargestFit>,
    /// Peak reserved at evenly spread values, a value per setting (none where it could not be
    /// predicted): the chart's lines.
    pub chart: Vec<ChartPoint>,
}

#[derive(Debug, Serialize)]
pub(crate) struct PlanPoint {
    pub value: u64,
    /// "recorded", "interpolated", "extrapolated, 2.00× the largest recorded".
    pub reach: String,
    /// Requests whose size shrinks with the size and whose fit reached nothing here: held at
    /// the least they were recorded at (`Scaling::requests_at`).
    pub held: usize,
    /// A run per setting; none where the value cannot be predicted (`why`).
    pub runs: Vec<Run>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
}

#[derive(Debug, Serialize)]
pub(crate) struct LargestFit {
    pub setting: String,
    /// The largest value that never runs out of memory; none when even the least does.
    pub value: Option<u64>,
    /// Memory does not grow enough to run out by this value (`value` is it).
    pub unbounded: bool,
    pub peak_reserved: Option<u64>,
    /// The allocator's budget less that peak.
    pub margin: Option<u64>,
    /// The job's own settings, or the best of the usual ones.
    pub role: &'static str,
}

#[derive(Debug, Serialize)]
pub(crate) struct ChartPoint {
    pub value: u64,
    pub peak_reserved: Vec<Option<u64>>,
}

/// Values the chart's lines go through, besides those the plan names.
const CHART_POINTS: u64 = 16;

pub fn run(request: &PlanRequest<'_>) -> Result<u8> {
    let plan = answer(request)?;
    let mut writer = crate::output::open_writer(request.output)?;
    match request.format {
        PlanFormat::Json => {
            serde_json::to_writer_pretty(&mut writer, &plan)?;
            writeln!(writer)?;
        }
        PlanFormat::Table => write_table(&mut writer, &plan)?,
        PlanFormat::Html => page::write(&mut writer, &plan)?,
    }
    writer.flush().context("cannot write the plan")?;
    Ok(if plan.processes.iter().all(|p| p.check == "exact") { 0 } else { 1 })
}

pub(crate) fn answer(request: &PlanRequest<'_>) -> Result<Plan> {
    if request.inputs.len() != request.values.len() {
        anyhow::bail!(
            "--scale names {} values and {} recordings were given: one recording per value, in the same order",
            request.values.len(),
            request.inputs.len()
        );
    }
    let mut recordings = Vec::new();
    for input in request.inputs {
        let mut traces = traces_of(input, None)?;
        // A process's requests pair with the process in the other recordings that began its
        // requests in the same order.
        traces.traces.sort_by_key(|t| t.origins.first().map_or(u64::MAX, |o| o.ts));
        recordings.push(traces);
    }
    let counts: Vec<usize> = recordings.iter().map(|r| r.traces.len()).collect();
    if counts.iter().any(|&c| c != counts[0]) {
        let said: Vec<String> = request
            .inputs
            .iter()
            .zip(&counts)
            .map(|(input, count)| format!("{} has {count}", input.display()))
            .collect();
        anyhow::bail!(
            "the recordings do not have the same processes using PyTorch's allocator ({}): record the same job at each size",
            said.join(", ")
        );
    }
    // Moments are those of the recording at the largest value, whose places are named, in one
    // pass over it for every process.
    let largest_recorded = (0..request.values.len()).max_by_key(|&i| request.values[i]).expect("two recordings");
    let mut processes = Vec::new();
    for index in 0..counts[0] {
        let traces: Vec<&AllocatorTrace> = recordings.iter().map(|r| &r.traces[index]).collect();
        processes.push(process_plan(request, &traces, largest_recorded, recordings[largest_recorded].first_ts)?);
    }
    let runs = processes.iter_mut().flat_map(|p| p.points.iter_mut()).flat_map(|p| p.runs.iter_mut());
    name_places(&request.inputs[largest_recorded], places_of(runs))?;
    Ok(Plan {
        size: request.size.clone(),
        recorded: request
            .values
            .iter()
            .zip(request.inputs)
            .map(|(&value, input)| RecordedAt { value, input: input.display().to_string() })
            .collect(),
        processes,
    })
}

fn process_plan(
    request: &PlanRequest<'_>,
    traces: &[&AllocatorTrace],
    largest_recorded: usize,
    first_ts: u64,
) -> Result<ProcessPlan> {
    let origin = traces[largest_recorded];
    let recorded = RecordedRun::new(origin, request.ran_with.as_deref());
    let budget = Budget::for_device(origin, request.device_memory);
    let mut plan = ProcessPlan {
        pids: traces.iter().map(|t| t.pid).collect(),
        device: origin.device,
        requests: traces.iter().map(|t| t.requests.len()).collect(),
        ran_with: shown(&recorded.ran_with),
        ran_with_source: recorded.ran_with_source.describe(),
        check: "exact".to_string(),
        device_memory: request.device_memory.or(origin.device_memory),
        budget: budget.bytes(),
        budget_source: budget_source(budget),
        settings: Vec::new(),
        points: Vec::new(),
        largest: Vec::new(),
        chart: Vec::new(),
    };
    for (trace, value) in traces.iter().zip(&request.values) {
        match RecordedRun::new(trace, request.ran_with.as_deref()).check() {
            Ok(()) => {}
            Err(error @ (WhatifError::Diverged(_) | WhatifError::Incomplete(_))) => {
                plan.check = format!("the recording at {} {value}: {error}", request.size);
                return Ok(plan);
            }
            Err(error) => return Err(error).context("the settings the job ran with (--ran-with)"),
        }
    }
    let points = traces.iter().zip(&request.values).map(|(&trace, &value)| ScalePoint { value, trace }).collect();
    let scaling = match Scaling::align(points) {
        Ok(scaling) => scaling,
        Err(error) => {
            plan.check = error.to_string();
            if let ScaleError::Parted { step, first, second, .. } = error {
                plan.check.push_str(&lines_at(request, traces, step, [first, second])?);
            }
            return Ok(plan);
        }
    };
    if request.largest && budget.bytes().is_none() {
        anyhow::bail!(
            "--largest needs the device's memory: the recordings do not say it (NVML was not read); give --device-memory, e.g. 80GiB"
        );
    }

    let mut columns: Vec<Vec<String>> = vec![Vec::new()];
    columns.extend(request.settings.iter().map(|s| vec![s.clone()]));
    if request.largest {
        let (own, best) = largest_fits(&recorded, &scaling, budget, request.step)?;
        if let Some(best) = &best {
            let extra = vec![best.setting_extra.clone()];
            if !columns.contains(&extra) {
                columns.insert(1, extra);
            }
        }
        plan.largest.push(own.fit);
        plan.largest.extend(best.map(|b| b.fit));
    }
    let configs: Vec<(String, AllocatorConfig)> = columns
        .iter()
        .map(|extra| {
            let setting = recorded.setting(extra);
            let config = AllocatorConfig::parse(&setting).context("--setting")?;
            Ok((setting, config))
        })
        .collect::<Result<_>>()?;
    plan.settings = configs.iter().map(|(s, _)| shown(s)).collect();

    let mut values: Vec<u64> = request.values.iter().chain(&request.at).copied().collect();
    values.extend(plan.largest.iter().filter_map(|l| l.value));
    values.sort_unstable();
    values.dedup();
    for value in values {
        let mut point =
            PlanPoint { value, reach: scaling.reach(value).describe(), held: 0, runs: Vec::new(), why: None };
        for (setting, config) in &configs {
            match scaling.replay(value, config, budget) {
                Ok(planned) => {
                    point.held = planned.held;
                    let prediction = Prediction { setting: setting.clone(), extra: Vec::new(), replay: planned.replay };
                    point.runs.push(run_of(origin, first_ts, &prediction));
                }
                Err(error) => {
                    point.runs.clear();
                    point.why = Some(error.to_string());
                    break;
                }
            }
        }
        // The curves are a chart's, not the plan's: they would repeat every replay.
        point.runs.iter_mut().for_each(|run| run.curve.clear());
        plan.points.push(point);
    }
    plan.chart = chart(&scaling, &configs, budget, plan.points.iter().map(|p| p.value).max().unwrap_or(1));
    Ok(plan)
}

struct Candidate {
    fit: LargestFit,
    setting_extra: String,
}

/// The largest value under the job's settings, and under the best of the usual ones (when one
/// of them fits a larger value).
fn largest_fits(
    recorded: &RecordedRun<'_>,
    scaling: &Scaling<'_>,
    budget: Budget,
    step: u64,
) -> Result<(Candidate, Option<Candidate>)> {
    let fit = |extra: &[String], role: &'static str| -> Result<Candidate> {
        let setting = recorded.setting(extra);
        let config = AllocatorConfig::parse(&setting)?;
        let found = scaling.largest(&config, budget, step).map_err(plan_error)?;
        let (value, unbounded) = match found {
            Largest::At(value) => (Some(value), false),
            Largest::Unbounded { tried } => (Some(tried), true),
            Largest::None => (None, false),
        };
        let peak = match value {
            Some(value) => Some(scaling.replay(value, &config, budget).map_err(plan_error)?.replay.peak_reserved),
            None => None,
        };
        Ok(Candidate {
            fit: LargestFit {
                setting: shown(&setting),
                value,
                unbounded,
                peak_reserved: peak,
                margin: peak.zip(budget.bytes()).map(|(peak, budget)| budget.saturating_sub(peak)),
                role,
            },
            setting_extra: extra.first().cloned().unwrap_or_default(),
        })
    };
    let own = fit(&[], "the job's settings")?;
    let mut best: Option<Candidate> = None;
    for usual in USUAL_SETTINGS {
        if recorded.setting(&[usual.to_string()]) == recorded.setting(&[]) {
            continue;
        }
        let candidate = fit(&[usual.to_string()], "the best of the usual settings")?;
        let better = |a: &Candidate, b: &Candidate| {
            (a.fit.value, std::cmp::Reverse(a.fit.peak_reserved))
                > (b.fit.value, std::cmp::Reverse(b.fit.peak_reserved))
        };
        if best.as_ref().is_none_or(|b| better(&candidate, b)) {
            best = Some(candidate);
        }
    }
    // The best of the usual settings is worth a column only where it fits more.
    let best = best.filter(|b| b.fit.value > own.fit.value);
    Ok((own, best))
}

/// "; request 7 is at plan_job.py:82 main at 2, at plan_job.py:57 Job.attention at 8": the
/// user's line of a request in the two recordings that part there, where they have it.
fn lines_at(request: &PlanRequest<'_>, traces: &[&AllocatorTrace], step: usize, parted: [u64; 2]) -> Result<String> {
    let mut said = Vec::new();
    let recordings = traces.iter().zip(request.inputs).zip(&request.values);
    for ((trace, input), value) in recordings.filter(|(_, value)| parted.contains(value)) {
        let Some(origin) = trace.origins.get(step) else { continue };
        let mut place = Place { step, event: origin.event, seconds: 0.0, place: String::new() };
        name_places(input, vec![&mut place])?;
        let line = if place.place.is_empty() { "(no Python stack)".to_string() } else { place.place };
        said.push(format!("at {line} at {value}"));
    }
    Ok(if said.is_empty() { String::new() } else { format!("; request {step} is {}", said.join(", ")) })
}

fn plan_error(error: PlanError) -> anyhow::Error {
    anyhow::anyhow!("{error}")
}

/// Peak reserved at `CHART_POINTS` values from the least to `most`, per setting.
fn chart(scaling: &Scaling<'_>, configs: &[(String, AllocatorConfig)], budget: Budget, most: u64) -> Vec<ChartPoint> {
    let least = scaling.values()[0].min(most);
    let mut values: Vec<u64> = (0..=CHART_POINTS).map(|i| least + (most - least) * i / CHART_POINTS).collect();
    values.dedup();
    values
        .into_iter()
        .map(|value| ChartPoint {
            value,
            peak_reserved: configs
                .iter()
                .map(|(_, config)| scaling.replay(value, config, budget).ok().map(|p| p.replay.peak_reserved))
                .collect(),
        })
        .collect()
}

fn write_table(writer: &mut dyn Write, plan: &Plan) -> Result<()> {
    let recorded: Vec<String> = plan.recorded.iter().map(|r| format!("{} ({})", r.value, r.input)).collect();
    for process in &plan.processes {
        let pids: Vec<String> = process.pids.iter().map(u32::to_string).collect();
        writeln!(
            writer,
            "{} from recordings at {}: pid {}, device {}: {} requests each, settings {} ({})",
            plan.size,
            recorded.join(", "),
            pids.join(", "),
            process.device,
            process.requests[0],
            process.ran_with,
            process.ran_with_source
        )?;
        if process.check != "exact" {
            writeln!(writer, "  no prediction: {}", process.check)?;
            writeln!(writer)?;
            continue;
        }
        writeln!(writer, "  replay check: exact on every recording; they align request by request")?;
        match process.budget {
            Some(budget) => writeln!(writer, "  the allocator may have {}: {}", gib(budget), process.budget_source)?,
            None => writeln!(writer, "  the allocator may have any amount: {}", process.budget_source)?,
        }
        let width = 30;
        let mut header = format!("  {:<10}{:<44}", plan.size, "");
        for (i, setting) in process.settings.iter().enumerate() {
            let title = if i == 0 { format!("{setting} (the job's)") } else { setting.clone() };
            header.push_str(&format!("{:<width$}", super::fit_to(&title, width - 2)));
        }
        writeln!(writer, "{}", header.trim_end())?;
        for point in &process.points {
            let mut line = format!("  {:<10}{:<44}", point.value, super::fit_to(&point.reach, 42));
            match &point.why {
                Some(why) => line.push_str(&format!("not predicted: {why}")),
                None => {
                    for run in &point.runs {
                        let cell = match run.out_of_memory.first() {
                            None => gib(run.peak_reserved),
                            Some(oom) => format!("{}, out of memory", gib(oom.reserved.max(run.peak_reserved))),
                        };
                        line.push_str(&format!("{cell:<width$}"));
                    }
                }
            }
            writeln!(writer, "{}", line.trim_end())?;
        }
        for point in process.points.iter().filter(|p| p.held > 0) {
            writeln!(
                writer,
                "  {} {}: {} requests whose size shrinks as the {} grows, and whose fit reaches nothing there, are held at the least they were recorded at",
                plan.size, point.value, point.held, plan.size
            )?;
        }
        for fit in &process.largest {
            let said = match (fit.value, fit.unbounded) {
                (None, _) => format!("none: even {} 1 runs out of memory", plan.size),
                (Some(value), true) => format!("any: memory does not grow enough to run out by {} {value}", plan.size),
                (Some(value), false) => format!(
                    "{} {value}, peak reserved {}, {} left",
                    plan.size,
                    gib(fit.peak_reserved.unwrap_or(0)),
                    gib(fit.margin.unwrap_or(0))
                ),
            };
            writeln!(writer, "  largest that fits with {} ({}): {said}", fit.setting, fit.role)?;
        }
        for point in &process.points {
            for run in &point.runs {
                if let Some(oom) = run.out_of_memory.first() {
                    writeln!(
                        writer,
                        "  {} {} with {}: out of memory at request {} asking for {} at {}",
                        plan.size,
                        point.value,
                        run.setting,
                        oom.at.step,
                        gib(oom.request),
                        if oom.at.place.is_empty() { "(no Python stack)" } else { &oom.at.place }
                    )?;
                }
            }
        }
        writeln!(writer)?;
    }
    Ok(())
}
