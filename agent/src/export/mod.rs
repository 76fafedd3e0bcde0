//! `gpuprof export`: views of a recorded event file for the tools people already read — folded
//! stacks and flame graphs (inferno) of live memory by Python stack, and a snapshot PyTorch's own
//! memory_viz opens — at the end of the recording, at a chosen time, or at an out-of-memory failure.

mod folded;
mod memory_viz;

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use gpuprof_model::event::{Event, Layer, Op, CUDA_ERROR_OUT_OF_MEMORY};
use gpuprof_model::{Analyzer, RuleConfig};

use crate::{input, output};

/// Output formats of `export`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ExportFormat {
    /// Folded stacks (`frame;frame;frame bytes`), for any flame graph tool.
    Folded,
    /// A flame graph SVG of live bytes by stack.
    Flamegraph,
    /// A pickled snapshot for PyTorch's memory_viz (torch.cuda._memory_viz, pytorch.org/memory_viz).
    MemoryViz,
}

/// Which memory a stack view counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum StackLayer {
    /// Allocator blocks (tensors) where the process reported them, driver allocations otherwise.
    Auto,
    /// Driver allocations (segments, pinned memory, VMM).
    Driver,
    /// Allocator blocks (tensors).
    Allocator,
}

/// Where in the recording the view is taken.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Moment {
    End,
    /// Seconds after the first event.
    At(f64),
    /// The n-th (1-based) out-of-memory failure.
    Oom(usize),
}

pub struct ExportRequest<'a> {
    pub input: &'a Path,
    pub format: ExportFormat,
    pub output: Option<PathBuf>,
    pub pid: Option<u32>,
    pub moment: Moment,
    pub layer: StackLayer,
}

/// Returns gpuprof's exit code.
pub fn run(request: &ExportRequest<'_>) -> Result<u8> {
    let mut events = Vec::new();
    input::for_each_event(request.input, |event| {
        events.push(event);
        Ok(())
    })?;
    let cut = cut_point(&events, request.moment, request.input)?;
    let mut analyzer = Analyzer::new(RuleConfig::default());
    let mut replayed = Vec::with_capacity(cut);
    for mut event in events.into_iter().take(cut) {
        analyzer.observe(&mut event);
        replayed.push(event);
    }
    let at_end = request.moment == Moment::End;
    let mut writer = output::open_writer(request.output.as_deref())?;
    match request.format {
        ExportFormat::Folded => {
            let lines = folded::lines(analyzer.tracker(), request.layer, at_end);
            for line in &lines {
                writeln!(writer, "{line}")?;
            }
        }
        ExportFormat::Flamegraph => {
            let lines = folded::lines(analyzer.tracker(), request.layer, at_end);
            if lines.is_empty() {
                bail!("no live memory with a stack at that moment in {}: nothing to draw", request.input.display());
            }
            folded::flamegraph(&lines, title(request.moment), &mut writer)?;
        }
        ExportFormat::MemoryViz => {
            let snapshot = memory_viz::snapshot(&replayed, analyzer.tracker(), request.pid, at_end)?;
            serde_pickle::to_writer(&mut writer, &snapshot, serde_pickle::SerOptions::new())
                .context("cannot write the memory_viz snapshot")?;
        }
    }
    writer.flush().context("cannot write the export")?;
    Ok(0)
}

fn title(moment: Moment) -> String {
    match moment {
        Moment::End => "gpuprof: live GPU memory by Python stack, at the end".to_string(),
        Moment::At(secs) => format!("gpuprof: live GPU memory by Python stack, {secs} s in"),
        Moment::Oom(n) => format!("gpuprof: live GPU memory by Python stack, at out-of-memory failure {n}"),
    }
}

/// How many events (from the start) make up the moment.
fn cut_point(events: &[Event], moment: Moment, input: &Path) -> Result<usize> {
    match moment {
        Moment::End => Ok(events.len()),
        Moment::At(secs) => {
            let Some(first) = events.first() else { return Ok(0) };
            let limit = first.ts.saturating_add((secs * 1e9) as u64);
            Ok(events.iter().position(|e| e.ts > limit).unwrap_or(events.len()))
        }
        Moment::Oom(n) => events
            .iter()
            .enumerate()
            .filter(|(_, e)| e.layer == Layer::Driver && e.op == Op::Alloc && e.result == CUDA_ERROR_OUT_OF_MEMORY)
            .nth(n.saturating_sub(1))
            .map(|(index, _)| index + 1)
            .with_context(|| format!("{} has fewer than {n} out-of-memory failures", input.display())),
    }
}
