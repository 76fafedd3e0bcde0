//! Why tensors grow: a retained autograd graph, or tensors the user's code keeps.
//!
//! Every forward op that records an autograd node takes its thread's next sequence number
//! (docs: `autograd.rs`), so a forward block whose thread's counter moved since the previous
//! block was made by such an op, for node `counter - 1`. A backward pass evaluates nodes from the
//! loss down, and its blocks name the node they are made for: the sequence numbers a pass
//! touched form a range. A growing block whose node lies in no evaluated range, though a
//! backward pass ran after it (or the process never ran one), belongs to a graph nobody
//! differentiates: evaluation without `torch.no_grad()`, or a loss kept across steps. A growing
//! block made outside autograd, or whose graph a backward pass already used, is kept by the
//! user's own code.

use std::collections::{HashMap, VecDeque};

use serde::{Deserialize, Serialize};

use crate::event::{Event, Layer, Op};
use crate::findings::Diagnosis;

/// Ranges kept per thread (a backward pass makes one; old steps' ranges go first).
const RANGES: usize = 1024;
/// Recent allocations kept per series as evidence.
const EVIDENCE: usize = 16;
/// Sequence numbers this high are no forward op's (`AccumulateGrad` takes `UINT64_MAX`).
const NO_FORWARD_NODE: u64 = 1 << 62;

/// One recent allocation of a series, as the evidence of its cause.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub(crate) struct Made {
    addr: u64,
    ts: u64,
    thread: u64,
    /// The autograd node the forward op that made it recorded, if it recorded one.
    node: Option<u64>,
    /// When it was freed, if it was.
    freed: Option<u64>,
}

/// A series' most recent allocations.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct Evidence(VecDeque<Made>);

impl Evidence {
    pub(crate) fn push(&mut self, made: Made) {
        if self.0.len() == EVIDENCE {
            self.0.pop_front();
        }
        self.0.push_back(made);
    }

    /// A block of the series was freed at `ts`.
    pub(crate) fn freed(&mut self, addr: u64, ts: u64) {
        if let Some(made) = self.0.iter_mut().rev().find(|made| made.addr == addr && made.freed.is_none()) {
            made.freed = Some(ts);
        }
    }
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct Evaluated {
    /// Sequence-number ranges backward passes touched, oldest first, not overlapping.
    ranges: VecDeque<(u64, u64)>,
    /// The latest backward block's time.
    last_ts: u64,
}

impl Evaluated {
    fn touch(&mut self, seq: u64, ts: u64) {
        self.last_ts = self.last_ts.max(ts);
        match self.ranges.back_mut() {
            Some((low, high)) if seq <= *high => *low = (*low).min(seq),
            _ => {
                if self.ranges.len() == RANGES {
                    self.ranges.pop_front();
                }
                self.ranges.push_back((seq, seq));
            }
        }
        // A pass reaching down into the one before: one range.
        while self.ranges.len() >= 2 {
            let (low, high) = self.ranges[self.ranges.len() - 1];
            let (before_low, before_high) = self.ranges[self.ranges.len() - 2];
            if before_high < low {
                break;
            }
            self.ranges.pop_back();
            *self.ranges.back_mut().expect("two ranges") = (before_low.min(low), before_high.max(high));
        }
    }

    fn contains(&self, seq: u64) -> bool {
        self.ranges.iter().any(|(low, high)| (*low..=*high).contains(&seq))
    }
}

/// What the stream says about autograd, per process and thread.
#[derive(Debug, Default, Serialize, Deserialize)]
pub(crate) struct Autograd {
    /// (pid, thread) → the counter at its last forward block, and whether that op made a node.
    forward: HashMap<(u32, u64), (u64, bool)>,
    /// (pid, forward thread) → what backward passes evaluated of the nodes it made.
    evaluated: HashMap<(u32, u64), Evaluated>,
}

impl Autograd {
    /// Learns from an allocator event; for a forward allocation, what made it.
    pub(crate) fn observe(&mut self, event: &Event) -> Option<Made> {
        if event.layer != Layer::Allocator || !event.succeeded() {
            return None;
        }
        let (Some(seq), Some(thread)) = (event.autograd_seq, event.autograd_thread) else { return None };
        if event.autograd_node.is_some() {
            if seq < NO_FORWARD_NODE {
                self.evaluated.entry((event.pid, thread)).or_default().touch(seq, event.ts);
            }
            return None;
        }
        if event.op != Op::Alloc {
            return None;
        }
        let Some((counter, made_node)) = self.forward.get_mut(&(event.pid, thread)) else {
            // The thread's first block: whether its op recorded a node is not known.
            self.forward.insert((event.pid, thread), (seq, false));
            return None;
        };
        if *counter != seq {
            // The counter moved since the last block: this op (or one just before it that
            // allocated nothing) recorded node `seq - 1`.
            *made_node = seq > *counter;
            *counter = seq;
        }
        let node = (*made_node && seq > 0).then(|| seq - 1);
        Some(Made { addr: event.addr.unwrap_or(0), ts: event.ts, thread, node, freed: None })
    }

    /// The process ended: its threads are forgotten.
    pub(crate) fn forget(&mut self, pid: u32) {
        self.forward.retain(|(p, _), _| *p != pid);
        self.evaluated.retain(|(p, _), _| *p != pid);
    }

    /// The cause that the recent allocations of `grown` still live at `at` show, with the share
    /// of them that says so (0–1); `None` when none of them was live then or none tells.
    pub(crate) fn diagnose<'a>(
        &self,
        pid: u32,
        at: u64,
        grown: impl Iterator<Item = &'a Evidence>,
    ) -> Option<(Diagnosis, f64)> {
        let any_backward = self.evaluated.keys().any(|(p, _)| *p == pid);
        let (mut retained, mut kept) = (0u32, 0u32);
        for made in grown.flat_map(|evidence| evidence.0.iter()) {
            if made.freed.is_some_and(|freed| freed <= at) {
                continue;
            }
            let evaluated = self.evaluated.get(&(pid, made.thread));
            match made.node {
                None => kept += 1,
                Some(node) if evaluated.is_some_and(|e| e.contains(node)) => kept += 1,
                // Made after the last backward pass: its own may still come.
                Some(_) if any_backward && evaluated.is_none_or(|e| e.last_ts < made.ts) => {}
                Some(_) => retained += 1,
            }
        }
        let told = retained + kept;
        if told == 0 {
            return None;
        }
        if retained > kept {
            Some((Diagnosis::AutogradGraphRetained, f64::from(retained) / f64::from(told)))
        } else {
            Some((Diagnosis::TensorsKeptByUserCode, f64::from(kept) / f64::from(told)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backward_passes_are_ranges_of_the_nodes_they_touched() {
        let mut evaluated = Evaluated::default();
        // Step 1's pass: nodes 10 down to 3; step 2's: 30 down to 22; then a pass reaching
        // back into step 1's graph (retain_graph) merges them.
        for seq in [10, 8, 9, 5, 3, 30, 28, 22, u64::MAX] {
            if seq < NO_FORWARD_NODE {
                evaluated.touch(seq, 1);
            }
        }
        assert_eq!(evaluated.ranges, [(3, 10), (22, 30)]);
        assert!(evaluated.contains(5) && evaluated.contains(22) && !evaluated.contains(15));
        evaluated.touch(40, 2);
        evaluated.touch(7, 2);
        assert_eq!(evaluated.ranges, [(3, 40)]);
    }
}
