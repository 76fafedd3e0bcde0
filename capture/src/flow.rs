//! What happens to every event, whichever capture made it (eBPF or the in-process shim): one
//! event per call where both capture it, the forward line of a backward-pass block, the exporter
//! (OTLP), the tracker and leak rules, a daemon's post-mortems, the output; and the end of a run:
//! the last findings, the summaries, the findings table or file, the counters.

use std::collections::BTreeMap;
use std::io;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use gpuprof_model::dedup::Dedup;
use gpuprof_model::escalation::{Escalation, EscalationConfig, Raise};
use gpuprof_model::forward_stacks::ForwardStacks;
use gpuprof_model::rank::Ranks;
use gpuprof_model::{Analyzer, Event, Finding, RuleConfig, Tracker};

use gpuprof_views::output::{self, EndOfRun, EventSink, Format};

use crate::nvml::NvmlView;
use crate::postmortem::{Done, PostmortemReport, PostmortemStats, Postmortems};

/// Where the flow also sends what it sees, besides its output: the fleet's OTLP export
/// (`gpuprof_fleet::telemetry`). Each call gets the tracker as it stands, for what the export
/// summarizes.
pub trait Exporter {
    /// An event, before the tracker takes it.
    fn before(&mut self, event: &Event, tracker: &Tracker);
    /// The same event once tracked, with the findings it fired.
    fn after(&mut self, event: &Event, fired: &[Finding], tracker: &Tracker);
    /// Findings that fired without an event (time passed, the run ended).
    fn findings(&mut self, fired: &[Finding], tracker: &Tracker);
    /// A post-mortem written (its finding went out already, naming it): its report.
    fn postmortem(&mut self, report: &PostmortemReport);
    /// Device memory each followed process uses as the driver accounts it (NVML), by pid.
    fn device_used(&mut self, used: BTreeMap<u32, u64>);
    /// Hands what is batched to the transport (`now`: wall-clock ns).
    fn flush(&mut self, tracker: &Tracker, now: u64);
    /// Sends what is left; what was delivered, in words.
    fn finish(self: Box<Self>, tracker: &Tracker) -> String;
    /// Delivered, lost and waiting so far (the daemon's health).
    fn health(&self) -> ExportHealth;
}

/// What an exporter has delivered so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ExportHealth {
    pub sent: u64,
    pub lost: u64,
    /// Encoded bytes waiting to be sent.
    pub queued_bytes: u64,
}

/// What a run does with its events besides tracking them.
pub struct FlowOptions {
    pub rules: RuleConfig,
    pub format: Format,
    /// The file the events go to (None: stdout): its end-of-run summary goes to stderr then.
    pub output_file: Option<PathBuf>,
    pub findings_file: Option<PathBuf>,
    /// Say findings and notices on stderr (off under a full-screen view).
    pub notices: bool,
    /// Keep every finding for the end of the run. A daemon runs for months: it logs each one
    /// as it fires and keeps only the count.
    pub keep_findings: bool,
    /// The events' pids are this agent's (its /proc shows them): false for a pod's shim sidecar,
    /// whose processes live in another pid namespace, where /proc/PID is someone else.
    pub pids_are_ours: bool,
}

pub struct EventFlow {
    analyzer: Analyzer,
    findings: Vec<Finding>,
    keep_findings: bool,
    findings_fired: u64,
    sink: Box<dyn EventSink>,
    /// OTLP export, when `--otlp-endpoint` names a collector.
    exporter: Option<Box<dyn Exporter>>,
    format: Format,
    output_file: Option<PathBuf>,
    findings_file: Option<PathBuf>,
    notices: bool,
    events: u64,
    /// What the driver says each followed process uses (nvidia-smi's figure), where NVML is.
    nvml: NvmlView,
    /// Forward lines of backward-pass blocks, by autograd sequence number.
    forward_stacks: ForwardStacks,
    /// Each process's rank in a distributed job, read once at its first CUDA call and put on
    /// that event (so a recording of the run names it too), so findings name it.
    ranks: Ranks,
    pids_are_ours: bool,
    /// With two captures feeding the flow (eBPF and the shim): one event per call.
    dedup: Option<Dedup>,
    /// A daemon's rules for raising a process's capture level, and what they decided.
    escalation: Option<Escalation>,
    raises: Vec<Raise>,
    /// A daemon's windows of recent events and the post-mortems written from them.
    postmortems: Option<Postmortems>,
}

impl EventFlow {
    pub fn new(options: FlowOptions, sink: Box<dyn EventSink>) -> Self {
        EventFlow {
            analyzer: Analyzer::new(options.rules),
            findings: Vec::new(),
            keep_findings: options.keep_findings,
            findings_fired: 0,
            sink,
            exporter: None,
            format: options.format,
            output_file: options.output_file,
            findings_file: options.findings_file,
            notices: options.notices,
            events: 0,
            nvml: NvmlView::open(),
            forward_stacks: ForwardStacks::default(),
            ranks: Ranks::default(),
            pids_are_ours: options.pids_are_ours,
            dedup: None,
            escalation: None,
            raises: Vec::new(),
            postmortems: None,
        }
    }

    /// Keeps the last seconds of every process's events and writes a post-mortem when one runs
    /// out of memory or a leak finding fires (`crate::postmortem`): before the exporter sees the
    /// finding, which names it.
    pub fn keep_postmortems(&mut self, postmortems: Postmortems) {
        self.postmortems = Some(postmortems);
    }

    /// What the post-mortems have kept, dropped and written so far (none without them).
    pub fn postmortem_stats(&self) -> Option<PostmortemStats> {
        self.postmortems.as_ref().map(Postmortems::stats)
    }

    /// Events come from two captures (eBPF and the shim): a call both see is kept once.
    pub fn keep_one_event_per_call(&mut self) {
        self.dedup = Some(Dedup::new(gpuprof_model::dedup::DEFAULT_WINDOW_NS));
    }

    /// Second copies of calls dropped so far.
    pub fn duplicates_dropped(&self) -> u64 {
        self.dedup.as_ref().map_or(0, Dedup::dropped)
    }

    /// Watches for processes whose capture level should be raised (`model::escalation`); what
    /// the rules decide waits in `take_raises`.
    pub fn escalate(&mut self, config: EscalationConfig) {
        self.escalation = Some(Escalation::new(config));
    }

    /// A raise the escalation rules decided at `now` (ns): the leak rules wait for its tensors.
    fn decided(&mut self, raise: Raise, now: u64) {
        let detail = self.escalation.as_ref().map_or(0, |rules| rules.config().detail_ns);
        self.expect_tensors(raise.pid, now, detail);
        if let Some(postmortems) = &mut self.postmortems {
            postmortems.raised(raise.pid, now, raise.reason.sentence());
        }
        self.raises.push(raise);
    }

    /// The escalation rules' windows that ended by `now` (ns), judged on the tracker as it
    /// stands: at each event's time before the leak rules see the event, and at the wall clock
    /// when none comes. The growth rule closes the same windows at the same events after them, so
    /// a process raised for growth has its tensors expected (its driver-only finding held) before
    /// that rule can judge it: said first, it would be the process's one growth finding, and the
    /// tensors' never came.
    fn close_escalation_windows(&mut self, now: u64) {
        if let Some(rules) = self.escalation.as_mut().filter(|rules| rules.due(now)) {
            let memory = self.analyzer.tracker().live_processes().into_iter().map(|p| (p.pid, p.device_bytes()));
            for raise in rules.tick(now, memory) {
                self.decided(raise, now);
            }
        }
    }

    /// Process `pid` is recorded at the tensors' level for `detail` ns from `now`.
    pub fn expect_tensors(&mut self, pid: u32, now: u64, detail: u64) {
        self.analyzer.expect_tensors(pid, now.saturating_add(detail));
    }

    /// Someone asked for process `pid`'s tensors from `now`, for `detail` ns.
    pub fn tensors_requested(&mut self, pid: u32, now: u64, detail: u64) {
        self.expect_tensors(pid, now, detail);
        if let Some(postmortems) = &mut self.postmortems {
            postmortems.raised(pid, now, gpuprof_model::escalation::Reason::Requested.sentence());
        }
    }

    /// Processes the escalation rules decided to raise since the last call.
    pub fn take_raises(&mut self) -> Vec<Raise> {
        std::mem::take(&mut self.raises)
    }

    /// The escalation rules, told of raises and lowerings decided elsewhere (requests).
    pub fn escalation_mut(&mut self) -> Option<&mut Escalation> {
        self.escalation.as_mut()
    }

    pub fn set_exporter(&mut self, exporter: Option<Box<dyn Exporter>>) {
        self.exporter = exporter;
    }

    /// One event through backward attribution, export, tracker, rules and output.
    pub fn observe(&mut self, mut event: Event) -> io::Result<()> {
        if self.dedup.as_mut().is_some_and(|d| !d.admit(&event)) {
            return Ok(());
        }
        self.forward_stacks.follow(&mut event);
        if self.pids_are_ours && self.ranks.first_call(&event) {
            let started_with = gpuprof_procfs::process::start_environment(event.pid)
                .map(|environ| {
                    gpuprof_model::start_environment::StartEnvironment::from_environment(|name| environ.value(name))
                })
                .unwrap_or_default();
            event.rank = event.rank.or(started_with.rank);
            event.allocator_settings =
                event.allocator_settings.take().or(started_with.allocator_settings.map(Into::into));
        }
        self.ranks.observe(&event);
        if let Some(exporter) = &mut self.exporter {
            exporter.before(&event, self.analyzer.tracker());
        }
        if let Some(postmortems) = &mut self.postmortems {
            postmortems.before(&event, self.analyzer.tracker());
        }
        if let Some(raise) = self.escalation.as_mut().and_then(|rules| rules.observe(&event)) {
            self.decided(raise, event.ts);
        }
        self.close_escalation_windows(event.ts);
        let mut fired = self.analyzer.observe(&mut event);
        self.ranks.name(&mut fired);
        if let Some(postmortems) = &mut self.postmortems {
            postmortems.after(&event, &mut fired, self.analyzer.tracker(), &self.ranks);
        }
        if let Some(exporter) = &mut self.exporter {
            exporter.after(&event, &fired, self.analyzer.tracker());
        }
        self.found(fired);
        self.events += 1;
        self.sink.event(&event)
    }

    /// Findings that wait for time to pass (orphans after their grace period); hands batches to
    /// the exporter and writes buffered output.
    pub fn flush(&mut self) -> Result<()> {
        let now = gpuprof_model::event::wall_clock_ns();
        let mut due = self.analyzer.tick(now);
        self.ranks.name(&mut due);
        if let Some(postmortems) = &mut self.postmortems {
            postmortems.found(&mut due, self.analyzer.tracker(), &self.ranks);
        }
        if !due.is_empty() {
            if let Some(exporter) = &mut self.exporter {
                exporter.findings(&due, self.analyzer.tracker());
            }
            self.found(due);
        }
        self.nvml.sample(self.analyzer.tracker(), now);
        for reading in self.nvml.take_readings(self.analyzer.tracker(), now) {
            self.observe(reading).context("cannot write the output")?;
        }
        self.close_escalation_windows(now);
        if let Some(postmortems) = &mut self.postmortems {
            let done = postmortems.tick(now);
            let said = postmortems.take_said();
            self.written(done, said);
        }
        if let Some(exporter) = &mut self.exporter {
            exporter.device_used(self.nvml.now().iter().map(|(pid, r)| (*pid, r.nvml_used)).collect());
            exporter.flush(self.analyzer.tracker(), now);
        }
        self.sink.flush().context("cannot write the output")
    }

    /// A line for the person at the terminal (quiet while a full-screen view owns it).
    pub fn notice(&self, text: String) {
        if self.notices {
            output::live_line::clear();
            eprintln!("gpuprof: {text}");
        } else {
            tracing::info!("{text}");
        }
    }

    /// What the post-mortem writer did: said (with the keeper's `said`), and each report handed
    /// to the exporter.
    fn written(&mut self, done: Vec<Done>, said: Vec<String>) {
        for line in said {
            self.notice(line);
        }
        for item in done {
            match item {
                Done::Written(report) => {
                    self.notice(format!(
                        "post-mortem of the {} of pid {}: {} ({:.1} s, {}, {}; the recording {})",
                        report.kind.as_str(),
                        report.pid,
                        report.report.display(),
                        report.span_ns as f64 / 1e9,
                        gpuprof_model::findings::wording::count(report.processes as u64, "process", "processes"),
                        gpuprof_model::findings::wording::count(report.events, "event", "events"),
                        report.recording.display()
                    ));
                    if let Some(exporter) = &mut self.exporter {
                        exporter.postmortem(&report);
                    }
                }
                Done::Failed { pid, kind, path, error, .. } => self.notice(format!(
                    "warning: cannot write the post-mortem of the {} of pid {pid} to {}: {error}: free space there, or give --postmortem-dir another directory or a smaller --postmortem-max-mib",
                    kind.as_str(),
                    path.display()
                )),
                Done::Swept { error: Some(error), .. } => self.notice(format!(
                    "warning: {error}: the post-mortem directory's cap and retention wait for the next sweep"
                )),
                Done::Swept { .. } => {}
            }
        }
    }

    fn found(&mut self, fired: Vec<Finding>) {
        self.findings_fired += fired.len() as u64;
        if self.keep_findings {
            self.findings.extend(fired);
            return;
        }
        for finding in fired {
            self.notice(format!("finding {}: {}", finding.kind.as_str(), finding.detail));
        }
    }

    /// Drops what is kept of processes that exited more than `age` ago (their tables, for the
    /// findings they can no longer cause). Returns how many were dropped.
    pub fn forget_exited(&mut self, age: Duration) -> usize {
        let horizon = gpuprof_model::event::wall_clock_ns().saturating_sub(age.as_nanos() as u64);
        let forgotten = self.analyzer.forget_closed_before(horizon);
        // Ranks of processes no longer followed go too: a daemon sees processes come and go for
        // months.
        let tracker = self.analyzer.tracker();
        self.ranks.retain(|pid| tracker.process(pid).is_some());
        if let Some(postmortems) = &mut self.postmortems {
            postmortems.forget(tracker);
        }
        forgotten
    }

    pub fn analyzer(&self) -> &Analyzer {
        &self.analyzer
    }

    pub fn nvml(&self) -> &NvmlView {
        &self.nvml
    }

    /// What the exporter has delivered so far (none without one).
    pub fn export_health(&self) -> Option<ExportHealth> {
        self.exporter.as_ref().map(|exporter| exporter.health())
    }

    /// Findings so far, in the order they fired (none kept without `keep_findings`).
    pub fn findings(&self) -> &[Finding] {
        &self.findings
    }

    pub fn findings_fired(&self) -> u64 {
        self.findings_fired
    }

    pub fn events(&self) -> u64 {
        self.events
    }

    /// The end of the run: findings the rules give only now, the output's summary, findings on
    /// stderr (and in `--findings`), then the `closing` lines and the export's own account.
    /// `lost_events`: what the capture dropped (a recording keeps the count).
    pub fn finish(mut self, closing: &[String], lost_events: u64) -> Result<()> {
        let mut ended = self.analyzer.finish();
        self.ranks.name(&mut ended);
        if let Some(postmortems) = &mut self.postmortems {
            postmortems.found(&mut ended, self.analyzer.tracker(), &self.ranks);
        }
        if let Some(exporter) = &mut self.exporter {
            exporter.findings(&ended, self.analyzer.tracker());
        }
        self.found(ended);
        if let Some(mut postmortems) = self.postmortems.take() {
            // Said and handed to the exporter before it sends what is left.
            let said = postmortems.take_said();
            let done = postmortems.finish();
            self.written(done, said);
        }
        let summaries = self.analyzer.tracker().summaries();
        let end =
            EndOfRun { processes: &summaries, findings: &self.findings, lost_events, nvml: self.nvml.last_seen() };
        self.sink.finish(&end).context("cannot write the output")?;
        // A file gpuprof named is not kept when nothing was captured (its sink removed it).
        let to_file = self.output_file.as_deref().filter(|f| self.format != Format::None && f.exists());
        match to_file {
            // The events went to a file: the terminal gets what they add up to.
            Some(_) if self.format != Format::Table && self.keep_findings => {
                output::write_end_of_run(&mut io::stderr(), &end, output::colour::on_stderr())
                    .context("cannot write to stderr")?
            }
            // The event stream stays pure jsonl; people read the findings on stderr.
            None if self.format != Format::Table && self.keep_findings => {
                output::findings::write_table(&mut io::stderr(), &self.findings, output::colour::on_stderr())
                    .context("cannot write to stderr")?
            }
            _ => {}
        }
        if let Some(path) = &self.findings_file {
            output::findings::save_json(path, &self.findings)?;
        }
        for line in closing {
            eprintln!("gpuprof: {line}");
        }
        if let Some(exporter) = self.exporter.take() {
            eprintln!("gpuprof: {}", exporter.finish(self.analyzer.tracker()));
        }
        // For files `summary`, `report` and `export` read; not for /dev/null and the like.
        let readable = matches!(self.format, Format::Recording | Format::Jsonl);
        if let Some(file) = to_file.filter(|f| self.notices && readable && f.is_file()) {
            output::write_next_steps(&mut io::stderr(), file, self.events).context("cannot write to stderr")?;
        }
        Ok(())
    }
}
