//! Reading a recorded event file — a recording or jsonl, as `attach`/`run` write them —
//! streaming, in order. A corrupt file is an error naming the line or byte; a file cut short
//! (a capture that was killed) is read up to its last whole event, with a warning saying so.

use std::path::Path;

use anyhow::Result;
use gpuprof_model::Event;
use gpuprof_recording::{Ending, EventFile};

/// Calls `each` with every event of the file, in order.
pub(crate) fn for_each_event(input: &Path, each: impl FnMut(Event) -> Result<()>) -> Result<()> {
    let file = EventFile::open(input)?;
    let ending = file.for_each(each)?;
    say_how_it_ended(input, Some(ending));
    Ok(())
}

/// A warning when the file was cut short or its capture lost events (nothing otherwise).
pub(crate) fn say_how_it_ended(input: &Path, ending: Option<Ending>) {
    let Some(ending) = ending else { return };
    match ending {
        Ending::Truncated { events } => eprintln!(
            "gpuprof: warning: {} is cut short after {events} events (its capture did not finish); what follows covers those",
            input.display()
        ),
        Ending::Closed { lost, .. } if lost > 0 => {
            eprintln!("gpuprof: warning: the capture of {} lost {lost} events; what follows lacks them", input.display())
        }
        Ending::Closed { .. } => {}
    }
}
