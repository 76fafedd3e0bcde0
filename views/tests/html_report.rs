//! The HTML report (`export --format html`, `run --html`), opened in headless Chromium and driven
//! as a person would (testkit/fixtures/browse_report.py: real mouse clicks and drags over the
//! DevTools protocol): what the timeline reads at the instants picked equals the capture's own
//! totals, the stacks and blocks shown equal what was live then, the findings are listed with
//! their lines and lead to their instant, and the page asks for nothing but itself. Screenshots
//! are kept next to each test's files (target/tmp/scratch/html_*/).

// A test reads as one scenario from start to end, so it may run past the length limit on functions.
#![allow(clippy::too_many_lines)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use gpuprof_model::event::{Event, Frame, Kind, Layer, Op};
use gpuprof_testkit::*;
use serde_json::{json, Value};

const MIB: u64 = 1 << 20;

fn rows(table: &str) -> Value {
    json!({ "eval": format!("Array.from(document.querySelectorAll('#{table} tbody tr')).map(r => Object.assign({{}}, r.dataset))") })
}

fn dataset(id: &str) -> Value {
    json!({ "eval": format!("Object.assign({{}}, document.getElementById('{id}').dataset)") })
}

fn ns(value: &Value) -> u64 {
    value.as_str().unwrap().parse().unwrap()
}

/// "forward (linear.py:125)", as the page names a frame.
fn frame_name(frame: &Frame) -> String {
    format!("{} ({}:{})", frame.function, frame.file.rsplit('/').next().unwrap(), frame.line)
}

/// The stack as the page's rows carry it: innermost first, each frame called by the next.
fn stack_text(stack: &[Frame]) -> String {
    stack.iter().map(frame_name).collect::<Vec<_>>().join(" <- ")
}

/// The user's line as the page writes it.
fn user_line(stack: &[Frame]) -> String {
    match gpuprof_model::user_frame(stack) {
        Some(f) => format!("{}:{} in {}", f.file.rsplit('/').next().unwrap(), f.line, f.function),
        None => stack.first().map(frame_name).unwrap_or_else(|| "(no Python stack)".to_string()),
    }
}

/// The capture, replayed to `t` nanoseconds after its first event.
struct State<'a> {
    /// (pid, allocator layer?, address) → the event that made it.
    live: BTreeMap<(u32, bool, u64), &'a Event>,
    /// pid → the allocator's last reported (allocated, reserved).
    totals: BTreeMap<u32, (u64, u64)>,
}

fn replay(events: &[Event], t: u64) -> State<'_> {
    let first = events[0].ts;
    let mut state = State { live: BTreeMap::new(), totals: BTreeMap::new() };
    for event in events.iter().take_while(|e| e.ts - first <= t) {
        if let (Some(allocated), Some(reserved)) = (event.allocated, event.reserved) {
            state.totals.insert(event.pid, (allocated, reserved));
        }
        if event.layer == Layer::Process && event.op == Op::Exit {
            // What a process held is returned when it exits.
            state.live.retain(|(pid, _, _), _| *pid != event.pid);
            state.totals.insert(event.pid, (0, 0));
        }
        let tensors = event.layer == Layer::Allocator;
        if !(tensors || event.layer == Layer::Driver) || !event.succeeded() || event.kind == Some(Kind::HostPinned) {
            continue;
        }
        let Some(addr) = event.addr else { continue };
        match event.op {
            Op::Alloc => {
                state.live.insert((event.pid, tensors, addr), event);
            }
            Op::Free => {
                state.live.remove(&(event.pid, tensors, addr));
            }
            _ => {}
        }
    }
    state
}

impl State<'_> {
    fn driver_bytes(&self, pid: u32) -> u64 {
        self.live.iter().filter(|((p, tensors, _), _)| *p == pid && !tensors).map(|(_, e)| e.size).sum()
    }

    /// (bytes, blocks, pid, stack, user line) per stack, largest first, as the stacks table.
    fn by_stack(&self, tensors: bool) -> Vec<(u64, u64, u32, String, String)> {
        let mut by: BTreeMap<(u32, String, String), (u64, u64)> = BTreeMap::new();
        for ((pid, is_tensor, _), event) in &self.live {
            if *is_tensor == tensors {
                let entry = by.entry((*pid, stack_text(&event.stack), user_line(&event.stack))).or_default();
                entry.0 += event.size;
                entry.1 += 1;
            }
        }
        let mut out: Vec<_> =
            by.into_iter().map(|((pid, stack, user), (bytes, count))| (bytes, count, pid, stack, user)).collect();
        if tensors {
            // The allocator's cache: what it reserves beyond its live blocks, beside them.
            for (&pid, &(allocated, reserved)) in &self.totals {
                if reserved > allocated {
                    out.push((reserved - allocated, 0, pid, String::new(), String::new()));
                }
            }
        }
        out.sort_by(|a, b| b.0.cmp(&a.0).then(a.3.cmp(&b.3)));
        out
    }
}

fn page_stacks(rows: &Value) -> Vec<(u64, u64, u32, String, String)> {
    let mut out: Vec<_> = rows
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                ns(&r["bytes"]),
                ns(&r["blocks"]),
                ns(&r["pid"]) as u32,
                r["stack"].as_str().unwrap().to_string(),
                r["userLine"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    out.sort_by(|a, b| b.0.cmp(&a.0).then(a.3.cmp(&b.3)));
    out
}

/// tensors.py through the stand-ins under `gpuprof run --html`: a caching allocator's blocks
/// over driver segments, held a while.
fn record_tensors(dir: &Path) -> (PathBuf, Vec<Event>) {
    let (log, events, page) = (dir.join("expected.jsonl"), dir.join("events.jsonl"), dir.join("report.html"));
    let script = workloads().join("tensors.py");
    let output = gpuprof_run(
        &["--output", events.to_str().unwrap(), "--html", page.to_str().unwrap()],
        &[python3(), script.to_str().unwrap(), "--hold", "0.3"],
        &log,
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains(&format!("gpuprof: wrote the report to {}; open it in a browser", page.display())),
        "{stderr}"
    );
    (page, read_events(&events))
}

#[test]
fn timelines_and_stacks_at_the_instants_picked_equal_the_capture() {
    let dir = scratch("html_tensors");
    let (page, events) = record_tensors(&dir);
    let pid = events.iter().find(|e| e.layer == Layer::Allocator).unwrap().pid;
    let span = events.last().unwrap().ts - events[0].ts;
    // Instants while the allocator works (it starts a while after the process does).
    let (busy_from, busy_to) = {
        let blocks: Vec<u64> =
            events.iter().filter(|e| e.layer == Layer::Allocator).map(|e| e.ts - events[0].ts).collect();
        (blocks[0] as f64, *blocks.last().unwrap() as f64)
    };
    let when = |share: f64| busy_from + (busy_to - busy_from) * share;
    let at = |share: f64| when(share) / 1e9;
    let look = || {
        vec![
            dataset("readout"),
            rows("readout"),
            dataset("instant-title"),
            rows("top-stacks"),
            rows("top-blocks"),
            dataset("icicle"),
        ]
    };
    let mut steps = vec![json!({ "eval": "window.gpuprofReport.data.peak" }), dataset("instant-title")];
    for share in [0.3, 0.7] {
        steps.push(json!({ "click": at(share) }));
        steps.extend(look());
    }
    steps.push(json!({ "drag": [at(0.1), at(0.9)] }));
    steps.extend(look());
    steps.push(json!({ "screenshot": dir.join("report.png") }));
    let report = browse_report(&page, json!(steps));
    let results = report["results"].as_array().unwrap();

    // The page opens on the peak, the same as `summary` finds.
    let summary =
        Command::new(gpuprof()).args(["summary", "-f", "json"]).arg(dir.join("events.jsonl")).output_within(PATIENCE);
    let summary: Value = serde_json::from_slice(&summary.stdout).unwrap();
    assert_eq!(results[0]["bytes"], summary["peak_bytes"]);
    assert_eq!(results[1]["snapshotLabel"], "peak");

    for (i, share) in [0.3, 0.7].into_iter().enumerate() {
        let [_, readout, curves, title, stacks, blocks, icicle] = &results[2 + 7 * i..9 + 7 * i] else {
            unreachable!()
        };
        // The click picked an instant near where it was aimed (a pixel is a few milliseconds).
        let t = ns(&readout["t"]);
        assert!((t as f64 - when(share)).abs() < span as f64 * 0.01, "picked {t} of {span}");
        // The readout is at the instant the report keeps the stacks of, at or before the click.
        assert_eq!(title["snapshotT"], readout["t"]);
        let state = replay(&events, t);
        let (allocated, reserved) = state.totals[&pid];
        let pid_text = pid.to_string();
        let curve = |metric: &str| {
            let row = curves
                .as_array()
                .unwrap()
                .iter()
                .find(|r| r["pid"].as_str() == Some(pid_text.as_str()) && r["metric"] == metric)
                .unwrap_or_else(|| panic!("{curves}"));
            assert_eq!(row["device"], "0");
            ns(&row["bytes"])
        };
        assert_eq!(curve("allocated"), allocated);
        assert_eq!(curve("reserved"), reserved);
        assert_eq!(curve("driver"), state.driver_bytes(pid));
        assert!(allocated > 0 && reserved >= 2 * MIB && reserved == state.driver_bytes(pid), "{allocated} {reserved}");

        // The stacks are those live at the instant recorded at or before the one picked.
        let snapshot_t = ns(&title["snapshotT"]);
        assert!(snapshot_t <= t && t - snapshot_t <= span / 200 + 1, "{snapshot_t} {t}");
        let state = replay(&events, snapshot_t);
        let expected = state.by_stack(true);
        assert!(!expected.is_empty());
        assert_eq!(page_stacks(stacks), expected.iter().take(15).cloned().collect::<Vec<_>>());
        assert_eq!(ns(&icicle["total"]), expected.iter().map(|s| s.0).sum::<u64>());
        // The largest live blocks, with their addresses.
        let mut largest: Vec<(u64, String)> = state
            .live
            .iter()
            .filter(|((_, tensors, _), _)| *tensors)
            .map(|((_, _, addr), e)| (e.size, format!("{addr:#x}")))
            .collect();
        largest.sort_by_key(|b| std::cmp::Reverse(b.0));
        let shown: Vec<(u64, String)> = blocks
            .as_array()
            .unwrap()
            .iter()
            .map(|b| (ns(&b["bytes"]), b["addr"].as_str().unwrap().to_string()))
            .collect();
        assert_eq!(
            shown.iter().map(|b| b.0).collect::<Vec<_>>(),
            largest.iter().take(20).map(|b| b.0).collect::<Vec<_>>()
        );
        assert!(shown.iter().all(|b| largest.contains(b)), "{shown:?}");
    }

    // A range: what grew between the instants recorded nearest before its ends.
    let [_, readout, curves, title, stacks, _, _] = &results[16..23] else { unreachable!() };
    let (from, to) = (ns(&readout["from"]), ns(&readout["to"]));
    assert!(from < to);
    let row = curves.as_array().unwrap().iter().find(|r| r["metric"] == "allocated").unwrap();
    assert_eq!(ns(&row["bytes"]), replay(&events, to).totals[&pid].0);
    let (before, after) = (replay(&events, ns(&title["fromSnapshotT"])), replay(&events, ns(&title["snapshotT"])));
    let old: BTreeMap<(u32, String), (u64, u64)> =
        before.by_stack(true).into_iter().map(|s| ((s.2, s.3), (s.0, s.1))).collect();
    let grew: Vec<_> = after
        .by_stack(true)
        .into_iter()
        .filter_map(|s| {
            let (bytes, count) = old.get(&(s.2, s.3.clone())).copied().unwrap_or((0, 0));
            (s.0 > bytes).then(|| (s.0 - bytes, s.1 - count, s.2, s.3, s.4))
        })
        .collect();
    assert_eq!(page_stacks(stacks), grew.into_iter().take(15).collect::<Vec<_>>());
    assert!(dir.join("report.png").metadata().unwrap().len() > 10_000);
}

/// A training job's traffic (training.py: tens of thousands of allocator events a second, deep
/// stacks, a line that keeps a block every few steps): curves too long to keep every change are
/// summarized, yet read exactly at every instant the report keeps, and the growth shows by line.
#[test]
fn a_training_jobs_curves_are_exact_where_the_stacks_are_kept() {
    let dir = scratch("html_training");
    let (log, events_file, page) = (dir.join("expected.jsonl"), dir.join("events.jsonl"), dir.join("report.html"));
    let script = workloads().join("training.py");
    let output = gpuprof_run(
        &["--output", events_file.to_str().unwrap(), "--html", page.to_str().unwrap()],
        &[python3(), script.to_str().unwrap(), "--seconds", "2", "--depth", "6", "--leak-every", "5"],
        &log,
    );
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
    let events = read_events(&events_file);
    let pid = events.iter().find(|e| e.layer == Layer::Allocator).unwrap().pid;
    let reports = events.iter().filter(|e| e.layer == Layer::Allocator).count();
    let span = events.last().unwrap().ts - events[0].ts;
    assert!(reports > 7_000, "{reports} allocator events: too few to summarize a curve");
    let read_all = "(() => { const r = window.gpuprofReport, out = [];
        r.data.snapshots.forEach((s, i) => { if (i % 9 === 0 || s.label) { r.pick(s.t / 1e9);
          out.push([s.t, s.label, Array.from(document.querySelectorAll('#readout tbody tr')).map(x => [x.dataset.pid, x.dataset.metric, x.dataset.bytes === '' ? null : Number(x.dataset.bytes)])]); } });
        return { curves: r.data.curves.map(c => [c.metric, c.summarized, c.t.length]), instants: out }; })()";
    // A range from after the model is made (its weights are the first blocks) to the end of training.
    let blocks: Vec<f64> =
        events.iter().filter(|e| e.layer == Layer::Allocator).map(|e| (e.ts - events[0].ts) as f64 / 1e9).collect();
    let range = [blocks[0] + 0.15, blocks[blocks.len() - 1] - 0.05];
    let report = browse_report(
        &page,
        json!([{ "eval": read_all }, rows("top-stacks"), { "drag": range }, rows("top-stacks"), { "screenshot": dir.join("report.png") }]),
    );
    let results = report["results"].as_array().unwrap();
    let curves = results[0]["curves"].as_array().unwrap();
    let allocated = curves.iter().find(|c| c[0] == "allocated").unwrap();
    assert_eq!(allocated[1], true, "{curves:?}");
    assert!(allocated[2].as_u64().unwrap() <= 4 * 1_500 + 400, "{allocated}");
    let instants = results[0]["instants"].as_array().unwrap();
    assert!(instants.len() >= 20);
    for instant in instants {
        let t = instant[0].as_u64().unwrap();
        let state = replay(&events, t);
        let pid_text = pid.to_string();
        let value = |metric: &str| {
            instant[2]
                .as_array()
                .unwrap()
                .iter()
                .find(|r| r[0].as_str() == Some(pid_text.as_str()) && r[1] == metric)
                .and_then(|r| r[2].as_u64())
        };
        let totals = state.totals.get(&pid).copied();
        assert_eq!(value("allocated").zip(value("reserved")), totals, "at {t} ({})", instant[1]);
        assert!(totals.is_some() || t < span / 2, "no allocator curve at {t}");
        assert_eq!(value("driver").unwrap_or(0), state.driver_bytes(pid), "at {t}");
    }
    // Over most of the run, what grew is the line that keeps a block every few steps.
    let grew = page_stacks(&results[3]);
    let kept: Value = read_expected(&log).into_iter().find(|v| v.get("leak_line").is_some()).unwrap();
    assert!(grew[0].3.contains(&format!(" <- keep_for_later (training.py:{}) <- ", kept["leak_line"])), "{grew:?}");
    assert_eq!(grew[0].2, pid);
}

#[test]
fn findings_are_listed_with_their_lines_and_lead_to_their_instant() {
    let dir_name = "html_oom";
    let device = scratch("html_oom_device").join("device");
    let env = [
        ("GPUPROF_STANDIN_DEVICE_MEMORY", (64 * MIB).to_string()),
        ("GPUPROF_STANDIN_DEVICE_FILE", device.to_str().unwrap().to_string()),
    ];
    let page = target_tmpdir().join("scratch").join("html_oom_report.html");
    let run = run_leaks(dir_name, "oom", &env, &["--html", page.to_str().unwrap()]);
    let events = read_events(&run.events);
    let report = browse_report(
        &page,
        json!([
            rows("findings"),
            { "eval": "window.gpuprofReport.data.markers.map(m => m.kind + ' ' + window.gpuprofReport.data.processes[m.process].pid)" },
            { "click_selector": "#findings tbody tr[data-kind='oom']" },
            dataset("readout"),
            dataset("instant-title"),
            rows("top-stacks"),
            { "screenshot": run.events.with_file_name("report.png") },
        ]),
    );
    let results = report["results"].as_array().unwrap();
    let (parent, worker) = (pid_of_role(&run.expected, "parent"), pid_of_role(&run.expected, "worker"));

    // Every finding of the capture, with its user's line.
    let listed: Vec<(String, u32, u64, String)> = results[0]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["kind"].as_str().unwrap().to_string(),
                ns(&r["pid"]) as u32,
                ns(&r["bytes"]),
                r["userLine"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let found: Vec<(String, u32, u64, String)> = run
        .findings
        .iter()
        .map(|f| {
            let line = f.user_frame.as_ref().map(|u| format!("{}:{}", u.file, u.line)).unwrap_or_default();
            (f.kind.as_str().to_string(), f.pid, f.bytes, line)
        })
        .collect();
    assert_eq!(listed, found);
    let oom_line = run.findings[0].stack.iter().find(|f| f.file.ends_with("leaks.py")).unwrap();
    assert_eq!(oom_line.line, 160, "{:?}", run.findings[0].stack);
    assert_eq!(listed[0].0, "oom");
    assert_eq!((listed[0].1, listed[0].2), (parent, 16 * MIB));
    assert_eq!((listed[1].0.as_str(), listed[1].1), ("worker_cuda_context", worker));

    // The timeline marks both processes starting and exiting, the failure and the finding.
    let mut markers: Vec<String> =
        results[1].as_array().unwrap().iter().map(|m| m.as_str().unwrap().to_string()).collect();
    markers.sort();
    let mut expected = vec![
        format!("exit {parent}"),
        format!("exit {worker}"),
        format!("finding {worker}"),
        format!("oom {parent}"),
        format!("start {parent}"),
        format!("start {worker}"),
    ];
    expected.sort();
    assert_eq!(markers, expected);

    // Clicking the failure shows that moment: its snapshot, the 40 MiB the worker held and the
    // 16 MiB the parent did, each at its line.
    let oom_t = events.iter().find(|e| e.layer == Layer::Driver && e.op == Op::Alloc && e.result == 2).unwrap().ts
        - events[0].ts;
    assert_eq!(ns(&results[3]["t"]), oom_t);
    assert_eq!(results[4]["snapshotLabel"], "finding 1");
    assert_eq!(ns(&results[4]["snapshotT"]), oom_t);
    let expected = replay(&events, oom_t).by_stack(false);
    assert_eq!(expected.iter().map(|s| (s.0, s.2)).collect::<Vec<_>>(), vec![(40 * MIB, worker), (16 * MIB, parent)]);
    assert_eq!(page_stacks(&results[5]), expected);
    assert!(expected[0].3.contains("holder (leaks.py:104)"), "{}", expected[0].3);
}

#[test]
fn bad_requests_say_what_to_do() {
    let dir = scratch("html_errors");
    let empty = dir.join("empty.jsonl");
    std::fs::write(&empty, "").unwrap();
    let output = Command::new(gpuprof())
        .args(["export", "-f", "html", "-o"])
        .arg(dir.join("r.html"))
        .arg(&empty)
        .output_within(PATIENCE);
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains(&format!("{} holds no events: nothing to report", empty.display())), "{stderr}");

    // --html reads the events file: with the events on stdout there is none.
    let page = dir.join("stdout.html");
    let output = Command::new(gpuprof())
        .args(["run", "-f", "jsonl", "-o", "-", "--html"])
        .arg(&page)
        .args(["--", "true"])
        .output_within(PATIENCE);
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(&format!("--html {} reads the events from the file the capture writes", page.display())),
        "{stderr}"
    );
    assert!(!page.exists());
}

#[test]
fn the_page_is_self_contained_with_the_pinned_chart_library() {
    let vendor = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/export/html/vendor");
    let readme = std::fs::read_to_string(vendor.join("README.md")).unwrap();
    for file in ["uPlot.iife.min.js", "uPlot.min.css", "uPlot.LICENSE"] {
        let output = Command::new("sha256sum").arg(vendor.join(file)).output_within(PATIENCE);
        let sum = String::from_utf8(output.stdout).unwrap().split_whitespace().next().unwrap().to_string();
        assert!(
            readme.contains(&format!("| `{file}` | `{sum}` |")),
            "{file} is not the version vendor/README.md names"
        );
    }
    let dir = scratch("html_self_contained");
    let (page, _) = record_tensors(&dir);
    let html = std::fs::read_to_string(&page).unwrap();
    for reference in ["src=\"http", "href=\"http", "src='http", "href='http", "url(http", "@import"] {
        assert!(!html.contains(reference), "the page refers to {reference}");
    }
    assert!(html.contains("The MIT License (MIT)") && html.contains("Copyright (c) 2022 Leon Sorokin"));
    assert!(html.contains("uPlot (v1.6.32)"));
}

/// The "what if" panel, on a recording made on an H100 machine (testkit/fixtures/h100_whatif:
/// a job whose default settings ran out of memory with half the card free in pieces): the
/// settings ranked as `gpuprof whatif --suggest` ranks them, the out-of-memory at the user's line,
/// a chart of each; and on a recording without allocator events, why there is none.
#[test]
fn the_what_if_panel_ranks_the_usual_settings() {
    let dir = scratch("html_whatif");
    let page = dir.join("halves.html");
    let input = fixtures().join("h100_whatif").join("halves.default.gpuprof");
    let output =
        Command::new(gpuprof()).args(["export", "-f", "html", "-o"]).arg(&page).arg(&input).output_within(PATIENCE);
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
    let cells = "Array.from(document.querySelectorAll('#whatif table.whatif-runs tbody tr')).map(r => Array.from(r.cells).map(c => c.textContent))";
    let report = browse_report(
        &page,
        json!([
            { "eval": cells },
            { "eval": "document.querySelector('#whatif .whatif-check').textContent" },
            { "eval": "document.querySelectorAll('#whatif .whatif-chart .uplot').length" },
            { "screenshot": dir.join("whatif.png").to_str().unwrap() },
        ]),
    );
    // Seconds from the recording's first event, as the timelines and `export --at` count them.
    let oom = "request 378 (3.618 s), asking for 0.75 GiB; every segment holds a live block";
    assert_eq!(
        report["results"][0],
        json!([
            ["as it ran", "default", "78.38 GiB", "38.70 GiB", oom, "whatif_job.py:127 halves"],
            ["1.", "expandable_segments:True", "40.08 GiB", "0.02 GiB", "no", ""],
            ["2.", "expandable_segments:True,roundup_power2_divisions:4", "44.00 GiB", "0.00 GiB", "no", ""],
            ["3.", "roundup_power2_divisions:4", "45.13 GiB", "1.13 GiB", "no", ""],
            ["4.", "max_split_size_mb:128", "78.66 GiB", "42.98 GiB", "no", ""],
            ["5.", "max_split_size_mb:512", "78.66 GiB", "42.98 GiB", "no", ""],
        ])
    );
    assert_eq!(
        report["results"][1],
        "Replay check: exact at every request and segment. The allocator may have 78.66 GiB: what the device gave the allocator when the job ran out of memory."
    );
    assert_eq!(report["results"][2], 1);

    let (page, _) = record_driver_only(&dir);
    let report = browse_report(&page, json!([{ "eval": "document.getElementById('whatif').textContent" }]));
    let note = report["results"][0].as_str().unwrap();
    assert!(note.contains("has no allocator requests: a what-if replays PyTorch's allocator"), "{note}");
}

/// A capture at the driver's level (no allocator events) and its HTML report.
fn record_driver_only(dir: &Path) -> (PathBuf, Vec<Event>) {
    let (log, out, page) = (dir.join("expected.jsonl"), dir.join("events.jsonl"), dir.join("driver.html"));
    let script = workloads().join("tensors.py");
    let output = gpuprof_run(
        &["--level", "driver", "--output", out.to_str().unwrap(), "--html", page.to_str().unwrap()],
        &[python3(), script.to_str().unwrap()],
        &log,
    );
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
    (page, read_events(&out))
}

/// Three ranks of one job (torchrun's variables; dp_rank.py over the stand-ins), rank 2 keeping
/// a block each step, under one capture: the report shows the ranks side by side, in rank
/// order, each with its job and the peaks its allocator reported.
#[test]
fn the_ranks_of_a_job_stand_side_by_side() {
    const LAUNCHER: &str = r#"
import json, os, subprocess, sys
script, said, libc10_cuda = sys.argv[1], sys.argv[2], sys.argv[3]
ranks = []
for rank in range(3):
    env = dict(os.environ, RANK=str(rank), WORLD_SIZE="3", LOCAL_RANK=str(rank), TORCHELASTIC_RUN_ID="html-7",
               GPUPROF_LIBC10_CUDA=libc10_cuda)
    keep = "1" if rank == 2 else "0"
    ranks.append(subprocess.Popen([sys.executable, script, "5", keep], env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE))
with open(said, "w") as out:
    for p in ranks:
        out.write(p.communicate(timeout=60)[0].decode())
"#;
    const MIB: u64 = 1 << 20;
    let dir = scratch("html_ranks");
    let (log, page, said) = (dir.join("expected.jsonl"), dir.join("ranks.html"), dir.join("said.jsonl"));
    let script = workloads().join("dp_rank.py");
    let mut run = Command::new(gpuprof());
    run.args(["run", "--output", dir.join("ranks.jsonl").to_str().unwrap(), "--html", page.to_str().unwrap(), "--"]);
    run.args([python3(), "-c", LAUNCHER, script.to_str().unwrap(), said.to_str().unwrap()]);
    run.arg(libc10_cuda_standin());
    workload_env(&mut run, &log);
    let stderr = dir.join("run.stderr");
    let mut child = run.stderr(std::fs::File::create(&stderr).unwrap()).spawn().unwrap();
    let status = child.wait_within(std::time::Duration::from_secs(120), "child");
    assert_eq!(status.code(), Some(0), "{}", std::fs::read_to_string(&stderr).unwrap());
    let pids: Vec<u64> = std::fs::read_to_string(&said)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str::<Value>(line).unwrap()["pid"].as_u64().unwrap())
        .collect();
    assert_eq!(pids.len(), 3);
    let report = browse_report(
        &page,
        json!([{ "eval": "Array.from(document.querySelectorAll('#ranks tbody tr')).map(r => ({ data: Object.assign({}, r.dataset), cells: Array.from(r.cells).map(c => c.textContent) }))" }]),
    );
    let ranks: Vec<(u64, u64, String, u64, u64)> = report["results"][0]
        .as_array()
        .unwrap_or_else(|| panic!("{report}"))
        .iter()
        .map(|row| {
            let number = |key: &str| row["data"][key].as_str().unwrap().parse::<u64>().unwrap();
            let job = row["cells"][2].as_str().unwrap().to_string();
            (number("rank"), number("pid"), job, number("peakAllocated"), number("peakReserved"))
        })
        .collect();
    // Weights 256 MiB and a step's 64 MiB of activations; rank 2 also its five kept 16 MiB blocks.
    let job = "torchrun:html-7".to_string();
    assert_eq!(
        ranks,
        [
            (0, pids[0], job.clone(), 320 * MIB, 1024 * MIB),
            (1, pids[1], job.clone(), 320 * MIB, 1024 * MIB),
            (2, pids[2], job, 400 * MIB, 1024 * MIB),
        ]
    );
}
