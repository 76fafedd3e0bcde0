//! `worker_cuda_context`: a child of a CUDA process (a DataLoader or multiprocessing worker)
//! created its own CUDA context — hundreds of MiB of device memory per worker. A child whose
//! parent had no context at that moment (a launcher, a worker forked before CUDA) is fine.
//!
//! A child that opens CUDA IPC memory (a `torch.multiprocessing` consumer of shared CUDA
//! tensors) needs its context for that: the finding waits a short while after the context is
//! created and is dropped if the child imports memory by then.
//!
//! Whose problem it is depends on the child. A DataLoader worker (its context made under
//! PyTorch's worker loop) should never touch CUDA: `leak`, `cuda_in_dataloader_worker`, as soon
//! as that time is up. A child that allocates device memory of its own does GPU work on purpose
//! (a worker per GPU, a spawned evaluator): `info`, once it does. One that never does by the
//! time it exits, or the capture ends, only carries a context: `leak`. A child that outlives
//! its parent is the orphan finding's, which tells of its context too: none here.

use std::collections::HashSet;

use super::{wording, Diagnosis, Finding, FindingKind, Severity};
use crate::event::{Event, Frame, Kind, Layer, Op};
use crate::track::{ProcessRef, Tracker};

/// The file of PyTorch's DataLoader worker loop, as it shows in a worker's Python stack.
const DATALOADER_WORKER_FILE: &str = "torch/utils/data/_utils/worker.py";

#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
pub(crate) struct Rule {
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
    /// Made under PyTorch's DataLoader worker loop.
    #[serde(default)]
    dataloader: bool,
    /// Device memory the child allocated since (bytes).
    #[serde(default)]
    own_bytes: u64,
}

impl Created {
    fn finding(self) -> Finding {
        let (severity, diagnosis, why) = if self.dataloader {
            (
                Severity::Leak,
                Some(Diagnosis::CudaInDataloaderWorker),
                " It is a DataLoader worker: keep CUDA out of the dataset and collate_fn (return CPU tensors; move batches to the GPU in the main process, with pin_memory=True).".to_string(),
            )
        } else if self.own_bytes > 0 {
            (
                Severity::Info,
                None,
                format!(
                    " It allocated {} of its own: GPU work by design (a worker per GPU or per task); nothing to do unless the device is short of memory.",
                    wording::bytes(self.own_bytes)
                ),
            )
        } else {
            (
                Severity::Leak,
                None,
                " It allocated no device memory of its own: the context only costs; keep CUDA out of this worker (return CPU tensors) or share tensors from the parent.".to_string(),
            )
        };
        let mut finding = Finding::new(
            FindingKind::WorkerCudaContext,
            self.child.pid,
            &self.comm,
            0,
            1,
            self.ts,
            self.ts,
            &self.stack,
            format!("{}{why}", self.detail),
        );
        finding.peer_pid = Some(self.parent);
        finding.api = Some(self.api);
        finding.severity = severity;
        finding.diagnosis = diagnosis;
        finding
    }

    /// Whether the finding can be told before the child ends: what it is is known.
    fn decided(&self) -> bool {
        self.dataloader || self.own_bytes > 0
    }
}

/// How long a child has, after creating its context, to show that it exists to import shared
/// memory: PyTorch opens the handle right after initializing CUDA for it.
pub(crate) const IMPORT_GRACE_NS: u64 = 2_000_000_000;

impl Rule {
    /// Drops what is kept of processes the tracker no longer knows.
    pub(crate) fn forget_unless(&mut self, known: impl Fn(ProcessRef) -> bool) {
        self.reported.retain(|process| known(*process));
        self.pending.retain(|created| known(created.child));
    }

    /// The findings decided by this event (the child imported memory: dropped; it exits:
    /// fired) or by its time; a context created by it becomes pending.
    pub(crate) fn check(&mut self, event: &Event, world: &Tracker) -> Vec<Finding> {
        if event.layer == Layer::Driver
            && event.op == Op::Alloc
            && event.succeeded()
            && event.kind.is_some_and(|kind| kind != Kind::HostPinned)
        {
            for created in self.pending.iter_mut().filter(|created| created.child.pid == event.pid) {
                created.own_bytes += event.size;
            }
        }
        // Time first: an import after the grace period comes too late to explain the context.
        let mut found = self.take_due(|created| created.decided() && event.ts >= created.ts + IMPORT_GRACE_NS);
        if event.op == Op::IpcOpen && event.succeeded() {
            self.pending.retain(|created| created.child.pid != event.pid || event.ts >= created.ts + IMPORT_GRACE_NS);
        }
        if event.layer == Layer::Process && matches!(event.op, Op::Exit | Op::Exec) {
            found.extend(self.take_due(|created| created.child.pid == event.pid));
        }
        self.created(event, world);
        found
    }

    /// Time passes without events (`now`): what is decided and past its grace fires. The
    /// capture ends (`None`): everything pending fires.
    pub(crate) fn due(&mut self, now: Option<u64>) -> Vec<Finding> {
        self.take_due(|created| now.is_none_or(|now| created.decided() && now >= created.ts + IMPORT_GRACE_NS))
    }

    /// The orphan findings of these children tell of their contexts: none of their own.
    pub(crate) fn orphaned(&mut self, pids: &[u32]) {
        self.pending.retain(|created| !pids.contains(&created.child.pid));
    }

    fn take_due(&mut self, due: impl Fn(&Created) -> bool) -> Vec<Finding> {
        let (fired, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut self.pending).into_iter().partition(due);
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
        let stack = event.attributed_stack();
        let dataloader = stack.iter().any(|frame| frame.file.ends_with(DATALOADER_WORKER_FILE));
        let detail = format!(
            "{}, a child of CUDA process {}, created its own CUDA context{device} ({} {}): each context takes hundreds of MiB of device memory.",
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
            stack: stack.to_vec(),
            api: event.api.to_string(),
            ts: event.ts,
            dataloader,
            own_bytes: 0,
        });
    }
}
