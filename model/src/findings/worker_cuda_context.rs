//! `worker_cuda_context`: a child of a CUDA process (a DataLoader or multiprocessing worker)
//! created its own CUDA context — hundreds of MiB of device memory per worker. A child whose
//! parent had no context at that moment (a launcher, a worker forked before CUDA) is fine.
//!
//! A child that opens CUDA IPC memory (a `torch.multiprocessing` consumer of shared CUDA
//! tensors) needs its context for that: the finding waits a short while after the context is
//! created and is dropped if the child imports memory by then. It fires when that time is up,
//! when the child exits, or when the capture ends.

use std::collections::HashSet;

use super::{wording, Finding, FindingKind};
use crate::event::{Event, Frame, Layer, Op};
use crate::track::{ProcessRef, Tracker};

#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct Rule {
    /// Children already seen creating a context: one finding per process instance.
    reported: HashSet<ProcessRef>,
    /// Contexts waiting to learn whether the child imports IPC memory.
    pending: Vec<Created>,
}

/// A child's context creation, as the finding will tell it.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Created {
    child: ProcessRef,
    comm: String,
    parent: u32,
    detail: String,
    stack: Vec<Frame>,
    api: String,
    ts: u64,
}

impl Created {
    fn finding(self) -> Finding {
        let mut finding = Finding::new(
            FindingKind::WorkerCudaContext,
            self.child.pid,
            &self.comm,
            0,
            1,
            self.ts,
            self.ts,
            &self.stack,
            self.detail,
        );
        finding.peer_pid = Some(self.parent);
        finding.api = Some(self.api);
        finding
    }
}

/// How long a child has, after creating its context, to show that it exists to import shared
/// memory: PyTorch opens the handle right after initializing CUDA for it.
pub const IMPORT_GRACE_NS: u64 = 2_000_000_000;

impl Rule {
    /// Drops what is kept of processes the tracker no longer knows.
    pub fn forget_unless(&mut self, known: impl Fn(ProcessRef) -> bool) {
        self.reported.retain(|process| known(*process));
        self.pending.retain(|created| known(created.child));
    }

    /// The findings decided by this event (the child imported memory: dropped; it exits:
    /// fired) or by its time; a context created by it becomes pending.
    pub fn check(&mut self, event: &Event, world: &Tracker) -> Vec<Finding> {
        // Time first: an import after the grace period comes too late to explain the context.
        let mut found = self.take_due(|_, created| event.ts >= created + IMPORT_GRACE_NS);
        if event.op == Op::IpcOpen && event.succeeded() {
            self.pending.retain(|created| created.child.pid != event.pid);
        }
        if event.layer == Layer::Process && matches!(event.op, Op::Exit | Op::Exec) {
            found.extend(self.take_due(|child, _| child.pid == event.pid));
        }
        self.created(event, world);
        found
    }

    /// Time passes without events (`now`), or the capture ends (`None`).
    pub fn due(&mut self, now: Option<u64>) -> Vec<Finding> {
        self.take_due(|_, created| now.is_none_or(|now| now >= created + IMPORT_GRACE_NS))
    }

    fn take_due(&mut self, due: impl Fn(ProcessRef, u64) -> bool) -> Vec<Finding> {
        let (fired, waiting): (Vec<_>, Vec<_>) =
            std::mem::take(&mut self.pending).into_iter().partition(|created| due(created.child, created.ts));
        self.pending = waiting;
        fired.into_iter().map(Created::finding).collect()
    }

    fn created(&mut self, event: &Event, world: &Tracker) {
        if event.op != Op::CtxCreate || !event.succeeded() {
            return;
        }
        let child = world.process(event.pid);
        let Some(ppid) = child.and_then(|c| c.ppid).or(event.ppid) else { return };
        let Some(parent) = world.process(ppid).filter(|p| p.contexts() > 0) else { return };
        let child_ref = child.map(|c| c.as_ref()).unwrap_or(ProcessRef { pid: event.pid, since: event.ts });
        if !self.reported.insert(child_ref) {
            return;
        }
        let device = event.device.map(|d| format!(" on device {d}")).unwrap_or_default();
        let detail = format!(
            "{}, a child of CUDA process {}, created its own CUDA context{device} ({} {}): each context takes hundreds of MiB of device memory; keep CUDA out of workers (DataLoader workers should return CPU tensors) or share tensors from the parent.",
            wording::process(event.pid, &event.comm),
            wording::process(parent.pid, &parent.comm),
            event.api,
            wording::at(&event.attributed_stack()),
        );
        self.pending.push(Created {
            child: child_ref,
            comm: event.comm.to_string(),
            parent: parent.pid,
            detail,
            stack: event.attributed_stack().to_vec(),
            api: event.api.to_string(),
            ts: event.ts,
        });
    }
}
