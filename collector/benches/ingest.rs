//! Collector ingest benchmark (`cargo bench -p gpuprof-collector --bench ingest`): starts the
//! real collector on loopback and sends it OTLP/HTTP protobuf as agents would — per allocation
//! lifetime, two events as log records (alloc, free: what the node's tracker takes in) and one span —
//! from two client threads. Reports, in the same run:
//!   - baseline: the spans alone (decoded and counted);
//!   - full: the events into the nodes' trackers, plus the spans (what `--otlp-events all` sends;
//!     the default summary sends a few items a second per process instead: docs/otlp.md);
//!   - memory per live allocation: RSS growth of the collector holding N open allocations.
//!
//! Client and collector share the machine, so the figures are a floor.

use std::borrow::Cow;
use std::time::Instant;

use gpuprof_model::{Event, Frame, Kind, Layer, Op, Source, Tracker};
use gpuprof_otlp::lifetimes::Lifetimes;
use gpuprof_otlp::proto::collector::logs::v1::ExportLogsServiceRequest;
use gpuprof_otlp::proto::collector::trace::v1::ExportTraceServiceRequest;
use gpuprof_otlp::proto::logs::v1::{ResourceLogs, ScopeLogs};
use gpuprof_otlp::proto::trace::v1::{ResourceSpans, ScopeSpans};
use gpuprof_otlp::resource::ProcessIdentity;
use prost::Message;

mod common;
use common::{post, start};

const LIFETIMES_PER_REQUEST: u64 = 1000;
const REQUESTS: u64 = 400;
const NODES: u64 = 10;
const CLIENTS: u64 = 2;

fn stack(depth: u32, variant: u64) -> Vec<Frame> {
    (0..depth)
        .map(|i| Frame {
            function: format!("Module.forward_{}", (variant + u64::from(i)) % 7),
            file: format!("/opt/venv/lib/python3.12/site-packages/model/layer_{i}.py"),
            line: 100 + i * 3,
        })
        .collect()
}

fn event(ts: u64, pid: u32, op: Op, addr: u64, size: u64, frames: &[Frame]) -> Event {
    let api = if op == Op::Alloc { "cuMemAlloc_v2" } else { "cuMemFree_v2" };
    let mut e = Event::new(ts, pid, pid, Source::Ebpf, Layer::Driver, op, Cow::Borrowed(api));
    e.kind = Some(Kind::Device);
    e.addr = Some(addr);
    e.size = size;
    e.comm = "python3".into();
    e.device = Some(0);
    e.stack = frames.to_vec().into();
    e
}

/// One logs request and one traces request of `LIFETIMES_PER_REQUEST` allocation lifetimes
/// (freed unless `keep`) of one process of one node.
fn requests(node: &str, pid: u32, first_ts: u64, keep: bool) -> (Vec<u8>, Vec<u8>) {
    let mut events = Vec::new();
    let frames: Vec<Vec<Frame>> = (0..8).map(|v| stack(12, v)).collect();
    for i in 0..LIFETIMES_PER_REQUEST {
        let addr = 0x7f00_0000_0000 + (u64::from(pid) << 32) + first_ts % 1_000_000_000 * 4096 + i * 4096;
        events.push(event(first_ts + i * 2, pid, Op::Alloc, addr, 4096 * (1 + i % 64), &frames[(i % 8) as usize]));
        if !keep {
            events.push(event(first_ts + i * 2 + 1, pid, Op::Free, addr, 0, &[]));
        }
    }
    let identity = ProcessIdentity { host_name: node.into(), pid, executable: "python3".into(), ..Default::default() };
    let mut tracker = Tracker::new();
    let mut lifetimes = Lifetimes::new(node);
    for e in &events {
        lifetimes.observe(e, &tracker);
        tracker.apply(e);
    }
    let spans: Vec<_> = lifetimes.take_finished().into_iter().map(|(_, s)| s).collect();
    let logs = ExportLogsServiceRequest {
        resource_logs: vec![ResourceLogs {
            resource: Some(identity.resource()),
            scope_logs: vec![ScopeLogs {
                log_records: events.iter().map(gpuprof_otlp::logs::record_of).collect(),
                ..Default::default()
            }],
            ..Default::default()
        }],
    };
    let traces = ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(identity.resource()),
            scope_spans: vec![ScopeSpans { spans, ..Default::default() }],
            ..Default::default()
        }],
    };
    (logs.encode_to_vec(), traces.encode_to_vec())
}

fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .unwrap()
        .trim()
        .trim_end_matches(" kB")
        .trim()
        .parse()
        .unwrap();
    kib * 1024
}

/// Sends every body to `path` from `CLIENTS` threads; returns seconds taken.
fn send_all(http: &str, path: &str, bodies: &[Vec<u8>]) -> f64 {
    let started = Instant::now();
    std::thread::scope(|scope| {
        for client in 0..CLIENTS {
            scope.spawn(move || {
                let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
                for body in bodies.iter().skip(client as usize).step_by(CLIENTS as usize) {
                    post(&agent, &format!("{http}{path}"), body);
                }
            });
        }
    });
    started.elapsed().as_secs_f64()
}

fn main() {
    let dir = std::env::temp_dir().join("gpuprof-collector-bench");
    std::fs::create_dir_all(&dir).unwrap();
    println!("building {REQUESTS} requests of {LIFETIMES_PER_REQUEST} allocation lifetimes over {NODES} nodes…");
    let (logs, traces): (Vec<Vec<u8>>, Vec<Vec<u8>>) = (0..REQUESTS)
        .map(|r| requests(&format!("node-{}", r % NODES), 1000 + (r % 64) as u32, 1_000_000 + r * 1_000_000, false))
        .unzip();
    let lifetimes = REQUESTS * LIFETIMES_PER_REQUEST;
    let mib = |v: &[Vec<u8>]| v.iter().map(Vec::len).sum::<usize>() as f64 / (1 << 20) as f64;
    println!("  {:.1} MiB of log requests, {:.1} MiB of trace requests", mib(&logs), mib(&traces));

    let collector = start(&dir.join("bench.redb"));
    let spans_only = send_all(&collector.http, "/v1/traces", &traces);
    let events = send_all(&collector.http, "/v1/logs", &logs);
    drop(collector);
    let baseline = lifetimes as f64 / spans_only;
    let full = lifetimes as f64 / (spans_only + events);
    println!("baseline, spans only (decode + count):        {:>10.0} spans/s", baseline);
    println!("events into the nodes' trackers:              {:>10.0} events/s", 2.0 * lifetimes as f64 / events);
    println!(
        "full (events + spans), lifetimes:             {:>10.0} spans/s ({:.2}x the baseline's time per span)",
        full,
        baseline / full
    );

    // Memory: open allocations that are never freed.
    let collector = start(&dir.join("memory.redb"));
    // Warm-up of the same size whose allocations are all freed: the heap grows to what decoding
    // requests takes, so the growth measured next is what the open allocations hold.
    let warm: Vec<Vec<u8>> = (0..20).map(|r| requests("node-m", 8, 1 + r * 1_000_000, false).0).collect();
    send_all(&collector.http, "/v1/logs", &warm);
    let before = rss_bytes(collector.child.id());
    let open_requests: Vec<Vec<u8>> = (1..=200).map(|r| requests("node-m", 7, 1 + r * 1_000_000, true).0).collect();
    send_all(&collector.http, "/v1/logs", &open_requests);
    let after = rss_bytes(collector.child.id());
    let open = 200 * LIFETIMES_PER_REQUEST;
    println!(
        "memory: {} open allocations (12-frame stacks, 8 distinct) grew RSS by {:.1} MiB: {:.0} bytes per live allocation",
        open,
        (after - before) as f64 / (1 << 20) as f64,
        (after - before) as f64 / open as f64
    );
}
