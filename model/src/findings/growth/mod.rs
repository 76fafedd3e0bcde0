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
//!
//! A run shorter than the windows is judged over its whole life (`life.rs`) when the process
//! ends or the capture does: stacks whose live bytes rose steadily through it and were given
//! back only at teardown (after the process's last allocation: the interpreter's clean-up), or
//! never, are one finding. Either finding names its cause where the events show it
//! (`cause.rs`) and, from the growth rate and the device's free memory (the driver's
//! `cuMemGetInfo`, NVML), when the device would be full.

mod cause;
mod life;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};

use super::{wording, Diagnosis, Finding, FindingKind, RuleConfig, StackBytes};
use crate::event::{Event, Layer, Op};
use crate::track::{ProcessMemory, ProcessRef, Space, Stack, Tracker};

/// Stacks a finding lists.
const TOP_STACKS: usize = 5;
/// A life's growth smaller than this, over all its stacks, is not a finding: a few small
/// buffers made once per phase are not what runs a device out of memory.
const MIN_LIFE_GROWTH: u64 = 4 << 20;
/// Device memory readings kept per device (one a second from NVML: a minute).
const READINGS: usize = 64;
/// A stack growing less than this over a life is left out of its finding.
const MIN_STACK_LIFE_GROWTH: u64 = 64 << 10;

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
    /// Live bytes through the series' life.
    #[serde(default)]
    life: life::Life,
    /// (the process's allocation count, live bytes, live allocations) when the series first
    /// freed after the process's latest allocation: what it held before teardown, if teardown
    /// began.
    #[serde(default)]
    teardown: Option<(u64, u64, u64)>,
    /// Its latest allocations, for the cause.
    #[serde(default)]
    evidence: cause::Evidence,
    /// The device of its latest allocation.
    #[serde(default)]
    device: Option<i32>,
}

/// A process's allocations so far: how many, and when the latest was made.
#[derive(Debug, Default, Clone, Copy, serde::Serialize, serde::Deserialize)]
struct Allocating {
    count: u64,
    last_ts: u64,
}

/// A device's memory as the driver or NVML last told it.
#[derive(Debug, Clone, Copy, serde::Serialize, serde::Deserialize)]
struct DeviceMemory {
    free: u64,
    ts: u64,
}

/// How a growth was seen, for its sentence.
enum Seen {
    /// Rose at the end of `rises` windows in a row.
    Windows { rises: u32 },
    /// Rose steadily through the process's life, until it `ended` that way.
    Life(LifeEnd),
}

/// Where a life judged as a whole ends.
#[derive(Clone, Copy, PartialEq)]
enum LifeEnd {
    /// The process exited (or ran another program): what it gave back after its last
    /// allocation was teardown.
    Exited,
    /// Its allocation failed for lack of device memory.
    OutOfMemory,
    /// The capture ended while it ran.
    CaptureEnded,
}

/// One stack of a finding: how much it grew and what it held at the end.
struct Grew<'a> {
    stack: &'a Stack,
    series: &'a Series,
    bytes: u64,
    live: u64,
    count: u64,
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub(crate) struct Rule {
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
    #[serde(default)]
    autograd: cause::Autograd,
    #[serde(default)]
    allocating: HashMap<ProcessRef, Allocating>,
    #[serde(default)]
    /// Each device's latest readings, oldest first (a life judged at its end takes the last
    /// one from before its teardown).
    devices: BTreeMap<i32, VecDeque<DeviceMemory>>,
    /// Processes run by a framework's allocator that ran out of memory: the segments it took
    /// until then are that failure's story (its oom finding), not a growth of their own.
    #[serde(default)]
    ran_out: HashSet<ProcessRef>,
}

impl Rule {
    pub(crate) fn new(config: RuleConfig) -> Self {
        Rule {
            config,
            window_end: None,
            series: HashMap::new(),
            releasing: None,
            reported: HashSet::new(),
            awaiting: HashMap::new(),
            held: HashMap::new(),
            autograd: cause::Autograd::default(),
            allocating: HashMap::new(),
            devices: BTreeMap::new(),
            ran_out: HashSet::new(),
        }
    }

    /// Device `device` had `free` bytes free at `ts` (NVML, as the live capture samples it).
    pub(crate) fn device_memory(&mut self, device: i32, free: u64, ts: u64) {
        let readings = self.devices.entry(device).or_default();
        if readings.back().is_none_or(|known| known.ts <= ts) {
            if readings.len() == READINGS {
                readings.pop_front();
            }
            readings.push_back(DeviceMemory { free, ts });
        }
    }

    /// Process `pid` is recorded at the tensors' level until `until` (ns): a finding on its
    /// driver allocations alone waits until then for one on its tensors.
    pub(crate) fn expect_tensors(&mut self, pid: u32, until: u64) {
        self.awaiting.insert(pid, until);
    }

    /// Drops what is kept of processes the tracker no longer knows.
    pub(crate) fn forget_unless(&mut self, known: impl Fn(ProcessRef) -> bool) {
        self.reported.retain(|process| known(*process));
        self.ran_out.retain(|process| known(*process));
        self.allocating.retain(|process, _| known(*process));
    }

    /// Closes the windows that ended before this event; notes what a free releases.
    pub(crate) fn before(&mut self, event: &Event, world: &Tracker) -> Vec<Finding> {
        let mut found = self.close_windows(event.ts, world);
        if event.layer == Layer::Process && matches!(event.op, Op::Exit | Op::Exec) {
            // The process is over (or another program): what it held is its finding. A driver
            // finding held for the tensors gives way to the tensors' growth over the life, if
            // they grew: it names the line that keeps them.
            self.awaiting.remove(&event.pid);
            let life = world.process(event.pid).and_then(|process| {
                let segments_too = !self.ran_out.contains(&process.as_ref());
                self.judge_life(process.as_ref(), event.ts, LifeEnd::Exited, segments_too, world)
            });
            let held = self.release(|process| process.pid == event.pid);
            match life {
                Some(life) if life.api.as_deref() == Some(crate::event::PYTORCH_ALLOCATOR_API) => found.push(life),
                _ if !held.is_empty() => found.extend(held),
                life => found.extend(life),
            }
        }
        if event.layer == Layer::Driver
            && event.op == Op::Alloc
            && event.result == crate::event::CUDA_ERROR_OUT_OF_MEMORY
        {
            // The device ran out: what grew until now is judged before the failure is told, so
            // a job shorter than the windows has its growth named first. Segments a framework's
            // allocator took until the device was full are its cache and tensors, which the
            // driver's level does not tell apart: the oom finding tells who held what, and
            // whether the cache was in pieces; a growth is said of tensors, or of a program's
            // own memory.
            if let Some(process) = world.process(event.pid) {
                if process.framework().is_some() {
                    self.ran_out.insert(process.as_ref());
                }
                let segments_too = !self.ran_out.contains(&process.as_ref());
                found.extend(self.judge_life(process.as_ref(), event.ts, LifeEnd::OutOfMemory, segments_too, world));
            }
        }
        if event.layer == Layer::Driver && event.op == Op::MemInfo && event.succeeded() {
            self.device_memory(event.device.unwrap_or(0), event.size, event.ts);
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
    pub(crate) fn after(&mut self, event: &Event, world: &Tracker) {
        let made = self.autograd.observe(event);
        if let Some((key, size)) = self.releasing.take() {
            let allocations = self.allocating.get(&key.0).map_or(0, |a| a.count);
            if let Some(series) = self.series.get_mut(&key) {
                series.life.advance(event.ts, series.live);
                if series.teardown.is_none_or(|(count, _, _)| count != allocations) {
                    series.teardown = Some((allocations, series.live, series.count));
                }
                series.evidence.freed(event.addr.unwrap_or(0), event.ts);
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
                let allocating = self.allocating.entry(process.as_ref()).or_default();
                allocating.count += 1;
                allocating.last_ts = event.ts;
                let series = self.series.entry((process.as_ref(), event.layer, allocation.stack.clone())).or_default();
                if series.count == 0 && series.live == 0 && series.life.is_empty() {
                    series.life = life::Life::begin(event.ts, event.size);
                } else {
                    series.life.advance(event.ts, series.live);
                }
                series.live += event.size;
                series.count += 1;
                series.device = event.device.or(allocation.device);
                if let Some(made) = made {
                    series.evidence.push(made);
                }
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
                self.allocating.retain(|process, _| process.pid != event.pid);
                self.autograd.forget(event.pid);
            }
            _ => {}
        }
    }

    /// The capture ended at `ts`: windows that ended by then are judged; the partial one is not.
    /// Held findings go out.
    pub(crate) fn finish(&mut self, ts: u64, world: &Tracker) -> Vec<Finding> {
        let mut found = self.close_windows(ts, world);
        found.extend(self.release(|_| true));
        let mut processes: Vec<ProcessRef> = self.series.keys().map(|(process, _, _)| *process).collect();
        processes.sort_by_key(|process| (process.pid, process.since));
        processes.dedup();
        for process in processes {
            let segments_too = !self.ran_out.contains(&process);
            found.extend(self.judge_life(process, ts, LifeEnd::CaptureEnded, segments_too, world));
        }
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
            let (layer, finding) = self.in_windows(process, window_end, world);
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
    fn in_windows(&self, process: ProcessRef, window_end: u64, world: &Tracker) -> (Layer, Finding) {
        let streaking = |layer: Layer| -> Vec<Grew<'_>> {
            self.series
                .iter()
                .filter(|((p, l, _), s)| *p == process && *l == layer && s.rises >= self.config.growth_rises)
                .map(|((_, _, stack), series)| Grew {
                    stack,
                    series,
                    bytes: grew_by(series),
                    live: series.live,
                    count: series.count,
                })
                .collect()
        };
        let tensors = streaking(Layer::Allocator);
        let layer = if tensors.is_empty() { Layer::Driver } else { Layer::Allocator };
        let grew = if tensors.is_empty() { streaking(Layer::Driver) } else { tensors };
        let first_ts = grew.iter().map(|g| g.series.streak_ts).min().unwrap_or(window_end);
        let rises = grew.iter().map(|g| g.series.rises).max().unwrap_or(0);
        (layer, self.finding(process, layer, grew, first_ts, window_end, Seen::Windows { rises }, world))
    }

    /// Judges a process over its whole life, unless it already has its finding: at its end
    /// (`ended`; what it gave back after its last allocation was teardown), or at `end` of the
    /// capture. Its driver allocations are judged when its tensors did not grow and
    /// `segments_too`.
    fn judge_life(
        &mut self,
        process: ProcessRef,
        end: u64,
        how: LifeEnd,
        segments_too: bool,
        world: &Tracker,
    ) -> Option<Finding> {
        let ended = how == LifeEnd::Exited;
        if self.reported.contains(&process) {
            return None;
        }
        let allocating = self.allocating.get(&process).copied().unwrap_or_default();
        let cutoff = if ended { allocating.last_ts } else { end };
        let rising = |layer: Layer| -> Vec<(Grew<'_>, u64)> {
            self.series
                .iter()
                .filter(|((p, l, _), _)| *p == process && *l == layer)
                .filter_map(|((_, _, stack), series)| {
                    let (live, count) = match series.teardown {
                        Some((allocations, live, count)) if ended && allocations == allocating.count => (live, count),
                        _ => (series.live, series.count),
                    };
                    let rise = series.life.steady_rise(cutoff, live)?;
                    let bytes = rise.to - rise.from;
                    (bytes >= MIN_STACK_LIFE_GROWTH).then_some((Grew { stack, series, bytes, live, count }, rise.start))
                })
                .collect()
        };
        let tensors = rising(Layer::Allocator);
        if tensors.is_empty() && !segments_too {
            return None;
        }
        let layer = if tensors.is_empty() { Layer::Driver } else { Layer::Allocator };
        let grew = if tensors.is_empty() { rising(Layer::Driver) } else { tensors };
        if grew.iter().map(|(g, _)| g.bytes).sum::<u64>() < MIN_LIFE_GROWTH {
            return None;
        }
        let first_ts = grew.iter().map(|(_, start)| *start).min().unwrap_or(cutoff);
        let grew = grew.into_iter().map(|(g, _)| g).collect();
        let finding = self.finding(process, layer, grew, first_ts, cutoff, Seen::Life(how), world);
        self.reported.insert(process);
        Some(finding)
    }

    /// One finding for the stacks of a process that grew from `first_ts` to `last_ts`, largest
    /// first, with its cause and the time until the device is full where the events tell.
    #[allow(clippy::too_many_arguments)]
    fn finding(
        &self,
        process: ProcessRef,
        layer: Layer,
        mut grew: Vec<Grew<'_>>,
        first_ts: u64,
        last_ts: u64,
        seen: Seen,
        world: &Tracker,
    ) -> Finding {
        grew.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.stack.cmp(b.stack)));
        let main = &grew[0];
        let bytes: u64 = grew.iter().map(|g| g.bytes).sum();
        let count: u64 = grew.iter().map(|g| g.count).sum();
        let live: u64 = grew.iter().map(|g| g.live).sum();
        let comm = &main.series.comm;
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
            Some(segments) if segments > 0 => {
                format!("; the driver segments carrying them grew by {}", wording::bytes(segments))
            }
            _ => String::new(),
        };
        let how = self.how_seen(&seen, first_ts, last_ts);
        let seconds = (last_ts.saturating_sub(first_ts)).max(1) as f64 / 1e9;
        let rate = bytes as f64 / seconds;
        let device = main.series.device.unwrap_or(0);
        let seconds_to_full = self.seconds_to_full(device, rate, last_ts);
        let ended = matches!(seen, Seen::Life(LifeEnd::Exited));
        let pace = pace(device, rate, seconds_to_full, ended);
        let diagnosis = (layer == Layer::Allocator)
            .then(|| self.autograd.diagnose(process.pid, last_ts, grew.iter().map(|g| &g.series.evidence)))
            .flatten();
        let place = wording::at(main.stack);
        let cause = cause_and_remedy(diagnosis, &place);
        let detail = format!(
            "live {what} allocated {place} in {} grew by {}{stacks} {how}, to {} in {}{segments}: {cause}.{pace}",
            wording::process(process.pid, comm),
            wording::bytes(main.bytes),
            wording::bytes(live),
            wording::count(count, "allocation", "allocations"),
        );
        let mut finding =
            Finding::new(FindingKind::Growth, process.pid, comm, bytes, count, first_ts, last_ts, main.stack, detail);
        finding.api = Some(main.series.api.to_string());
        finding.stacks = grew
            .iter()
            .take(TOP_STACKS)
            .map(|g| StackBytes { stack: g.stack.to_vec(), bytes: g.bytes, count: g.count })
            .collect();
        finding.segment_bytes = segment_bytes;
        finding.diagnosis = diagnosis.map(|(diagnosis, _)| diagnosis);
        finding.bytes_per_second = Some(rate);
        finding.seconds_to_full = seconds_to_full;
        finding
    }

    /// How the growth was seen, as the finding's sentence tells it.
    fn how_seen(&self, seen: &Seen, first_ts: u64, last_ts: u64) -> String {
        match seen {
            Seen::Windows { rises } => format!(
                "over {rises} consecutive {:.1} s windows without coming back",
                self.config.growth_window_ns.max(1) as f64 / 1e9
            ),
            Seen::Life(LifeEnd::Exited) => format!(
                "steadily through the process's {:.1} s and was given back only when it ended",
                (last_ts - first_ts) as f64 / 1e9
            ),
            Seen::Life(LifeEnd::OutOfMemory) => {
                format!("steadily for {:.1} s until the device ran out of memory", (last_ts - first_ts) as f64 / 1e9)
            }
            Seen::Life(LifeEnd::CaptureEnded) => {
                format!("steadily through the {:.1} s captured without coming back", (last_ts - first_ts) as f64 / 1e9)
            }
        }
    }

    /// Seconds until `device` is full, growing at `rate` bytes a second from its last free-memory
    /// reading at or before `last_ts`; `None` when it was never read by then.
    fn seconds_to_full(&self, device: i32, rate: f64, last_ts: u64) -> Option<f64> {
        let reading = self.devices.get(&device).and_then(|readings| readings.iter().rev().find(|r| r.ts <= last_ts));
        reading.map(|memory| {
            let since = last_ts.saturating_sub(memory.ts) as f64 / 1e9;
            (memory.free as f64 - rate * since).max(0.0) / rate
        })
    }
}

/// The sentence on the growth's pace: when the device is full (or, for a process that `ended`,
/// would have been), or only the rate where no reading tells.
fn pace(device: i32, rate: f64, seconds_to_full: Option<f64>, ended: bool) -> String {
    match seconds_to_full {
        Some(left) if ended => {
            format!(
                " At {}/s device {device} would have been full {} later had it run on.",
                wording::bytes(rate as u64),
                wording::duration(left)
            )
        }
        Some(left) => {
            format!(" At {}/s device {device} is full {}.", wording::bytes(rate as u64), wording::within(left))
        }
        None => format!(" It grew at {}/s.", wording::bytes(rate as u64)),
    }
}

/// What keeps the memory, as the autograd evidence shows it (with the share that shows it), and
/// the remedy; allocated at `place`.
fn cause_and_remedy(diagnosis: Option<(Diagnosis, f64)>, place: &str) -> String {
    match diagnosis {
        Some((Diagnosis::AutogradGraphRetained, share)) => format!(
            "{:.0}% of its recent blocks still live were made by forward ops whose autograd graph no backward pass used: a retained autograd graph, built {place}; run evaluation under torch.no_grad() (or torch.inference_mode()), and keep losses across steps as numbers (loss.item())",
            share * 100.0
        ),
        Some((Diagnosis::TensorsKeptByUserCode, share)) => format!(
            "{:.0}% of its recent blocks still live were made outside autograd or already went through a backward pass: the user's code keeps these tensors, allocated {place}; drop the references kept there (a list, a dict, a cache), or keep .item() / .cpu() copies",
            share * 100.0
        ),
        _ => "something keeps these allocations alive (a growing list or cache, a retained autograd graph: evaluation without torch.no_grad(), a loss summed without .item())".to_string(),
    }
}

/// The segments allocated since `since` that carry blocks of the `grew` stacks allocated since
/// then: how much driver memory the tensors' growth took.
fn segments_carrying(process: &ProcessMemory, grew: &[Grew<'_>], since: u64) -> u64 {
    let stacks: HashSet<&Stack> = grew.iter().map(|g| g.stack).collect();
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
