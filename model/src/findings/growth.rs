//! `growth`: live device memory attributed to one stack (in one process) rose at the end of
//! each of N consecutive windows, never coming back. A warm-up that plateaus, or churn that
//! frees what it allocates, stops the streak. Driver allocations and a framework allocator's
//! blocks (tensors) are followed apart: a leaking tensor shows in blocks long before segments.

use std::collections::HashMap;

use super::{wording, Finding, FindingKind, RuleConfig};
use crate::event::{Event, Frame, Layer, Op};
use crate::track::{ProcessRef, Space, Stack, Tracker};

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
}

impl Rule {
    pub fn new(config: RuleConfig) -> Self {
        Rule { config, window_end: None, series: HashMap::new(), releasing: None }
    }

    /// Closes the windows that ended before this event; notes what a free releases.
    pub fn before(&mut self, event: &Event, world: &Tracker) -> Vec<Finding> {
        let found = self.close_windows(event.ts);
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
    pub fn finish(&mut self, ts: u64, _world: &Tracker) -> Vec<Finding> {
        self.close_windows(ts)
    }

    fn close_windows(&mut self, ts: u64) -> Vec<Finding> {
        let window = self.config.growth_window_ns.max(1);
        let end = *self.window_end.get_or_insert(ts + window);
        if ts < end {
            return Vec::new();
        }
        let mut found = self.judge(end);
        let mut next = end + window;
        if ts >= next {
            // Whole windows without events: nothing moved, so every streak stops here.
            found.extend(self.judge(next));
            next += (ts - next) / window * window + window;
        }
        self.window_end = Some(next);
        found
    }

    fn judge(&mut self, window_end: u64) -> Vec<Finding> {
        let window = self.config.growth_window_ns.max(1);
        let mut found = Vec::new();
        for ((process, layer, stack), series) in &mut self.series {
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
            if series.rises >= self.config.growth_rises && !series.reported {
                series.reported = true;
                found.push(finding(*process, *layer, stack, series, window_end, window));
            }
        }
        found.sort_by_key(|f| (f.pid, f.first_ts));
        found
    }
}

fn finding(process: ProcessRef, layer: Layer, stack: &[Frame], series: &Series, window_end: u64, window: u64) -> Finding {
    let grew = series.live - series.streak_bytes;
    let what = if layer == Layer::Allocator { "tensor memory (allocator blocks)" } else { "device memory" };
    Finding {
        kind: FindingKind::Growth,
        pid: process.pid,
        comm: series.comm.to_string(),
        bytes: grew,
        count: series.count,
        peer_pid: None,
        first_ts: series.streak_ts,
        last_ts: window_end,
        stack: stack.to_vec(),
        detail: format!(
            "live {what} allocated {} in {} grew by {} over {} consecutive {:.1} s windows without coming back, to {} in {}: something keeps these allocations alive (a growing list or cache, a retained autograd graph).",
            wording::at(stack),
            wording::process(process.pid, &series.comm),
            wording::bytes(grew),
            series.rises,
            window as f64 / 1e9,
            wording::bytes(series.live),
            wording::count(series.count, "allocation", "allocations"),
        ),
        api: Some(series.api.to_string()),
        processes: Vec::new(),
    }
}
