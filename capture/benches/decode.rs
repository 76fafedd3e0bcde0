//! Decode throughput of the user-space pipeline on one core: ring-buffer records → contract
//! events → tracker → leak rules → jsonl bytes, per stage, against copying the records alone (the floor any
//! consumer pays) in the same run.
//!
//!     cargo bench -p gpuprof-capture --bench decode

use std::hint::black_box;
use std::time::Instant;

use gpuprof_capture::clock::Clock;
use gpuprof_capture::decode::Decoder;
use gpuprof_capture::kernel::Record;
use gpuprof_ebpf::types::gp_record_kind;
use gpuprof_model::driver_api;
use gpuprof_model::track::Tracker;
use gpuprof_model::{Analyzer, RuleConfig};

const RECORDS: usize = 1_000_000;
const ROUNDS: usize = 5;

/// A realistic stream: alloc/free pairs over 8 processes, an IPC open every 50 calls.
fn records() -> Vec<Record> {
    let (alloc, _) = driver_api::by_name("cuMemAlloc_v2").unwrap();
    let (free, _) = driver_api::by_name("cuMemFree_v2").unwrap();
    let (open, _) = driver_api::by_name("cuIpcOpenMemHandle_v2").unwrap();
    (0..RECORDS)
        .map(|i| {
            let mut r = Record::default();
            r.header.kind = gp_record_kind::GP_RECORD_DRIVER.0;
            r.header.ts_ns = 1_000_000 + i as u64 * 1000;
            r.header.duration_ns = 90_000;
            r.header.pid = 1000 + (i % 8) as u32;
            r.header.tid = r.header.pid;
            r.header.ppid = 1;
            r.header.device = -1;
            r.header.comm[..7].copy_from_slice(b"python3");
            r.header.addr = 0x7f00_0000_0000 + ((i / 2) as u64 % 4096) * (2 << 20);
            if i % 50 == 49 {
                r.header.api = open;
                r.header.handle_len = 64;
                r.handle = Some([0xab; 64]);
            } else if i % 2 == 0 {
                r.header.api = alloc;
                r.header.size = 2 << 20;
            } else {
                r.header.api = free;
            }
            r
        })
        .collect()
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
    let input = records();
    let clock = Clock::with_offset(1_700_000_000_000_000_000);

    let copy = best_of(ROUNDS, || {
        let mut sink = 0u64;
        for r in &input {
            // The fixed-size header is what the ring buffer hands over for most records.
            let copied = black_box(r.header);
            sink = sink.wrapping_add(copied.addr);
        }
        black_box(sink);
        input.len()
    });
    let decode = best_of(ROUNDS, || {
        let mut decoder = Decoder::new(clock);
        for r in &input {
            black_box(decoder.decode(r).unwrap());
        }
        input.len()
    });
    let track = best_of(ROUNDS, || {
        let mut decoder = Decoder::new(clock);
        let mut tracker = Tracker::new();
        for r in &input {
            tracker.apply(&decoder.decode(r).unwrap());
        }
        black_box(tracker.processes().len());
        input.len()
    });
    let rules = best_of(ROUNDS, || {
        let mut decoder = Decoder::new(clock);
        let mut analyzer = Analyzer::new(RuleConfig::default());
        let mut fired = 0;
        for r in &input {
            fired += analyzer.observe(&mut decoder.decode(r).unwrap()).len();
        }
        black_box(fired + analyzer.finish().len());
        input.len()
    });
    let jsonl = best_of(ROUNDS, || {
        let mut decoder = Decoder::new(clock);
        let mut analyzer = Analyzer::new(RuleConfig::default());
        let mut out = Vec::with_capacity(400 * input.len());
        for r in &input {
            let mut event = decoder.decode(r).unwrap();
            black_box(analyzer.observe(&mut event));
            serde_json::to_writer(&mut out, &event).unwrap();
            out.push(b'\n');
        }
        black_box(out.len());
        input.len()
    });

    println!("decode pipeline, {RECORDS} records, best of {ROUNDS}, one core");
    println!("{:<34} {:>10} {:>14} {:>10}", "stage", "ns/event", "events/s", "vs copy");
    for (name, ns) in [
        ("copy record (floor)", copy),
        ("decode", decode),
        ("decode + track", track),
        ("decode + track + leak rules", rules),
        ("decode + track + rules + jsonl", jsonl),
    ] {
        println!("{:<34} {:>10.1} {:>14.0} {:>9.1}x", name, ns, 1e9 / ns, ns / copy);
    }
}
