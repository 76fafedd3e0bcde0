//! A plan as one HTML page that needs no script: for each process, peak reserved against the
//! size as an SVG chart (a line per setting, the recorded values marked, the allocator's share
//! of the device as a horizontal line, the largest value that fits marked), then the plan's
//! table.

use std::fmt::Write as _;
use std::io::Write;

use anyhow::Result;

use super::{Plan, ProcessPlan};
use crate::output::text::escape_html;
use crate::whatif::gib;

const WIDTH: f64 = 760.0;
const HEIGHT: f64 = 360.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 20.0;
const BOTTOM: f64 = 50.0;
/// A line's colour per setting, the job's own first.
const COLOURS: &[&str] = &["#1f6feb", "#d9480f", "#2b8a3e", "#9c36b5", "#e8590c", "#495057"];

pub(crate) fn write(writer: &mut dyn Write, plan: &Plan) -> Result<()> {
    let mut page = String::new();
    let title = format!("gpuprof plan: peak reserved by {}", plan.size);
    let _ = write!(
        page,
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>{}</title><style>{STYLE}</style></head><body><h1>{}</h1>",
        escape_html(&title),
        escape_html(&title)
    );
    let recorded: Vec<String> =
        plan.recorded.iter().map(|r| format!("{} {} ({})", plan.size, r.value, r.input)).collect();
    let _ = write!(page, "<p class=\"recorded\">From recordings at {}.</p>", escape_html(&recorded.join(", ")));
    for process in &plan.processes {
        process_section(&mut page, plan, process);
    }
    page.push_str("</body></html>\n");
    writer.write_all(page.as_bytes())?;
    Ok(())
}

const STYLE: &str = "body{font:14px system-ui,sans-serif;margin:24px;color:#212529}h1{font-size:20px}\
h2{font-size:16px;margin-top:28px}table{border-collapse:collapse;margin-top:12px}\
td,th{padding:4px 10px;border-bottom:1px solid #dee2e6;text-align:right}td:nth-child(-n+2),th:nth-child(-n+2){text-align:left}\
.refused{color:#c92a2a}.legend span{margin-right:18px}.legend i{display:inline-block;width:14px;height:3px;margin-right:6px;vertical-align:middle}\
svg text{font:12px system-ui,sans-serif;fill:#495057}";

fn process_section(page: &mut String, plan: &Plan, process: &ProcessPlan) {
    let pids: Vec<String> = process.pids.iter().map(u32::to_string).collect();
    let _ = write!(
        page,
        "<section class=\"process\"><h2>pid {}, device {}: settings {}</h2>",
        escape_html(&pids.join(", ")),
        process.device,
        escape_html(&process.ran_with)
    );
    if process.check != "exact" {
        let _ = write!(page, "<p class=\"refused\">No prediction: {}</p></section>", escape_html(&process.check));
        return;
    }
    let _ = write!(
        page,
        "<p>The allocator may have {}: {}.</p>",
        process.budget.map_or("any amount".to_string(), gib),
        escape_html(&process.budget_source)
    );
    chart(page, plan, process);
    table(page, plan, process);
    page.push_str("</section>");
}

/// Where values and bytes fall on the chart.
struct Frame {
    least: u64,
    most: u64,
    /// Bytes at the top of the y axis, and between its ticks.
    top: f64,
    tick: f64,
}

impl Frame {
    fn of(process: &ProcessPlan) -> Frame {
        let values = process.chart.iter().map(|p| p.value);
        let (least, most) = (values.clone().min().unwrap_or(0), values.max().unwrap_or(1));
        let highest = process
            .chart
            .iter()
            .flat_map(|p| p.peak_reserved.iter().flatten().copied())
            .chain(process.budget)
            .max()
            .unwrap_or(1)
            .max(1);
        let tick = nice_step(highest as f64 * 1.08 / 5.0);
        Frame { least, most, top: (highest as f64 * 1.08 / tick).ceil() * tick, tick }
    }

    fn x(&self, value: u64) -> f64 {
        LEFT + (value - self.least) as f64 / (self.most - self.least).max(1) as f64 * (WIDTH - LEFT - RIGHT)
    }

    fn y(&self, bytes: u64) -> f64 {
        HEIGHT - BOTTOM - bytes as f64 / self.top * (HEIGHT - TOP - BOTTOM)
    }

    fn shows(&self, value: u64) -> bool {
        (self.least..=self.most).contains(&value)
    }
}

fn chart(page: &mut String, plan: &Plan, process: &ProcessPlan) {
    let frame = Frame::of(process);
    let _ = write!(
        page,
        "<svg class=\"plan\" width=\"{WIDTH}\" height=\"{HEIGHT}\" viewBox=\"0 0 {WIDTH} {HEIGHT}\" role=\"img\" aria-label=\"peak reserved by {}\">",
        escape_html(&plan.size)
    );
    axes(page, plan, process, &frame);
    if let Some(budget) = process.budget {
        let _ = write!(
            page,
            "<line class=\"device\" x1=\"{LEFT}\" y1=\"{0:.1}\" x2=\"{1}\" y2=\"{0:.1}\" stroke=\"#c92a2a\" stroke-dasharray=\"6 4\"/><text x=\"{1}\" y=\"{2:.1}\" text-anchor=\"end\" style=\"fill:#c92a2a\">the allocator's share of the device: {3}</text>",
            frame.y(budget),
            WIDTH - RIGHT,
            frame.y(budget) - 6.0,
            gib(budget)
        );
    }
    for column in 0..process.settings.len() {
        setting_line(page, plan, process, &frame, column);
    }
    largest_marks(page, process, &frame);
    legend(page, process);
}

/// Axes and their ticks: steps of GiB; the size's values at the ends and the plan's.
fn axes(page: &mut String, plan: &Plan, process: &ProcessPlan, frame: &Frame) {
    let _ = write!(
        page,
        "<line x1=\"{LEFT}\" y1=\"{0}\" x2=\"{1}\" y2=\"{0}\" stroke=\"#868e96\"/><line x1=\"{LEFT}\" y1=\"{TOP}\" x2=\"{LEFT}\" y2=\"{0}\" stroke=\"#868e96\"/>",
        HEIGHT - BOTTOM,
        WIDTH - RIGHT
    );
    let mut bytes = 0.0;
    while bytes <= frame.top + 0.5 {
        let _ = write!(
            page,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
            LEFT - 6.0,
            frame.y(bytes as u64) + 4.0,
            gib(bytes as u64)
        );
        bytes += frame.tick;
    }
    let mut ticks: Vec<u64> = vec![frame.least, frame.most];
    ticks.extend(process.points.iter().map(|p| p.value).filter(|&v| frame.shows(v)));
    ticks.sort_unstable();
    ticks.dedup();
    for value in ticks {
        let _ = write!(
            page,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{value}</text>",
            frame.x(value),
            HEIGHT - BOTTOM + 16.0
        );
    }
    let _ = write!(
        page,
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
        (LEFT + WIDTH - RIGHT) / 2.0,
        HEIGHT - 12.0,
        escape_html(&plan.size)
    );
}

/// A setting's peak reserved through the chart's values, its plan's points marked: filled
/// where recorded, open where predicted.
fn setting_line(page: &mut String, plan: &Plan, process: &ProcessPlan, frame: &Frame, column: usize) {
    let (colour, setting) = (COLOURS[column % COLOURS.len()], &process.settings[column]);
    let points: Vec<String> = process
        .chart
        .iter()
        .filter_map(|p| p.peak_reserved[column].map(|bytes| format!("{:.1},{:.1}", frame.x(p.value), frame.y(bytes))))
        .collect();
    let _ = write!(
        page,
        "<polyline class=\"setting\" data-setting=\"{}\" fill=\"none\" stroke=\"{colour}\" stroke-width=\"2\" points=\"{}\"/>",
        escape_html(setting),
        points.join(" ")
    );
    for point in process.points.iter().filter(|p| frame.shows(p.value)) {
        let Some(run) = point.runs.get(column) else { continue };
        let recorded = point.reach == "recorded";
        let _ = write!(
            page,
            "<circle class=\"{}\" cx=\"{:.1}\" cy=\"{:.1}\" r=\"{}\" fill=\"{}\" stroke=\"{colour}\" stroke-width=\"2\"><title>{} {}: {} with {}</title></circle>",
            if recorded { "recorded" } else { "predicted" },
            frame.x(point.value),
            frame.y(run.peak_reserved),
            if recorded { 5 } else { 4 },
            if recorded { colour } else { "#fff" },
            escape_html(&plan.size),
            point.value,
            gib(run.peak_reserved),
            escape_html(setting)
        );
    }
}

fn largest_marks(page: &mut String, process: &ProcessPlan, frame: &Frame) {
    for (i, fit) in process.largest.iter().enumerate() {
        let Some(value) = fit.value.filter(|&v| !fit.unbounded && frame.shows(v)) else { continue };
        let colour =
            process.settings.iter().position(|s| *s == fit.setting).map_or("#495057", |c| COLOURS[c % COLOURS.len()]);
        let right_half = frame.x(value) > (LEFT + WIDTH - RIGHT) / 2.0;
        let _ = write!(
            page,
            "<line class=\"largest\" x1=\"{0:.1}\" y1=\"{TOP}\" x2=\"{0:.1}\" y2=\"{1}\" stroke=\"{colour}\" stroke-dasharray=\"2 3\"/><text x=\"{2:.1}\" y=\"{3:.1}\" text-anchor=\"{4}\" style=\"fill:{colour}\">largest that fits: {5}</text>",
            frame.x(value),
            HEIGHT - BOTTOM,
            // Beside the line, on the side with room.
            if right_half { frame.x(value) - 4.0 } else { frame.x(value) + 4.0 },
            TOP + 30.0 + 16.0 * i as f64,
            if right_half { "end" } else { "start" },
            value
        );
    }
}

fn legend(page: &mut String, process: &ProcessPlan) {
    page.push_str("</svg><p class=\"legend\">");
    for (column, setting) in process.settings.iter().enumerate() {
        let colour = COLOURS[column % COLOURS.len()];
        let own = if column == 0 { " (the job's)" } else { "" };
        let _ = write!(page, "<span><i style=\"background:{colour}\"></i>{}{own}</span>", escape_html(setting));
    }
    page.push_str("<span>● recorded ○ predicted</span></p>");
}

/// A step of the y axis, labelled in GiB, at least `rough` bytes: 1, 2 or 5 times a power of
/// ten of GiB (0.05 GiB, 0.5 GiB, 20 GiB).
fn nice_step(rough: f64) -> f64 {
    const GIB: f64 = 1073741824.0;
    let gib = (rough / GIB).max(0.01);
    let power = 10f64.powf(gib.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0].into_iter().map(|m| m * power).find(|s| *s >= gib).unwrap_or(10.0 * power);
    step * GIB
}

fn table(page: &mut String, plan: &Plan, process: &ProcessPlan) {
    let _ = write!(page, "<table class=\"points\"><tr><th>{}</th><th>reach</th>", escape_html(&plan.size));
    for setting in &process.settings {
        let _ = write!(page, "<th>{}</th>", escape_html(setting));
    }
    page.push_str("</tr>");
    for point in &process.points {
        let _ = write!(page, "<tr><td>{}</td><td>{}</td>", point.value, escape_html(&point.reach));
        match &point.why {
            Some(why) => {
                let _ =
                    write!(page, "<td colspan=\"{}\">not predicted: {}</td>", process.settings.len(), escape_html(why));
            }
            None => {
                for run in &point.runs {
                    let oom = if run.out_of_memory.is_empty() { "" } else { ", out of memory" };
                    let _ = write!(page, "<td>{}{oom}</td>", gib(run.peak_reserved));
                }
            }
        }
        page.push_str("</tr>");
    }
    page.push_str("</table>");
    for fit in &process.largest {
        let said = match (fit.value, fit.unbounded) {
            (None, _) => "none fits".to_string(),
            (Some(value), true) => format!("any: memory does not grow enough to run out by {value}"),
            (Some(value), false) => format!(
                "{} {value}, peak reserved {}, {} left",
                plan.size,
                gib(fit.peak_reserved.unwrap_or(0)),
                gib(fit.margin.unwrap_or(0))
            ),
        };
        let _ = write!(
            page,
            "<p class=\"largest\">Largest that fits with {} ({}): {}</p>",
            escape_html(&fit.setting),
            fit.role,
            escape_html(&said)
        );
    }
}
