//! What an export is asked for: the format, the moment in the recording, the memory a stack view
//! counts, the trace entries a memory_viz snapshot keeps. Each view reads its request from here.

use std::path::{Path, PathBuf};

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
