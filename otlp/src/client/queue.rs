//! The client's queue: batches waiting for the sender, bounded by their encoded bytes (a
//! request in flight still counts, until it is settled). When a batch does not fit, the oldest
//! gauge batches go first — a curve's newer point supersedes them — and then the new batch
//! itself: events, spans and findings are never pushed out by gauges.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

use super::transport::Request;

pub(crate) struct Batch {
    pub request: Request,
    pub items: u64,
    pub bytes: usize,
}

impl Batch {
    pub(crate) fn new(request: Request, items: u64, bytes: usize) -> Self {
        Batch { request, items, bytes }
    }

    fn is_gauges(&self) -> bool {
        matches!(self.request, Request::Metrics(_))
    }
}

struct State {
    batches: VecDeque<Batch>,
    /// Encoded bytes of the batches queued and the one in flight.
    bytes: usize,
    closed: bool,
}

pub(crate) struct Queue {
    limit: usize,
    state: Mutex<State>,
    changed: Condvar,
}

impl Queue {
    pub(crate) fn new(limit: usize) -> Self {
        Queue {
            limit,
            state: Mutex::new(State { batches: VecDeque::new(), bytes: 0, closed: false }),
            changed: Condvar::new(),
        }
    }

    /// Queues `batch`; returns the items that were dropped to stay within the limit (gauges
    /// pushed out, or the batch itself).
    pub(crate) fn push(&self, batch: Batch) -> u64 {
        let mut state = self.state.lock().expect("queue lock");
        let mut dropped = 0;
        while state.bytes + batch.bytes > self.limit {
            let Some(oldest_gauges) = state.batches.iter().position(Batch::is_gauges) else { break };
            let gone = state.batches.remove(oldest_gauges).expect("found above");
            state.bytes -= gone.bytes;
            dropped += gone.items;
        }
        if state.bytes + batch.bytes > self.limit {
            return dropped + batch.items;
        }
        state.bytes += batch.bytes;
        state.batches.push_back(batch);
        self.changed.notify_all();
        dropped
    }

    /// The next batch; None once the queue is closed and empty, or the client gave up.
    pub(crate) fn pop(&self, give_up: &AtomicBool) -> Option<Batch> {
        let mut state = self.state.lock().expect("queue lock");
        loop {
            if give_up.load(Ordering::Relaxed) {
                return None;
            }
            if let Some(batch) = state.batches.pop_front() {
                return Some(batch);
            }
            if state.closed {
                return None;
            }
            state = self.changed.wait(state).expect("queue lock");
        }
    }

    /// A batch popped earlier is settled (sent or dropped): its bytes are free again.
    pub(crate) fn done(&self, batch: &Batch) {
        let mut state = self.state.lock().expect("queue lock");
        state.bytes -= batch.bytes;
    }

    /// Waits `pause` (a retry's back-off), or less if the client gives up meanwhile.
    pub(crate) fn sleep(&self, pause: Duration, give_up: &AtomicBool) {
        let state = self.state.lock().expect("queue lock");
        if give_up.load(Ordering::Relaxed) {
            return;
        }
        let _ = self.changed.wait_timeout(state, pause);
    }

    pub(crate) fn bytes(&self) -> usize {
        self.state.lock().map(|s| s.bytes).unwrap_or(0)
    }

    pub(crate) fn close(&self) {
        if let Ok(mut state) = self.state.lock() {
            state.closed = true;
        }
        self.changed.notify_all();
    }

    /// Wakes the sender (to notice it must give up).
    pub(crate) fn wake(&self) {
        let _guard = self.state.lock();
        self.changed.notify_all();
    }
}
