//! One node's stream: `processes` training processes, each the recording's busiest process
//! replayed at `rate` events a second (its own time scaled, its steps repeated), and a short
//! DataLoader-like worker every `worker_every` seconds that makes its own CUDA context and
//! exits holding 2 MiB (two findings, to time). The node's own agent path — the leak rules and
//! the OTLP export, summarized or in full — runs over it on a simulated clock, and what the
//! export hands its client is recorded with the simulated time it was handed: the stream a
//! real node would send, made once, then sent by every simulated node in real time.

use std::borrow::Cow;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gpuprof_model::{Analyzer, Event, Kind, Layer, Op, RuleConfig, Source};
use gpuprof_otlp::client::Delivery;
use gpuprof_otlp::client::Protocol;
use gpuprof_otlp::proto::logs::v1::ResourceLogs;
use gpuprof_otlp::proto::metrics::v1::ResourceMetrics;
use gpuprof_otlp::proto::trace::v1::ResourceSpans;
use gpuprof_otlp::reporter::{EventStream, OtlpOptions, OtlpTuning, Outbox, Telemetry};

/// Pids of simulated processes start here: above Linux's highest pid (2^22), so no lookup in
/// /proc ever finds a real process of this machine.
pub const SIMULATED_PID_BASE: u32 = 5_000_000;
/// How often the agent hands what it has to its client (it does after each ring-buffer poll).
const FLUSH_EVERY_NS: u64 = 100_000_000;
const WORKER_BYTES: u64 = 2 << 20;

/// What a node hands its OTLP client, one call's worth.
#[derive(Clone)]
pub enum Outgoing {
    Logs(Vec<ResourceLogs>),
    Spans(Vec<ResourceSpans>),
    Metrics(Vec<ResourceMetrics>),
}

/// A node's stream, by simulated time (ns from the start).
pub struct NodeStream {
    pub batches: Vec<(u64, Outgoing)>,
    pub events: u64,
    /// (simulated ns, pid, kind) of each finding the node's rules fired.
    pub findings: Vec<(u64, u32, &'static str)>,
    /// CPU seconds the agent path took for the whole stream (rules, tracker, export).
    pub cpu_seconds: f64,
}

#[derive(Clone, Copy)]
pub struct NodeShape {
    pub processes: u32,
    /// Allocator (and driver) events per second of each process.
    pub rate: f64,
    pub seconds: f64,
    /// A worker every this many seconds (0: none).
    pub worker_every: f64,
}

/// A process's events split for replay: what happens once (the CUDA context, weights, the
/// caching allocator's segments: allocations never freed in the recording, failed calls) and
/// the steady loop (allocations freed again within it), which repeats.
pub struct Template {
    pub prologue: Vec<Event>,
    pub round: Vec<Event>,
}

/// The recording's busiest process (most allocator events), split into prologue and loop.
pub fn template(recording: &[Event]) -> Template {
    let mut counts: std::collections::HashMap<u32, u64> = std::collections::HashMap::new();
    for event in recording.iter().filter(|e| e.layer == Layer::Allocator) {
        *counts.entry(event.pid).or_default() += 1;
    }
    let busiest = counts.into_iter().max_by_key(|&(pid, n)| (n, Reverse(pid))).map(|(pid, _)| pid);
    let Some(pid) = busiest.or_else(|| recording.first().map(|e| e.pid)) else {
        return Template { prologue: Vec::new(), round: Vec::new() };
    };
    let events: Vec<&Event> = recording.iter().filter(|e| e.pid == pid && e.layer != Layer::Process).collect();
    // Pairs of an allocation (mapping, reservation) and its release, by address.
    let family = |op: Op| match op {
        Op::Alloc | Op::Free => Some(0),
        Op::Map | Op::Unmap => Some(1),
        Op::Reserve | Op::Unreserve => Some(2),
        _ => None,
    };
    let mut open: std::collections::HashMap<(Layer, u8, u64), usize> = std::collections::HashMap::new();
    let mut paired = vec![false; events.len()];
    for (i, event) in events.iter().enumerate() {
        let (Some(f), Some(addr), true) = (family(event.op), event.addr, event.succeeded()) else { continue };
        let key = (event.layer, f, addr);
        match event.op {
            Op::Alloc | Op::Map | Op::Reserve => {
                open.insert(key, i);
            }
            _ => {
                if let Some(j) = open.remove(&key) {
                    paired[i] = true;
                    paired[j] = true;
                }
            }
        }
    }
    let (mut prologue, mut round) = (Vec::new(), Vec::new());
    for (event, in_round) in events.into_iter().zip(paired) {
        let mut event = event.clone();
        event.segment = None; // the replay's tracker finds it anew
        if in_round {
            round.push(event);
        } else {
            prologue.push(event);
        }
    }
    if !prologue.iter().chain(&round).any(|e| e.op == Op::CtxCreate) {
        // A recording made after the process set up CUDA (attach): its context, as at its start.
        let first = prologue.first().or(round.first());
        if let Some(first) = first {
            let mut context = Event::new(
                first.ts,
                first.pid,
                first.pid,
                Source::Ebpf,
                Layer::Driver,
                Op::CtxCreate,
                Cow::Borrowed("cuDevicePrimaryCtxRetain"),
            );
            (context.addr, context.device, context.comm) = (Some(0x5555_0000), Some(0), first.comm.clone());
            prologue.insert(0, context);
        }
    }
    Template { prologue, round }
}

/// One process of the node: its prologue, then its loop at `rate`, repeated, from `offset` ns in.
struct Replayed<'t> {
    template: &'t Template,
    pid: u32,
    /// ns of simulated time per ns of the loop's own time.
    scale: f64,
    period: u64,
    offset: u64,
    /// Prologue events emitted so far.
    prologue: usize,
    round: u64,
    index: usize,
}

/// Each round's addresses are its own (a block of round 2 is not one of round 1 still held).
const ROUND_ADDRESS_STRIDE: u64 = 1 << 40;

impl Replayed<'_> {
    fn next(&mut self, start: u64) -> Option<Event> {
        let (prologue, round) = (&self.template.prologue, &self.template.round);
        let begin = start + self.offset;
        let mut event = if self.prologue < prologue.len() {
            let mut event = prologue[self.prologue].clone();
            event.ts = begin + self.prologue as u64 * 1_000;
            self.prologue += 1;
            event
        } else {
            if round.is_empty() {
                return None;
            }
            if self.index == round.len() {
                self.index = 0;
                self.round += 1;
            }
            let original = &round[self.index];
            self.index += 1;
            let mut event = original.clone();
            let since = ((original.ts - round[0].ts) as f64 * self.scale) as u64;
            event.ts = begin + prologue.len() as u64 * 1_000 + self.round * self.period + since;
            event.addr = event.addr.map(|a| a.wrapping_add(self.round * ROUND_ADDRESS_STRIDE));
            event
        };
        event.tid = self.pid + (event.tid.wrapping_sub(event.pid) % 1000);
        event.pid = self.pid;
        event.ppid = Some(1);
        Some(event)
    }
}

/// Records what the export hands over, at the simulated time set before each call.
#[derive(Clone)]
struct Recorder {
    now: Arc<AtomicU64>,
    batches: Arc<Mutex<Vec<(u64, Outgoing)>>>,
}

impl Recorder {
    fn push(&mut self, outgoing: Outgoing) {
        let now = self.now.load(Ordering::Relaxed);
        self.batches.lock().expect("recorder").push((now, outgoing));
    }
}

impl Outbox for Recorder {
    fn logs(&mut self, resource_logs: Vec<ResourceLogs>) {
        self.push(Outgoing::Logs(resource_logs));
    }

    fn spans(&mut self, resource_spans: Vec<ResourceSpans>) {
        self.push(Outgoing::Spans(resource_spans));
    }

    fn metrics(&mut self, resource_metrics: Vec<ResourceMetrics>) {
        self.push(Outgoing::Metrics(resource_metrics));
    }

    fn endpoint(&self) -> String {
        "(recorded)".into()
    }

    fn delivery(&self) -> Delivery {
        Delivery::default()
    }

    fn queued_bytes(&self) -> usize {
        0
    }

    fn finish(self: Box<Self>, _drain: Duration) -> Delivery {
        Delivery::default()
    }
}

/// A short-lived worker's events: fork, its own context, 2 MiB, exit holding it.
fn worker(ts: u64, pid: u32, parent: u32) -> Vec<Event> {
    let event = |ts, layer, op, api: &'static str| {
        let mut e = Event::new(ts, pid, pid, Source::Ebpf, layer, op, Cow::Borrowed(api));
        e.comm = "pt_data_worker".into();
        e.ppid = Some(parent);
        e
    };
    let fork = event(ts, Layer::Process, Op::Fork, "sched_process_fork");
    let mut context = event(ts + 1_000_000, Layer::Driver, Op::CtxCreate, "cuDevicePrimaryCtxRetain");
    (context.addr, context.device) = (Some(0x5555_0000), Some(0));
    let mut alloc = event(ts + 2_000_000, Layer::Driver, Op::Alloc, "cuMemAlloc_v2");
    (alloc.kind, alloc.device, alloc.addr, alloc.size) =
        (Some(Kind::Device), Some(0), Some(0x7e00_0000_0000), WORKER_BYTES);
    let mut exit = event(ts + 50_000_000, Layer::Process, Op::Exit, "sched_process_exit");
    exit.exit_code = Some(0);
    vec![fork, context, alloc, exit]
}

/// The node's stream at `start` (ns since the epoch: event times are `start` + simulated time).
pub fn build(template: &Template, shape: NodeShape, events: EventStream, start: u64) -> NodeStream {
    let round = &template.round;
    let round_ns = round.last().map_or(0, |e| e.ts) - round.first().map_or(0, |e| e.ts);
    let round_rate = round.len() as f64 / (round_ns.max(1) as f64 / 1e9);
    let scale = round_rate / shape.rate;
    // One mean gap past the last event before the next round starts.
    let period = ((round_ns as f64 + 1e9 / round_rate) * scale) as u64;
    let mut processes: Vec<Replayed<'_>> = (0..shape.processes)
        .map(|i| Replayed {
            template,
            pid: SIMULATED_PID_BASE + i,
            scale,
            period: period.max(1),
            // Staggered a little, so the processes' steps do not coincide.
            offset: u64::from(i) * 13_000_000,
            prologue: 0,
            round: 0,
            index: 0,
        })
        .collect();
    let end = start + (shape.seconds * 1e9) as u64;
    let mut heap: BinaryHeap<Reverse<(u64, usize)>> = BinaryHeap::new();
    let mut pending: Vec<Option<Event>> = processes.iter_mut().map(|p| p.next(start)).collect();
    for (i, event) in pending.iter().enumerate() {
        if let Some(event) = event {
            heap.push(Reverse((event.ts, i)));
        }
    }
    let mut workers: Vec<Event> = Vec::new();
    if shape.worker_every > 0.0 {
        let every = (shape.worker_every * 1e9) as u64;
        let mut at = start + every / 2;
        let mut n = 0;
        while at + 60_000_000 < end {
            workers.extend(worker(at, SIMULATED_PID_BASE + 1000 + n, SIMULATED_PID_BASE));
            at += every;
            n += 1;
        }
    }
    let mut workers = workers.into_iter().peekable();

    let recorder = Recorder { now: Arc::new(AtomicU64::new(start)), batches: Arc::default() };
    let tuning = OtlpTuning { otlp_events: Some(events), ..Default::default() };
    let options: OtlpOptions = tuning
        .options("http://recorded", Protocol::Grpc, None, Some("sim-node".into()))
        .expect("default settings are valid");
    let cpu_before = gpuprof_procfs::process::own_cpu_seconds();
    let mut telemetry = Telemetry::with_outbox(options, Box::new(recorder.clone()), start);
    let mut analyzer = Analyzer::new(RuleConfig::default());
    let mut stream = NodeStream { batches: Vec::new(), events: 0, findings: Vec::new(), cpu_seconds: 0.0 };
    let mut next_flush = start + FLUSH_EVERY_NS;
    loop {
        let from_training = heap.peek().map(|Reverse((ts, _))| *ts);
        let from_worker = workers.peek().map(|e| e.ts);
        let training_first = match (from_training, from_worker) {
            (Some(t), Some(w)) => t <= w,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (None, None) => break,
        };
        let mut event = if training_first {
            let Reverse((_, i)) = heap.pop().expect("peeked");
            let event = pending[i].take().expect("pending");
            pending[i] = processes[i].next(start);
            if let Some(next) = &pending[i] {
                heap.push(Reverse((next.ts, i)));
            }
            event
        } else {
            workers.next().expect("peeked")
        };
        if event.ts >= end {
            break;
        }
        while event.ts >= next_flush {
            recorder.now.store(next_flush, Ordering::Relaxed);
            telemetry.flush(analyzer.tracker(), next_flush);
            next_flush += FLUSH_EVERY_NS;
        }
        recorder.now.store(event.ts, Ordering::Relaxed);
        telemetry.before(&event, analyzer.tracker());
        let fired = analyzer.observe(&mut event);
        telemetry.after(&event, &fired, analyzer.tracker());
        for finding in &fired {
            stream.findings.push((event.ts - start, finding.pid, finding.kind.as_str()));
        }
        stream.events += 1;
    }
    recorder.now.store(end, Ordering::Relaxed);
    telemetry.flush(analyzer.tracker(), end);
    stream.cpu_seconds = gpuprof_procfs::process::own_cpu_seconds() - cpu_before;
    drop(telemetry);
    stream.batches = std::mem::take(&mut *recorder.batches.lock().expect("recorder"));
    for (ts, _) in &mut stream.batches {
        *ts -= start;
    }
    stream
}

/// Items (log records, spans, metric points) and encoded bytes of what a node hands over.
pub fn count(batches: &[(u64, Outgoing)]) -> (u64, u64, u64, u64) {
    use prost::Message;
    let (mut records, mut spans, mut points, mut bytes) = (0u64, 0u64, 0u64, 0u64);
    for (_, outgoing) in batches {
        match outgoing {
            Outgoing::Logs(groups) => {
                records += groups.iter().flat_map(|g| &g.scope_logs).map(|s| s.log_records.len() as u64).sum::<u64>();
                bytes += groups.iter().map(|g| g.encoded_len() as u64).sum::<u64>();
            }
            Outgoing::Spans(groups) => {
                spans += groups.iter().flat_map(|g| &g.scope_spans).map(|s| s.spans.len() as u64).sum::<u64>();
                bytes += groups.iter().map(|g| g.encoded_len() as u64).sum::<u64>();
            }
            Outgoing::Metrics(groups) => {
                use gpuprof_otlp::proto::metrics::v1::metric::Data;
                points += groups
                    .iter()
                    .flat_map(|g| &g.scope_metrics)
                    .flat_map(|s| &s.metrics)
                    .map(|m| match &m.data {
                        Some(Data::Gauge(g)) => g.data_points.len() as u64,
                        _ => 0,
                    })
                    .sum::<u64>();
                bytes += groups.iter().map(|g| g.encoded_len() as u64).sum::<u64>();
            }
        }
    }
    (records, spans, points, bytes)
}
