//! Symbolization throughput with a warm cache: 32-frame stacks of known code objects to
//! `file:line function`, against cloning the resolved frames alone (the floor any consumer of a
//! frame pays) in the same run.
//!
//!     cargo bench -p gpuprof-pystack --bench symbolize

use std::hint::black_box;
use std::time::Instant;

use gpuprof_model::event::Frame;
use gpuprof_pystack::code::CodeInfo;
use gpuprof_pystack::memory::{Memory, MemoryError};
use gpuprof_pystack::offsets::{layout_for, Version};
use gpuprof_pystack::Symbolizer;

const EVENTS: usize = 100_000;
const DEPTH: usize = 32;

/// Every read fails: a warm cache must not need one.
struct NoMemory;

impl Memory for NoMemory {
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), MemoryError> {
        Err(MemoryError::Unreadable { pid: 0, addr, len: buf.len(), reason: "cold cache".into() })
    }
}

/// A location table of `entries` one-line entries, one code unit each, a line apart.
fn line_table(entries: usize) -> Vec<u8> {
    (0..entries).flat_map(|_| [0x80 | (11 << 3), 0, 0]).collect()
}

fn main() {
    let layout = layout_for(Version { major: 3, minor: 11 }).unwrap();
    let adaptive = u64::from(layout.offsets.code_adaptive.unwrap());
    let mut symbolizer = Symbolizer::new(layout);
    let codes: Vec<u64> = (0..DEPTH as u64).map(|i| 0x7f00_0000_0000 + i * 0x1000).collect();
    for (i, &code) in codes.iter().enumerate() {
        let info = CodeInfo {
            function: format!("Model.layer_{i}"),
            file: "/srv/train/model.py".to_string(),
            first_line: 10 * i as i32,
            line_table: line_table(200),
        };
        symbolizer.insert(code, info);
    }
    // Each event: the same 32 code objects, at one of 4 instructions each.
    let stacks: Vec<Vec<(u64, u64)>> =
        (0..4u64).map(|k| codes.iter().map(|&c| (c, c + adaptive + 2 * (40 + k * 30))).collect()).collect();
    let warm: Vec<Vec<Frame>> =
        stacks.iter().map(|s| s.iter().map(|&(c, i)| symbolizer.frame(&NoMemory, c, i).unwrap()).collect()).collect();

    let best = |f: &mut dyn FnMut() -> usize| -> f64 {
        (0..5)
            .map(|_| {
                let start = Instant::now();
                let n = f();
                start.elapsed().as_nanos() as f64 / n as f64
            })
            .fold(f64::INFINITY, f64::min)
    };
    let floor = best(&mut || {
        for e in 0..EVENTS {
            black_box(warm[e % 4].clone());
        }
        EVENTS
    });
    let symbolize = best(&mut || {
        for e in 0..EVENTS {
            let frames: Vec<Frame> =
                stacks[e % 4].iter().map(|&(c, i)| symbolizer.frame(&NoMemory, c, i).unwrap()).collect();
            black_box(frames);
        }
        EVENTS
    });
    println!("symbolization, warm cache, {DEPTH}-frame stacks, {EVENTS} events, best of 5, one core");
    println!("{:<28} {:>12} {:>14} {:>14} {:>8}", "stage", "ns/event", "events/s", "frames/s", "vs floor");
    for (name, ns) in [("clone resolved frames", floor), ("symbolize (cache hit)", symbolize)] {
        println!("{:<28} {:>12.0} {:>14.0} {:>14.0} {:>7.2}x", name, ns, 1e9 / ns, 1e9 / ns * DEPTH as f64, ns / floor);
    }
}
