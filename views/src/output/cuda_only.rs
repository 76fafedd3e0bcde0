//! Keeps processes that never touch CUDA out of the event stream: the shells, launchers and
//! version managers a job starts through fork and exec by the dozen. A process's fork and exec
//! wait until it makes its first CUDA call, and are written just before it; those of a process
//! that exits without one are dropped and counted.

use std::collections::{HashMap, HashSet};
use std::io;

use gpuprof_model::event::{Event, Layer, Op};

use super::{EndOfRun, EventSink};

/// Events kept waiting per process; a process that forks and execs more than this without a
/// CUDA call is a launcher, whose oldest lines go first.
const WAITING_PER_PROCESS: usize = 16;

pub(crate) struct CudaProcessesOnly {
    inner: Box<dyn EventSink>,
    cuda: HashSet<u32>,
    waiting: HashMap<u32, Vec<Event>>,
    left_out_processes: u64,
    left_out_events: u64,
}

impl CudaProcessesOnly {
    pub(crate) fn new(inner: Box<dyn EventSink>) -> Self {
        CudaProcessesOnly {
            inner,
            cuda: HashSet::new(),
            waiting: HashMap::new(),
            left_out_processes: 0,
            left_out_events: 0,
        }
    }
}

impl EventSink for CudaProcessesOnly {
    fn event(&mut self, event: &Event) -> io::Result<()> {
        if event.layer != Layer::Process {
            if self.cuda.insert(event.pid) {
                for waited in self.waiting.remove(&event.pid).unwrap_or_default() {
                    self.inner.event(&waited)?;
                }
            }
            return self.inner.event(event);
        }
        if self.cuda.contains(&event.pid) {
            if event.op == Op::Exit {
                // The pid may come back as another process.
                self.cuda.remove(&event.pid);
            }
            return self.inner.event(event);
        }
        if event.op == Op::Exit {
            let waited = self.waiting.remove(&event.pid).map_or(0, |w| w.len() as u64);
            self.left_out_processes += 1;
            self.left_out_events += waited + 1;
            return Ok(());
        }
        let waiting = self.waiting.entry(event.pid).or_default();
        if waiting.len() == WAITING_PER_PROCESS {
            waiting.remove(0);
            self.left_out_events += 1;
        }
        waiting.push(event.clone());
        Ok(())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }

    fn finish(&mut self, end: &EndOfRun<'_>) -> io::Result<()> {
        self.left_out_processes += self.waiting.len() as u64;
        self.left_out_events += self.waiting.drain().map(|(_, w)| w.len() as u64).sum::<u64>();
        if self.left_out_processes > 0 {
            eprintln!(
                "gpuprof: left out {} events of {} processes that made no CUDA call (shells, launchers); --all-processes keeps them",
                self.left_out_events, self.left_out_processes
            );
        }
        self.inner.finish(end)
    }
}
