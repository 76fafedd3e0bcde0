//! What `gpuprof top` draws: a snapshot of the session's flow (the model) and the widgets.

use std::collections::BTreeMap;

use gpuprof_model::bytes::human;
use gpuprof_model::findings::wording::count;
use gpuprof_model::track::{LiveSummary, ProcessState};
use gpuprof_model::Finding;
use ratatui::layout::{Constraint, Direction, Layout};
use ratatui::style::{Modifier, Style};
use ratatui::text::Line;
use ratatui::widgets::{Block, Borders, Cell, Paragraph, Row, Table, TableState, Wrap};
use ratatui::Frame;

use gpuprof_capture::nvml::Reconciled;
use gpuprof_capture::session::Session;

/// The columns the process table can be sorted by.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum SortKey {
    #[default]
    Driver,
    Allocated,
    Reserved,
    Pid,
}

impl SortKey {
    fn next(self) -> Self {
        match self {
            SortKey::Driver => SortKey::Allocated,
            SortKey::Allocated => SortKey::Reserved,
            SortKey::Reserved => SortKey::Pid,
            SortKey::Pid => SortKey::Driver,
        }
    }

    fn name(self) -> &'static str {
        match self {
            SortKey::Driver => "driver bytes",
            SortKey::Allocated => "allocated",
            SortKey::Reserved => "reserved",
            SortKey::Pid => "pid",
        }
    }
}

/// What the person did: the selected row, the sort.
#[derive(Debug, Default)]
pub struct ViewState {
    table: TableState,
    sort: SortKey,
    rows: usize,
    /// Lines the findings pane is scrolled down by.
    findings_scroll: u16,
}

impl ViewState {
    pub fn select_next(&mut self) {
        let next = self.table.selected().map_or(0, |i| (i + 1).min(self.rows.saturating_sub(1)));
        self.table.select(Some(next));
    }

    pub fn select_previous(&mut self) {
        let previous = self.table.selected().map_or(0, |i| i.saturating_sub(1));
        self.table.select(Some(previous));
    }

    pub fn next_sort(&mut self) {
        self.sort = self.sort.next();
    }

    pub fn scroll_findings(&mut self, lines: i32) {
        self.findings_scroll = (self.findings_scroll as i32 + lines).max(0) as u16;
    }
}

/// How long an exited process stays in the table (dimmed), for its last figures and findings.
pub const KEEP_EXITED_NS: u64 = 60_000_000_000;

/// One redraw's worth of state, taken from the session.
pub struct Model {
    processes: Vec<LiveSummary>,
    findings: Vec<Finding>,
    events: u64,
    /// Events the capture lost (the same count as `--stats` and the daemon's metrics).
    lost: u64,
    /// NVML's latest figures, where the machine has NVML.
    nvml: BTreeMap<u32, Reconciled>,
}

impl Model {
    pub fn of(session: &Session<'_>) -> Model {
        let flow = session.flow();
        let stats = session.stats();
        let since = gpuprof_model::event::wall_clock_ns().saturating_sub(KEEP_EXITED_NS);
        let processes = flow
            .analyzer()
            .tracker()
            .processes()
            .into_iter()
            .filter(|p| match p.state {
                ProcessState::Running => true,
                ProcessState::Exited { ts, .. } => ts >= since,
                // An exec'd image is the same process under a new table.
                ProcessState::Replaced { .. } => false,
            })
            .map(|p| p.summary())
            .filter(|s| s.driver_calls > 0 || s.allocator.is_some())
            .collect();
        Model {
            processes,
            findings: flow.findings().to_vec(),
            events: stats.events,
            lost: stats.lost,
            nvml: flow.nvml().now().clone(),
        }
    }
}

fn device_bytes(process: &LiveSummary) -> u64 {
    process.by_kind.iter().filter(|(kind, _)| kind.as_str() != "host_pinned").map(|(_, t)| t.bytes).sum()
}

pub fn draw(frame: &mut Frame<'_>, model: &Model, state: &mut ViewState) {
    let processes = in_order(model, state.sort);
    state.rows = processes.len();
    if state.table.selected().is_none_or(|i| i >= processes.len()) {
        state.table.select((!processes.is_empty()).then_some(0));
    }
    let areas = Layout::default()
        .direction(Direction::Vertical)
        .constraints([Constraint::Length(1), Constraint::Percentage(50), Constraint::Min(6)])
        .split(frame.area());
    frame.render_widget(Paragraph::new(header(model, &processes, state.sort)), areas[0]);
    frame.render_stateful_widget(process_table(model, &processes), areas[1], &mut state.table);
    let bottom = Layout::default()
        .direction(Direction::Horizontal)
        .constraints([Constraint::Percentage(50), Constraint::Percentage(50)])
        .split(areas[2]);
    let selected = state.table.selected().and_then(|i| processes.get(i)).copied();
    frame.render_widget(stacks_of(selected), bottom[0]);
    frame.render_widget(findings(model, &mut state.findings_scroll), bottom[1]);
}

/// Running processes first, each group in the chosen order.
fn in_order(model: &Model, sort: SortKey) -> Vec<&LiveSummary> {
    let mut processes: Vec<&LiveSummary> = model.processes.iter().collect();
    match sort {
        SortKey::Driver => {
            processes.sort_by_key(|p| (p.state != ProcessState::Running, std::cmp::Reverse(device_bytes(p))))
        }
        SortKey::Allocated => processes.sort_by_key(|p| {
            (p.state != ProcessState::Running, std::cmp::Reverse(p.allocator.map_or(0, |a| a.allocated)))
        }),
        SortKey::Reserved => processes.sort_by_key(|p| {
            (p.state != ProcessState::Running, std::cmp::Reverse(p.allocator.map_or(0, |a| a.reserved)))
        }),
        SortKey::Pid => processes.sort_by_key(|p| (p.state != ProcessState::Running, p.pid)),
    }
    processes
}

fn header(model: &Model, processes: &[&LiveSummary], sort: SortKey) -> String {
    format!(
        "gpuprof top — {}, {}{}, {} — sorted by {} — q quit, ↑/↓ select, s sort, PgUp/PgDn findings",
        count(
            processes.iter().filter(|p| p.state == ProcessState::Running).count() as u64,
            "CUDA process",
            "CUDA processes"
        ),
        count(model.events, "event", "events"),
        if model.lost > 0 { format!(" ({} lost)", model.lost) } else { String::new() },
        count(model.findings.len() as u64, "finding", "findings"),
        sort.name()
    )
}

fn process_table<'a>(model: &Model, processes: &[&LiveSummary]) -> Table<'a> {
    let rows: Vec<Row<'a>> = processes.iter().map(|p| process_row(model, p)).collect();
    Table::new(
        rows,
        [
            Constraint::Length(8),
            Constraint::Length(16),
            Constraint::Length(12),
            Constraint::Length(5),
            Constraint::Length(12),
            Constraint::Length(12),
            Constraint::Length(12),
            Constraint::Length(11),
            Constraint::Length(12),
            Constraint::Length(12),
            Constraint::Length(9),
            Constraint::Length(4),
            Constraint::Length(8),
        ],
    )
    .header(
        Row::new([
            "PID",
            "COMM",
            "STATE",
            "DEV",
            "DRIVER",
            "ALLOCATED",
            "RESERVED",
            "BEFORE",
            "NVML USED",
            "NOT PROBED",
            "IPC OPEN",
            "CTX",
            "CALLS",
        ])
        .style(Style::default().add_modifier(Modifier::BOLD)),
    )
    .row_highlight_style(Style::default().add_modifier(Modifier::REVERSED))
    .block(Block::default().borders(Borders::ALL).title("Processes"))
}

fn process_row<'a>(model: &Model, p: &LiveSummary) -> Row<'a> {
    let state_text = match p.state {
        ProcessState::Running => "running".to_string(),
        ProcessState::Exited { code, .. } => format!("exited({code})"),
        ProcessState::Replaced { .. } => "exec'd".to_string(),
    };
    let (allocated, reserved) =
        p.allocator.map_or((String::from("-"), String::from("-")), |a| (human(a.allocated), human(a.reserved)));
    // NVML's figure and the part of it no probed call made (context, modules, …).
    let (nvml, not_probed) = model.nvml.get(&p.pid).map_or((String::from("-"), String::from("-")), |r| {
        let sign = if r.not_probed() < 0 { "-" } else { "" };
        (human(r.nvml_used), format!("{sign}{}", human(r.not_probed().unsigned_abs())))
    });
    // Held before gpuprof first heard from the allocator: in no figure it counted itself.
    let before = p.before_capture.map_or(String::from("-"), |b| human(b.reserved));
    let row = Row::new(vec![
        Cell::from(p.pid.to_string()),
        Cell::from(p.comm.clone()),
        Cell::from(state_text),
        Cell::from(if p.devices.is_empty() {
            "-".to_string()
        } else {
            p.devices.iter().map(i32::to_string).collect::<Vec<_>>().join(",")
        }),
        Cell::from(human(device_bytes(p))),
        Cell::from(allocated),
        Cell::from(reserved),
        Cell::from(before),
        Cell::from(nvml),
        Cell::from(not_probed),
        Cell::from(p.imports.to_string()),
        Cell::from(p.contexts.to_string()),
        Cell::from(p.driver_calls.to_string()),
    ]);
    if p.state == ProcessState::Running {
        row
    } else {
        row.style(Style::default().add_modifier(Modifier::DIM))
    }
}

/// Live bytes of the selected process by the user's line.
fn stacks_of<'a>(selected: Option<&LiveSummary>) -> Paragraph<'a> {
    let stacks: Vec<Line<'a>> = match selected {
        Some(p) => p
            .by_frame
            .iter()
            .take(20)
            .map(|entry| {
                let frame = entry.frame.as_ref().map_or("(no Python stack)".to_string(), |f| match f.native_module() {
                    Some(_) => f.to_string(),
                    None => format!("{}:{} {}", f.file.rsplit('/').next().unwrap_or(&f.file), f.line, f.function),
                });
                Line::from(format!("{:>10} {:<11} {frame}", human(entry.total.bytes), entry.kind.as_str()))
            })
            .collect(),
        None => vec![Line::from("no CUDA process yet")],
    };
    let title = selected.map_or("Stacks".to_string(), |p| format!("Live bytes by the user's line — pid {}", p.pid));
    Paragraph::new(stacks).block(Block::default().borders(Borders::ALL).title(title))
}

/// The findings, newest first: the first line of each is short, the detail follows indented.
fn findings<'a>(model: &Model, scroll: &mut u16) -> Paragraph<'a> {
    let findings: Vec<Line<'a>> = model
        .findings
        .iter()
        .rev()
        .flat_map(|f| {
            [
                Line::from(format!("{} [{}] pid {}: {}", f.kind.as_str(), f.severity.as_str(), f.pid, human(f.bytes))),
                Line::from(format!("  {}", f.detail)),
            ]
        })
        .collect();
    let most = (findings.len() as u16).saturating_sub(1);
    *scroll = (*scroll).min(most);
    let title = match model.findings.len() {
        0 => "Findings".to_string(),
        n => format!("Findings ({n}, newest first)"),
    };
    Paragraph::new(findings)
        .wrap(Wrap { trim: true })
        .scroll((*scroll, 0))
        .block(Block::default().borders(Borders::ALL).title(title))
}
