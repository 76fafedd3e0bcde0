//! What was live at chosen instants, by stack, compactly: every Python stack is a node of one
//! trie (outermost frame at the root, so stacks share their common start), every frame is
//! written once, and an instant is a list of (process, kind, stack node, bytes, blocks) plus its
//! largest blocks. The page builds its icicle graph and tables from these.

use std::collections::HashMap;

use gpuprof_model::event::{Frame, Kind};
use gpuprof_model::stack::Stack;
use gpuprof_model::track::{Allocation, ProcessMemory};
use serde::Serialize;

/// Largest blocks kept an instant, of tensors and of driver allocations each.
const TOP_BLOCKS: usize = 40;

/// The kinds an entry names: 0 for the allocator's blocks (tensors), then the driver's kinds,
/// then what the allocator reserves beyond its live blocks (its cache: one entry per process,
/// with no stack), which a view of tensors shows beside them: at an out-of-memory failure the
/// caches are often what filled the device.
pub(crate) fn kind_names() -> Vec<&'static str> {
    std::iter::once("tensors").chain(Kind::ALL.iter().map(|k| k.as_str())).chain(std::iter::once(CACHE)).collect()
}

const CACHE: &str = "cache";
const CACHE_KIND: u8 = 1 + Kind::ALL.len() as u8;

fn kind_index(kind: Kind) -> u8 {
    1 + Kind::ALL.iter().position(|k| *k == kind).expect("every kind is in Kind::ALL") as u8
}

/// How a frame is drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum FrameClass {
    /// The standard library or an installed package.
    Library,
    /// The user's own code (what `user_frame` picks from).
    User,
    /// The frame naming the autograd node whose forward stack follows (backward blocks).
    Autograd,
    /// Native code with no Python frame (`[libnccl.so.2]`).
    Native,
}

/// Frames and the stack trie, columns side by side (compact JSON).
#[derive(Debug, Default, Serialize)]
pub(crate) struct Stacks {
    pub function: Vec<String>,
    pub file: Vec<String>,
    pub line: Vec<u32>,
    pub class: Vec<FrameClass>,
    /// Node 0 is the root (no frame); every other node is a frame under its parent.
    pub parent: Vec<u32>,
    pub frame: Vec<u32>,
    #[serde(skip)]
    frames: HashMap<Frame, u32>,
    #[serde(skip)]
    children: HashMap<(u32, u32), u32>,
    #[serde(skip)]
    leaves: HashMap<Stack, u32>,
}

impl Stacks {
    pub(crate) fn new() -> Stacks {
        Stacks { parent: vec![0], frame: vec![u32::MAX], ..Stacks::default() }
    }

    /// The node of a stack's innermost frame (0 for an empty stack).
    pub(crate) fn node(&mut self, stack: &Stack) -> u32 {
        if let Some(&node) = self.leaves.get(stack) {
            return node;
        }
        let mut node = 0;
        for frame in stack.frames().iter().rev() {
            let frame = self.frame_index(frame);
            node = match self.children.get(&(node, frame)) {
                Some(&child) => child,
                None => {
                    let child = self.parent.len() as u32;
                    self.parent.push(node);
                    self.frame.push(frame);
                    self.children.insert((node, frame), child);
                    child
                }
            };
        }
        self.leaves.insert(stack.clone(), node);
        node
    }

    fn frame_index(&mut self, frame: &Frame) -> u32 {
        if let Some(&index) = self.frames.get(frame) {
            return index;
        }
        let index = self.function.len() as u32;
        let class = if frame.autograd_node().is_some() {
            FrameClass::Autograd
        } else if frame.native_module().is_some() {
            FrameClass::Native
        } else if gpuprof_model::user_frame(std::slice::from_ref(frame)).is_some() {
            FrameClass::User
        } else {
            FrameClass::Library
        };
        self.function.push(frame.function.clone());
        self.file.push(frame.file.clone());
        self.line.push(frame.line);
        self.class.push(class);
        self.frames.insert(frame.clone(), index);
        index
    }
}

/// Live memory at one instant.
#[derive(Debug, Default, Serialize)]
pub(crate) struct Snapshot {
    /// Nanoseconds after the first event: the state after every event up to then.
    pub t: u64,
    /// "peak", "end", "finding 3", or empty for an instant of the regular grid.
    pub label: String,
    /// Processes whose views count tensors (their allocator reported), as `--layer auto` does.
    pub tensors: Vec<u32>,
    /// Entries, one per (process, kind, stack): columns.
    pub p: Vec<u32>,
    pub k: Vec<u8>,
    pub n: Vec<u32>,
    pub b: Vec<u64>,
    pub c: Vec<u32>,
    /// The largest live blocks (tensors) and driver allocations.
    pub blocks: Blocks,
}

#[derive(Debug, Default, Serialize)]
pub(crate) struct Blocks {
    pub p: Vec<u32>,
    pub k: Vec<u8>,
    pub n: Vec<u32>,
    pub size: Vec<u64>,
    /// Hexadecimal addresses.
    pub addr: Vec<String>,
    /// When each was allocated, nanoseconds after the first event.
    pub since: Vec<u64>,
}

/// Takes a snapshot of `processes` (the live ones, each with its index in the report).
pub(crate) fn take(
    t: u64,
    label: String,
    processes: &[(u32, &ProcessMemory)],
    first_ts: u64,
    stacks: &mut Stacks,
) -> Snapshot {
    let mut snapshot = Snapshot { t, label, ..Snapshot::default() };
    let mut entries: HashMap<(u32, u8, u32), (u64, u32)> = HashMap::new();
    let mut tensors: Vec<(u32, &Allocation)> = Vec::new();
    let mut driver: Vec<(u32, &Allocation)> = Vec::new();
    for &(index, process) in processes {
        if crate::export::request::StackLayer::Auto.counts_tensors(process) {
            snapshot.tensors.push(index);
            let cached: u64 = process.allocator_totals().values().map(|t| t.reserved.saturating_sub(t.allocated)).sum();
            if cached > 0 {
                entries.insert((index, CACHE_KIND, 0), (cached, 0));
            }
        }
        for block in process.blocks_unordered() {
            let entry = entries.entry((index, 0, stacks.node(&block.stack))).or_default();
            entry.0 += block.size;
            entry.1 += 1;
            tensors.push((index, block));
        }
        for allocation in process.allocations_unordered() {
            let entry =
                entries.entry((index, kind_index(allocation.kind), stacks.node(&allocation.stack))).or_default();
            entry.0 += allocation.size;
            entry.1 += 1;
            driver.push((index, allocation));
        }
    }
    let mut entries: Vec<_> = entries.into_iter().collect();
    entries.sort_unstable_by(|a, b| b.1 .0.cmp(&a.1 .0).then(a.0.cmp(&b.0)));
    for ((p, k, n), (bytes, count)) in entries {
        snapshot.p.push(p);
        snapshot.k.push(k);
        snapshot.n.push(n);
        snapshot.b.push(bytes);
        snapshot.c.push(count);
    }
    for (kind, mut live) in [(None, tensors), (Some(()), driver)] {
        let keep = TOP_BLOCKS.min(live.len());
        let largest = |a: &(u32, &Allocation), b: &(u32, &Allocation)| {
            b.1.size.cmp(&a.1.size).then(a.1.ts.cmp(&b.1.ts)).then(a.1.addr.cmp(&b.1.addr))
        };
        if keep < live.len() {
            live.select_nth_unstable_by(keep, largest);
            live.truncate(keep);
        }
        live.sort_unstable_by(largest);
        for (p, allocation) in live {
            snapshot.blocks.p.push(p);
            snapshot.blocks.k.push(if kind.is_none() { 0 } else { kind_index(allocation.kind) });
            snapshot.blocks.n.push(stacks.node(&allocation.stack));
            snapshot.blocks.size.push(allocation.size);
            snapshot.blocks.addr.push(format!("{:#x}", allocation.addr));
            snapshot.blocks.since.push(allocation.ts.saturating_sub(first_ts));
        }
    }
    snapshot
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(function: &str, file: &str, line: u32) -> Frame {
        Frame { function: function.into(), file: file.into(), line }
    }

    #[test]
    fn the_cache_is_the_last_kind() {
        assert_eq!(kind_names()[CACHE_KIND as usize], "cache");
        assert_eq!(kind_names()[kind_index(Kind::Pool) as usize], "pool");
    }

    #[test]
    fn stacks_share_their_outer_frames_and_frames_are_written_once() {
        let mut stacks = Stacks::new();
        let main = frame("<module>", "/app/train.py", 40);
        let step = frame("step", "/app/train.py", 12);
        let linear = frame("forward", "/usr/lib/python3.12/site-packages/torch/nn/modules/linear.py", 125);
        let a = Stack::new(vec![linear.clone(), step.clone(), main.clone()]);
        let b = Stack::new(vec![step.clone(), main.clone()]);
        let a_node = stacks.node(&a);
        let b_node = stacks.node(&b);
        assert_eq!(stacks.node(&Stack::new(vec![linear, step, main])), a_node);
        assert_eq!(stacks.parent[a_node as usize], b_node);
        assert_eq!(stacks.function, vec!["<module>", "step", "forward"]);
        assert_eq!(stacks.class, vec![FrameClass::User, FrameClass::User, FrameClass::Library]);
        assert_eq!(stacks.parent.len(), 4);
        assert_eq!(stacks.node(&Stack::empty()), 0);
    }
}
