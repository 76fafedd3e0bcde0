//! One event per call when two captures see it: a process running with gpuprof's shim on a node
//! whose daemon also probes it with eBPF reports each allocator call and each driver memory call
//! twice, once per source (the shim's CUPTI callbacks, eBPF's uprobes). A call is the same call
//! when everything it reported matches — process, layer, entry point, operation, address, size,
//! result, the allocator's totals — within a short window; the first copy to arrive is kept,
//! whichever source it came from. Repeats from one source are never dropped.

use std::collections::{HashMap, VecDeque};

use crate::event::{Event, Layer, Op, Source};

/// How far apart two sources' copies of one call may arrive (the shim sends within milliseconds,
/// the eBPF reader within its poll interval).
pub const DEFAULT_WINDOW_NS: u64 = 2_000_000_000;

/// What makes two events the same call.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct CallKey {
    pid: u32,
    layer: Layer,
    api: std::borrow::Cow<'static, str>,
    op: Op,
    addr: Option<u64>,
    size: u64,
    result: i32,
    allocated: Option<u64>,
    reserved: Option<u64>,
}

impl CallKey {
    fn of(event: &Event) -> CallKey {
        CallKey {
            pid: event.pid,
            layer: event.layer,
            api: event.api.clone(),
            op: event.op,
            addr: event.addr,
            size: event.size,
            result: event.result,
            allocated: event.allocated,
            reserved: event.reserved,
        }
    }
}

#[derive(Debug)]
pub struct Dedup {
    window_ns: u64,
    /// Copies still waiting for their twin, per call, oldest first.
    waiting: HashMap<CallKey, VecDeque<(Source, u64)>>,
    /// Every waiting copy by arrival, to let old ones go.
    arrivals: VecDeque<(u64, CallKey)>,
    dropped: u64,
}

impl Dedup {
    pub fn new(window_ns: u64) -> Self {
        Dedup { window_ns, waiting: HashMap::new(), arrivals: VecDeque::new(), dropped: 0 }
    }

    /// Only calls both captures see are compared: allocator reports and driver calls. (Process
    /// transitions are the kernel's to report where it probes: a consumer of both takes them
    /// from eBPF alone.)
    fn compared(event: &Event) -> bool {
        matches!(event.layer, Layer::Allocator | Layer::Driver)
    }

    /// True when the event is to be kept; false for the second copy of a call already kept.
    pub fn admit(&mut self, event: &Event) -> bool {
        if !Self::compared(event) {
            return true;
        }
        self.expire(event.ts);
        let key = CallKey::of(event);
        if let Some(copies) = self.waiting.get_mut(&key) {
            if let Some(twin) = copies
                .iter()
                .position(|(source, ts)| *source != event.source && event.ts.abs_diff(*ts) <= self.window_ns)
            {
                copies.remove(twin);
                if copies.is_empty() {
                    self.waiting.remove(&key);
                }
                self.dropped += 1;
                return false;
            }
        }
        self.waiting.entry(key.clone()).or_default().push_back((event.source, event.ts));
        self.arrivals.push_back((event.ts, key));
        true
    }

    /// Second copies dropped so far.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    fn expire(&mut self, now: u64) {
        while let Some((ts, _)) = self.arrivals.front() {
            if now.saturating_sub(*ts) <= self.window_ns {
                break;
            }
            let (ts, key) = self.arrivals.pop_front().expect("checked above");
            if let Some(copies) = self.waiting.get_mut(&key) {
                if let Some(at) = copies.iter().position(|(_, t)| *t == ts) {
                    copies.remove(at);
                }
                if copies.is_empty() {
                    self.waiting.remove(&key);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;

    use super::*;

    fn report(ts: u64, source: Source, op: Op, addr: u64, allocated: u64) -> Event {
        let mut event =
            Event::new(ts, 7, 7, source, Layer::Allocator, op, Cow::Borrowed(crate::event::PYTORCH_ALLOCATOR_API));
        event.addr = Some(addr);
        event.size = 512;
        event.allocated = Some(allocated);
        event.reserved = Some(2 << 20);
        event
    }

    #[test]
    fn the_second_source_copy_of_each_call_is_dropped_even_when_a_source_runs_ahead() {
        let mut dedup = Dedup::new(DEFAULT_WINDOW_NS);
        // eBPF sees alloc, free, alloc of one block before the shim's copies arrive.
        let ebpf = [
            report(10, Source::Ebpf, Op::Alloc, 0x100, 512),
            report(11, Source::Ebpf, Op::Free, 0x100, 0),
            report(12, Source::Ebpf, Op::Alloc, 0x100, 512),
        ];
        let shim = [
            report(15, Source::Shim, Op::Alloc, 0x100, 512),
            report(16, Source::Shim, Op::Free, 0x100, 0),
            report(17, Source::Shim, Op::Alloc, 0x100, 512),
        ];
        let kept: Vec<bool> = ebpf.iter().chain(&shim).map(|e| dedup.admit(e)).collect();
        assert_eq!(kept, [true, true, true, false, false, false]);
        assert_eq!(dedup.dropped(), 3);
    }

    #[test]
    fn repeats_from_one_source_and_copies_too_far_apart_are_kept() {
        let mut dedup = Dedup::new(1_000);
        assert!(dedup.admit(&report(10, Source::Shim, Op::Alloc, 0x100, 512)));
        assert!(dedup.admit(&report(20, Source::Shim, Op::Alloc, 0x100, 512)));
        // The eBPF copy of the first arrives in time: dropped; of the second, too late: kept.
        assert!(!dedup.admit(&report(900, Source::Ebpf, Op::Alloc, 0x100, 512)));
        assert!(dedup.admit(&report(5_000, Source::Ebpf, Op::Alloc, 0x100, 512)));
    }

    #[test]
    fn a_driver_call_seen_by_both_captures_is_kept_once_and_a_failed_twin_is_another_call() {
        let mut dedup = Dedup::new(DEFAULT_WINDOW_NS);
        let call = |ts, source, result| {
            let mut event = Event::new(ts, 7, 7, source, Layer::Driver, Op::Alloc, Cow::Borrowed("cuMemAlloc_v2"));
            event.addr = Some(if result == 0 { 0x7f00_0000_0000 } else { 0 });
            event.size = 2 << 20;
            event.result = result;
            event
        };
        assert!(dedup.admit(&call(10, Source::Shim, 0)));
        assert!(dedup.admit(&call(11, Source::Shim, 2)));
        assert!(!dedup.admit(&call(30, Source::Ebpf, 0)));
        assert!(!dedup.admit(&call(31, Source::Ebpf, 2)));
        // The same values from another entry point: another call.
        let mut legacy = call(32, Source::Ebpf, 0);
        legacy.api = Cow::Borrowed("cuMemAlloc");
        assert!(dedup.admit(&legacy));
        assert_eq!(dedup.dropped(), 2);
    }

    #[test]
    fn process_transitions_are_not_compared() {
        let mut dedup = Dedup::new(DEFAULT_WINDOW_NS);
        let exit = |ts, source| Event::new(ts, 9, 9, source, Layer::Process, Op::Exit, Cow::Borrowed("exit"));
        assert!(dedup.admit(&exit(100, Source::Shim)));
        assert!(dedup.admit(&exit(150, Source::Ebpf)));
    }
}
