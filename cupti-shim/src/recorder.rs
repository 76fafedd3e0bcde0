//! One call, recorded by the thread that made it: its pid and tid, its Python stack (walked by
//! `python`: its hash, its frames sent once), and how many code descriptions were queued before
//! it. The producers (`allocator`, `cupti`'s callback) call this; the sender reads the record.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::python;
use crate::queue::{self, Call};
use crate::timing::{self, Phase};

/// Bumped in a forked child: ids cached before the fork are stale there.
static FORKS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// (forks seen, pid, tid) of this thread: two system calls saved on every event.
    static IDS: Cell<(u64, u32, u32)> = const { Cell::new((u64::MAX, 0, 0)) };
}

/// Records a call made at `ts_ns` by this thread, with its Python stack.
pub fn record(ts_ns: u64, call: Call) {
    let (pid, tid) = this_thread();
    let walking = timing::stamp();
    let stack = python::walk();
    timing::lap(Phase::Walk, walking);
    // After the walk: the descriptions it queued come before this record.
    let codes_before = queue::codes_queued();
    queue::push_call(|record| {
        record.ts_ns = ts_ns;
        record.pid = pid;
        record.tid = tid;
        record.call = call;
        record.codes_before = codes_before;
        record.stack = stack;
    });
}

/// This process's pid and this thread's tid.
fn this_thread() -> (u32, u32) {
    let forks = FORKS.load(Ordering::Relaxed);
    IDS.with(|ids| {
        let (seen, pid, tid) = ids.get();
        if seen == forks {
            return (pid, tid);
        }
        // SAFETY: getpid/gettid have no preconditions.
        let (pid, tid) = unsafe { (libc::getpid() as u32, libc::gettid() as u32) };
        ids.set((forks, pid, tid));
        (pid, tid)
    })
}

/// In a forked child: the forking thread's cached ids are the parent's.
pub fn forget_ids_after_fork() {
    FORKS.fetch_add(1, Ordering::Relaxed);
}
