//! `gpuprof top`: a live terminal view of every CUDA process on the machine (or one process
//! tree): driver bytes, the allocator's allocated and reserved, IPC mappings, the stacks holding
//! the most, findings as they fire. The capture runs through the same pipeline as `attach`; new
//! CUDA processes are picked up by a scan of /proc every second.

mod view;

use std::io;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use crossterm::event::{self, Event as TermEvent, KeyCode, KeyEventKind, KeyModifiers};
use gpuprof_model::RuleConfig;

use crate::capture::{Capture, CaptureOptions};
use crate::flow::FlowOptions;
use crate::libcuda;
use crate::output::{Format, NullSink};
use crate::pipeline::{Pipeline, PipelineOptions};
use crate::{preflight, procfs, signals};

pub use view::SortKey;

const RESCAN: Duration = Duration::from_secs(1);
const POLL: Duration = Duration::from_millis(50);

pub struct TopArgs {
    pub pid: Option<u32>,
    /// Seconds between redraws.
    pub interval: f64,
}

/// Returns gpuprof's exit code.
pub fn run(args: &TopArgs) -> Result<u8> {
    if let Some(pid) = args.pid {
        if !procfs::is_running(pid) {
            anyhow::bail!("no process with pid {pid}: check the pid with `ps -p {pid}` (it may have exited)");
        }
    }
    if !(args.interval.is_finite() && args.interval >= 0.1) {
        anyhow::bail!("--interval {}: give at least 0.1 seconds", args.interval);
    }
    preflight::check_ebpf_capture()?;
    signals::install();
    let capture = Capture::load(CaptureOptions::default())?;
    let options = PipelineOptions {
        flow: FlowOptions {
            rules: RuleConfig::default(),
            format: Format::Jsonl,
            output_file: None,
            findings_file: None,
            notices: false,
            keep_findings: true,
            pids_are_ours: true,
        },
        print_stats: false,
        autograd: true,
    };
    let mut pipeline = Pipeline::new(&capture, options, Box::new(NullSink), None);
    follow_new_processes(&mut pipeline, args.pid);
    pipeline.discover_libraries();

    let mut terminal = ratatui::try_init().context("cannot take over the terminal (is stdout a terminal?)")?;
    let outcome = view_loop(&mut terminal, &mut pipeline, args);
    ratatui::restore();
    outcome?;
    let findings = pipeline.findings();
    crate::output::findings::write_table(&mut io::stdout(), findings).context("cannot write to stdout")?;
    Ok(0)
}

fn view_loop(terminal: &mut ratatui::DefaultTerminal, pipeline: &mut Pipeline<'_>, args: &TopArgs) -> Result<()> {
    let redraw = Duration::from_secs_f64(args.interval);
    let mut state = view::ViewState::default();
    let mut last_scan = Instant::now();
    let mut last_draw: Option<Instant> = None;
    loop {
        pipeline.pump(POLL)?;
        pipeline.tick();
        if last_scan.elapsed() >= RESCAN {
            last_scan = Instant::now();
            follow_new_processes(pipeline, args.pid);
        }
        while event::poll(Duration::ZERO).context("cannot read the keyboard")? {
            if let TermEvent::Key(key) = event::read().context("cannot read the keyboard")? {
                if key.kind != KeyEventKind::Press {
                    continue;
                }
                match key.code {
                    KeyCode::Char('q') | KeyCode::Esc => return Ok(()),
                    KeyCode::Char('c') if key.modifiers.contains(KeyModifiers::CONTROL) => return Ok(()),
                    KeyCode::Down | KeyCode::Char('j') => state.select_next(),
                    KeyCode::Up | KeyCode::Char('k') => state.select_previous(),
                    KeyCode::Char('s') => state.next_sort(),
                    KeyCode::PageDown => state.scroll_findings(5),
                    KeyCode::PageUp => state.scroll_findings(-5),
                    _ => {}
                }
                last_draw = None;
            }
        }
        if signals::take().is_some() {
            return Ok(());
        }
        if last_draw.is_none_or(|t| t.elapsed() >= redraw) {
            let model = view::Model::from_pipeline(pipeline);
            terminal.draw(|frame| view::draw(frame, &model, &mut state)).context("cannot draw")?;
            last_draw = Some(Instant::now());
        }
    }
}

/// Follows CUDA processes not followed yet: the given one and its descendants, or every process
/// on the machine that maps libcuda or libc10.
fn follow_new_processes(pipeline: &mut Pipeline<'_>, pid: Option<u32>) {
    let candidates: Vec<u32> = match pid {
        Some(root) => std::iter::once(root).chain(procfs::descendants(root)).collect(),
        None => libcuda::cuda_processes_on_node(pipeline.alive()),
    };
    for pid in candidates {
        if !pipeline.alive().contains(&pid) {
            let _ = pipeline.add_process(pid);
        }
    }
}
