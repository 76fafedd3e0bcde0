//! How findings say things: one place for bytes, frames and process names in sentences.

use super::user_frame;
use crate::bytes::human;
use crate::event::Frame;

/// "at train.py:88 in evaluate": the user's own line (see `user_frame`), with the library
/// function that made the call when that is another frame, or a note that there was no Python
/// frame.
pub(crate) fn at(stack: &[Frame]) -> String {
    if let Some(module) = stack.first().and_then(Frame::native_module) {
        return format!("called from {module} (no Python stack)");
    }
    if stack.first().and_then(Frame::autograd_node) == Some(crate::stack::BACKWARD_PASS) {
        return format!("in the backward pass run {}", at(&stack[1..]));
    }
    if let Some(node) = stack.first().and_then(Frame::autograd_node) {
        return format!("in {node} (backward pass) of the forward call {}", at(&stack[1..]));
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

pub(crate) fn bytes(bytes: u64) -> String {
    human(bytes)
}

/// "1 allocation", "3 allocations".
pub fn count(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// "about 4 minutes": a span of time as a person would round it.
pub(crate) fn duration(seconds: f64) -> String {
    let (value, unit) = match seconds {
        s if s < 90.0 => (s, "second"),
        s if s < 90.0 * 60.0 => (s / 60.0, "minute"),
        s if s < 36.0 * 3600.0 => (s / 3600.0, "hour"),
        s => (s / 86400.0, "day"),
    };
    let value = value.round().max(1.0) as u64;
    format!("about {value} {unit}{}", if value == 1 { "" } else { "s" })
}

/// "in about 4 minutes", or "now" when no time is left.
pub fn within(seconds: f64) -> String {
    if seconds < 1.0 {
        "now".to_string()
    } else {
        format!("in {}", duration(seconds))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(function: &str, file: &str, line: u32) -> Frame {
        Frame { function: function.into(), file: file.into(), line }
    }

    #[test]
    fn where_memory_was_asked_for() {
        let forward = [
            frame("Linear.forward", "/venv/lib/python3.12/site-packages/torch/nn/modules/linear.py", 134),
            frame("Block.forward", "/srv/model.py", 58),
        ];
        assert_eq!(at(&forward), "at /srv/model.py:58 in Block.forward (through Linear.forward)");
        let backward: Vec<Frame> =
            std::iter::once(frame("AddmmBackward0", crate::stack::AUTOGRAD_FILE, 0)).chain(forward).collect();
        assert_eq!(at(&backward), "in AddmmBackward0 (backward pass) of the forward call at /srv/model.py:58 in Block.forward (through Linear.forward)");
        assert_eq!(backward[0].to_string(), "AddmmBackward0 (backward)");
        let caller = [
            frame(crate::stack::BACKWARD_PASS, crate::stack::AUTOGRAD_FILE, 0),
            frame("backward", "/venv/lib/python3.12/site-packages/torch/autograd/__init__.py", 353),
            frame("step", "/srv/train.py", 31),
        ];
        assert_eq!(at(&caller), "in the backward pass run at /srv/train.py:31 in step (through backward)");
        assert_eq!(caller[0].to_string(), "(backward pass)");
        assert_eq!(
            at(&[frame("[libnccl.so.2]", crate::stack::NATIVE_FILE, 0)]),
            "called from libnccl.so.2 (no Python stack)"
        );
        assert_eq!(at(&[]), "(no Python stack)");
    }

    #[test]
    fn time_left_as_a_person_rounds_it() {
        assert_eq!(within(0.4), "now");
        assert_eq!(within(1.2), "in about 1 second");
        assert_eq!(within(245.0), "in about 4 minutes");
        assert_eq!(duration(3.0 * 3600.0), "about 3 hours");
        assert_eq!(duration(5.0 * 86400.0), "about 5 days");
    }
}
