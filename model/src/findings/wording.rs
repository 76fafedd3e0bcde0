//! How findings say things: one place for bytes, frames and process names in sentences.

use crate::bytes::human;
use super::user_frame;
use crate::event::Frame;

/// "at train.py:88 in evaluate": the user's own line (see `user_frame`), with the library
/// function that made the call when that is another frame, or a note that there was no Python
/// frame.
pub fn at(stack: &[Frame]) -> String {
    if let Some(module) = stack.first().and_then(Frame::native_module) {
        return format!("called from {module} (no Python stack)");
    }
    match (user_frame(stack), stack.first()) {
        (Some(user), Some(innermost)) if user != innermost => {
            format!("at {}:{} in {} (through {})", user.file, user.line, user.function, innermost.function)
        }
        (_, Some(frame)) => format!("at {}:{} in {}", frame.file, frame.line, frame.function),
        (_, None) => "(no Python stack)".to_string(),
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
