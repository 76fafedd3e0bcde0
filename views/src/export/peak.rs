//! The peak: the instant the recording's processes held the most GPU memory together, as the
//! stack views count it (tensors where the allocator reported, driver allocations elsewhere).
//! Found in one streaming pass; the view is then taken by replaying to it.

use std::collections::HashMap;
use std::path::Path;

use anyhow::{bail, Result};
use gpuprof_model::event::Event;
use gpuprof_model::forward_stacks::ForwardStacks;
use gpuprof_model::track::{ProcessMemory, Tracker};
use gpuprof_model::{Analyzer, RuleConfig};

use super::request::StackLayer;

/// Where the peak lies.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Peak {
    /// Events up to and including the one that reached the peak.
    pub events: u64,
    /// Seconds after the first event.
    pub secs: f64,
    /// Live bytes then, all processes together.
    pub bytes: u64,
}

/// What a process counts for in a view of `layer`.
pub(crate) fn view_bytes(process: &ProcessMemory, layer: StackLayer) -> u64 {
    process.live_bytes(layer.counts_tensors(process))
}

/// The first instant the total is highest. An error when nothing was ever live.
pub(crate) fn find(input: &Path, layer: StackLayer) -> Result<Peak> {
    find_with(input, layer, |_, _| ()).map(|(peak, _)| peak)
}

/// `find`, with `each` seeing every event after the tracker took it in; also returns the
/// tracker's state at the end.
pub(crate) fn find_with(
    input: &Path,
    layer: StackLayer,
    each: impl FnMut(&Event, &Tracker),
) -> Result<(Peak, Analyzer)> {
    let (peak, analyzer, events) = scan(input, layer, each)?;
    match peak {
        Some(peak) => Ok((peak, analyzer)),
        None => bail!(
            "no GPU memory was ever live in {} ({events} events): nothing to show at its peak; check it with `gpuprof report {}`",
            input.display(),
            input.display()
        ),
    }
}

/// One pass: the peak (None when nothing was ever live), the rules' state at the end, and the
/// number of events.
pub(crate) fn scan(
    input: &Path,
    layer: StackLayer,
    mut each: impl FnMut(&Event, &Tracker),
) -> Result<(Option<Peak>, Analyzer, u64)> {
    let mut analyzer = Analyzer::new(RuleConfig::default());
    let mut forward_stacks = ForwardStacks::default();
    let mut counted: HashMap<u32, u64> = HashMap::new();
    let (mut total, mut events, mut first_ts) = (0u64, 0u64, None);
    let mut peak = Peak { events: 0, secs: 0.0, bytes: 0 };
    let mut file = crate::input::Reading::open(input)?;
    while let Some(mut event) = file.next_event()? {
        events += 1;
        let first = *first_ts.get_or_insert(event.ts);
        forward_stacks.follow(&mut event);
        analyzer.observe(&mut event);
        each(&event, analyzer.tracker());
        // Only the event's own process changed; an exited one holds nothing any more.
        let now = analyzer.tracker().process(event.pid).map_or(0, |p| view_bytes(p, layer));
        let before = counted.insert(event.pid, now).unwrap_or(0);
        total = total + now - before;
        if total > peak.bytes {
            peak = Peak { events, secs: event.ts.saturating_sub(first) as f64 / 1e9, bytes: total };
        }
    }
    crate::input::say_how_it_ended(input, file.ending());
    Ok(((peak.bytes > 0).then_some(peak), analyzer, events))
}
