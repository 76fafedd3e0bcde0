//! What happens to every event, whichever capture made it (eBPF or the in-process shim): one
//! event per call where both capture it, the forward line of a backward-pass block, the tracker
//! and leak rules, a daemon's post-mortems, and then the reporters (`gpuprof_model::Reporter`:
//! the views' outputs, the OTLP reporter), each handed the event and its findings alike; and the
//! end of a run: the last findings, and the reporters finished in turn.

use std::collections::BTreeMap;
use std::io;
use std::time::Duration;

use anyhow::{Context, Result};
use gpuprof_model::dedup::Dedup;
use gpuprof_model::escalation::{Escalation, EscalationConfig, Raise};
use gpuprof_model::forward_stacks::ForwardStacks;
use gpuprof_model::rank::Ranks;
use gpuprof_model::report::{EndOfRun, ExportHealth, Notice, Reporter};
use gpuprof_model::{Analyzer, Event, Finding, RuleConfig};

use crate::nvml::NvmlView;
use crate::postmortem::{Done, PostmortemStats, Postmortems};

/// What a run does with its events besides handing them to its reporters.
pub struct FlowOptions {
    pub rules: RuleConfig,
    /// Keep every finding for the end of the run. A daemon runs for months: it says each one
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
    /// Whatever consumes the run (outputs, the OTLP reporter), in the order each is handed
    /// things; the last is finished first.
    reporters: Vec<Box<dyn Reporter>>,
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
    pub fn new(options: FlowOptions, reporters: Vec<Box<dyn Reporter>>) -> Self {
        EventFlow {
            analyzer: Analyzer::new(options.rules),
            findings: Vec::new(),
            keep_findings: options.keep_findings,
            findings_fired: 0,
            reporters,
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
    /// out of memory or a leak finding fires (`crate::postmortem`): before the reporters see the
    /// finding, which names it.
    pub fn keep_postmortems(&mut self, postmortems: Postmortems) {
        self.postmortems = Some(postmortems);
    }

    /// What the post-mortems have kept, dropped and written so far (none without them).
    pub fn postmortem_stats(&self) -> Option<PostmortemStats> {
        self.postmortems.as_ref().map(Postmortems::stats)
    }

    /// Events come from two captures (eBPF and the shim): a call both see is kept once.
    pub(crate) fn keep_one_event_per_call(&mut self) {
        self.dedup = Some(Dedup::new(gpuprof_model::dedup::DEFAULT_WINDOW_NS));
    }

    /// Second copies of calls dropped so far.
    pub(crate) fn duplicates_dropped(&self) -> u64 {
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

    /// One event through backward attribution, tracker and rules, to the reporters.
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
            let job = started_with.job;
            event.job = event.job.take().or(job.id.map(Into::into));
            event.rank = event.rank.or(job.rank);
            event.local_rank = event.local_rank.or(job.local_rank);
            event.world_size = event.world_size.or(job.world_size);
            event.allocator_settings =
                event.allocator_settings.take().or(started_with.allocator_settings.map(Into::into));
        }
        self.ranks.observe(&event);
        for reporter in &mut self.reporters {
            reporter.before(&event, self.analyzer.tracker());
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
        self.events += 1;
        let handed = self.reporters.iter_mut().try_for_each(|r| r.event(&event, &fired, self.analyzer.tracker()));
        self.found(fired);
        handed
    }

    /// Findings that wait for time to pass (orphans after their grace period); the reporters'
    /// batches go on.
    pub(crate) fn flush(&mut self) -> Result<()> {
        let now = gpuprof_model::event::wall_clock_ns();
        let mut due = self.analyzer.tick(now);
        self.ranks.name(&mut due);
        if let Some(postmortems) = &mut self.postmortems {
            postmortems.found(&mut due, self.analyzer.tracker(), &self.ranks);
        }
        if !due.is_empty() {
            for reporter in &mut self.reporters {
                reporter.findings(&due);
            }
            self.found(due);
        }
        self.nvml.sample(self.analyzer.tracker(), now);
        for warning in self.nvml.take_warnings() {
            self.warn(warning);
        }
        for reading in self.nvml.take_readings(self.analyzer.tracker(), now) {
            self.observe(reading).context("cannot write the output")?;
        }
        self.close_escalation_windows(now);
        if let Some(postmortems) = &mut self.postmortems {
            let done = postmortems.tick(now);
            let said = postmortems.take_said();
            self.written(done, said);
        }
        let used: BTreeMap<u32, u64> = self.nvml.now().iter().map(|(pid, r)| (*pid, r.nvml_used)).collect();
        for reporter in &mut self.reporters {
            reporter.device_used(&used);
            reporter.flush(self.analyzer.tracker(), now).context("cannot write the output")?;
        }
        Ok(())
    }

    /// A line for the person who runs the capture (a full-screen view or a daemon logs it).
    pub fn notice(&mut self, text: String) {
        self.tell(Notice::Info(text));
    }

    /// A warning for the person who runs the capture, whoever that is.
    pub(crate) fn warn(&mut self, text: String) {
        self.tell(Notice::Warning(text));
    }

    pub(crate) fn tell(&mut self, notice: Notice) {
        for reporter in &mut self.reporters {
            reporter.notice(&notice);
        }
    }

    /// What the post-mortem writer did: said (with the keeper's `said`), and each report handed
    /// to the reporters.
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
                    for reporter in &mut self.reporters {
                        reporter.postmortem(&report);
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
    pub(crate) fn forget_exited(&mut self, age: Duration) -> usize {
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

    /// What the export has delivered so far (none without one).
    pub(crate) fn export_health(&self) -> Option<ExportHealth> {
        self.reporters.iter().find_map(|reporter| reporter.health())
    }

    /// Findings so far, in the order they fired (none kept without `keep_findings`).
    pub fn findings(&self) -> &[Finding] {
        &self.findings
    }

    pub(crate) fn findings_fired(&self) -> u64 {
        self.findings_fired
    }

    pub fn events(&self) -> u64 {
        self.events
    }

    /// The end of the run: findings the rules give only now, post-mortems still being written,
    /// then each reporter finished, the last first: what one says it delivered joins `closing`
    /// (what the capture took in, in words) for those finished after it. `lost_events`: what the
    /// capture dropped (a recording keeps the count). The run's findings, where they were kept.
    pub(crate) fn finish(mut self, mut closing: Vec<String>, lost_events: u64) -> Result<Vec<Finding>> {
        let mut ended = self.analyzer.finish();
        self.ranks.name(&mut ended);
        if let Some(postmortems) = &mut self.postmortems {
            postmortems.found(&mut ended, self.analyzer.tracker(), &self.ranks);
        }
        for reporter in &mut self.reporters {
            reporter.findings(&ended);
        }
        self.found(ended);
        if let Some(mut postmortems) = self.postmortems.take() {
            // Said and handed to the reporters before they finish.
            let said = postmortems.take_said();
            let done = postmortems.finish();
            self.written(done, said);
        }
        let summaries = self.analyzer.tracker().summaries();
        // One reporter that cannot finish (its output's disk is full) does not keep the others
        // from saying what they have: its error comes after.
        let mut failed = None;
        while let Some(reporter) = self.reporters.pop() {
            let end = EndOfRun {
                tracker: self.analyzer.tracker(),
                processes: &summaries,
                findings: &self.findings,
                lost_events,
                events: self.events,
                nvml: self.nvml.last_seen(),
                closing: &closing,
                output_failed: failed.is_some(),
            };
            match reporter.finish(&end) {
                Ok(Some(delivered)) => closing.push(delivered),
                Ok(None) => {}
                Err(error) => failed = failed.or(Some(error)),
            }
        }
        match failed {
            Some(error) => Err(error).context("cannot write the output"),
            None => Ok(self.findings),
        }
    }
}
