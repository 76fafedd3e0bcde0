//! Post-mortems written on a thread of their own, so the capture never waits on a disk or on the
//! seconds an HTML report of a raised process's window can take. A job carries what the capture
//! thread took at the finding (the windows' chunks and what the processes held before them);
//! here they become one recording — what each process held at the window's first instant, then
//! the window's events, every process's merged in time order — its HTML report, and the report
//! gzipped for the collector. Files are written under a `.partial` name and renamed whole.

use std::collections::{HashMap, HashSet};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver, Sender, TryRecvError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use gpuprof_model::event::{Event, Layer, Source};
use gpuprof_model::report::PostmortemReport;
use gpuprof_model::{FindingKind, Tracker};
use gpuprof_recording::{Reader, Writer};

use super::detail::{self, ProcessDetail, Raise};
use super::directory::{self, Policy, PARTIAL_SUFFIX};
use super::holdings::{Held, Holdings};
use super::RenderReport;

/// One process's share of a post-mortem.
pub(crate) struct Part {
    pub pid: u32,
    /// What it held before its first chunk kept (its prologue there).
    pub start: Holdings,
    /// Its chunks, oldest first: whole recordings.
    pub chunks: Vec<Arc<[u8]>>,
    pub rank: Option<u32>,
    pub allocator_settings: Option<Arc<str>>,
    pub source: Source,
    /// The newest event a memory cap dropped from its window (0: none), and the first it kept.
    pub shed_until: u64,
    pub first_kept: Option<u64>,
}

/// A post-mortem to write.
pub(crate) struct Job {
    pub finding_id: String,
    pub kind: FindingKind,
    pub pid: u32,
    pub comm: String,
    pub node: String,
    pub recording: PathBuf,
    pub report: PathBuf,
    /// The window (ns): the recording opens at `start`.
    pub start: u64,
    pub end: u64,
    pub window_ns: u64,
    /// The finding's process first.
    pub parts: Vec<Part>,
    pub raises: Vec<Raise>,
}

/// What became of a job or a sweep.
#[derive(Debug)]
pub(crate) enum Done {
    Written(PostmortemReport),
    /// `path`: the file it could not write.
    Failed {
        finding_id: String,
        pid: u32,
        kind: FindingKind,
        path: PathBuf,
        error: String,
    },
    Swept {
        removed: u64,
        error: Option<String>,
    },
}

enum Work {
    Write(Box<Job>),
    Sweep,
}

/// The writing thread and the two queues to and from it.
pub(crate) struct WriterThread {
    work: Option<Sender<Work>>,
    done: Receiver<Done>,
    handle: Option<JoinHandle<()>>,
    /// Jobs handed over and not yet done.
    pending: usize,
}

impl WriterThread {
    pub(crate) fn start(dir: PathBuf, policy: Policy, render: RenderReport) -> io::Result<WriterThread> {
        let (work, jobs) = mpsc::channel();
        let (done_in, done) = mpsc::channel();
        let handle = std::thread::Builder::new()
            .name("gpuprof-postmortem".into())
            .spawn(move || serve(&dir, policy, render, &jobs, &done_in))?;
        Ok(WriterThread { work: Some(work), done, handle: Some(handle), pending: 0 })
    }

    pub(crate) fn pending(&self) -> usize {
        self.pending
    }

    pub(crate) fn write(&mut self, job: Job) {
        if self.work.as_ref().is_some_and(|work| work.send(Work::Write(Box::new(job))).is_ok()) {
            self.pending += 1;
        }
    }

    pub(crate) fn sweep(&self) {
        if let Some(work) = &self.work {
            let _ = work.send(Work::Sweep);
        }
    }

    /// What was done since the last call.
    pub(crate) fn take_done(&mut self) -> Vec<Done> {
        let mut done = Vec::new();
        loop {
            match self.done.try_recv() {
                Ok(item) => {
                    if !matches!(item, Done::Swept { .. }) {
                        self.pending = self.pending.saturating_sub(1);
                    }
                    done.push(item);
                }
                Err(TryRecvError::Empty | TryRecvError::Disconnected) => return done,
            }
        }
    }

    /// Lets the thread finish what it was given, waiting at most `limit`; returns what it did.
    pub(crate) fn finish(mut self, limit: Duration) -> Vec<Done> {
        drop(self.work.take());
        let deadline = Instant::now() + limit;
        let mut done = Vec::new();
        while self.pending > 0 {
            match self.done.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(item) => {
                    if !matches!(item, Done::Swept { .. }) {
                        self.pending -= 1;
                    }
                    done.push(item);
                }
                Err(_) => break,
            }
        }
        if self.pending == 0 {
            if let Some(handle) = self.handle.take() {
                let _ = handle.join();
            }
        }
        done.extend(self.take_done());
        done
    }
}

fn serve(dir: &Path, policy: Policy, render: RenderReport, jobs: &Receiver<Work>, done: &Sender<Done>) {
    for work in jobs {
        let outcome = match work {
            Work::Write(job) => {
                let written = write(&job, render).map_err(|(path, error)| Done::Failed {
                    finding_id: job.finding_id.clone(),
                    pid: job.pid,
                    kind: job.kind,
                    path,
                    error,
                });
                let _ = done.send(written.map_or_else(|failed| failed, Done::Written));
                release_freed_memory();
                sweep(dir, policy)
            }
            Work::Sweep => sweep(dir, policy),
        };
        if !matches!(outcome, Done::Swept { removed: 0, error: None }) {
            let _ = done.send(outcome);
        }
    }
}

/// Hands the memory a post-mortem freed back to the system: its report's buffers are freed, but
/// glibc keeps them in this thread's arena, and a daemon that writes one now and then would stay
/// near its largest.
fn release_freed_memory() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim has no preconditions; it only returns free memory to the system.
    unsafe {
        libc::malloc_trim(0);
    }
}

fn sweep(dir: &Path, policy: Policy) -> Done {
    match directory::sweep(dir, policy, SystemTime::now()) {
        Ok(swept) => Done::Swept { removed: swept.removed, error: None },
        Err(error) => Done::Swept { removed: 0, error: Some(format!("cannot sweep {}: {error}", dir.display())) },
    }
}

/// Writes the recording, then its report; an error names the file it could not write.
fn write(job: &Job, render: RenderReport) -> Result<PostmortemReport, (PathBuf, String)> {
    let partial = |path: &Path| {
        let mut name = path.as_os_str().to_owned();
        name.push(PARTIAL_SUFFIX);
        PathBuf::from(name)
    };
    let failed = |path: &Path, error: String| {
        let _ = std::fs::remove_file(partial(path));
        (path.to_path_buf(), error)
    };
    let recording_partial = partial(&job.recording);
    let (events, details) =
        write_recording(job, &recording_partial).map_err(|e| failed(&job.recording, e.to_string()))?;
    std::fs::rename(&recording_partial, &job.recording).map_err(|e| failed(&job.recording, e.to_string()))?;
    let about = detail::About { kind: job.kind.as_str(), pid: job.pid, comm: &job.comm, node: &job.node };
    let notes = detail::notes(&about, job.start, job.end, job.window_ns, &details, &job.raises);
    let report_partial = partial(&job.report);
    render(&job.recording, &report_partial, &notes).map_err(|e| failed(&job.report, format!("{e:#}")))?;
    std::fs::rename(&report_partial, &job.report).map_err(|e| failed(&job.report, e.to_string()))?;
    let html = std::fs::read(&job.report).map_err(|e| (job.report.clone(), e.to_string()))?;
    let mut gzip = flate2::write::GzEncoder::new(Vec::with_capacity(html.len() / 4), flate2::Compression::default());
    gzip.write_all(&html).map_err(|e| (job.report.clone(), e.to_string()))?;
    Ok(PostmortemReport {
        finding_id: job.finding_id.clone(),
        kind: job.kind,
        pid: job.pid,
        recording: job.recording.clone(),
        report: job.report.clone(),
        events,
        processes: details.len(),
        span_ns: job.end.saturating_sub(job.start),
        html_bytes: html.len() as u64,
        gzip: gzip.finish().map_err(|e| (job.report.clone(), e.to_string()))?,
    })
}

/// One process's kept events, chunk after chunk.
struct Stream {
    chunks: std::collections::VecDeque<Arc<[u8]>>,
    reader: Option<Reader>,
}

impl Stream {
    fn new(chunks: &[Arc<[u8]>]) -> Stream {
        Stream { chunks: chunks.iter().cloned().collect(), reader: None }
    }

    fn next_event(&mut self) -> io::Result<Option<Event>> {
        loop {
            if let Some(reader) = &mut self.reader {
                if let Some(event) = reader.next_event().map_err(io::Error::other)? {
                    return Ok(Some(event));
                }
            }
            let Some(chunk) = self.chunks.pop_front() else { return Ok(None) };
            self.reader = Some(Reader::new(io::Cursor::new(chunk)).map_err(io::Error::other)?);
        }
    }
}

/// Every process's kept events in time order (a process's own stay in capture order).
struct Merged {
    streams: Vec<Stream>,
    heads: Vec<Option<Event>>,
}

impl Merged {
    fn new(parts: &[Part]) -> io::Result<Merged> {
        let mut streams: Vec<Stream> = parts.iter().map(|p| Stream::new(&p.chunks)).collect();
        let heads = streams.iter_mut().map(Stream::next_event).collect::<io::Result<_>>()?;
        Ok(Merged { streams, heads })
    }

    fn peek(&self) -> Option<&Event> {
        self.heads.iter().flatten().min_by_key(|e| e.ts)
    }

    fn next_event(&mut self) -> io::Result<Option<Event>> {
        let Some((n, _)) =
            self.heads.iter().enumerate().filter_map(|(n, e)| e.as_ref().map(|e| (n, e.ts))).min_by_key(|(_, ts)| *ts)
        else {
            return Ok(None);
        };
        let next = self.streams[n].next_event()?;
        Ok(std::mem::replace(&mut self.heads[n], next))
    }
}

/// The recording: the processes' holdings at the window's start, then its events. Returns the
/// events written and what each process shows.
fn write_recording(job: &Job, path: &Path) -> io::Result<(u64, Vec<ProcessDetail>)> {
    // What the processes held before their kept chunks, then the kept events before the window
    // (a chunk may begin before it): a tracker of them holds what they held at its start.
    let mut tracker = Tracker::new();
    let starts: Vec<_> = job.parts.iter().map(|part| part.start.events(job.start, part.source, true)).collect();
    for event in starts.iter().flat_map(|p| &p.own).chain(starts.iter().flat_map(|p| &p.imports)) {
        tracker.apply(event);
    }
    let mut merged = Merged::new(&job.parts)?;
    while merged.peek().is_some_and(|e| e.ts < job.start) {
        if let Some(event) = merged.next_event()? {
            tracker.apply(&event);
        }
    }

    let file = std::fs::File::create(path)?;
    let mut out = Recorder::new(Writer::new(BufWriter::with_capacity(1 << 16, file), true)?, &job.parts);
    let mut details: Vec<ProcessDetail> = job
        .parts
        .iter()
        .map(|p| ProcessDetail {
            pid: p.pid,
            comm: p.start.comm.to_string(),
            shed_until: p.shed_until,
            first_kept: p.first_kept,
            ..ProcessDetail::default()
        })
        .collect();
    let mut imports = Vec::new();
    for (part, detail) in job.parts.iter().zip(&mut details) {
        let Some(process) = tracker.process(part.pid) else { continue };
        let held = Holdings::of(process, &tracker, None);
        detail.comm = held.comm.to_string();
        for item in &held.held {
            match item {
                Held::Allocation(_) | Held::Mapping(_) => detail.prologue_allocations += 1,
                Held::Block(_) => detail.prologue_tensors += 1,
                Held::Import { .. } | Held::Export { .. } => {}
            }
        }
        let prologue = held.events(job.start, part.source, false);
        for event in prologue.own {
            out.write(event)?;
        }
        imports.extend(prologue.imports);
    }
    for event in imports {
        out.write(event)?;
    }
    let index: HashMap<u32, usize> = job.parts.iter().enumerate().map(|(n, p)| (p.pid, n)).collect();
    while let Some(event) = merged.next_event()? {
        // Tensor detail: blocks, not the allocator's out-of-memory report (recorded at every level).
        if event.layer == Layer::Allocator && event.succeeded() {
            if let Some(detail) = index.get(&event.pid).map(|&n| &mut details[n]) {
                detail.tensor_events += 1;
                detail.first_tensor.get_or_insert(event.ts);
                detail.last_tensor = Some(event.ts);
            }
        }
        out.write(event)?;
    }
    let events = out.events();
    let mut file = out.finish()?;
    file.flush()?;
    Ok((events, details))
}

/// The recording's writer, putting each process's rank and allocator settings on its first
/// event, as a live capture's recording has them.
struct Recorder<'a, W: Write> {
    writer: Writer<W>,
    parts: &'a [Part],
    named: HashSet<u32>,
}

impl<'a, W: Write> Recorder<'a, W> {
    fn new(writer: Writer<W>, parts: &'a [Part]) -> Self {
        Recorder { writer, parts, named: HashSet::new() }
    }

    fn write(&mut self, mut event: Event) -> io::Result<()> {
        if self.named.insert(event.pid) {
            if let Some(part) = self.parts.iter().find(|p| p.pid == event.pid) {
                event.rank = event.rank.or(part.rank);
                if event.allocator_settings.is_none() {
                    event.allocator_settings.clone_from(&part.allocator_settings);
                }
            }
        }
        self.writer.write(&event)
    }

    fn events(&self) -> u64 {
        self.writer.events()
    }

    fn finish(self) -> io::Result<W> {
        self.writer.finish(0)
    }
}
