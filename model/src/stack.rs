//! A Python stack as every part of gpuprof holds it: shared, not copied. A training process
//! makes tens of thousands of allocations a second from a few hundred distinct stacks, each
//! 30–40 frames deep; an event, an allocation, a rule's series and an output all point at the
//! one copy of a stack, and its hash is computed once, when it is made, so that keying maps by
//! stack costs the same for a 40-frame stack as for an empty one.
//!
//! Its frames, the frames that stand for something else (a native module, a backward block's
//! autograd node), and how a stack was found (`StackOrigin`) are defined here too.

use std::collections::HashSet;
use std::hash::{Hash, Hasher};
use std::ops::Deref;
use std::sync::{Arc, LazyLock};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Python frames, innermost first; empty when the thread had none.
#[derive(Clone)]
pub struct Stack(Arc<Inner>);

struct Inner {
    hash: u64,
    frames: Box<[Frame]>,
}

static EMPTY: LazyLock<Stack> = LazyLock::new(|| Stack::new(Vec::new()));

/// A hash of the frames that is the same in every process and every run (the recording's and
/// the profiles' stack identities do not depend on a random seed).
fn content_hash(frames: &[Frame]) -> u64 {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    frames.hash(&mut hasher);
    hasher.finish()
}

impl Stack {
    pub fn new(frames: Vec<Frame>) -> Stack {
        Stack(Arc::new(Inner { hash: content_hash(&frames), frames: frames.into_boxed_slice() }))
    }

    /// The empty stack (shared: making one allocates nothing).
    pub fn empty() -> Stack {
        EMPTY.clone()
    }

    pub fn frames(&self) -> &[Frame] {
        &self.0.frames
    }

    /// The content hash, computed once.
    pub(crate) fn content_hash(&self) -> u64 {
        self.0.hash
    }

    /// True when both are the very same shared stack (not only equal frames).
    pub fn same(&self, other: &Stack) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// The file of the frame that stands for native code: a call made without Python frames,
/// named by the module that made it.
pub(crate) const NATIVE_FILE: &str = "<native>";

impl Stack {
    /// These frames under one naming the backward pass (`StackOrigin::BackwardCaller`): a driver
    /// call one of autograd's threads made while the thread with these frames ran the pass.
    pub fn under_backward_pass(&self) -> Stack {
        let pass = Frame { function: BACKWARD_PASS.to_string(), file: AUTOGRAD_FILE.to_string(), line: 0 };
        Stack::new(std::iter::once(pass).chain(self.frames().iter().cloned()).collect())
    }

    /// One frame, `[libnccl.so.2]` in `<native>`, for what a module did with no Python frame on
    /// the thread: views, findings, exports and profiles group such memory by it. Shared per
    /// module.
    pub(crate) fn of_module(module: &str) -> Stack {
        static MODULES: LazyLock<std::sync::Mutex<std::collections::HashMap<String, Stack>>> =
            LazyLock::new(Default::default);
        let mut modules = MODULES.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(stack) = modules.get(module) {
            return stack.clone();
        }
        modules
            .entry(module.to_string())
            .or_insert_with(|| {
                Stack::new(vec![Frame { function: format!("[{module}]"), file: NATIVE_FILE.to_string(), line: 0 }])
            })
            .clone()
    }
}

impl Default for Stack {
    fn default() -> Self {
        Stack::empty()
    }
}

impl Deref for Stack {
    type Target = [Frame];

    fn deref(&self) -> &[Frame] {
        &self.0.frames
    }
}

impl PartialEq for Stack {
    fn eq(&self, other: &Stack) -> bool {
        self.same(other) || (self.0.hash == other.0.hash && self.0.frames == other.0.frames)
    }
}

impl Eq for Stack {}

impl Hash for Stack {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.0.hash);
    }
}

impl PartialOrd for Stack {
    fn partial_cmp(&self, other: &Stack) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Stack {
    fn cmp(&self, other: &Stack) -> std::cmp::Ordering {
        self.frames().cmp(other.frames())
    }
}

impl std::fmt::Debug for Stack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.frames()).finish()
    }
}

impl From<Vec<Frame>> for Stack {
    fn from(frames: Vec<Frame>) -> Stack {
        Stack::new(frames)
    }
}

impl From<&[Frame]> for Stack {
    fn from(frames: &[Frame]) -> Stack {
        Stack::new(frames.to_vec())
    }
}

impl Serialize for Stack {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.frames().serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Stack {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Stack, D::Error> {
        Vec::<Frame>::deserialize(deserializer).map(Stack::new)
    }
}

/// Each distinct stack once: readers of recorded events (jsonl, OTLP) intern what they decode,
/// so that a million events from the same line share one stack.
#[derive(Default)]
pub struct StackTable {
    stacks: HashSet<Stack>,
}

impl StackTable {
    /// The shared copy of `stack`'s frames (`stack` itself the first time they are seen).
    pub fn intern(&mut self, stack: Stack) -> Stack {
        if stack.is_empty() {
            return Stack::empty();
        }
        if let Some(known) = self.stacks.get(&stack) {
            return known.clone();
        }
        self.stacks.insert(stack.clone());
        stack
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.stacks.len()
    }

    /// Forgets stacks nothing but the table holds any more.
    pub fn forget_unused(&mut self) {
        self.stacks.retain(|s| Arc::strong_count(&s.0) > 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(function: &str, line: u32) -> Frame {
        Frame { function: function.into(), file: "train.py".into(), line }
    }

    #[test]
    fn equal_frames_are_equal_stacks_with_the_same_hash() {
        let a = Stack::new(vec![frame("step", 7), frame("main", 20)]);
        let b = Stack::new(vec![frame("step", 7), frame("main", 20)]);
        let c = Stack::new(vec![frame("step", 8), frame("main", 20)]);
        assert_eq!(a, b);
        assert!(!a.same(&b));
        assert_eq!(a.content_hash(), b.content_hash());
        assert_ne!(a, c);
        assert_eq!(&a[..], &[frame("step", 7), frame("main", 20)]);
        assert_eq!(
            serde_json::to_string(&a).unwrap(),
            r#"[{"function":"step","file":"train.py","line":7},{"function":"main","file":"train.py","line":20}]"#
        );
        let back: Stack = serde_json::from_str(&serde_json::to_string(&a).unwrap()).unwrap();
        assert_eq!(back, a);
    }

    #[test]
    fn the_table_keeps_one_copy_and_empty_stacks_share_one() {
        let mut table = StackTable::default();
        let first = table.intern(Stack::new(vec![frame("step", 7)]));
        let again = table.intern(Stack::new(vec![frame("step", 7)]));
        assert!(first.same(&again));
        assert_eq!(table.len(), 1);
        assert!(table.intern(Stack::new(Vec::new())).same(&Stack::empty()));
        assert!(Stack::default().same(&Stack::empty()));
    }
}

/// One Python frame.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Frame {
    pub function: String,
    pub file: String,
    pub line: u32,
}

/// "train.py:42 in step"; the frame standing for a module with no Python stack
/// (`Stack::of_module`) as "[libnccl.so.2]"; the frame naming a backward block's autograd node
/// as "AddmmBackward0 (backward)".
impl std::fmt::Display for Frame {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.native_module().is_some() {
            write!(f, "{}", self.function)
        } else if self.autograd_node() == Some(BACKWARD_PASS) {
            write!(f, "({BACKWARD_PASS})")
        } else if self.autograd_node().is_some() {
            write!(f, "{} (backward)", self.function)
        } else {
            write!(f, "{}:{} in {}", self.file, self.line, self.function)
        }
    }
}

impl Frame {
    /// The module, when this frame stands for native code with no Python stack
    /// (`Stack::of_module`): "libnccl.so.2" of "[libnccl.so.2]".
    pub fn native_module(&self) -> Option<&str> {
        (self.file == NATIVE_FILE).then(|| self.function.trim_start_matches('[').trim_end_matches(']'))
    }

    /// The node, when this frame marks a backward block's forward stack (`autograd`).
    pub fn autograd_node(&self) -> Option<&str> {
        (self.file == AUTOGRAD_FILE).then_some(self.function.as_str())
    }
}

/// How the Python stack of an event was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StackOrigin {
    /// The forward call that made the event's autograd node.
    Forward,
    /// The node's forward op allocated nothing and its neighbours differ: the forward line just
    /// before the node was made.
    ForwardNear,
    /// A driver call on one of autograd's threads, which have no Python frames: the stack of the
    /// thread that runs the backward pass (the process's main thread, waiting in
    /// `loss.backward()`), under a frame naming the pass.
    BackwardCaller,
}

impl StackOrigin {
    pub fn as_str(self) -> &'static str {
        match self {
            StackOrigin::Forward => "forward",
            StackOrigin::ForwardNear => "forward_near",
            StackOrigin::BackwardCaller => "backward_caller",
        }
    }
}

/// The file of the frame that marks a backward block's stack: its innermost frame names the
/// node ("AddmmBackward0"), the frames outside it are the node's forward stack.
pub(crate) const AUTOGRAD_FILE: &str = "<autograd>";

/// The function of the `AUTOGRAD_FILE` frame over a `StackOrigin::BackwardCaller` stack: the
/// frames outside it are the thread that runs the backward pass, not a node's forward call.
pub(crate) const BACKWARD_PASS: &str = "backward pass";
