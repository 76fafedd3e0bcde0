//! What a what-if costs on one core for a 4-million-event recording: a training job's allocator
//! stream (steps of activations of changing sizes, freed in reverse, weights kept; one block in
//! 64 of them large), made by the model itself so that the replay check passes, through
//! - the tracker alone (what `summary`/`report` pay per event: the baseline, same run),
//! - events → allocator trace (`TraceBuilder`),
//! - the replay check under the settings it ran with,
//! - a replay under expandable_segments:True and one under max_split_size_mb:128.
//!
//! And the trace's memory: bytes held per event.
//!
//!     cargo bench -p gpuprof-model --bench whatif

use std::borrow::Cow;
use std::hint::black_box;
use std::time::Instant;

use gpuprof_model::allocator::{replay, AllocatorConfig, CachingAllocator, RecordedRun, TraceBuilder, MIB};
use gpuprof_model::event::{Event, Kind, Layer, Op, Source};
use gpuprof_model::track::Tracker;

const EVENTS: usize = 4_000_000;
const ROUNDS: usize = 3;
const SEGMENT_BASE: u64 = 0x7f00_0000_0000;

/// xorshift64*: the same stream every run.
struct Random(u64);

impl Random {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

/// The job's events: driver segments and allocator reports, with the counters the model gives.
fn recording() -> Vec<Event> {
    let mut allocator = CachingAllocator::new(AllocatorConfig::default(), None);
    let mut random = Random(0x9e37_79b9_7f4a_7c15);
    let mut events = Vec::with_capacity(EVENTS + EVENTS / 50);
    let mut ts = 1u64;
    let mut push = |events: &mut Vec<Event>, layer: Layer, op: Op, api: &'static str, addr: u64, size: u64| {
        ts += 1_000;
        let mut e = Event::new(ts, 4242, 4242, Source::Ebpf, layer, op, Cow::Borrowed(api));
        (e.device, e.kind, e.addr, e.size) = (Some(0), Some(Kind::Device), Some(addr), size);
        events.push(e);
        events.len() - 1
    };
    let mut next_id = 0u64;
    let mut segments_made = std::collections::HashSet::new();
    // A report of block `id` in segment `segment`; a segment's first block follows its cuMemAlloc.
    let mut report =
        |events: &mut Vec<Event>, allocator: &CachingAllocator, op: Op, id: u64, size: u64, segment: u64| {
            let segment_addr = SEGMENT_BASE + (segment << 32);
            if segments_made.insert(segment) {
                let segment_size = allocator.segments().iter().find(|s| s.id == segment).map_or(0, |s| s.size);
                push(events, Layer::Driver, Op::Alloc, "cuMemAlloc_v2", segment_addr, segment_size);
            }
            let at =
                push(events, Layer::Allocator, op, "c10::reportMemoryUsageToProfiler", SEGMENT_BASE + id * 4096, size);
            let e = &mut events[at];
            (e.allocated, e.reserved, e.segment) =
                (Some(allocator.allocated()), Some(allocator.reserved()), Some(segment_addr));
        };
    let weights: Vec<u64> = (0..200).map(|_| 512 + random.next() % (16 * MIB)).collect();
    for &size in &weights {
        let id = next_id;
        next_id += 1;
        let got = allocator.malloc(id, size).unwrap();
        report(&mut events, &allocator, Op::Alloc, id, got.block_size, got.segment);
    }
    while events.len() < EVENTS {
        let length = 1 + random.next() % 8;
        let mut step = Vec::new();
        for _ in 0..400 {
            let size = if random.next() % 64 == 0 { length * 32 * MIB } else { 512 + random.next() % (length * MIB) };
            let id = next_id;
            next_id += 1;
            let got = allocator.malloc(id, size).unwrap();
            report(&mut events, &allocator, Op::Alloc, id, got.block_size, got.segment);
            step.push((id, got.block_size, got.segment));
        }
        while let Some((id, block, segment)) = step.pop() {
            allocator.free(id).unwrap();
            report(&mut events, &allocator, Op::Free, id, block, segment);
        }
    }
    events
}

fn timed<T>(what: &str, events: usize, baseline: Option<f64>, mut run: impl FnMut() -> T) -> f64 {
    let mut best = f64::MAX;
    for _ in 0..ROUNDS {
        let start = Instant::now();
        black_box(run());
        best = best.min(start.elapsed().as_secs_f64());
    }
    let ratio = baseline.map(|b| format!("  {:.2}x the tracker", best / b)).unwrap_or_default();
    println!("{what:<44} {:>8.3} s  {:>6.2} M events/s{ratio}", best, events as f64 / best / 1e6);
    best
}

fn main() {
    let events = recording();
    let n = events.len();
    println!("{n} events, best of {ROUNDS} rounds");
    let tracker = timed("tracker (baseline)", n, None, || {
        let mut tracker = Tracker::new();
        events.iter().for_each(|e| tracker.apply(e));
        tracker
    });
    timed("events -> allocator trace", n, Some(tracker), || {
        let mut builder = TraceBuilder::new();
        events.iter().for_each(|e| builder.push(e));
        builder.finish()
    });
    let mut builder = TraceBuilder::new();
    events.iter().for_each(|e| builder.push(e));
    let trace = builder.finish().remove(0);
    let run = RecordedRun::new(&trace, None);
    timed("replay check (default, as it ran)", n, Some(tracker), || run.check().expect("the replay check passes"));
    for setting in ["expandable_segments:True", "max_split_size_mb:128"] {
        let config = AllocatorConfig::parse(setting).unwrap();
        timed(&format!("replay under {setting}"), n, Some(tracker), || replay(&config, None, &trace.requests).unwrap());
    }
    let held = trace.requests.capacity() * std::mem::size_of_val(&trace.requests[0])
        + trace.recorded.capacity() * std::mem::size_of_val(&trace.recorded[0])
        + trace.origins.capacity() * std::mem::size_of_val(&trace.origins[0]);
    let curve = 2 * trace.requests.len() * std::mem::size_of::<u64>();
    println!(
        "memory: the trace holds {:.1} MiB ({:.1} bytes an event); each replay adds its curves, {:.1} MiB",
        held as f64 / MIB as f64,
        held as f64 / n as f64,
        curve as f64 / MIB as f64
    );
}
