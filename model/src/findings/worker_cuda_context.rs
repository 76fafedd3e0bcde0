//! `worker_cuda_context`: a child of a CUDA process (a DataLoader or multiprocessing worker)
//! created its own CUDA context — hundreds of MiB of device memory per worker. A child whose
//! parent had no context at that moment (a launcher, a worker forked before CUDA) is fine.

use std::collections::HashSet;

use super::{wording, Finding, FindingKind};
use crate::event::{Event, Op};
use crate::track::{ProcessRef, Tracker};

#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct Rule {
    /// Children already reported: one finding per process instance.
    reported: HashSet<ProcessRef>,
}

impl Rule {
    /// Drops what is kept of processes the tracker no longer knows.
    pub fn forget_unless(&mut self, known: impl Fn(ProcessRef) -> bool) {
        self.reported.retain(|process| known(*process));
    }

    pub fn check(&mut self, event: &Event, world: &Tracker) -> Option<Finding> {
        if event.op != Op::CtxCreate || !event.succeeded() {
            return None;
        }
        let child = world.process(event.pid);
        let ppid = child.and_then(|c| c.ppid).or(event.ppid)?;
        let parent = world.process(ppid).filter(|p| p.contexts() > 0)?;
        let child_ref = child.map(|c| c.as_ref()).unwrap_or(ProcessRef { pid: event.pid, since: event.ts });
        if !self.reported.insert(child_ref) {
            return None;
        }
        let device = event.device.map(|d| format!(" on device {d}")).unwrap_or_default();
        Some(Finding {
            kind: FindingKind::WorkerCudaContext,
            pid: event.pid,
            comm: event.comm.to_string(),
            bytes: 0,
            count: 1,
            peer_pid: Some(parent.pid),
            first_ts: event.ts,
            last_ts: event.ts,
            stack: event.stack.to_vec(),
            detail: format!(
                "{}, a child of CUDA process {}, created its own CUDA context{device} ({} {}): each context takes hundreds of MiB of device memory; keep CUDA out of workers (DataLoader workers should return CPU tensors) or share tensors from the parent.",
                wording::process(event.pid, &event.comm),
                wording::process(parent.pid, &parent.comm),
                event.api,
                wording::at(&event.stack),
            ),
            api: Some(event.api.to_string()),
            processes: Vec::new(),
        })
    }
}
