//! `growth`: live device memory attributed to a stack (in one process) rose at the end of each
//! of N consecutive windows, never coming back. A warm-up that plateaus, or churn that frees
//! what it allocates, stops the streak. Driver allocations and a framework allocator's blocks
//! (tensors) are followed apart: a leaking tensor shows in blocks long before segments.
//!
//! One finding per process instance: the tensors that grow and the segments that carry them are
//! one problem, and so are the several stacks a retained autograd graph grows at once. It names
//! the tensors when they grew (else the driver allocations), every stack that grew, and how much
//! the driver's memory grew meanwhile.
//!
//! A process recorded at the driver's level whose tensors are about to be recorded (the daemon
//! raised it, `expect_tensors`) has its driver-only finding held until they had their time: the
//! tensors' finding names the Python line that leaks, the driver's only the library that called
//! the driver (on PyTorch's autograd thread, often no Python at all). Held findings go out when
//! that time is up without one on tensors, when the process ends, or when the capture does.

use std::collections::{BTreeSet, HashMap, HashSet};

use super::{wording, Finding, FindingKind, RuleConfig, StackBytes};
use crate::event::{Event, Layer, Op};
use crate::track::{ProcessMemory, ProcessRef, Space, Stack, Tracker};

/// Stacks a finding lists.
const TOP_STACKS: usize = 5;

type Key = (ProcessRef, Layer, Stack);

#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
struct Series {
    live: u64,
    count: u64,
    /// Live bytes at the last window end.
    sampled: u64,
    rises: u32,
    streak_bytes: u64,
    streak_ts: u64,
    reported: bool,
    comm: std::sync::Arc<str>,
    api: std::borrow::Cow<'static, str>,
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct Rule {
    config: RuleConfig,
    window_end: Option<u64>,
    series: HashMap<Key, Series>,
    /// The allocation a free is about to release (found before the tracker forgets it).
    releasing: Option<(Key, u64)>,
    /// Processes with a growth finding.
    reported: HashSet<ProcessRef>,
    /// Processes whose tensors are recorded from now on, by pid: until when a driver-only
    /// finding waits for theirs.
    #[serde(default)]
    awaiting: HashMap<u32, u64>,
    /// Driver-only findings held meanwhile.
    #[serde(default)]
    held: HashMap<ProcessRef, Finding>,
}

impl Rule {
    pub fn new(config: RuleConfig) -> Self {
        Rule {
            config,
            window_end: None,
            series: HashMap::new(),
            releasing: None,
            reported: HashSet::new(),
            awaiting: HashMap::new(),
            held: HashMap::new(),
        }
    }

    /// Process `pid` is recorded at the tensors' level until `until` (ns): a finding on its
    /// driver allocations alone waits until then for one on its tensors.
    pub fn expect_tensors(&mut self, pid: u32, until: u64) {
        self.awaiting.insert(pid, until);
    }

    /// Drops what is kept of processes the tracker no longer knows.
    pub fn forget_unless(&mut self, known: impl Fn(ProcessRef) -> bool) {
        self.reported.retain(|process| known(*process));
    }

    /// Closes the windows that ended before this event; notes what a free releases.
    pub fn before(&mut self, event: &Event, world: &Tracker) -> Vec<Finding> {
        let mut found = self.close_windows(event.ts, world);
        if event.layer == Layer::Process && matches!(event.op, Op::Exit | Op::Exec) {
            // The process is over (or another program): what it held is its finding.
            self.awaiting.remove(&event.pid);
            found.extend(self.release(|process| process.pid == event.pid));
        }
        self.releasing = None;
        if event.op == Op::Free && event.succeeded() {
            if let Some(process) = world.process(event.pid) {
                let released = match event.layer {
                    Layer::Driver => process.released_by(event).filter(|a| a.is_device_memory()),
                    Layer::Allocator => event.addr.and_then(|addr| process.block(addr)),
                    Layer::Process => None,
                };
                if let Some(allocation) = released {
                    self.releasing = Some(((process.as_ref(), event.layer, allocation.stack.clone()), allocation.size));
                }
            }
        }
        found
    }

    /// Counts what the event allocated or released, once the tracker has applied it.
    pub fn after(&mut self, event: &Event, world: &Tracker) {
        if let Some((key, size)) = self.releasing.take() {
            if let Some(series) = self.series.get_mut(&key) {
                series.live = series.live.saturating_sub(size);
                series.count = series.count.saturating_sub(1);
            }
            return;
        }
        match (event.layer, event.op) {
            (Layer::Driver | Layer::Allocator, Op::Alloc) if event.succeeded() => {
                let Some(process) = world.process(event.pid) else { return };
                let Some(kind) = event.kind else { return };
                let addr = event.addr.unwrap_or(0);
                let allocation = match event.layer {
                    Layer::Driver => process.allocation(Space::of(kind), addr).filter(|a| a.is_device_memory()),
                    _ => process.block(addr),
                };
                let Some(allocation) = allocation else { return };
                let series = self.series.entry((process.as_ref(), event.layer, allocation.stack.clone())).or_default();
                series.live += event.size;
                series.count += 1;
                // Compared first: the same name and entry point come again and again.
                if series.comm != process.comm {
                    series.comm = process.comm.clone();
                }
                if series.api != event.api {
                    series.api = event.api.clone();
                }
            }
            (Layer::Process, Op::Exit | Op::Exec | Op::Fork) => {
                self.series.retain(|(process, _, _), _| process.pid != event.pid);
            }
            _ => {}
        }
    }

    /// The capture ended at `ts`: windows that ended by then are judged; the partial one is not.
    /// Held findings go out.
    pub fn finish(&mut self, ts: u64, world: &Tracker) -> Vec<Finding> {
        let mut found = self.close_windows(ts, world);
        found.extend(self.release(|_| true));
        found.sort_by_key(|f| (f.pid, f.first_ts));
        found
    }

    /// The held findings of the processes `which` picks, reported now.
    fn release(&mut self, which: impl Fn(&ProcessRef) -> bool) -> Vec<Finding> {
        let processes: Vec<ProcessRef> = self.held.keys().filter(|p| which(p)).copied().collect();
        let mut found = Vec::new();
        for process in processes {
            if let Some(finding) = self.held.remove(&process) {
                self.reported.insert(process);
                found.push(finding);
            }
        }
        found
    }

    fn close_windows(&mut self, ts: u64, world: &Tracker) -> Vec<Finding> {
        let window = self.config.growth_window_ns.max(1);
        // Windows lie on the clock, not after the first event seen: a file that leaves out
        // events (a shell's fork, before the job) judges the same windows as the live capture.
        let end = *self.window_end.get_or_insert(ts - ts % window + window);
        if ts < end {
            return Vec::new();
        }
        let mut found = self.judge(end, world);
        let mut next = end + window;
        if ts >= next {
            // Whole windows without events: nothing moved, so every streak stops here.
            found.extend(self.judge(next, world));
            next += (ts - next) / window * window + window;
        }
        self.window_end = Some(next);
        found
    }

    fn judge(&mut self, window_end: u64, world: &Tracker) -> Vec<Finding> {
        let window = self.config.growth_window_ns.max(1);
        let mut grown: Vec<ProcessRef> = Vec::new();
        for ((process, _, _), series) in &mut self.series {
            if series.live > series.sampled {
                if series.rises == 0 {
                    series.streak_bytes = series.sampled;
                    series.streak_ts = window_end - window;
                }
                series.rises += 1;
            } else {
                series.rises = 0;
            }
            series.sampled = series.live;
            if series.rises >= self.config.growth_rises && !self.reported.contains(process) && !grown.contains(process)
            {
                grown.push(*process);
            }
        }
        self.awaiting.retain(|_, until| *until > window_end);
        let mut found = Vec::new();
        for process in grown {
            let (layer, finding) = self.finding(process, window_end, world);
            if layer == Layer::Driver && self.awaiting.contains_key(&process.pid) {
                // Kept as it stands now: the driver's memory may stop growing meanwhile.
                self.held.insert(process, finding);
                continue;
            }
            self.held.remove(&process);
            self.reported.insert(process);
            found.push(finding);
        }
        let awaited = |process: &ProcessRef| !self.awaiting.contains_key(&process.pid);
        let done: Vec<ProcessRef> = self.held.keys().filter(|p| awaited(p)).copied().collect();
        found.extend(self.release(|process| done.contains(process)));
        found.sort_by_key(|f| (f.pid, f.first_ts));
        found
    }

    /// The finding of a process whose stacks grew long enough: tensors when they grew, else
    /// driver allocations (the layer it names).
    fn finding(&self, process: ProcessRef, window_end: u64, world: &Tracker) -> (Layer, Finding) {
        let window = self.config.growth_window_ns.max(1);
        let streaking = |layer: Layer| -> Vec<(&Stack, &Series)> {
            let mut grew: Vec<(&Stack, &Series)> = self
                .series
                .iter()
                .filter(|((p, l, _), s)| *p == process && *l == layer && s.rises >= self.config.growth_rises)
                .map(|((_, _, stack), series)| (stack, series))
                .collect();
            grew.sort_by(|(a_stack, a), (b_stack, b)| grew_by(b).cmp(&grew_by(a)).then_with(|| a_stack.cmp(b_stack)));
            grew
        };
        let tensors = streaking(Layer::Allocator);
        let layer = if tensors.is_empty() { Layer::Driver } else { Layer::Allocator };
        let grew = if tensors.is_empty() { streaking(Layer::Driver) } else { tensors };
        let (main_stack, main) = grew[0];
        let bytes: u64 = grew.iter().map(|(_, s)| grew_by(s)).sum();
        let count: u64 = grew.iter().map(|(_, s)| s.count).sum();
        let live: u64 = grew.iter().map(|(_, s)| s.live).sum();
        let first_ts = grew.iter().map(|(_, s)| s.streak_ts).min().unwrap_or(main.streak_ts);
        let rises = grew.iter().map(|(_, s)| s.rises).max().unwrap_or(main.rises);
        let segment_bytes = (layer == Layer::Allocator)
            .then(|| world.process(process.pid).filter(|p| p.as_ref() == process))
            .flatten()
            .map(|p| segments_carrying(p, &grew, first_ts));
        let what = if layer == Layer::Allocator { "tensor memory (allocator blocks)" } else { "device memory" };
        let stacks = if grew.len() == 1 {
            String::new()
        } else {
            format!(" (and {} more stacks, {} in all)", grew.len() - 1, wording::bytes(bytes))
        };
        let segments = match segment_bytes {
            Some(segments) => format!("; the driver segments carrying them grew by {}", wording::bytes(segments)),
            None => String::new(),
        };
        let detail = format!(
            "live {what} allocated {} in {} grew by {}{stacks} over {} consecutive {:.1} s windows without coming back, to {} in {}{segments}: something keeps these allocations alive (a growing list or cache, a retained autograd graph: evaluation without torch.no_grad(), a loss summed without .item()).",
            wording::at(main_stack),
            wording::process(process.pid, &main.comm),
            wording::bytes(grew_by(main)),
            rises,
            window as f64 / 1e9,
            wording::bytes(live),
            wording::count(count, "allocation", "allocations"),
        );
        let mut finding = Finding::new(
            FindingKind::Growth,
            process.pid,
            &main.comm,
            bytes,
            count,
            first_ts,
            window_end,
            main_stack,
            detail,
        );
        finding.api = Some(main.api.to_string());
        finding.stacks = grew
            .iter()
            .take(TOP_STACKS)
            .map(|(stack, series)| StackBytes { stack: stack.to_vec(), bytes: grew_by(series), count: series.count })
            .collect();
        finding.segment_bytes = segment_bytes;
        (layer, finding)
    }
}

/// The segments allocated since `since` that carry blocks of the `grew` stacks allocated since
/// then: how much driver memory the tensors' growth took.
fn segments_carrying(process: &ProcessMemory, grew: &[(&Stack, &Series)], since: u64) -> u64 {
    let stacks: HashSet<&Stack> = grew.iter().map(|(stack, _)| *stack).collect();
    let carrying: BTreeSet<u64> = process
        .blocks()
        .into_iter()
        .filter(|block| block.ts >= since && stacks.contains(&block.stack))
        .filter_map(|block| process.segment_of(block.addr))
        .collect();
    carrying
        .into_iter()
        .filter_map(|start| process.segment_at(start))
        .filter(|(_, ts)| *ts >= since)
        .map(|(size, _)| size)
        .sum()
}

/// How much a series grew since its streak began.
fn grew_by(series: &Series) -> u64 {
    series.live.saturating_sub(series.streak_bytes)
}
