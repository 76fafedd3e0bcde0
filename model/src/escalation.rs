//! When a node's daemon raises one process's capture level. The daemon runs every process at a
//! level it can always afford (the driver's calls: a warm training step makes none), and raises a
//! process to tensor events with stacks, for a bounded time, where the cheap level shows that
//! detail will pay:
//! - its device memory grows: the driver memory it holds rose at the end of each of `rises`
//!   consecutive windows (the caching allocator takes segments only while its live tensors
//!   outgrow its cache, so a warm loop's segments stay flat and a leak's keep coming);
//! - its device is nearly full: a `cuMemGetInfo` it made saw less than `near_full` of the device
//!   free;
//! - it ran out of memory: a driver allocation failed with CUDA_ERROR_OUT_OF_MEMORY (the caching
//!   allocator frees its cache and retries, and the next step fails the same way: this time with
//!   its tensors recorded).
//!
//! Pure functions over the event stream and the tracker's totals, as the leak rules are: the
//! daemon acts on what they decide. A process raised is not looked at again until it is lowered.

use std::collections::HashMap;

use serde::Serialize;

use crate::event::{Event, Layer, Op, CUDA_ERROR_OUT_OF_MEMORY};

/// What makes the daemon raise a process, and for how long.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EscalationConfig {
    /// Growth: window length.
    pub window_ns: u64,
    /// Growth: consecutive rising windows that raise the level.
    pub rises: u32,
    /// Near full: the device's free memory, as a fraction of its total, under which the level
    /// is raised.
    pub near_full: f64,
    /// How long a raised level lasts.
    pub detail_ns: u64,
}

impl Default for EscalationConfig {
    fn default() -> Self {
        EscalationConfig { window_ns: 10_000_000_000, rises: 2, near_full: 0.1, detail_ns: 120_000_000_000 }
    }
}

/// Why a process's level was raised.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "reason")]
pub enum Reason {
    /// Its driver memory rose in `windows` consecutive windows, from `from` to `to` bytes.
    Growing { from: u64, to: u64, windows: u32 },
    /// A `cuMemGetInfo` saw `free` of `total` bytes free on its device.
    NearlyFull { device: Option<i32>, free: u64, total: u64 },
    /// A driver allocation of `size` bytes failed for lack of memory.
    OutOfMemory { size: u64, api: String },
    /// Someone asked (the daemon's API).
    Requested,
}

impl Reason {
    /// One line for a person: "its device memory rose from 1.0 GiB to 1.4 GiB in 2 windows".
    pub fn sentence(&self) -> String {
        let gib = |bytes: u64| crate::bytes::human(bytes);
        match self {
            Reason::Growing { from, to, windows } => {
                format!("its device memory rose from {} to {} over {windows} windows", gib(*from), gib(*to))
            }
            Reason::NearlyFull { device, free, total } => format!(
                "device {} has {} free of {}",
                device.map_or_else(|| "?".to_string(), |d| d.to_string()),
                gib(*free),
                gib(*total)
            ),
            Reason::OutOfMemory { size, api } => format!("{api} of {} failed: out of memory", gib(*size)),
            Reason::Requested => "asked for through the daemon's API".to_string(),
        }
    }
}

/// A process to raise, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Raise {
    pub pid: u32,
    pub reason: Reason,
}

/// One process's growth series.
#[derive(Debug, Default)]
struct Watch {
    /// Driver memory at the last window end, and when the streak started.
    sampled: Option<u64>,
    streak_from: u64,
    rises: u32,
    /// Raised now: not looked at until lowered.
    raised: bool,
}

/// The escalation rules' state over a node's processes.
#[derive(Debug)]
pub struct Escalation {
    config: EscalationConfig,
    window_end: Option<u64>,
    watched: HashMap<u32, Watch>,
}

impl Escalation {
    pub fn new(config: EscalationConfig) -> Escalation {
        Escalation { config, window_end: None, watched: HashMap::new() }
    }

    pub fn config(&self) -> &EscalationConfig {
        &self.config
    }

    /// What one event says: an allocation that failed for lack of memory, a device nearly full.
    pub fn observe(&mut self, event: &Event) -> Option<Raise> {
        if event.layer != Layer::Driver || self.watched.get(&event.pid).is_some_and(|w| w.raised) {
            return None;
        }
        let reason = match event.op {
            Op::Alloc | Op::Map if event.result == CUDA_ERROR_OUT_OF_MEMORY => {
                Reason::OutOfMemory { size: event.size, api: event.api.to_string() }
            }
            Op::MemInfo if event.succeeded() => {
                let total = event.total.filter(|total| *total > 0)?;
                if (event.size as f64) >= self.config.near_full * total as f64 {
                    return None;
                }
                Reason::NearlyFull { device: event.device, free: event.size, total }
            }
            _ => return None,
        };
        self.raised(event.pid);
        Some(Raise { pid: event.pid, reason })
    }

    /// True when a window has ended by `now` (`tick` has work).
    pub fn due(&self, now: u64) -> bool {
        self.window_end.is_none_or(|end| now >= end)
    }

    /// At `now`, with each live process's driver memory (the tracker's): the processes whose
    /// memory grew in `rises` windows running. Call it often; windows close on their own clock.
    /// Windows lie on the clock (they end at multiples of `window_ns`), as the growth rule's do:
    /// with the same window and fewer rises, a growth is raised at a window end no later than the
    /// one at which that rule could say it on the driver's calls alone.
    pub fn tick(&mut self, now: u64, memory: impl IntoIterator<Item = (u32, u64)>) -> Vec<Raise> {
        let window = self.config.window_ns.max(1);
        let next_end = now - now % window + window;
        let end = *self.window_end.get_or_insert(next_end);
        if now < end {
            return Vec::new();
        }
        self.window_end = Some(next_end);
        let mut raises = Vec::new();
        let mut seen = Vec::new();
        for (pid, bytes) in memory {
            seen.push(pid);
            let watch = self.watched.entry(pid).or_default();
            if watch.raised {
                continue;
            }
            match watch.sampled {
                Some(before) if bytes > before => {
                    if watch.rises == 0 {
                        watch.streak_from = before;
                    }
                    watch.rises += 1;
                }
                _ => watch.rises = 0,
            }
            watch.sampled = Some(bytes);
            if watch.rises >= self.config.rises {
                let reason = Reason::Growing { from: watch.streak_from, to: bytes, windows: watch.rises };
                watch.rises = 0;
                watch.raised = true;
                raises.push(Raise { pid, reason });
            }
        }
        // Processes gone from the tracker are forgotten.
        self.watched.retain(|pid, _| seen.contains(pid));
        raises
    }

    /// A process raised for another reason (a request): not raised again meanwhile.
    pub fn raised(&mut self, pid: u32) {
        self.watched.entry(pid).or_default().raised = true;
    }

    /// A process back at the daemon's level: watched again, its growth counted afresh.
    pub fn lowered(&mut self, pid: u32) {
        if let Some(watch) = self.watched.get_mut(&pid) {
            *watch = Watch::default();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;

    use super::*;
    use crate::event::{Kind, Source};

    const S: u64 = 1_000_000_000;
    const MIB: u64 = 1 << 20;

    fn config() -> EscalationConfig {
        EscalationConfig { window_ns: 10 * S, rises: 2, near_full: 0.1, detail_ns: 60 * S }
    }

    fn driver(pid: u32, op: Op, api: &'static str, size: u64, result: i32) -> Event {
        let mut event = Event::new(5 * S, pid, pid, Source::Ebpf, Layer::Driver, op, Cow::Borrowed(api));
        event.kind = Some(Kind::Device);
        event.size = size;
        event.result = result;
        event
    }

    #[test]
    fn memory_rising_two_windows_running_raises_once_and_a_warm_plateau_does_not() {
        let mut rules = Escalation::new(config());
        // The first call starts the clock; windows end at 10, 20, 30, 40 s.
        assert_eq!(rules.tick(0, [(7, 40 * MIB), (8, 100 * MIB)]), []);
        // Warm-up: both grow in the first window, then 8 stays flat.
        assert_eq!(rules.tick(10 * S, [(7, 60 * MIB), (8, 300 * MIB)]), []);
        assert_eq!(rules.tick(15 * S, [(7, 70 * MIB), (8, 300 * MIB)]), [], "no window ended");
        assert_eq!(rules.tick(20 * S, [(7, 80 * MIB), (8, 300 * MIB)]), []);
        let raised = rules.tick(30 * S, [(7, 100 * MIB), (8, 300 * MIB)]);
        assert_eq!(raised, [Raise { pid: 7, reason: Reason::Growing { from: 60 * MIB, to: 100 * MIB, windows: 2 } }]);
        // Raised: not again while raised, and nothing for the flat one.
        assert_eq!(rules.tick(40 * S, [(7, 200 * MIB), (8, 300 * MIB)]), []);
        // Lowered: counted afresh (its first window after is a baseline, not a rise).
        rules.lowered(7);
        assert_eq!(rules.tick(50 * S, [(7, 220 * MIB), (8, 300 * MIB)]), []);
        assert_eq!(rules.tick(60 * S, [(7, 240 * MIB), (8, 300 * MIB)]), []);
        assert_eq!(rules.tick(70 * S, [(7, 260 * MIB)]).len(), 1);
        // A process gone from the tracker is forgotten.
        assert!(!rules.watched.contains_key(&8));
    }

    #[test]
    fn windows_end_on_the_clock_as_the_growth_rules_do() {
        let mut rules = Escalation::new(config());
        // Started at 3 s: the first window ends at 10 s, not 13 s.
        assert_eq!(rules.tick(3 * S, [(7, 0)]), []);
        assert!(!rules.due(10 * S - 1) && rules.due(10 * S));
        // Closed late (at 12 s): the next still ends at 20 s.
        assert_eq!(rules.tick(12 * S, [(7, MIB)]), []);
        assert!(!rules.due(20 * S - 1) && rules.due(20 * S));
    }

    #[test]
    fn an_out_of_memory_failure_and_a_nearly_full_device_raise_at_once() {
        let mut rules = Escalation::new(config());
        let failed = driver(7, Op::Alloc, "cuMemAlloc_v2", 8 << 30, CUDA_ERROR_OUT_OF_MEMORY);
        assert_eq!(
            rules.observe(&failed),
            Some(Raise { pid: 7, reason: Reason::OutOfMemory { size: 8 << 30, api: "cuMemAlloc_v2".into() } })
        );
        // Raised already: the allocator's retry raises nothing more.
        assert_eq!(rules.observe(&failed), None);
        // Another failure code is not lack of memory.
        assert_eq!(rules.observe(&driver(8, Op::Alloc, "cuMemAlloc_v2", MIB, 1)), None);
        let mut info = driver(9, Op::MemInfo, "cuMemGetInfo_v2", 6 << 30, 0);
        info.total = Some(80 << 30);
        info.device = Some(0);
        assert_eq!(
            rules.observe(&info),
            Some(Raise { pid: 9, reason: Reason::NearlyFull { device: Some(0), free: 6 << 30, total: 80 << 30 } })
        );
        let mut roomy = driver(10, Op::MemInfo, "cuMemGetInfo_v2", 40 << 30, 0);
        roomy.total = Some(80 << 30);
        assert_eq!(rules.observe(&roomy), None);
        assert_eq!(
            Reason::NearlyFull { device: Some(0), free: 6 << 30, total: 80 << 30 }.sentence(),
            "device 0 has 6.0 GiB free of 80.0 GiB"
        );
    }
}
