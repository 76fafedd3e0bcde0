//! Writes the fuzz targets' starting corpora (`corpus-seeds/<target>/`) from real data: the H100
//! recordings of testkit/fixtures/h100_whatif, their events as jsonl and through gpuprof's own
//! OTLP reporter, shim messages as the shim writes them, and the settings, queries and
//! configuration files the docs and the chart give. Run from the repository's root:
//!
//! ```sh
//! cargo +nightly run --manifest-path fuzz/Cargo.toml --example seeds
//! ```

use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gpuprof_model::shim::wire::{Block, Message};
use gpuprof_model::{Analyzer, Event, Level, RuleConfig};
use gpuprof_otlp::client::{Delivery, Protocol};
use gpuprof_otlp::proto::collector::logs::v1::ExportLogsServiceRequest;
use gpuprof_otlp::proto::collector::metrics::v1::ExportMetricsServiceRequest;
use gpuprof_otlp::proto::collector::trace::v1::ExportTraceServiceRequest;
use gpuprof_otlp::proto::logs::v1::ResourceLogs;
use gpuprof_otlp::proto::metrics::v1::ResourceMetrics;
use gpuprof_otlp::proto::trace::v1::ResourceSpans;
use gpuprof_otlp::reporter::{OtlpTuning, Outbox, Telemetry};
use gpuprof_recording::{EventFile, Writer};
use prost::Message as _;

/// Events taken from each recording: enough for every kind of entry, few enough to keep the
/// corpora small (a fuzzer mutates small inputs faster).
const EVENTS_PER_SEED: usize = 40;

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("fuzz/ is in the repository").to_path_buf();
    let seeds = root.join("fuzz/corpus-seeds");
    let recordings = recordings(&root);
    let mut all_events = Vec::new();
    for (name, path) in &recordings {
        let events = first_events(path, EVENTS_PER_SEED);
        write(&seeds, "recording", &format!("{name}.gpuprof"), &recording(&events));
        write(&seeds, "jsonl", &format!("{name}.jsonl"), &jsonl(&events));
        all_events.push(events);
    }
    // One whole real capture as it was written (zstd), and one cut short: a killed capture.
    let (_, smallest) =
        recordings.iter().min_by_key(|(_, p)| p.metadata().map(|m| m.len()).unwrap_or(u64::MAX)).unwrap();
    let whole = std::fs::read(smallest).expect("the recording reads");
    write(&seeds, "recording", "whole-zstd.gpuprof", &whole);
    write(&seeds, "recording", "cut-zstd.gpuprof", &whole[..whole.len() / 2]);
    otlp(&seeds, &first_events(smallest, 80));
    shim(&seeds, &all_events[0]);
    lines(&seeds, "allocator_settings", ALLOCATOR_SETTINGS);
    lines(&seeds, "level_request", LEVEL_QUERIES);
    daemon_config(&seeds, &root);
    println!("seeds written under {}", seeds.display());
}

fn recordings(root: &Path) -> Vec<(String, PathBuf)> {
    let dir = root.join("testkit/fixtures/h100_whatif");
    let mut found: Vec<(String, PathBuf)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|entry| {
            let path = entry.ok()?.path();
            let name = path.file_name()?.to_str()?.strip_suffix(".gpuprof")?.to_string();
            Some((name, path))
        })
        .collect();
    found.sort();
    found
}

fn first_events(path: &Path, most: usize) -> Vec<Event> {
    let mut file = EventFile::open(path).unwrap_or_else(|e| panic!("{e}"));
    let mut events = Vec::new();
    while let Some(event) = file.next_event().unwrap_or_else(|e| panic!("{e}")) {
        events.push(event);
        if events.len() == most {
            break;
        }
    }
    events
}

/// Uncompressed: the fuzzer's mutations then change entries, not a zstd stream.
fn recording(events: &[Event]) -> Vec<u8> {
    let mut writer = Writer::new(Vec::new(), false).expect("in memory");
    for event in events {
        writer.write(event).expect("in memory");
    }
    writer.finish(0).expect("in memory")
}

/// As `gpuprof export --format jsonl` writes them.
fn jsonl(events: &[Event]) -> Vec<u8> {
    let mut out = Vec::new();
    for event in events {
        serde_json::to_writer(&mut out, event).expect("in memory");
        out.push(b'\n');
    }
    out
}

/// The requests gpuprof's OTLP reporter sends for these events (every event as a log record,
/// findings, spans, gauges and profiles), each as the `otlp_request` target takes it (a byte for
/// the signal, then protobuf) and as the `otlp_http_body` target does (protobuf, JSON, gzip).
fn otlp(seeds: &Path, events: &[Event]) {
    let sent = Arc::new(Mutex::new(Sent::default()));
    let tuning = OtlpTuning {
        otlp_events: Some(gpuprof_otlp::reporter::EventStream::All),
        otlp_profile_interval: Some(0.001),
        ..OtlpTuning::default()
    };
    let options = tuning.options("http://seeds", Protocol::Http, None, Some("node-a".into())).expect("the defaults");
    let mut telemetry = Telemetry::with_outbox(options, Box::new(Recorded(sent.clone())), 1);
    let mut analyzer = Analyzer::new(RuleConfig::default());
    for event in events {
        let mut event = event.clone();
        telemetry.before(&event, analyzer.tracker());
        let fired = analyzer.observe(&mut event);
        telemetry.after(&event, &fired, analyzer.tracker());
    }
    let last = events.last().map_or(1, |e| e.ts);
    let fired = analyzer.finish();
    gpuprof_model::Reporter::findings(&mut telemetry, &fired);
    telemetry.flush(analyzer.tracker(), last + 60_000_000_000);
    let sent = std::mem::take(&mut *sent.lock().expect("sent"));
    let logs = ExportLogsServiceRequest { resource_logs: sent.logs };
    let traces = ExportTraceServiceRequest { resource_spans: sent.spans };
    let metrics = ExportMetricsServiceRequest { resource_metrics: sent.metrics };
    let requests = [
        ("logs", 0u8, logs.encode_to_vec(), serde_json::to_vec(&logs).expect("JSON")),
        ("traces", 1, traces.encode_to_vec(), serde_json::to_vec(&traces).expect("JSON")),
        ("metrics", 2, metrics.encode_to_vec(), serde_json::to_vec(&metrics).expect("JSON")),
    ];
    for (name, signal, protobuf, json) in requests {
        write(seeds, "otlp_request", &format!("{name}.pb"), &[&[signal][..], &protobuf].concat());
        // Content types 0 (protobuf) and 1 (JSON); encodings 0 (none) and 2 (gzip).
        write(seeds, "otlp_http_body", &format!("{name}.pb"), &[&[signal, 0, 0][..], &protobuf].concat());
        write(seeds, "otlp_http_body", &format!("{name}.json"), &[&[signal, 1, 0][..], &json].concat());
        write(seeds, "otlp_http_body", &format!("{name}.pb.gz"), &[&[signal, 0, 2][..], &gzip(&protobuf)].concat());
    }
}

#[derive(Default)]
struct Sent {
    logs: Vec<ResourceLogs>,
    spans: Vec<ResourceSpans>,
    metrics: Vec<ResourceMetrics>,
}

/// An outbox that keeps what the reporter hands it.
struct Recorded(Arc<Mutex<Sent>>);

impl Outbox for Recorded {
    fn logs(&mut self, resource_logs: Vec<ResourceLogs>) {
        self.0.lock().expect("sent").logs.extend(resource_logs);
    }

    fn spans(&mut self, resource_spans: Vec<ResourceSpans>) {
        self.0.lock().expect("sent").spans.extend(resource_spans);
    }

    fn metrics(&mut self, resource_metrics: Vec<ResourceMetrics>) {
        self.0.lock().expect("sent").metrics.extend(resource_metrics);
    }

    fn endpoint(&self) -> String {
        "(seeds)".into()
    }

    fn delivery(&self) -> Delivery {
        Delivery::default()
    }

    fn queued_bytes(&self) -> usize {
        0
    }

    fn finish(self: Box<Self>, _: Duration) -> Delivery {
        Delivery::default()
    }
}

/// What a shim writes on its connection, each message as `Message::write` frames it: one per
/// seed, and the whole stream in one.
fn shim(seeds: &Path, events: &[Event]) {
    let first = events.first().expect("events");
    let stack = events.iter().find(|e| !e.stack.frames().is_empty()).map(|e| e.stack.frames().to_vec());
    let mut messages = vec![
        Message::Process {
            pid: first.pid,
            ppid: 1,
            comm: Cow::Borrowed(&first.comm),
            rank: Some(0),
            allocator_settings: Some(Cow::Borrowed("expandable_segments:True")),
        },
        Message::Stack { id: 1, frames: stack.unwrap_or_default() },
        Message::Name { id: 1, text: Cow::Borrowed("AddmmBackward0") },
        Message::Level { level: Level::Tensors, ts: first.ts },
        Message::ForgetStacks,
    ];
    for event in events.iter().filter(|e| e.allocated.is_some()).take(4) {
        messages.push(Message::Block(Block {
            ts: event.ts,
            pid: event.pid,
            tid: event.tid,
            ptr: event.addr.unwrap_or(0),
            delta: if event.op == gpuprof_model::Op::Free { -(event.size as i64) } else { event.size as i64 },
            allocated: event.allocated.unwrap_or(0),
            reserved: event.reserved.unwrap_or(0),
            device: event.device.unwrap_or(0) as i8,
            stack: 1,
            autograd: Some((1, 7, 1)),
        }));
    }
    let line = serde_json::to_string(events.iter().find(|e| e.allocated.is_none()).unwrap_or(first)).expect("JSON");
    messages.push(Message::Json(Cow::Owned(line)));
    let mut stream = Vec::new();
    for (n, message) in messages.iter().enumerate() {
        let mut one = Vec::new();
        message.write(&mut one);
        write(seeds, "shim_wire", &format!("message-{n}"), &one);
        stream.extend_from_slice(&one);
    }
    write(seeds, "shim_wire", "stream", &stream);
    write(seeds, "shim_wire", "word", b"level driver\n");
}

const ALLOCATOR_SETTINGS: &[&str] = &[
    "expandable_segments:True,max_split_size_mb:128,garbage_collection_threshold:0.6",
    "expandable_segments:True",
    "max_split_size_mb:512",
    "roundup_power2_divisions:4",
    "expandable_segments:True,roundup_power2_divisions:4",
    "roundup_power2_divisions:[256:1,512:2,1024:4,>:8]",
    "max_non_split_rounding_mb:64,backend:native",
    "",
];

const LEVEL_QUERIES: &[&str] = &[
    "pid=4711&level=tensors&seconds=300",
    "pid=4711&level=off&seconds=60",
    "pid=4711&level=driver",
    "pid=1&level=full",
    "pid=7&level=tensors&seconds=-1",
];

/// The daemon's configuration as the plain manifests ship it (the chart's defaults rendered), and
/// one with the keys the chart leaves out: a sidecar's shim socket, post-mortems, tokens.
fn daemon_config(seeds: &Path, root: &Path) {
    let manifests = std::fs::read_to_string(root.join("deploy/manifests/gpuprof.yaml")).expect("the manifests read");
    let block: Vec<&str> = manifests
        .lines()
        .skip_while(|line| line.trim() != "daemon.toml: |")
        .skip(1)
        .take_while(|line| line.starts_with("    "))
        .map(str::trim)
        .collect();
    assert!(!block.is_empty(), "deploy/manifests/gpuprof.yaml has a daemon.toml");
    write(seeds, "daemon_config", "manifests.toml", (block.join("\n") + "\n").as_bytes());
    write(seeds, "daemon_config", "sidecar.toml", SIDECAR_CONFIG.as_bytes());
}

const SIDECAR_CONFIG: &str = r#"otlp_endpoint = "https://collector.example:4318"
otlp_protocol = "http"
otlp_token_file = "/var/run/secrets/gpuprof/token"
metrics_token = "scrape-me"
capture = "shim"
sidecar = "/gpuprof"
shim_socket = "/gpuprof/shim.sock"
shim_socket_mode = "0666"
shim_socket_group = "1000"
level = "off"
detail = 300
no_auto_raise = false
scan_interval = 0.25
retain_exited = 300.5
postmortem_window = 30
postmortem_max_mib = 512
postmortem_retention = 604800
postmortem_process_mib = 8
postmortem_node_mib = 64
otlp_profile_interval = 10
otlp_profile_stacks = 50
otlp_span_min_bytes = 67108864
otlp_queue_mib = 64
"#;

fn lines(seeds: &Path, target: &str, lines: &[&str]) {
    for (n, line) in lines.iter().enumerate() {
        write(seeds, target, &format!("{n}"), line.as_bytes());
    }
}

fn gzip(body: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    encoder.write_all(body).expect("in memory");
    encoder.finish().expect("in memory")
}

fn write(seeds: &Path, target: &str, name: &str, bytes: &[u8]) {
    let dir = seeds.join(target);
    std::fs::create_dir_all(&dir).expect("the seeds' directory can be made");
    std::fs::write(dir.join(name), bytes).expect("a seed can be written");
}
