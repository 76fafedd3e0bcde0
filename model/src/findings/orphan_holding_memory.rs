//! `orphan_holding_memory`: a process whose CUDA-using parent is gone (exited, killed) still
//! holds device memory or a CUDA context. Nothing will use that memory any more, and nothing
//! will end the process: a launcher killed with SIGKILL leaves its spawned workers holding
//! their GPU memory until someone kills them.
//!
//! The parent's descendants are looked at a grace period after its exit (workers that watch
//! their parent end by themselves), or when the capture ends.

use super::{wording, Diagnosis, Finding, FindingKind};
use crate::event::{Event, Frame, Layer, Op};
use crate::track::{ProcessMemory, ProcessRef, Tracker};

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Gone {
    parent: ProcessRef,
    comm: std::sync::Arc<str>,
    /// "exited with code 0", "was killed by signal 9".
    how: String,
    ts: u64,
}

#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
pub(crate) struct Rule {
    /// CUDA-using parents that ended, whose descendants are still to be looked at.
    pending: Vec<Gone>,
}

impl Rule {
    /// Before the tracker closes the table of a process that exits: a CUDA-using process with
    /// descendants is noted.
    pub(crate) fn at_exit(&mut self, event: &Event, world: &Tracker) {
        if event.layer != Layer::Process || event.op != Op::Exit {
            return;
        }
        let Some(parent) = world.process(event.pid) else { return };
        if parent.contexts() == 0 && parent.driver_calls() == 0 {
            return;
        }
        if descendants(parent.as_ref(), world).is_empty() {
            return;
        }
        let how = match event.signal {
            Some(signal) => format!("was killed by signal {signal}"),
            None => format!("exited with code {}", event.exit_code.unwrap_or(0)),
        };
        self.pending.push(Gone { parent: parent.as_ref(), comm: parent.comm.clone(), how, ts: event.ts });
    }

    /// The parents whose grace period ended by `now` (all of them when `now` is None: the
    /// capture ends): their descendants that still hold device memory or a context.
    pub(crate) fn check(&mut self, now: Option<u64>, grace_ns: u64, world: &Tracker) -> Vec<Finding> {
        let (due, waiting): (Vec<Gone>, Vec<Gone>) = std::mem::take(&mut self.pending)
            .into_iter()
            .partition(|gone| now.is_none_or(|now| now >= gone.ts + grace_ns));
        self.pending = waiting;
        let mut found = Vec::new();
        for gone in due {
            let orphans: Vec<&ProcessMemory> = descendants(gone.parent, world)
                .into_iter()
                .filter(|p| p.device_bytes() > 0 || p.contexts() > 0)
                .collect();
            let mut pids: Vec<u32> = orphans.iter().map(|p| p.pid).collect();
            pids.sort();
            let pids: Vec<String> = pids.iter().map(u32::to_string).collect();
            for orphan in &orphans {
                found.push(finding(orphan, &gone, now.unwrap_or(world_last_ts(world)), &pids.join(" ")));
            }
        }
        found
    }
}

/// Live processes descended from `parent` (through live intermediates: a forkserver), oldest
/// first.
pub(super) fn descendants(parent: ProcessRef, world: &Tracker) -> Vec<&ProcessMemory> {
    let mut family = vec![parent.pid];
    let mut found = Vec::new();
    let mut live = world.live_processes();
    live.sort_by_key(|p| (p.first_ts, p.pid));
    for process in live {
        if process.pid == parent.pid || process.first_ts < parent.since {
            continue;
        }
        if process.ppid.is_some_and(|ppid| family.contains(&ppid)) {
            family.push(process.pid);
            found.push(process);
        }
    }
    found
}

fn world_last_ts(world: &Tracker) -> u64 {
    world.live_processes().iter().map(|p| p.last_ts).max().unwrap_or(0)
}

fn finding(orphan: &ProcessMemory, gone: &Gone, ts: u64, all: &str) -> Finding {
    let live: Vec<_> = orphan.allocations().into_iter().filter(|a| a.is_device_memory()).collect();
    let bytes: u64 = live.iter().map(|a| a.size).sum();
    let largest = live.iter().max_by(|a, b| a.size.cmp(&b.size).then(b.ts.cmp(&a.ts)));
    let stack: Vec<Frame> = largest.map(|a| a.stack.to_vec()).unwrap_or_default();
    let holds = match (bytes, orphan.contexts()) {
        (0, _) => "a CUDA context".to_string(),
        (bytes, 0) => format!(
            "{} of device memory in {}",
            wording::bytes(bytes),
            wording::count(live.len() as u64, "allocation", "allocations")
        ),
        (bytes, _) => format!(
            "{} of device memory in {} and a CUDA context",
            wording::bytes(bytes),
            wording::count(live.len() as u64, "allocation", "allocations")
        ),
    };
    let from = match largest {
        Some(a) => format!("; the largest, {}, came from {} {}", wording::bytes(a.size), a.api, wording::at(&a.stack)),
        None => String::new(),
    };
    let detail = format!(
        "{} still holds {holds} after its parent {} {}{from}: nothing will use it; end it with `kill {all}`, and make workers end with their parent (daemon=True, a watchdog on os.getppid(), prctl PR_SET_PDEATHSIG).",
        wording::process(orphan.pid, &orphan.comm),
        wording::process(gone.parent.pid, &gone.comm),
        gone.how,
    );
    let count = live.len() as u64;
    let mut finding = Finding::new(
        FindingKind::OrphanHoldingMemory,
        orphan.pid,
        &orphan.comm,
        bytes,
        count,
        gone.ts,
        ts.max(gone.ts),
        &stack,
        detail,
    );
    finding.peer_pid = Some(gone.parent.pid);
    finding.api = largest.map(|a| a.api.to_string());
    finding.diagnosis = Some(Diagnosis::OrphanedWorker);
    finding
}
