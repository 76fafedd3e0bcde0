//! How findings say things: one place for bytes, frames and process names in sentences.

use crate::bytes::human;
use crate::event::Frame;

/// "train.py:88 in forward", or a note that the call had no Python frame.
pub fn at(stack: &[Frame]) -> String {
    match stack.first() {
        Some(frame) => format!("at {}:{} in {}", frame.file, frame.line, frame.function),
        None => "(no Python stack)".to_string(),
    }
}

/// "pid 4711 (python3)".
pub fn process(pid: u32, comm: &str) -> String {
    if comm.is_empty() {
        format!("pid {pid}")
    } else {
        format!("pid {pid} ({comm})")
    }
}

pub fn bytes(bytes: u64) -> String {
    human(bytes)
}

/// "1 allocation", "3 allocations".
pub fn count(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}
