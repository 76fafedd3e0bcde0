//! What the leak rules cost per tensor event on one core: a training job's allocator stream
//! (forward blocks whose ops record autograd nodes, backward blocks naming their nodes, frees,
//! one block kept a step; 40-frame stacks over 64 lines, 4 processes) through the tracker alone,
//! then through the whole analyzer (tracker and every rule), in the same run: the ratio is what
//! the rules add.
//!
//!     cargo bench -p gpuprof-model --bench rules

use std::borrow::Cow;
use std::hint::black_box;
use std::time::Instant;

use gpuprof_model::event::{Event, Frame, Kind, Layer, Op, Source};
use gpuprof_model::track::Tracker;
use gpuprof_model::{Analyzer, RuleConfig, Stack};

const STEPS: u64 = 25_000;
const ROUNDS: usize = 5;

fn stream() -> Vec<Event> {
    let stacks: Vec<Stack> = (0..64u32)
        .map(|line| {
            let frames: Vec<Frame> = (0..40u32)
                .map(|depth| Frame {
                    function: format!("f{depth}"),
                    file: "/srv/train.py".into(),
                    line: if depth == 0 { 100 + line } else { depth },
                })
                .collect();
            frames.into()
        })
        .collect();
    let mut events = Vec::new();
    let mut ts = 1_000_000_000u64;
    let mut counter = [0u64; 4];
    let mut allocated = [0u64; 4];
    let mut next = 0x7f00_0000_0000u64;
    let block = |pid: u32, op: Op, addr: u64, size: u64, allocated: u64, ts: u64| {
        let mut e = Event::new(
            ts,
            pid,
            pid,
            Source::Ebpf,
            Layer::Allocator,
            op,
            Cow::Borrowed("c10::reportMemoryUsageToProfiler"),
        );
        e.kind = Some(Kind::Device);
        e.device = Some(0);
        e.addr = Some(addr);
        e.size = size;
        e.allocated = Some(allocated);
        e.reserved = Some(64 << 30);
        e.comm = "python3".into();
        e
    };
    for step in 0..STEPS {
        let pid = 1000 + (step % 4) as u32;
        let p = (step % 4) as usize;
        let mut live = Vec::new();
        for op in 0..8u64 {
            ts += 2_000;
            counter[p] += 1;
            next += 0x10_0000;
            allocated[p] += 1 << 20;
            let mut e = block(pid, Op::Alloc, next, 1 << 20, allocated[p], ts);
            e.stack = stacks[(op * 8 + step % 8) as usize].clone();
            (e.autograd_seq, e.autograd_thread) = (Some(counter[p]), Some(p as u64 + 1));
            events.push(e);
            live.push(next);
        }
        for node in (counter[p] - 8..counter[p]).rev() {
            ts += 2_000;
            next += 0x10_0000;
            for op in [Op::Alloc, Op::Free] {
                let mut e = block(pid, op, next, 4096, allocated[p], ts);
                e.autograd_node = Some("AddmmBackward0".into());
                (e.autograd_seq, e.autograd_thread) = (Some(node), Some(p as u64 + 1));
                events.push(e);
            }
        }
        // The last output is kept; the rest freed.
        for addr in &live[..7] {
            ts += 2_000;
            allocated[p] -= 1 << 20;
            events.push(block(pid, Op::Free, *addr, 1 << 20, allocated[p], ts));
        }
    }
    events
}

fn best_of(rounds: usize, mut stage: impl FnMut() -> usize) -> f64 {
    (0..rounds)
        .map(|_| {
            let start = Instant::now();
            let n = stage();
            start.elapsed().as_nanos() as f64 / n as f64
        })
        .fold(f64::INFINITY, f64::min)
}

fn main() {
    let events = stream();
    let tracker = best_of(ROUNDS, || {
        let mut tracker = Tracker::new();
        for event in &events {
            tracker.apply(black_box(event));
        }
        black_box(&tracker);
        events.len()
    });
    let rules = best_of(ROUNDS, || {
        let mut analyzer = Analyzer::new(RuleConfig::default());
        let mut found = 0;
        for event in &events {
            found += analyzer.observe(&mut event.clone()).len();
        }
        found += analyzer.finish().len();
        black_box(found);
        events.len()
    });
    let clone = best_of(ROUNDS, || {
        for event in &events {
            black_box(event.clone());
        }
        events.len()
    });
    println!("{} tensor events, best of {ROUNDS} rounds, ns per event:", events.len());
    println!("  tracker               {tracker:8.1}");
    println!("  analyzer (all rules)  {:8.1}  (the event's clone {clone:.1} included)", rules);
    println!("  rules / tracker       {:8.2}x", rules / tracker);
}
