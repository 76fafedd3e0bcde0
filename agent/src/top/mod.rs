//! `gpuprof top`: a live terminal view of every CUDA process on the machine (or one process
//! tree): driver bytes, the allocator's allocated and reserved, IPC mappings, the stacks holding
//! the most, findings as they fire. The capture is a session like `attach`'s; new
//! CUDA processes are picked up by a scan of /proc every second.

mod view;

use std::io;
use std::ops::ControlFlow;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use crossterm::event::{self, Event as TermEvent, KeyCode, KeyEventKind, KeyModifiers};
use gpuprof_model::RuleConfig;

use gpuprof_capture::flow::{EventFlow, FlowOptions};
use gpuprof_capture::kernel::{Capture, CaptureOptions};
use gpuprof_capture::session::{EbpfOptions, EbpfSource, Every, Scope, Session, Until};
use gpuprof_capture::signals;
use gpuprof_procfs::process;
use gpuprof_views::output::{Format, Terminal, TerminalOptions};

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
        if !process::is_running(pid) {
            anyhow::bail!("no process with pid {pid}: check the pid with `ps -p {pid}` (it may have exited)");
        }
    }
    if !(args.interval.is_finite() && args.interval >= 0.1) {
        anyhow::bail!("--interval {}: give at least 0.1 seconds", args.interval);
    }
    crate::doctor::check_ebpf_capture()?;
    signals::install();
    let capture = Capture::load(CaptureOptions::default())?;
    // The screen is the view's: notices are logged, findings kept for the end.
    let log = TerminalOptions {
        format: Format::None,
        output_file: None,
        findings_file: None,
        notices: false,
        findings_at_the_end: true,
    };
    let flow = EventFlow::new(
        FlowOptions { rules: RuleConfig::default(), keep_findings: true, pids_are_ours: true },
        vec![Box::new(Terminal::new(log))],
    );
    let ebpf = EbpfSource::new(&capture, EbpfOptions { autograd: true, level: gpuprof_model::Level::Tensors }, None);
    let mut session = Session::new(flow).with_ebpf(ebpf).with_poll(POLL);
    let scope = args.pid.map_or(Scope::Node, Scope::Tree);
    session.follow(scope);

    let mut terminal = ratatui::try_init().context("cannot take over the terminal (is stdout a terminal?)")?;
    let outcome = view_loop(&mut terminal, &mut session, scope, args);
    ratatui::restore();
    outcome?;
    gpuprof_views::output::findings::write_table(
        &mut io::stdout(),
        session.flow().findings(),
        gpuprof_views::output::colour::on_stdout(),
    )
    .context("cannot write to stdout")?;
    Ok(0)
}

/// The capture loop with two hooks: a scan for new processes each second, and the terminal —
/// keys read each turn, redrawn each `--interval` or at a key.
fn view_loop(
    terminal: &mut ratatui::DefaultTerminal,
    session: &mut Session<'_>,
    scope: Scope,
    args: &TopArgs,
) -> Result<()> {
    let redraw = Duration::from_secs_f64(args.interval);
    let mut state = view::ViewState::default();
    let mut last_draw: Option<Instant> = None;
    let rescan = Every::new(RESCAN, |session: &mut Session<'_>| {
        session.follow(scope);
        Ok(ControlFlow::Continue(()))
    });
    let screen = Every::new(Duration::ZERO, |session: &mut Session<'_>| {
        while event::poll(Duration::ZERO).context("cannot read the keyboard")? {
            if let TermEvent::Key(key) = event::read().context("cannot read the keyboard")? {
                if key.kind != KeyEventKind::Press {
                    continue;
                }
                match key.code {
                    KeyCode::Char('q') | KeyCode::Esc => return Ok(ControlFlow::Break(())),
                    KeyCode::Char('c') if key.modifiers.contains(KeyModifiers::CONTROL) => {
                        return Ok(ControlFlow::Break(()))
                    }
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
        if last_draw.is_none_or(|t| t.elapsed() >= redraw) {
            let model = view::Model::of(session);
            terminal.draw(|frame| view::draw(frame, &model, &mut state)).context("cannot draw")?;
            last_draw = Some(Instant::now());
        }
        Ok(ControlFlow::Continue(()))
    });
    session.run(Until::Stopped, None, &mut [rescan, screen])?;
    Ok(())
}
