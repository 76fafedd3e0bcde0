//! A recording streamed up to the moment an export is taken: the peak found first when that is
//! the moment, then the rules' tracker replayed to it (the views read what was live there).

use std::path::Path;

use anyhow::{bail, Result};
use gpuprof_model::event::{Event, Layer, Op, CUDA_ERROR_OUT_OF_MEMORY};
use gpuprof_model::forward_stacks::ForwardStacks;
use gpuprof_model::{Analyzer, RuleConfig};

use super::peak;
use super::request::{Moment, StackLayer};
use crate::input;

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

/// The rules' tracker at the moment, the file streamed up to it; `each` sees every event
/// replayed (after the tracker took it in).
pub(crate) fn replay_to(input: &Path, moment: Moment, mut each: impl FnMut(&Event)) -> Result<Analyzer> {
    let mut analyzer = Analyzer::new(RuleConfig::default());
    // A shim's own file has no forward lines yet.
    let mut forward_stacks = ForwardStacks::default();
    let mut cut = Cut::new(moment);
    let mut reached = false;
    let mut file = input::Reading::open(input)?;
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
            bail!("--at {secs} is past the end of {}: its events span {span:.3} s; give at most that, or --end for the end", input.display())
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
