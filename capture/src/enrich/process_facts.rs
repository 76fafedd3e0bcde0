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
pub(crate) struct ProcessFacts {
    processes: HashMap<u32, Facts>,
}

impl ProcessFacts {
    pub(crate) fn fill(&mut self, event: &mut Event) {
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

#[cfg(test)]
mod tests {
    use std::borrow::Cow;

    use gpuprof_model::event::{Layer, Source};

    use super::*;

    fn event(pid: u32, op: Op, ppid: Option<u32>) -> Event {
        let mut event = Event::new(1, pid, pid, Source::Ebpf, Layer::Driver, op, Cow::Borrowed("cuMemAlloc_v2"));
        event.ppid = ppid;
        event
    }

    #[test]
    fn a_parent_no_record_named_is_read_from_proc_and_a_named_one_is_kept() {
        let pid = std::process::id();
        let mut facts = ProcessFacts::default();
        let mut unnamed = event(pid, Op::Alloc, None);
        facts.fill(&mut unnamed);
        // SAFETY: getppid(2) cannot fail.
        let parent = unsafe { libc::getppid() } as u32;
        assert_eq!(unnamed.ppid, Some(parent));
        // The test runs in the machine's own pid namespace: no namespace pid apart from the pid.
        assert_eq!(unnamed.ns_pid, None);
        let mut named = event(pid, Op::Fork, Some(4711));
        facts.fill(&mut named);
        assert_eq!((named.ppid, named.ns_pid), (Some(4711), None));
    }

    #[test]
    fn a_process_gone_keeps_what_its_records_said() {
        let mut facts = ProcessFacts::default();
        let mut gone = event(u32::MAX - 1, Op::Alloc, Some(7));
        facts.fill(&mut gone);
        assert_eq!((gone.ppid, gone.ns_pid), (Some(7), None));
    }
}
