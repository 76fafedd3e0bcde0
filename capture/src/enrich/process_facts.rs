//! A process's parent and its pid in its own namespace, from /proc, for events whose records did
//! not say: a driver record carries no parent, and the parent is learned from the process's fork
//! or exec record (by decode) or read here once. Read while the process lives; a process gone
//! before its records are read keeps what its records said.

use std::collections::HashMap;

use gpuprof_model::event::{Event, Op};
use gpuprof_procfs::process;

#[derive(Debug, Clone, Copy, Default)]
struct Facts {
    /// None: /proc did not say (gone), or the records named the parent.
    ppid: Option<u32>,
    ns_pid: Option<u32>,
}

/// What /proc said of each process, read once (again after an exec: another namespace maybe).
#[derive(Default)]
pub struct ProcessFacts {
    processes: HashMap<u32, Facts>,
}

impl ProcessFacts {
    pub fn fill(&mut self, event: &mut Event) {
        let pid = event.pid;
        if matches!(event.op, Op::Fork | Op::Exec) {
            self.processes.remove(&pid);
        }
        let reported_ppid = event.ppid;
        let facts = *self.processes.entry(pid).or_insert_with(|| Facts {
            ppid: if reported_ppid.is_some() { None } else { process::stat(pid).map(|(_, ppid)| ppid) },
            ns_pid: process::ns_pid(pid),
        });
        event.ppid = reported_ppid.or(facts.ppid);
        event.ns_pid = facts.ns_pid;
        if event.op == Op::Exit {
            self.processes.remove(&pid);
        }
    }
}
