//! The forward line of a backward-pass block. PyTorch runs the backward pass on its own threads,
//! which have no Python frames; what it keeps is the autograd node each block is made for, and the
//! node's sequence number and creating thread. Every node a thread makes takes that thread's next
//! sequence number, just before its forward op computes its outputs; so a forward block whose
//! thread's counter read `s + 1` right after node `s` was made is that op's output, and its Python
//! stack is the forward line of node `s` (PyTorch's profiler links backward to forward ops by the
//! same pair of numbers). Captures record the counter on every allocator event and the node on
//! backward ones; this matches them.
//!
//! A node whose forward op allocated nothing (a view, an in-place op) has no block of its own:
//! when the blocks just before and just after it on its thread share a stack (the op was part of
//! one line, like `F.linear`'s transpose), that is its line; otherwise the line before it is
//! taken and marked `forward_near`.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use crate::event::{Event, Layer, Op};
use crate::stack::{Frame, Stack, StackOrigin, AUTOGRAD_FILE};

/// Sequence numbers remembered per forward thread: a backward pass follows its forward within a
/// few thousand nodes; a graph kept for a later backward (`retain_graph`) that much older gets
/// no forward line.
const WINDOW: u64 = 1 << 16;
/// Marked stacks remembered (one per forward line and node class, a few thousand in a model).
const MARKED_MAX: usize = 1 << 16;

#[derive(Default)]
pub struct ForwardStacks {
    /// (pid, forward thread) → counter value → the first and last forward allocation stacks seen at it.
    threads: HashMap<(u32, u64), BTreeMap<u64, Seen>>,
    marked: HashMap<(u64, Arc<str>), Stack>,
}

struct Seen {
    first: Stack,
    last: Stack,
}

impl ForwardStacks {
    /// Learns from a forward allocation; gives a backward block its node's forward stack.
    pub(crate) fn attribute(&mut self, event: &mut Event) {
        if event.layer != Layer::Allocator || !event.succeeded() {
            return;
        }
        let (Some(seq), Some(thread)) = (event.autograd_seq, event.autograd_thread) else { return };
        match event.autograd_node.clone() {
            None if event.op == Op::Alloc && !event.stack.is_empty() => {
                self.observe(event.pid, thread, seq, &event.stack)
            }
            None => {}
            Some(node) => {
                if let Some((forward, origin)) = self.forward_of(event.pid, thread, seq) {
                    event.stack = self.marked(&forward, &node);
                    event.stack_origin = Some(origin);
                }
            }
        }
    }

    /// The next event of a stream, in order: attributed (a block already given its forward line,
    /// as in a recording of a live capture, is left as it is), and a process that exits or runs
    /// another program forgotten.
    pub fn follow(&mut self, event: &mut Event) {
        if event.stack_origin.is_none() {
            self.attribute(event);
        }
        if event.layer == Layer::Process && matches!(event.op, Op::Exec | Op::Exit) {
            self.forget(event.pid);
        }
    }

    /// The process ended or runs another program.
    pub(crate) fn forget(&mut self, pid: u32) {
        self.threads.retain(|(p, _), _| *p != pid);
    }

    fn observe(&mut self, pid: u32, thread: u64, counter: u64, stack: &Stack) {
        let seen = self.threads.entry((pid, thread)).or_default();
        match seen.get_mut(&counter) {
            Some(at) => at.last = stack.clone(),
            None => {
                seen.insert(counter, Seen { first: stack.clone(), last: stack.clone() });
                while seen.first_key_value().is_some_and(|(&oldest, _)| oldest + WINDOW < counter) {
                    seen.pop_first();
                }
            }
        }
    }

    fn forward_of(&self, pid: u32, thread: u64, node: u64) -> Option<(Stack, StackOrigin)> {
        let seen = self.threads.get(&(pid, thread))?;
        let after = node.checked_add(1)?;
        if let Some(own) = seen.get(&after) {
            return Some((own.first.clone(), StackOrigin::Forward));
        }
        let before = seen.range(..=node).next_back().map(|(_, at)| &at.last);
        let next = seen.range(after..).next().map(|(_, at)| &at.first);
        match (before, next) {
            (Some(before), Some(next)) if before == next => Some((before.clone(), StackOrigin::Forward)),
            (Some(before), _) => Some((before.clone(), StackOrigin::ForwardNear)),
            // Older than anything remembered (made before the capture began, or long ago).
            (None, _) => None,
        }
    }

    /// The forward stack with the node's frame inside it, shared per (stack, node).
    fn marked(&mut self, forward: &Stack, node: &Arc<str>) -> Stack {
        let key = (forward.content_hash(), node.clone());
        if let Some(stack) = self.marked.get(&key).filter(|s| &s.frames()[1..] == forward.frames()) {
            return stack.clone();
        }
        if self.marked.len() >= MARKED_MAX {
            self.marked.clear();
        }
        let mut frames = Vec::with_capacity(forward.frames().len() + 1);
        frames.push(Frame { function: node.to_string(), file: AUTOGRAD_FILE.to_string(), line: 0 });
        frames.extend_from_slice(forward.frames());
        let stack = Stack::new(frames);
        self.marked.insert(key, stack.clone());
        stack
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::Source;
    use std::borrow::Cow;

    fn stack(line: u32) -> Stack {
        Stack::new(vec![Frame { function: "forward".into(), file: "/srv/model.py".into(), line }])
    }

    fn block(op: Op, seq: u64, node: Option<&str>, own: Stack) -> Event {
        let mut event = Event::new(
            1,
            10,
            11,
            Source::Ebpf,
            Layer::Allocator,
            op,
            Cow::Borrowed("c10::reportMemoryUsageToProfiler"),
        );
        event.autograd_seq = Some(seq);
        event.autograd_thread = Some(1);
        event.autograd_node = node.map(Arc::from);
        event.stack = own;
        event
    }

    fn lines(event: &Event) -> Vec<(String, u32)> {
        event.stack.frames().iter().map(|f| (f.function.clone(), f.line)).collect()
    }

    #[test]
    fn backward_blocks_get_the_line_of_their_nodes_forward_op() {
        let mut stacks = ForwardStacks::default();
        // A forward block carries its thread's counter: node 7 (line 20) allocates at 8; node 8
        // (line 21, a view) allocates nothing; node 9 (line 22) allocates at 10; line 23 makes
        // node 10 (a transpose, nothing), node 11 (allocates at 12), node 12 (a view, nothing)
        // and node 13 (allocates at 14).
        for (op, seq, line) in [
            (Op::Alloc, 7, 19),
            (Op::Alloc, 8, 20),
            (Op::Free, 8, 30),
            (Op::Alloc, 10, 22),
            (Op::Alloc, 12, 23),
            (Op::Alloc, 14, 23),
        ] {
            stacks.attribute(&mut block(op, seq, None, stack(line)));
        }
        fn backward(stacks: &mut ForwardStacks, seq: u64, node: &str) -> (Vec<(String, u32)>, Option<StackOrigin>) {
            let mut event = block(Op::Alloc, seq, Some(node), Stack::empty());
            stacks.attribute(&mut event);
            (lines(&event), event.stack_origin)
        }
        let marked = |node: &str, line| vec![(node.to_string(), 0), ("forward".to_string(), line)];
        assert_eq!(
            backward(&mut stacks, 7, "AddmmBackward0"),
            (marked("AddmmBackward0", 20), Some(StackOrigin::Forward))
        );
        assert_eq!(backward(&mut stacks, 9, "MulBackward0"), (marked("MulBackward0", 22), Some(StackOrigin::Forward)));
        assert_eq!(backward(&mut stacks, 11, "MmBackward0"), (marked("MmBackward0", 23), Some(StackOrigin::Forward)));
        // Line 23 before it and after it.
        assert_eq!(
            backward(&mut stacks, 12, "UnsafeViewBackward0"),
            (marked("UnsafeViewBackward0", 23), Some(StackOrigin::Forward))
        );
        // Line 20 before it (the free is not a forward op's output), line 22 after it: the one
        // before, marked near; likewise line 22 and 23 around the transpose.
        assert_eq!(
            backward(&mut stacks, 8, "ViewBackward0"),
            (marked("ViewBackward0", 20), Some(StackOrigin::ForwardNear))
        );
        assert_eq!(backward(&mut stacks, 10, "TBackward0"), (marked("TBackward0", 22), Some(StackOrigin::ForwardNear)));
        // Another process's thread 1, or a node older than anything seen: none.
        let mut other = block(Op::Alloc, 7, Some("AddmmBackward0"), Stack::empty());
        other.pid = 99;
        stacks.attribute(&mut other);
        assert_eq!((other.stack.is_empty(), other.stack_origin), (true, None));
        assert_eq!(backward(&mut stacks, 3, "AddBackward0"), (Vec::new(), None));
        // One marked stack per (line, node).
        let mut a = block(Op::Alloc, 7, Some("AddmmBackward0"), Stack::empty());
        let mut b = block(Op::Free, 7, Some("AddmmBackward0"), Stack::empty());
        stacks.attribute(&mut a);
        stacks.attribute(&mut b);
        assert!(a.stack.same(&b.stack));
        stacks.forget(10);
        assert_eq!(backward(&mut stacks, 7, "AddmmBackward0"), (Vec::new(), None));
    }

    #[test]
    fn a_stream_keeps_given_forward_lines_and_forgets_a_process_at_its_exit() {
        let mut stacks = ForwardStacks::default();
        stacks.follow(&mut block(Op::Alloc, 8, None, stack(20)));
        // Already given its line (a recording of a live run): left as it is.
        let mut given = block(Op::Alloc, 7, Some("AddmmBackward0"), stack(99));
        given.stack_origin = Some(StackOrigin::ForwardNear);
        stacks.follow(&mut given);
        assert_eq!(
            (lines(&given), given.stack_origin),
            (vec![("forward".to_string(), 99)], Some(StackOrigin::ForwardNear))
        );
        let mut found = block(Op::Alloc, 7, Some("AddmmBackward0"), Stack::empty());
        stacks.follow(&mut found);
        assert_eq!(
            (lines(&found), found.stack_origin),
            (vec![("AddmmBackward0".to_string(), 0), ("forward".to_string(), 20)], Some(StackOrigin::Forward))
        );
        let mut exit = Event::new(2, 10, 10, Source::Ebpf, Layer::Process, Op::Exit, Cow::Borrowed("exit"));
        stacks.follow(&mut exit);
        let mut after = block(Op::Alloc, 7, Some("AddmmBackward0"), Stack::empty());
        stacks.follow(&mut after);
        assert_eq!((after.stack.is_empty(), after.stack_origin), (true, None));
    }

    #[test]
    fn old_sequence_numbers_are_let_go() {
        let mut stacks = ForwardStacks::default();
        stacks.attribute(&mut block(Op::Alloc, 1, None, stack(1)));
        stacks.attribute(&mut block(Op::Alloc, 2 + WINDOW, None, stack(2)));
        assert_eq!(stacks.threads[&(10, 1)].keys().copied().collect::<Vec<_>>(), vec![2 + WINDOW]);
    }
}
