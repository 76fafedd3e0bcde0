//! Post-mortems: a node's daemon (and a pod's sidecar) keeps, per followed process, the last
//! seconds of its events in bounded memory (`window`), and when a process runs out of memory or
//! a leak finding fires, writes that window — opened by what the processes held then
//! (`holdings`) — as a recording and its HTML report in a node directory (`writer`, on a thread
//! of its own; `directory`: names, size cap and retention), with notes on what the window shows
//! (`detail`). The finding names the files at once (`Finding::postmortem`); the report follows to
//! the collector through the flow's exporter.
//!
//! The flow hands every event here before and after the tracker takes it, and the findings
//! before the exporter sees them (`EventFlow::keep_postmortems`). The windows' memory is counted
//! against a per-process and a per-node cap; what a cap drops before its time is counted.

pub(crate) mod detail;
pub(crate) mod directory;
pub(crate) mod holdings;
mod window;
mod writer;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use gpuprof_model::event::{Event, Layer, Op};
use gpuprof_model::findings::Severity;
use gpuprof_model::postmortem::{report_url, Postmortem};
use gpuprof_model::rank::Ranks;
use gpuprof_model::track::ProcessMemory;
use gpuprof_model::{Finding, FindingKind, Tracker};

pub(crate) use detail::Raise;
pub(crate) use writer::Done;

use holdings::Holdings;
use window::{Limits, Window};
use writer::{Job, Part, WriterThread};

/// Post-mortems waiting to be written at most; beyond, a leak finding gets none (counted). An
/// out-of-memory failure may wait behind more: a burst of leaks does not take its place.
const MAX_PENDING: usize = 4;
const MAX_PENDING_OOM: usize = 16;
/// Chunks a window is cut into (more: finer expiry, each chunk its own tables of stacks).
const CHUNKS_PER_WINDOW: u64 = 12;
/// How often the directory is swept when nothing is written.
const SWEEP_INTERVAL: Duration = Duration::from_secs(60);
/// How long the end of a capture waits for post-mortems on their way: within a pod's grace
/// period (30 s by default) with the OTLP queue's drain after it.
const FINISH_LIMIT: Duration = Duration::from_secs(10);

/// Writes the HTML report of the recording at `recording` to `report`, with `notes` on it.
pub(crate) type RenderReport = fn(recording: &Path, report: &Path, notes: &[String]) -> anyhow::Result<()>;

/// What post-mortems keep and where they go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PostmortemConfig {
    /// Where they are written (made if missing).
    pub dir: PathBuf,
    /// The node's name, in file names and on findings.
    pub node: String,
    /// How far back a window reaches.
    pub window: Duration,
    /// Bytes one process's window holds at most.
    pub process_bytes: u64,
    /// Bytes all windows hold together at most.
    pub node_bytes: u64,
    /// Bytes of post-mortems the directory keeps at most (the oldest go first).
    pub max_bytes: u64,
    /// How long the directory keeps a post-mortem.
    pub retention: Duration,
}

/// What post-mortems have kept, dropped and written so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PostmortemStats {
    /// Bytes and events the windows hold now.
    pub window_bytes: u64,
    pub window_events: u64,
    /// Events a memory cap dropped from a window before they were a window old.
    pub window_events_shed: u64,
    pub written: u64,
    /// Post-mortems that could not be written (the disk, permissions).
    pub failed: u64,
    /// Findings that got none: too many were being written.
    pub skipped: u64,
    /// Post-mortems the directory's cap and retention deleted.
    pub deleted: u64,
}

/// The window keeper and post-mortem writer of a flow.
pub struct Postmortems {
    config: PostmortemConfig,
    limits: Limits,
    /// By pid, looked up twice an event.
    windows: HashMap<u32, Window, gpuprof_model::hashing::Spread>,
    /// One post-mortem per process instance (pid, since) and finding kind.
    taken: HashSet<(u32, u64, FindingKind)>,
    /// Files of post-mortems on their way, by finding id.
    in_flight: HashMap<String, [PathBuf; 2]>,
    raises: Vec<Raise>,
    writer: WriterThread,
    /// One zstd context for every chunk that closes.
    compressor: gpuprof_recording::Compressor,
    last_sweep: Instant,
    stats: PostmortemStats,
    /// Windows whose last write failed, said once each.
    failing: HashSet<u32>,
    /// Findings that got no post-mortem since the last tick (said then, in one line).
    skipped_unsaid: u64,
    said: Vec<String>,
}

impl Postmortems {
    /// Makes the directory if missing and starts the writing thread; an error names the
    /// directory and what to do.
    /// `render` writes a recording's HTML report (the views' report, which stands apart from
    /// the capture).
    pub fn start(config: PostmortemConfig, render: RenderReport) -> anyhow::Result<Postmortems> {
        use anyhow::Context;
        std::fs::create_dir_all(&config.dir).with_context(|| {
            format!(
                "cannot make the post-mortem directory {}: give --postmortem-dir a directory this user may write, or --no-postmortems",
                config.dir.display()
            )
        })?;
        let probe = config.dir.join(format!(".gpuprof-probe-{}", std::process::id()));
        std::fs::write(&probe, b"").and_then(|_| std::fs::remove_file(&probe)).with_context(|| {
            format!(
                "cannot write in the post-mortem directory {}: give --postmortem-dir a directory this user may write, or --no-postmortems",
                config.dir.display()
            )
        })?;
        let policy = directory::Policy { max_bytes: config.max_bytes, retention: config.retention };
        let writer =
            WriterThread::start(config.dir.clone(), policy, render).context("cannot start the post-mortem writer")?;
        writer.sweep();
        let window_ns = config.window.as_nanos() as u64;
        let limits = Limits {
            window_ns,
            chunk_ns: (window_ns / CHUNKS_PER_WINDOW).max(1),
            // A closed chunk compresses to several times less, so many fit the cap; each chunk
            // writes its stacks' frames again, so fewer, larger ones cost less per event (1 MiB
            // at the default cap: 1.5x the flow's tracker and rules against 1.6-1.8x at 256 KiB,
            // docs/benchmarks.md).
            chunk_bytes: (config.process_bytes / 16).clamp(64 << 10, 2 << 20) as usize,
        };
        Ok(Postmortems {
            config,
            limits,
            windows: HashMap::default(),
            taken: HashSet::new(),
            in_flight: HashMap::new(),
            raises: Vec::new(),
            writer,
            compressor: gpuprof_recording::Compressor::new().context("cannot start the post-mortems' compressor")?,
            last_sweep: Instant::now(),
            stats: PostmortemStats::default(),
            failing: HashSet::new(),
            skipped_unsaid: 0,
            said: Vec::new(),
        })
    }

    /// An event, before the tracker takes it: what it releases from before its chunk is kept.
    pub(crate) fn before(&mut self, event: &Event, tracker: &Tracker) {
        if event.layer == Layer::Process && matches!(event.op, Op::Fork | Op::Exec) {
            // It begins another instance: its window opens after the findings of the last one.
            return;
        }
        let window = self.windows.entry(event.pid).or_insert_with(|| {
            let since = tracker.process(event.pid).map_or(event.ts, |p| p.first_ts);
            Window::new(since, event.source)
        });
        match window.prepare(event, tracker, &self.limits, &mut self.compressor) {
            Ok(true) => {
                self.process_cap(event.pid);
                self.node_cap();
            }
            Ok(false) => {}
            Err(error) => self.write_failed(event.pid, &error),
        }
    }

    /// The same event, tracked, with the findings it fired: the event is kept, and each
    /// finding that calls for a post-mortem gets one (named on it now, written meanwhile).
    pub(crate) fn after(&mut self, event: &Event, fired: &mut [Finding], tracker: &Tracker, ranks: &Ranks) {
        let begins = event.layer == Layer::Process && matches!(event.op, Op::Fork | Op::Exec);
        if begins {
            self.found(fired, tracker, ranks);
            self.windows.insert(event.pid, Window::new(event.ts, event.source));
        }
        if let Some(window) = self.windows.get_mut(&event.pid) {
            let mut kept = window.write(event, tracker);
            if event.layer == Layer::Process && event.op == Op::Exit {
                // Nothing follows an exit: its writer goes now, not when its time is up.
                kept = kept.and_then(|_| window.close(&mut self.compressor));
            }
            if let Err(error) = kept {
                self.write_failed(event.pid, &error);
            }
        }
        if !begins {
            self.found(fired, tracker, ranks);
        }
    }

    /// A process raised to tensor events at `ts`, and why: the report says which part of a
    /// window has tensor detail, and why.
    pub(crate) fn raised(&mut self, pid: u32, ts: u64, why: String) {
        self.raises.push(Raise { pid, ts, why });
    }

    /// Findings that fired (with or without an event): post-mortems for an out-of-memory
    /// failure and for leaks, one per process instance and kind.
    pub(crate) fn found(&mut self, fired: &mut [Finding], tracker: &Tracker, ranks: &Ranks) {
        for finding in fired {
            if finding.severity != Severity::Leak && finding.kind != FindingKind::Oom {
                continue;
            }
            let since = tracker.instance_since(finding.pid, finding.first_ts);
            if !self.windows.contains_key(&finding.pid) || self.taken.contains(&(finding.pid, since, finding.kind)) {
                continue;
            }
            let limit = if finding.kind == FindingKind::Oom { MAX_PENDING_OOM } else { MAX_PENDING };
            if self.writer.pending() >= limit {
                self.stats.skipped += 1;
                self.skipped_unsaid += 1;
                continue;
            }
            self.taken.insert((finding.pid, since, finding.kind));
            match self.job(finding, since, tracker, ranks) {
                // The tracker no longer knows the process: there is nothing to show.
                Ok(job) if job.parts.is_empty() => {}
                Ok(job) => {
                    finding.postmortem = Some(Postmortem {
                        node: self.config.node.clone(),
                        recording: job.recording.display().to_string(),
                        report: job.report.display().to_string(),
                        window_start: job.start,
                        window_end: job.end,
                        url: report_url(&finding.finding_id),
                        pids: job.parts.iter().map(|p| p.pid).collect(),
                    });
                    self.in_flight.insert(job.finding_id.clone(), [job.recording.clone(), job.report.clone()]);
                    self.writer.write(job);
                }
                Err(error) => self.write_failed(finding.pid, &error),
            }
        }
    }

    /// What the capture thread takes for one post-mortem: the windows of the finding's process
    /// (and, for an out-of-memory failure, of every process that held memory then) and what
    /// each held before them.
    fn job(&mut self, finding: &Finding, since: u64, tracker: &Tracker, ranks: &Ranks) -> std::io::Result<Job> {
        let end = finding.last_ts.max(finding.first_ts);
        let window_ns = self.limits.window_ns;
        let mut pids = vec![finding.pid];
        if finding.kind == FindingKind::Oom {
            pids.extend(finding.processes.iter().map(|p| p.pid).filter(|&pid| pid != finding.pid));
        }
        let mut parts = Vec::new();
        // Where the finding's own window can begin: the recording opens no earlier.
        let mut own_first = None;
        for pid in pids {
            let process = if pid == finding.pid { instance(tracker, pid, since) } else { tracker.process(pid) };
            let Some(process) = process else { continue };
            let Some(window) = self.windows.get_mut(&pid).filter(|w| w.since == process.first_ts) else {
                // A process whose window was not kept: what it holds is its part.
                parts.push(Part {
                    pid,
                    start: Holdings::of(process, tracker, None),
                    chunks: Vec::new(),
                    rank: ranks.of(pid),
                    allocator_settings: None,
                    source: gpuprof_model::Source::Ebpf,
                    shed_until: 0,
                    first_kept: None,
                });
                continue;
            };
            let kept = window.kept(&mut self.compressor)?;
            if pid == finding.pid {
                // Nothing of the process before it began, or before what a cap dropped; a quiet
                // stretch (a warm training loop makes no driver call) is part of the window.
                own_first = if kept.shed_until > 0 { kept.first_ts } else { Some(window.since) };
            }
            let mut start = Holdings::of(process, tracker, Some(kept.before));
            start.held.extend(kept.freed);
            if let Some(opening) = kept.opening {
                (start.comm, start.ppid, start.contexts, start.totals) =
                    (opening.comm, opening.ppid, opening.contexts, opening.totals);
            }
            parts.push(Part {
                pid,
                start,
                chunks: kept.chunks,
                rank: ranks.of(pid),
                allocator_settings: window.allocator_settings.clone(),
                source: window.source,
                shed_until: kept.shed_until,
                first_kept: kept.first_ts,
            });
        }
        let start = end.saturating_sub(window_ns).max(own_first.unwrap_or(0)).min(end);
        let names = directory::names(
            &self.config.dir,
            &self.config.node,
            finding.pid,
            &finding.comm,
            finding.kind.as_str(),
            end,
            |path| self.in_flight.values().flatten().any(|p| p == path) || path.exists(),
        );
        let raises = self.raises.iter().filter(|r| parts.iter().any(|p| p.pid == r.pid)).cloned().collect();
        Ok(Job {
            finding_id: finding.finding_id.clone(),
            kind: finding.kind,
            pid: finding.pid,
            comm: finding.comm.clone(),
            node: self.config.node.clone(),
            recording: names.recording,
            report: names.report,
            start,
            end,
            window_ns,
            parts,
            raises,
        })
    }

    /// Drops the oldest chunks of `pid`'s window past the per-process cap.
    fn process_cap(&mut self, pid: u32) {
        let Some(window) = self.windows.get_mut(&pid) else { return };
        while window.bytes() > self.config.process_bytes {
            match window.shed_oldest() {
                Some(events) => self.stats.window_events_shed += events,
                None => break,
            }
        }
    }

    /// Drops the oldest chunks of any window (the oldest first) past the node's cap.
    fn node_cap(&mut self) {
        let mut total: u64 = self.windows.values().map(Window::bytes).sum();
        while total > self.config.node_bytes {
            let oldest = self.windows.iter().filter_map(|(pid, w)| Some((w.oldest_closed()?, *pid))).min();
            let Some((_, pid)) = oldest else { break };
            let Some(window) = self.windows.get_mut(&pid) else { break };
            let before = window.bytes();
            if let Some(events) = window.shed_oldest() {
                self.stats.window_events_shed += events;
            }
            total -= before - window.bytes();
        }
    }

    /// Time passes (`now`: wall-clock ns): idle windows close their chunks, old chunks go, the
    /// caps hold; the directory is swept now and then. Returns what the writer did meanwhile.
    pub(crate) fn tick(&mut self, now: u64) -> Vec<Done> {
        let pids: Vec<u32> = self.windows.keys().copied().collect();
        for pid in pids {
            let ticked = self.windows.get_mut(&pid).map(|w| w.tick(now, &self.limits, &mut self.compressor));
            if let Some(Err(error)) = ticked {
                self.write_failed(pid, &error);
            }
        }
        self.node_cap();
        self.raises.retain(|r| r.ts.saturating_add(self.limits.window_ns * 4) >= now);
        if self.skipped_unsaid > 0 {
            self.said.push(format!(
                "warning: no post-mortem for {}: {MAX_PENDING} were being written already (gpuprof_daemon_postmortems_skipped_total counts them)",
                gpuprof_model::findings::wording::count(std::mem::take(&mut self.skipped_unsaid), "finding", "findings")
            ));
        }
        if self.last_sweep.elapsed() >= SWEEP_INTERVAL {
            self.last_sweep = Instant::now();
            self.writer.sweep();
        }
        let done = self.writer.take_done();
        account(&mut self.stats, &mut self.in_flight, &done);
        done
    }

    /// Windows of process instances the tracker no longer knows go (a daemon's processes come
    /// and go for months), and so does what was kept about them.
    pub(crate) fn forget(&mut self, tracker: &Tracker) {
        let known: HashSet<(u32, u64)> = tracker.processes().iter().map(|p| (p.pid, p.first_ts)).collect();
        self.windows.retain(|pid, w| known.contains(&(*pid, w.since)));
        self.taken.retain(|(pid, since, _)| known.contains(&(*pid, *since)));
        self.failing.retain(|pid| self.windows.contains_key(pid));
    }

    /// What the windows hold and what was written, dropped and deleted so far.
    pub(crate) fn stats(&self) -> PostmortemStats {
        PostmortemStats {
            window_bytes: self.windows.values().map(Window::bytes).sum(),
            window_events: self.windows.values().map(Window::events).sum(),
            ..self.stats
        }
    }

    /// Lines to say (warnings), since the last call.
    pub(crate) fn take_said(&mut self) -> Vec<String> {
        std::mem::take(&mut self.said)
    }

    /// The end of the capture: waits for the post-mortems on their way (at most
    /// `FINISH_LIMIT`); returns what was done meanwhile.
    pub(crate) fn finish(mut self) -> Vec<Done> {
        let done = self.writer.finish(FINISH_LIMIT);
        account(&mut self.stats, &mut self.in_flight, &done);
        done
    }

    fn write_failed(&mut self, pid: u32, error: &std::io::Error) {
        self.stats.failed += 1;
        if self.failing.insert(pid) {
            self.said.push(format!(
                "warning: cannot keep the events of pid {pid} for its post-mortem: {error} (its window starts afresh)"
            ));
        }
        if let Some(window) = self.windows.get_mut(&pid) {
            *window = Window::new(window.since, window.source);
        }
    }
}

/// The instance of `pid` first seen at `since`, live or ended.
fn instance(tracker: &Tracker, pid: u32, since: u64) -> Option<&ProcessMemory> {
    tracker
        .process(pid)
        .filter(|p| p.first_ts == since)
        .or_else(|| tracker.processes().into_iter().rev().find(|p| p.pid == pid && p.first_ts == since))
}

/// What the writer did, counted.
fn account(stats: &mut PostmortemStats, in_flight: &mut HashMap<String, [PathBuf; 2]>, done: &[Done]) {
    for item in done {
        match item {
            Done::Written(report) => {
                stats.written += 1;
                in_flight.remove(&report.finding_id);
            }
            Done::Failed { finding_id, .. } => {
                stats.failed += 1;
                in_flight.remove(finding_id);
            }
            Done::Swept { removed, .. } => stats.deleted += removed,
        }
    }
}

#[cfg(test)]
mod tests;
