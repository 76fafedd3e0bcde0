//! One call, recorded by the thread that made it: its pid and tid, its Python stack (walked by
//! `python_stack`: its hash, its frames sent once), and how many code descriptions were queued before
//! it. The producers (`allocator`, `cupti`'s callback) call this; the sender reads the record.

use crate::python_stack;
use crate::queue::{self, Call};
use crate::timing::{self, Phase};

/// Records a call made at `ts_ns` by this thread, with its Python stack.
pub fn record(ts_ns: u64, call: Call) {
    let walking = timing::stamp();
    let python_stack::Walked { pid, tid, stack } = python_stack::walk();
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
