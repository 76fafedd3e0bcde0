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
mod replay;
mod request;
mod speedscope;
pub mod summary;

use std::io::Write;

use anyhow::{bail, Context, Result};
use gpuprof_model::forward_stacks::ForwardStacks;

use crate::input;
use crate::output::{self, EndOfRun};
use replay::{replay_to, resolve};
pub use request::{ExportFormat, ExportRequest, Moment, StackLayer, TraceWindow};

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
    let mut file = input::Reading::open(request.input)?;
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
        output_failed: false,
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
