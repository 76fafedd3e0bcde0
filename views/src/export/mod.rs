//! `gpuprof export`: views of a recorded event file for the tools people already read — folded
//! stacks and flame graphs (inferno) of live memory by Python stack, and a snapshot PyTorch's own
//! memory_viz opens — at the end of the recording, at a chosen time, or at an out-of-memory
//! failure; and the recording itself as jsonl (or jsonl as a recording).
//!
//! Every view streams the file: memory is what was live at the moment taken (and, for
//! memory_viz, at most `--max-entries` trace entries), however long the recording.

mod destination;
mod folded;
pub mod html;
mod memory_viz;
pub(crate) mod peak;
mod speedscope;
pub mod summary;

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use gpuprof_model::event::{Event, Layer, Op, CUDA_ERROR_OUT_OF_MEMORY};
use gpuprof_model::forward_stacks::ForwardStacks;
use gpuprof_model::{Analyzer, RuleConfig};

use crate::input;
use crate::output::{self, EndOfRun};

/// Output formats of `export`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExportFormat {
    /// Folded stacks (`frame;frame;frame bytes`), for any flame graph tool.
    Folded,
    /// A flame graph SVG of live bytes by stack.
    Flamegraph,
    /// A pickled snapshot for PyTorch's memory_viz (torch.cuda._memory_viz, pytorch.org/memory_viz).
    MemoryViz,
    /// Live bytes by stack for speedscope (speedscope.app), one profile per process.
    Speedscope,
    /// One self-contained HTML page: timelines per process and device, the stacks behind any
    /// instant, the findings (docs/views.md).
    Html,
    /// Every event as a line of the jsonl contract (docs/events.md).
    Jsonl,
    /// Every event into a compact recording (from jsonl, say).
    Recording,
}

impl ExportFormat {
    /// The name `-f` takes.
    pub fn name(self) -> &'static str {
        match self {
            ExportFormat::Folded => "folded",
            ExportFormat::Flamegraph => "flamegraph",
            ExportFormat::MemoryViz => "memory-viz",
            ExportFormat::Speedscope => "speedscope",
            ExportFormat::Html => "html",
            ExportFormat::Jsonl => "jsonl",
            ExportFormat::Recording => "recording",
        }
    }
}

/// Which memory a stack view counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StackLayer {
    /// Allocator blocks (tensors) where the process reported them, driver allocations otherwise.
    Auto,
    /// Driver allocations (segments, pinned memory, VMM).
    Driver,
    /// Allocator blocks (tensors).
    Allocator,
}

impl StackLayer {
    /// Whether the view counts this process's allocator blocks (tensors) rather than its driver
    /// allocations.
    pub(crate) fn counts_tensors(self, process: &gpuprof_model::track::ProcessMemory) -> bool {
        match self {
            StackLayer::Allocator => true,
            StackLayer::Driver => false,
            StackLayer::Auto => !process.allocator_totals().is_empty(),
        }
    }
}

/// Where in the recording the view is taken.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Moment {
    /// When the processes held the most memory together (the default).
    Peak,
    End,
    /// Seconds after the first event.
    At(f64),
    /// The n-th (1-based) out-of-memory failure.
    Oom(usize),
    /// Right after the n-th event (where a peak was found).
    AfterEvents(u64),
}

impl Moment {
    /// The moment `export`'s flags name (`--peak`, `--end`, `--at`, `--oom`), else the format's
    /// own default: the end for memory_viz (its trace leads up to it), the peak for the rest.
    pub fn chosen(format: ExportFormat, peak: bool, end: bool, at: Option<f64>, oom: Option<u64>) -> Moment {
        match (peak, end, at, oom) {
            (true, ..) => Moment::Peak,
            (_, true, ..) => Moment::End,
            (_, _, Some(secs), _) => Moment::At(secs),
            (_, _, None, Some(n)) => Moment::Oom(n as usize),
            _ if format == ExportFormat::MemoryViz => Moment::End,
            _ => Moment::Peak,
        }
    }
}

/// A moment made concrete: the peak found, and how titles and errors name it.
pub(crate) struct Resolved {
    pub moment: Moment,
    pub described: String,
}

/// Finds the peak when that is the moment (one pass over the file).
pub(crate) fn resolve(input: &Path, moment: Moment, layer: StackLayer) -> Result<Resolved> {
    if moment != Moment::Peak {
        return Ok(Resolved { moment, described: where_in(moment) });
    }
    let peak = peak::find(input, layer)?;
    Ok(Resolved {
        moment: Moment::AfterEvents(peak.events),
        described: format!("at the peak, {:.3} s in ({} live)", peak.secs, gpuprof_model::bytes::human(peak.bytes)),
    })
}

/// Which trace entries a memory_viz snapshot keeps.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TraceWindow {
    /// Seconds after the first event: entries before are left out.
    pub from: Option<f64>,
    /// Seconds after the first event: entries after are left out.
    pub to: Option<f64>,
    /// The most recent entries kept (PyTorch's `max_entries`).
    pub max_entries: usize,
}

pub struct ExportRequest<'a> {
    pub input: &'a Path,
    pub format: ExportFormat,
    pub output: Option<PathBuf>,
    pub pid: Option<u32>,
    pub moment: Moment,
    pub layer: StackLayer,
    pub window: TraceWindow,
    /// Recordings: zstd.
    pub compress: bool,
}

/// Returns gpuprof's exit code.
pub fn run(request: &ExportRequest<'_>) -> Result<u8> {
    let output = destination::resolve(request.input, request.format, request.output.as_deref(), request.moment)?;
    let request = ExportRequest { output: output.clone(), ..*request };
    let code = write(&request)?;
    if let Some(file) = output.filter(|f| f.is_file()) {
        destination::say_written(&file, request.format);
    }
    Ok(code)
}

fn write(request: &ExportRequest<'_>) -> Result<u8> {
    match request.format {
        ExportFormat::Jsonl => convert(request, output::Format::Jsonl),
        ExportFormat::Recording => convert(request, output::Format::Recording),
        ExportFormat::Folded | ExportFormat::Flamegraph | ExportFormat::Speedscope => stack_view(request),
        ExportFormat::MemoryViz => memory_viz::export(request),
        ExportFormat::Html => html::export(request),
    }
}

fn convert(request: &ExportRequest<'_>, format: output::Format) -> Result<u8> {
    let format = output::Format::resolve(Some(format), request.output.as_deref())?;
    let mut sink = output::sink(format, output::open_writer(request.output.as_deref())?, request.compress, false)?;
    let mut file = gpuprof_recording::EventFile::open(request.input)?;
    // A shim's own file has no forward lines yet: converted, it has.
    let mut forward_stacks = ForwardStacks::default();
    while let Some(mut event) = file.next_event()? {
        forward_stacks.follow(&mut event);
        sink.event(&event).context("cannot write the export")?;
    }
    input::say_how_it_ended(request.input, file.ending());
    let lost = match file.ending() {
        Some(gpuprof_recording::Ending::Closed { lost, .. }) => lost,
        _ => 0,
    };
    sink.finish(&EndOfRun {
        tracker: &gpuprof_model::Tracker::new(),
        processes: &[],
        findings: &[],
        lost_events: lost,
        events: 0,
        nvml: &std::collections::BTreeMap::new(),
        closing: &[],
    })
    .context("cannot write the export")?;
    Ok(0)
}

fn stack_view(request: &ExportRequest<'_>) -> Result<u8> {
    let resolved = resolve(request.input, request.moment, request.layer)?;
    let analyzer = replay_to(request.input, resolved.moment, |_| ())?;
    let at_end = request.moment == Moment::End;
    let stacks = folded::stacks(analyzer.tracker(), request.layer, at_end);
    // Said before any file is made: an empty view is a wrong moment, not a result.
    if stacks.is_empty() {
        bail!(
            "no live GPU memory {} in {}: every block was freed by then; leave the moment out for the peak, or pick one with --at SECS or --oom N",
            resolved.described,
            request.input.display()
        );
    }
    let mut writer = output::open_writer(request.output.as_deref())?;
    let title = format!("gpuprof: live GPU memory by Python stack, {}", resolved.described);
    match request.format {
        ExportFormat::Flamegraph => folded::flamegraph(&folded::lines(&stacks), title, &mut writer)?,
        ExportFormat::Speedscope => speedscope::write(&stacks, &title, &mut writer)?,
        _ => {
            for line in folded::lines(&stacks) {
                writeln!(writer, "{line}")?;
            }
        }
    }
    writer.flush().context("cannot write the export")?;
    Ok(0)
}

/// The rules' tracker at the moment, the file streamed up to it; `each` sees every event
/// replayed (after the tracker took it in).
pub(crate) fn replay_to(input: &Path, moment: Moment, mut each: impl FnMut(&Event)) -> Result<Analyzer> {
    let mut analyzer = Analyzer::new(RuleConfig::default());
    // A shim's own file has no forward lines yet.
    let mut forward_stacks = ForwardStacks::default();
    let mut cut = Cut::new(moment);
    let mut reached = false;
    let mut file = gpuprof_recording::EventFile::open(input)?;
    while let Some(mut event) = file.next_event()? {
        cut.last_ts = event.ts;
        if cut.before(&event) {
            reached = true;
            break;
        }
        forward_stacks.follow(&mut event);
        analyzer.observe(&mut event);
        each(&event);
        if cut.after(&event) {
            reached = true;
            break;
        }
    }
    if !reached {
        input::say_how_it_ended(input, file.ending());
    }
    match moment {
        Moment::Oom(n) if !reached => bail!("{} has fewer than {n} out-of-memory failures", input.display()),
        Moment::At(secs) if !reached => {
            let span = cut.span_secs();
            bail!("--at {secs} is past the end of {}: its events span {span:.3} s; give at most that, or leave --at out for the end", input.display())
        }
        _ => {}
    }
    Ok(analyzer)
}

/// Where a moment cuts the stream.
struct Cut {
    moment: Moment,
    first_ts: Option<u64>,
    /// The newest event read so far.
    last_ts: u64,
    ooms: usize,
    events: u64,
}

impl Cut {
    fn new(moment: Moment) -> Self {
        Cut { moment, first_ts: None, last_ts: 0, ooms: 0, events: 0 }
    }

    /// Seconds from the first event to the newest read.
    fn span_secs(&self) -> f64 {
        self.first_ts.map_or(0.0, |first| self.last_ts.saturating_sub(first) as f64 / 1e9)
    }

    /// True when `event` already lies past the moment (it is not replayed).
    fn before(&mut self, event: &Event) -> bool {
        let first = *self.first_ts.get_or_insert(event.ts);
        match self.moment {
            Moment::At(secs) => event.ts > first.saturating_add((secs * 1e9) as u64),
            _ => false,
        }
    }

    /// True when the moment is `event` itself (the n-th out-of-memory failure, the n-th event).
    fn after(&mut self, event: &Event) -> bool {
        self.events += 1;
        if let Moment::AfterEvents(n) = self.moment {
            return self.events == n;
        }
        let Moment::Oom(n) = self.moment else { return false };
        if event.layer == Layer::Driver && event.op == Op::Alloc && event.result == CUDA_ERROR_OUT_OF_MEMORY {
            self.ooms += 1;
        }
        self.ooms == n.max(1)
    }
}

fn where_in(moment: Moment) -> String {
    match moment {
        Moment::End => "at the end".to_string(),
        Moment::Peak => "at the peak".to_string(),
        Moment::AfterEvents(n) => format!("after event {n}"),
        Moment::At(secs) => format!("{secs} s in"),
        Moment::Oom(n) => format!("at out-of-memory failure {n}"),
    }
}
