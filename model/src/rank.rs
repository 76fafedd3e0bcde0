//! Each process's rank in a distributed job, as its events say it. A live capture reads the rank
//! (`RANK` in the environment torchrun, torch.distributed, DeepSpeed or Accelerate started the
//! process with, else its MPI or Slurm launcher's: `job`) at the process's first call and puts it
//! on that event (`Event::rank`); a recording or jsonl file keeps that event, so whoever replays
//! the file learns the rank at the same event the capture did, and names findings with it the
//! same way.

use std::collections::HashMap;

use crate::event::{Event, Layer, Op};
use crate::findings::Finding;

/// The environment variable a distributed launcher (torchrun, torch.distributed, DeepSpeed,
/// Accelerate) gives each process its rank in.
pub const RANK_VARIABLE: &str = "RANK";

/// A `RANK` value as a rank: a non-negative integer, else none.
pub fn parse(value: &[u8]) -> Option<u32> {
    std::str::from_utf8(value).ok()?.parse().ok()
}

/// The rank of each process followed, learnt from its first call.
#[derive(Debug, Default)]
pub struct Ranks {
    /// Processes whose first call was seen; None: it carried no rank.
    by_pid: HashMap<u32, Option<u32>>,
}

impl Ranks {
    /// Whether `event` is its process's first call since it started or exec'd: where a live
    /// capture reads the rank and puts it on the event.
    pub fn first_call(&self, event: &Event) -> bool {
        event.layer != Layer::Process && !self.by_pid.contains_key(&event.pid)
    }

    /// Takes an event in, before the rules see it (so the findings it fires have the rank).
    pub fn observe(&mut self, event: &Event) {
        match (event.layer, event.op) {
            // A new process, or a new image: another rank, or none.
            (Layer::Process, Op::Fork | Op::Exec) => {
                self.by_pid.remove(&event.pid);
            }
            // Kept past the exit: its findings fire then, and orphans' after a grace period.
            (Layer::Process, _) => {}
            _ if event.rank.is_some() => {
                self.by_pid.insert(event.pid, event.rank);
            }
            _ => {
                self.by_pid.entry(event.pid).or_insert(None);
            }
        }
    }

    /// The rank of process `pid`, where its first call carried one.
    pub fn of(&self, pid: u32) -> Option<u32> {
        self.by_pid.get(&pid).copied().flatten()
    }

    /// Gives each finding its process's rank.
    pub fn name(&self, findings: &mut [Finding]) {
        for finding in findings {
            finding.rank = self.of(finding.pid);
        }
    }

    /// Keeps the processes `keep` says (a daemon sees processes come and go for months).
    pub fn retain(&mut self, mut keep: impl FnMut(u32) -> bool) {
        self.by_pid.retain(|pid, _| keep(*pid));
    }
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;

    use super::*;
    use crate::event::Source;
    use crate::findings::FindingKind;

    fn event(pid: u32, layer: Layer, op: Op, rank: Option<u32>) -> Event {
        let mut event = Event::new(1, pid, pid, Source::Ebpf, layer, op, Cow::Borrowed("x"));
        event.rank = rank;
        event
    }

    #[test]
    fn a_process_has_the_rank_its_first_call_carried_until_it_execs() {
        let mut ranks = Ranks::default();
        let first = event(7, Layer::Driver, Op::Alloc, Some(3));
        assert!(ranks.first_call(&first));
        ranks.observe(&first);
        assert!(!ranks.first_call(&event(7, Layer::Driver, Op::Free, None)));
        ranks.observe(&event(7, Layer::Driver, Op::Free, None));
        ranks.observe(&event(7, Layer::Process, Op::Exit, None));
        assert_eq!(ranks.of(7), Some(3));

        // A process without one is known to have none: a live capture reads it once.
        ranks.observe(&event(8, Layer::Allocator, Op::Alloc, None));
        assert!(!ranks.first_call(&event(8, Layer::Driver, Op::Alloc, None)));
        assert_eq!(ranks.of(8), None);

        ranks.observe(&event(7, Layer::Process, Op::Exec, None));
        assert_eq!(ranks.of(7), None);
        assert!(ranks.first_call(&event(7, Layer::Driver, Op::Alloc, None)));
        ranks.observe(&event(7, Layer::Driver, Op::Alloc, Some(5)));
        ranks.observe(&event(9, Layer::Process, Op::Fork, None));
        assert_eq!((ranks.of(7), ranks.of(9)), (Some(5), None));

        let finding = |pid| Finding::new(FindingKind::ExitWithLiveAllocations, pid, "", 0, 0, 0, 0, &[], String::new());
        let mut findings = [finding(7), finding(8)];
        ranks.name(&mut findings);
        assert_eq!(findings.map(|f| f.rank), [Some(5), None]);
    }
}
