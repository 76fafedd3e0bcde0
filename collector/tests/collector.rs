//! gpuprof-collector end to end: agents send OTLP (gRPC and HTTP) from multiprocessing/IPC
//! workloads on the libcuda stand-in, and the collector serves exactly the findings the agent's
//! own rules fired, and its processes; bad input gets the right status while the collector keeps
//! serving; a restart keeps findings, open allocations and the nodes' summaries; Prometheus'
//! promtool accepts /metrics.

// A test reads as one scenario from start to end, so it may run past the length limit on functions.
#![allow(clippy::too_many_lines)]

use std::borrow::Cow;
use std::io::BufReader;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use gpuprof_model::{Event, Finding, Layer, Op, Source};
use gpuprof_otlp::proto::collector::logs::v1::ExportLogsServiceRequest;
use gpuprof_otlp::resource::ProcessIdentity;
use gpuprof_testkit::collector::{
    allocator_gauges, collector_bin, free_port, handed_over, logs_request, logs_request_of, nvml_gauge, otelcol_bin,
    profile_record, records_request, send_a_finding, synthetic, trainer, Collector, Jaeger, OpenTelemetryCollector,
};
use gpuprof_testkit::*;
use prost::Message;
use serde_json::Value;

const MIB: u64 = 1 << 20;

/// The contract fields of a finding from the API (without the collector's id and node), to
/// compare with the agent's own.
fn contract(value: &Value) -> Finding {
    let mut value = value.clone();
    let object = value.as_object_mut().unwrap();
    object.remove("id");
    object.remove("node");
    serde_json::from_value(value).unwrap()
}

struct AgentRun {
    findings: Vec<Finding>,
    events: Vec<Event>,
    expected: Vec<Value>,
    stderr: String,
}

fn run_agent(name: &str, scenario: &str, otlp: &[&str]) -> AgentRun {
    // OTLP carries every event; the file keeps them all too, to be counted against it.
    let args: Vec<&str> = otlp.iter().copied().chain(["--all-processes"]).collect();
    let run = run_leaks(&format!("collector_{name}"), scenario, &[], &args);
    AgentRun { findings: run.findings, events: read_events(&run.events), expected: run.expected, stderr: run.stderr }
}

/// Allocations that make a span: successful driver allocations, and tensor blocks of 64 MiB up.
fn allocations(events: &[Event]) -> u64 {
    events
        .iter()
        .filter(|e| e.op == Op::Alloc && e.succeeded() && e.addr.is_some() && e.kind.is_some())
        .filter(|e| e.layer == Layer::Driver || (e.layer == Layer::Allocator && e.size >= 64 * MIB))
        .count() as u64
}

#[test]
fn agents_over_grpc_and_http_give_the_collector_the_agents_own_findings() {
    let dir = scratch("collector_e2e");
    let collector = Collector::start(&dir.join("c.redb"), &[]);
    let grpc = run_agent("grpc", "ipc-left-open", &["--otlp-endpoint", &collector.grpc, "--node-name", "node-a"]);
    let http = run_agent(
        "http",
        "export-freed",
        &["--otlp-endpoint", &collector.http, "--otlp-protocol", "http", "--node-name", "node-b"],
    );
    let mut handed_total = 0;
    for run in [&grpc, &http] {
        // Every event (these workloads make driver and process events only), each finding, the
        // profiles; a span per driver allocation and per finding.
        let (records, findings, profiles, spans, points) = handed_over(&run.stderr);
        assert_eq!(findings, run.findings.len() as u64);
        assert_eq!(records, run.events.len() as u64 + findings + profiles, "{}", run.stderr);
        assert_eq!(spans, allocations(&run.events) + findings, "{}", run.stderr);
        let sent = format!("sent {records} log records, {spans} spans, {points} metric points in ");
        assert!(run.stderr.contains(&sent), "{sent}\n{}", run.stderr);
        assert!(
            run.stderr
                .contains("dropped 0 (queue full 0, delivery failed 0, too large 0); rejected by the collector 0"),
            "{}",
            run.stderr
        );
        handed_total += records;
    }

    // Node a: the worker left the parent's IPC mapping open (its context serves the import: no
    // worker_cuda_context).
    let (parent, worker) = (pid_of_role(&grpc.expected, "parent"), pid_of_role(&grpc.expected, "worker"));
    let a = collector.findings("?node=node-a");
    let summary: Vec<(String, u64, Option<u64>, u64)> = a
        .iter()
        .map(|f| {
            (
                f["kind"].as_str().unwrap().to_string(),
                f["pid"].as_u64().unwrap(),
                f["peer_pid"].as_u64(),
                f["bytes"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        vec![("ipc_handle_not_closed".to_string(), u64::from(worker), Some(u64::from(parent)), 4 * MIB)]
    );
    assert_eq!(a.iter().map(contract).collect::<Vec<_>>(), grpc.findings);
    assert!(a.iter().all(|f| f["node"] == "node-a"));
    // The collector serves the cause the node found.
    assert_eq!(a[0]["diagnosis"], "ipc_handle_not_released");

    let a_worker = worker;

    // Node b: the exporter freed a buffer its worker still had open.
    let (parent, worker) = (pid_of_role(&http.expected, "parent"), pid_of_role(&http.expected, "worker"));
    let b = collector.findings("?node=node-b");
    assert_eq!(b.iter().map(contract).collect::<Vec<_>>(), http.findings);
    assert_eq!(b.len(), 1);
    assert_eq!(b[0]["kind"], "ipc_export_freed_while_imported");
    assert_eq!((b[0]["pid"].as_u64(), b[0]["peer_pid"].as_u64()), (Some(u64::from(parent)), Some(u64::from(worker))));

    // Filters.
    assert_eq!(collector.findings("").len(), 2);
    assert_eq!(collector.findings(&format!("?kind=ipc_export_freed_while_imported&pid={parent}")).len(), 1);
    assert_eq!(collector.findings(&format!("?kind=ipc_export_freed_while_imported&pid={worker}")).len(), 0);
    let after = b[0]["last_ts"].as_u64().unwrap() + 1;
    assert_eq!(collector.findings(&format!("?since={after}")).len(), 0);
    let (status, body) = collector.get("/api/v1/findings?kind=nonsense");
    assert_eq!(status, 400, "{body}");

    // Every record arrived; one span per allocation lifetime and per finding.
    assert_eq!(collector.metric("gpuprof_collector_received_total{signal=\"log_records\"}"), handed_total);
    assert_eq!(
        collector.metric("gpuprof_collector_received_total{signal=\"spans\"}"),
        allocations(&grpc.events) + allocations(&http.events) + 2
    );
    assert_eq!(
        collector
            .metric("gpuprof_findings{node=\"node-b\",kind=\"ipc_export_freed_while_imported\",severity=\"leak\"}"),
        1
    );

    // The processes of a node, closed out at exit.
    let (status, body) = collector.get("/api/v1/processes?node=node-a");
    assert_eq!(status, 200);
    let processes: Vec<Value> = serde_json::from_str(&body).unwrap();
    let worker_view =
        processes.iter().find(|p| p["pid"] == a_worker && p["contexts"] == 1).unwrap_or_else(|| panic!("{body}"));
    assert_eq!(worker_view["state"], "exited");
    assert_eq!(worker_view["ipc_imports"], 1);
    collector.stop();
}

#[test]
fn a_restart_keeps_findings_open_allocations_and_the_nodes_summaries() {
    let dir = scratch("collector_restart");
    let db = dir.join("c.redb");
    let base = 1_800_000_000_000_000_000u64;
    let collector = Collector::start(&db, &[]);
    // Process 500 allocates 8 MiB and 2 MiB, frees the 2 MiB; process 501 exits holding 1 MiB
    // and its node's rules say so.
    let first = [
        synthetic(base, 500, Op::Alloc, "cuMemAlloc_v2", 0x7000_0000, 8 * MIB),
        synthetic(base + 1, 500, Op::Alloc, "cuMemAlloc_v2", 0x7100_0000, 2 * MIB),
        synthetic(base + 2, 500, Op::Free, "cuMemFree_v2", 0x7100_0000, 0),
        synthetic(base + 3, 501, Op::Alloc, "cuMemAlloc_v2", 0x7000_0000, MIB),
        Event::new(base + 4, 501, 501, Source::Ebpf, Layer::Process, Op::Exit, Cow::Borrowed("sched_process_exit")),
    ];
    let (status, body) =
        collector.post("/v1/logs", "application/x-protobuf", &logs_request("node-r", 500, &first), None);
    assert_eq!(status, 200, "{body}");
    let found = gpuprof_model::analyze(&first, gpuprof_model::RuleConfig::default());
    assert_eq!(found.len(), 1);
    let finding = gpuprof_otlp::logs::finding_record(&found[0], base + 4);
    assert_eq!(
        collector
            .post("/v1/logs", "application/x-protobuf", &records_request(&trainer("node-r", 501), vec![finding]), None)
            .0,
        200
    );
    // Process 500's allocator and its profile, as its node summarizes them.
    assert_eq!(
        collector
            .post(
                "/v1/metrics",
                "application/x-protobuf",
                &allocator_gauges(&trainer("node-r", 500), base + 5, 5 * MIB, 8 * MIB),
                None
            )
            .0,
        200
    );
    let profile = profile_record(base + 5, "allocator", &[("forward", 7, 4 * MIB, 2), ("backward", 9, MIB, 1)]);
    assert_eq!(
        collector
            .post("/v1/logs", "application/x-protobuf", &records_request(&trainer("node-r", 500), vec![profile]), None)
            .0,
        200
    );

    let before = collector.findings("");
    assert_eq!(before.len(), 1);
    assert_eq!(
        (before[0]["kind"].as_str(), before[0]["pid"].as_u64(), before[0]["bytes"].as_u64()),
        (Some("exit_with_live_allocations"), Some(501), Some(MIB))
    );
    assert_eq!(contract(&before[0]), found[0]);
    let (_, processes_before) = collector.get("/api/v1/processes?node=node-r&detail=true");
    let (status, pprof_before) = collector.get_bytes("/api/v1/profile?node=node-r&pid=500");
    assert_eq!(status, 200);
    let samples = gpuprof_otlp::pprof::samples(&gpuprof_otlp::pprof::decode(&pprof_before).unwrap());
    assert_eq!(
        samples.iter().map(|(stack, bytes, count)| (stack[0].line, *bytes, *count)).collect::<Vec<_>>(),
        vec![(7, 4 * MIB, 2), (9, MIB, 1)]
    );
    collector.stop();

    let collector = Collector::start(&db, &[]);
    assert_eq!(collector.findings(""), before);
    let (_, processes_after) = collector.get("/api/v1/processes?node=node-r&detail=true");
    assert_eq!(processes_after, processes_before);
    assert_eq!(collector.get_bytes("/api/v1/profile?node=node-r&pid=500"), (200, pprof_before));
    let processes: Vec<Value> = serde_json::from_str(&processes_after).unwrap();
    let live = processes.iter().find(|p| p["pid"] == 500).unwrap();
    assert_eq!(live["live_bytes"]["device"], 8 * MIB);
    assert_eq!(live["allocations"][0]["addr"], "0x70000000");
    assert_eq!(live["allocations"][0]["stack"][0]["line"], 42);
    assert_eq!(live["allocator"]["0"], serde_json::json!({"allocated": 5 * MIB, "reserved": 8 * MIB}));
    assert_eq!(
        live["top_stacks"][0],
        serde_json::json!({"bytes": 4 * MIB, "count": 2, "stack": [{"function": "forward", "file": "/srv/train.py", "line": 7}]})
    );
    // The process exits later: the collector closes it out; findings are the node's to fire.
    let exit =
        [Event::new(base + 10, 500, 500, Source::Ebpf, Layer::Process, Op::Exit, Cow::Borrowed("sched_process_exit"))];
    let (status, _) = collector.post("/v1/logs", "application/x-protobuf", &logs_request("node-r", 500, &exit), None);
    assert_eq!(status, 200);
    let (_, processes) = collector.get("/api/v1/processes?node=node-r");
    let processes: Vec<Value> = serde_json::from_str(&processes).unwrap();
    assert_eq!(processes.iter().find(|p| p["pid"] == 500).unwrap()["state"], "exited");
    assert_eq!(collector.findings("").len(), 1);
    let (status, body) = collector.get("/api/v1/profile?node=node-r&pid=9");
    assert_eq!((status, body.as_str()), (404, "no memory profile of pid 9 on node node-r\n"));
    collector.stop();
}

/// A page as a node writes it: `bytes` that do not compress (a gzipped page keeps its size).
fn page(seed: u64, bytes: usize) -> Vec<u8> {
    let mut state = seed | 1;
    let mut page = b"<!doctype html><title>post-mortem</title><pre>".to_vec();
    page.extend((0..bytes).map(|_| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        b'!' + (state % 90) as u8
    }));
    page
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    encoder.write_all(bytes).unwrap();
    encoder.finish().unwrap()
}

/// A node's oom finding that names its post-mortem, and the post-mortem's record.
fn postmortem_of(pid: u32, ts: u64, body: gpuprof_otlp::logs::PostmortemBody, html_bytes: u64) -> (Finding, Vec<u8>) {
    let mut finding =
        Finding::new(gpuprof_model::FindingKind::Oom, pid, "trainer", MIB, 1, ts, ts, &[], "out of memory".into());
    finding.finding_id = format!("{:016x}", 0xabc0_0000 + u64::from(pid));
    // The node names the process instance, as an agent's finding does.
    finding.process_since = ts - 5_000_000_000;
    let report = format!("/var/lib/gpuprof/postmortems/node-m-{pid}-trainer-oom.html");
    finding.postmortem = Some(gpuprof_model::postmortem::Postmortem {
        node: "node-m".into(),
        recording: report.replace(".html", ".gpuprof"),
        report: report.clone(),
        window_start: ts - 60_000_000_000,
        window_end: ts,
        url: gpuprof_model::postmortem::report_url(&finding.finding_id),
        pids: vec![pid],
    });
    let record = gpuprof_otlp::logs::postmortem_record(
        gpuprof_otlp::logs::PostmortemRecord { finding_id: finding.finding_id.clone(), report, html_bytes, body },
        ts,
    );
    let records = vec![gpuprof_otlp::logs::finding_record(&finding, ts), record];
    (finding, records_request(&trainer("node-m", pid), records))
}

/// The nodes' post-mortems: their pages kept by finding and served by its finding_id or number,
/// gzipped to who takes gzip; a page too large to send is a 404 saying where it is; the pages
/// survive a restart, and the oldest go past --max-report-mib.
#[test]
fn post_mortems_are_served_by_finding_kept_through_a_restart_and_within_their_cap() {
    use gpuprof_otlp::logs::PostmortemBody;
    let dir = scratch("collector_postmortems");
    let db = dir.join("c.redb");
    let collector = Collector::start(&db, &["--max-report-mib", "1"]);
    let ts = gpuprof_model::event::wall_clock_ns();
    let first = page(1, 700 << 10);
    let (a, request) = postmortem_of(601, ts, PostmortemBody::Gzip(gzip(&first)), first.len() as u64);
    assert_eq!(collector.post("/v1/logs", "application/x-protobuf", &request, None).0, 200);
    let (b, request) =
        postmortem_of(602, ts + 1, PostmortemBody::Omitted("the report is 9.0 MiB gzipped".into()), 40 << 20);
    assert_eq!(collector.post("/v1/logs", "application/x-protobuf", &request, None).0, 200);

    let findings = collector.findings("?node=node-m");
    assert_eq!(contract(&findings[0]), a);
    let url = |id: &str| format!("/api/v1/findings/{id}/report");
    assert_eq!(collector.get_bytes(&url(&a.finding_id)), (200, first.clone()));
    assert_eq!(collector.get_bytes(&url(&findings[0]["id"].to_string())), (200, first.clone()));
    // A browser takes it gzipped.
    let agent: ureq::Agent = http_client();
    let mut response = agent
        .get(&format!("{}{}", collector.http, url(&a.finding_id)))
        .header("accept-encoding", "gzip, br")
        .call()
        .unwrap();
    let headers = |name: &str| response.headers().get(name).map(|v| v.to_str().unwrap().to_string());
    assert_eq!(
        (headers("content-type"), headers("content-encoding")),
        (Some("text/html; charset=utf-8".into()), Some("gzip".into()))
    );
    let mut plain = Vec::new();
    std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(response.body_mut().as_reader()), &mut plain).unwrap();
    assert_eq!(plain, first);
    let (status, body) = collector.get(&url(&b.finding_id));
    assert_eq!(
        (status, body),
        (
            404,
            format!(
                "{{\"error\":\"the post-mortem report of finding {} was not sent: the report is 9.0 MiB gzipped\"}}",
                b.finding_id
            )
        )
    );
    let (status, body) = collector.get(&url("nope"));
    assert_eq!(
        (status, body.as_str()),
        (400, r#"{"error":"\"nope\" names no finding: give its finding_id (16 hex digits) or its id"}"#)
    );
    assert_eq!(collector.get(&url("99")).0, 404);
    assert_eq!(collector.metric("gpuprof_collector_received_postmortems_total"), 2);
    assert_eq!(collector.metric("gpuprof_collector_postmortem_reports"), 2);
    collector.stop();

    let collector = Collector::start(&db, &["--max-report-mib", "1"]);
    assert_eq!(collector.get_bytes(&url(&a.finding_id)), (200, first));
    // Another 700 KiB page: the first goes, the newer stays.
    let second = page(2, 700 << 10);
    let (c, request) = postmortem_of(603, ts + 2, PostmortemBody::Gzip(gzip(&second)), second.len() as u64);
    assert_eq!(collector.post("/v1/logs", "application/x-protobuf", &request, None).0, 200);
    assert_eq!(collector.get_bytes(&url(&c.finding_id)), (200, second));
    let (status, body) = collector.get(&url(&a.finding_id));
    assert_eq!(
        (status, body),
        (404, format!("{{\"error\":\"no post-mortem report of finding {} here: its node node-m has it at /var/lib/gpuprof/postmortems/node-m-601-trainer-oom.html (sent once written; dropped here past --max-report-mib or --retention-hours)\"}}", a.finding_id))
    );
    assert!(collector.metric("gpuprof_collector_postmortem_report_bytes") <= MIB);
    assert_eq!(collector.metric("gpuprof_collector_postmortem_reports"), 2);
    collector.stop();
}

#[test]
fn bad_input_gets_the_right_status_and_the_collector_keeps_serving() {
    let dir = scratch("collector_bad_input");
    let collector = Collector::start(&dir.join("c.redb"), &["--token", "s3cret", "--max-request-mib", "4"]);
    let good = logs_request("node-x", 600, &[synthetic(1, 600, Op::Alloc, "cuMemAlloc_v2", 0x1000, 4096)]);
    let protobuf = "application/x-protobuf";

    assert_eq!(collector.post("/v1/logs", protobuf, &good, None).0, 401);
    assert_eq!(collector.post("/v1/logs", protobuf, &good, Some("wrong")).0, 401);
    let (status, body) = collector.post("/v1/logs", "text/plain", &good, Some("s3cret"));
    assert_eq!(status, 415, "{body}");
    let (status, body) = collector.post("/v1/logs", protobuf, &good[..good.len() / 2], Some("s3cret"));
    assert_eq!(status, 400, "{body}");
    assert!(body.starts_with("malformed OTLP protobuf"), "{body}");
    let (status, body) = collector.post("/v1/traces", "application/json", b"{\"resourceSpans\": [", Some("s3cret"));
    assert_eq!(status, 400, "{body}");
    let huge = vec![0u8; 100 << 20];
    let (status, body) = collector.post("/v1/logs", protobuf, &huge, Some("s3cret"));
    assert!(status == 413 || status == 0, "{status} {body}");

    // A record that claims to be an event but is not: partial success, the rest taken.
    let mut request = ExportLogsServiceRequest::decode(good.as_slice()).unwrap();
    let mut bad = request.resource_logs[0].scope_logs[0].log_records[0].clone();
    bad.body = None;
    request.resource_logs[0].scope_logs[0].log_records.push(bad);
    let (status, body) = collector.post("/v1/logs", protobuf, &request.encode_to_vec(), Some("s3cret"));
    assert_eq!(status, 200, "{body}");
    let response =
        gpuprof_otlp::proto::collector::logs::v1::ExportLogsServiceResponse::decode(body.as_bytes()).unwrap();
    let partial = response.partial_success.unwrap();
    assert_eq!((partial.rejected_log_records, partial.error_message.as_str()), (1, "log record has no body"));

    // gRPC without the token: the agent is told UNAUTHENTICATED and counts what it lost.
    let run = run_agent("bad_token", "fork-clean", &["--otlp-endpoint", &collector.grpc]);
    assert!(run.stderr.contains("last error: gRPC Unauthenticated: missing or wrong bearer token"), "{}", run.stderr);
    assert!(run.stderr.contains("sent 0 log records, 0 spans"), "{}", run.stderr);

    // Gzip, as the OpenTelemetry Collector's OTLP/HTTP exporter sends by default, is taken; a
    // body that unzips past the limit, corrupt gzip and another encoding are refused.
    let gzip = |bytes: &[u8]| {
        use std::io::Write;
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        encoder.write_all(bytes).unwrap();
        encoder.finish().unwrap()
    };
    let (status, body) = collector.post_encoded("/v1/logs", protobuf, "gzip", &gzip(&good), Some("s3cret"));
    assert_eq!(status, 200, "{body}");
    let bomb = gzip(&vec![0u8; 5 << 20]);
    assert!(bomb.len() < 64 << 10);
    let (status, body) = collector.post_encoded("/v1/logs", protobuf, "gzip", &bomb, Some("s3cret"));
    assert_eq!(
        (status, body.as_str()),
        (413, "request larger than 4194304 bytes once unzipped; send smaller batches\n")
    );
    let (status, body) = collector.post_encoded("/v1/logs", protobuf, "gzip", &good, Some("s3cret"));
    assert_eq!(status, 400, "{body}");
    assert!(body.starts_with("malformed gzip body: "), "{body}");
    let (status, body) = collector.post_encoded("/v1/logs", protobuf, "br", &good, Some("s3cret"));
    assert_eq!((status, body.as_str()), (415, "content encoding \"br\": send gzip or none\n"));

    // Still serving: the good request goes through, and every refusal was counted.
    assert_eq!(collector.post("/v1/logs", protobuf, &good, Some("s3cret")).0, 200);
    assert_eq!(collector.get("/healthz"), (200, "ok\n".to_string()));
    assert!(collector.metric("gpuprof_collector_refused_requests_total{reason=\"unauthenticated\"}") >= 3);
    assert_eq!(collector.metric("gpuprof_collector_refused_requests_total{reason=\"unsupported_media_type\"}"), 2);
    assert_eq!(collector.metric("gpuprof_collector_refused_requests_total{reason=\"malformed\"}"), 3);
    assert_eq!(collector.metric("gpuprof_collector_rejected_log_records_total"), 1);
    let (_, processes) = collector.get("/api/v1/processes?node=node-x");
    assert!(processes.contains("\"open_allocations\":1"), "{processes}");
    collector.stop();
}

/// With a readers' token, the findings, processes and profile API and /metrics answer only who
/// sends it — not the agents' token, which cannot read (nor the readers' write); /healthz stays
/// open for probes.
#[test]
fn the_read_side_takes_its_own_token() {
    let dir = scratch("collector_read_token");
    let collector = Collector::start(&dir.join("c.redb"), &["--token", "s3cret", "--read-token", "r3ad"]);
    let good = logs_request("node-r", 700, &[synthetic(1, 700, Op::Alloc, "cuMemAlloc_v2", 0x1000, 4096)]);
    let protobuf = "application/x-protobuf";
    assert_eq!(collector.post("/v1/logs", protobuf, &good, Some("r3ad")).0, 401);
    assert_eq!(collector.post("/v1/logs", protobuf, &good, Some("s3cret")).0, 200);
    let refused = (401, "missing or wrong read token (--read-token)\n".to_string());
    for path in ["/api/v1/findings", "/api/v1/processes?node=node-r", "/api/v1/profile?node=node-r&pid=700", "/metrics"]
    {
        assert_eq!(collector.get_as(path, None), refused, "{path}");
        assert_eq!(collector.get_as(path, Some("s3cret")), refused, "{path}");
        assert_eq!(collector.get_as(path, Some("r3adX")), refused, "{path}");
    }
    assert_eq!(collector.get_as("/api/v1/findings", Some("r3ad")), (200, "[]".to_string()));
    let (status, processes) = collector.get_as("/api/v1/processes?node=node-r", Some("r3ad"));
    assert_eq!(status, 200);
    assert!(processes.contains("\"open_allocations\":1"), "{processes}");
    let (status, metrics) = collector.get_as("/metrics", Some("r3ad"));
    assert_eq!(status, 200);
    assert!(metrics.contains("gpuprof_collector_refused_requests_total{reason=\"unauthenticated\"} 1"), "{metrics}");
    assert_eq!(collector.get("/healthz"), (200, "ok\n".to_string()));
    collector.stop();

    // One token for both sides would let every agent read: refused.
    let output = std::process::Command::new(collector_bin())
        .args(["--db", dir.join("d.redb").to_str().unwrap(), "--token", "same", "--read-token", "same"])
        .output_within(PATIENCE);
    assert_eq!(output.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&output.stderr),
        "gpuprof-collector: --read-token is the agents' --token: give readers a token of their own, so that an agent's cannot read and a reader's cannot write\n"
    );
}

#[test]
fn refuses_to_start_unsafely() {
    let dir = scratch("collector_refusals");
    let output = Command::new(collector_bin())
        .args([
            "--db",
            dir.join("c.redb").to_str().unwrap(),
            "--grpc-listen",
            "0.0.0.0:0",
            "--http-listen",
            "127.0.0.1:0",
        ])
        .output_within(PATIENCE);
    assert_eq!(output.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&output.stderr),
        "gpuprof-collector: --grpc-listen 0.0.0.0:0 is reachable from other machines but no token is set: give --token-file (or GPUPROF_COLLECTOR_TOKEN), or listen on 127.0.0.1\n"
    );
}

/// The database unreadable, cut short, or with records that do not read back: the collector
/// starts anyway, keeps what it cannot read aside or drops it, says so, and serves the rest.
#[test]
fn a_corrupt_or_truncated_database_is_set_aside_or_salvaged_and_the_collector_serves() {
    let dir = scratch("collector_corrupt_db");
    // Not a database at all: kept aside, whole, and the collector starts empty.
    let garbage = dir.join("garbage.redb");
    std::fs::write(&garbage, vec![0x5a; 8192]).unwrap();
    let collector = Collector::start(&garbage, &[]);
    assert_eq!(collector.warnings.len(), 1, "{:?}", collector.warnings);
    let warning = &collector.warnings[0];
    let prefix = format!("gpuprof-collector: warning: --db {}: cannot open it (", garbage.display());
    assert!(warning.starts_with(&prefix), "{warning}");
    let aside = warning.split("): kept it as ").nth(1).unwrap().split(" and started").next().unwrap();
    assert!(aside.starts_with(&format!("{}.unreadable-", garbage.display())), "{warning}");
    assert!(
        warning.ends_with(" and started on an empty database; the findings, nodes and reports it held are not served"),
        "{warning}"
    );
    assert_eq!(std::fs::read(aside).unwrap(), vec![0x5a; 8192]);
    assert!(collector.findings("").is_empty());
    send_a_finding(&collector, "node-g", 1_800_000_000_000_000_000);
    assert_eq!(collector.findings("?node=node-g").len(), 1);
    collector.stop();

    // Records that do not read back: a finding and a node's state written as garbage beside
    // good ones. Each is dropped and named, then deleted, and the good ones are served.
    let db = dir.join("records.redb");
    let collector = Collector::start(&db, &[]);
    send_a_finding(&collector, "node-a", 1_800_000_000_000_000_000);
    collector.stop();
    {
        let database = redb::Database::create(&db).unwrap();
        let write = database.begin_write().unwrap();
        {
            let mut findings = write.open_table(redb::TableDefinition::<u64, &[u8]>::new("findings")).unwrap();
            findings.insert(77, b"{not json".as_slice()).unwrap();
            let mut nodes = write.open_table(redb::TableDefinition::<&str, &[u8]>::new("nodes")).unwrap();
            nodes.insert("node-x", [4u8, 0xff, 0xff, 0xff, 0xff, 0xff].as_slice()).unwrap();
        }
        write.commit().unwrap();
    }
    let collector = Collector::start(&db, &[]);
    assert_eq!(
        collector.warnings,
        [format!(
            "gpuprof-collector: warning: --db {}: dropped 1 corrupt finding (id 77); the corrupt state of node node-x (its processes come back with its next batches; its findings are kept); the rest is served",
            db.display()
        )]
    );
    let served = collector.findings("");
    assert_eq!(served.len(), 1, "{served:#?}");
    assert_eq!((&served[0]["node"], &served[0]["pid"]), (&Value::from("node-a"), &Value::from(501)));
    collector.stop();
    // Deleted: the next start says nothing.
    let collector = Collector::start(&db, &[]);
    assert_eq!(collector.warnings, Vec::<String>::new());
    assert_eq!(collector.findings("").len(), 1);
    collector.stop();

    // Cut short (a disk that filled, a copy that stopped): redb refuses it, so it is set aside.
    let cut = dir.join("cut.redb");
    let collector = Collector::start(&cut, &[]);
    send_a_finding(&collector, "node-c", 1_800_000_000_000_000_000);
    collector.stop();
    let length = std::fs::metadata(&cut).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&cut).unwrap().set_len(length / 2).unwrap();
    let collector = Collector::start(&cut, &[]);
    assert_eq!(collector.warnings.len(), 1, "{:?}", collector.warnings);
    let said = format!("--db {}: cannot open it (DB corrupted: File truncated below stored layout", cut.display());
    assert!(collector.warnings[0].contains(&said), "{:?}", collector.warnings);
    send_a_finding(&collector, "node-c", 1_800_000_000_000_000_100);
    assert_eq!(collector.findings("?node=node-c").len(), 1);
    collector.stop();
}

#[test]
fn promtool_accepts_the_metrics_and_the_values_are_the_nodes() {
    let dir = scratch("collector_promtool");
    let collector = Collector::start(&dir.join("c.redb"), &[]);
    let base = 1_800_000_000_000_000_000u64;
    let mut second = synthetic(base + 1, 700, Op::Alloc, "cuMemAlloc_v2", 0x2000_0000, 5 * MIB);
    let mut frames = second.stack.to_vec();
    frames[0].line = 43;
    second.stack = frames.into();
    let events = [synthetic(base, 700, Op::Alloc, "cuMemAlloc_v2", 0x1000_0000, 3 * MIB), second];
    let pod = ProcessIdentity {
        host_name: "node-p".into(),
        pid: 700,
        executable: "trainer".into(),
        k8s_namespace: Some("ml".into()),
        k8s_pod_name: Some("trainer-0".into()),
        k8s_container_name: Some("main".into()),
        ..Default::default()
    };
    assert_eq!(collector.post("/v1/logs", "application/x-protobuf", &logs_request_of(&pod, &events), None).0, 200);
    // Its node's profile of it (driver allocations: no framework allocator there).
    assert_eq!(
        collector
            .post("/v1/metrics", "application/x-protobuf", &nvml_gauge(&pod, base + 2, 8 * MIB + 500 * MIB), None)
            .0,
        200
    );
    let profile = profile_record(base + 2, "driver", &[("step", 43, 5 * MIB, 1), ("step", 42, 3 * MIB, 1)]);
    assert_eq!(
        collector.post("/v1/logs", "application/x-protobuf", &records_request(&pod, vec![profile]), None).0,
        200
    );
    // A PyTorch process: its allocator's gauges and a profile of its tensors.
    let torch = ProcessIdentity { pid: 702, ..pod.clone() };
    assert_eq!(
        collector
            .post("/v1/metrics", "application/x-protobuf", &allocator_gauges(&torch, base + 3, 6 * MIB, 10 * MIB), None)
            .0,
        200
    );
    let tensors = profile_record(base + 3, "allocator", &[("Linear.forward", 128, 6 * MIB, 12)]);
    assert_eq!(
        collector.post("/v1/logs", "application/x-protobuf", &records_request(&torch, vec![tensors]), None).0,
        200
    );
    // A process outside Kubernetes exits holding 1 MiB: its node's finding is the most recent.
    let exit = [
        synthetic(base + 2, 701, Op::Alloc, "cuMemAlloc_v2", 0x3000_0000, MIB),
        Event::new(base + 3, 701, 701, Source::Ebpf, Layer::Process, Op::Exit, Cow::Borrowed("sched_process_exit")),
    ];
    assert_eq!(collector.post("/v1/logs", "application/x-protobuf", &logs_request("node-p", 701, &exit), None).0, 200);
    let found = gpuprof_model::analyze(&exit, gpuprof_model::RuleConfig::default());
    let finding_id = found[0].finding_id.clone();
    let finding = gpuprof_otlp::logs::finding_record(&found[0], base + 3);
    assert_eq!(
        collector
            .post("/v1/logs", "application/x-protobuf", &records_request(&trainer("node-p", 701), vec![finding]), None)
            .0,
        200
    );

    let (_, text) = collector.get("/metrics");
    let process = "node=\"node-p\",namespace=\"ml\",pod=\"trainer-0\",container=\"main\",pid=\"700\",comm=\"trainer\"";
    assert_eq!(collector.metric(&format!("gpuprof_live_bytes{{{process},kind=\"device\"}}")), 8 * MIB);
    let stack = "node=\"node-p\",namespace=\"ml\",pod=\"trainer-0\",pid=\"700\",comm=\"trainer\",layer=\"driver\"";
    assert_eq!(
        collector
            .metric(&format!("gpuprof_top_stack_live_bytes{{{stack},rank=\"1\",stack=\"step (/srv/train.py:43)\"}}")),
        5 * MIB
    );
    assert_eq!(
        collector
            .metric(&format!("gpuprof_top_stack_live_bytes{{{stack},rank=\"2\",stack=\"step (/srv/train.py:42)\"}}")),
        3 * MIB
    );
    let torch_process = "node=\"node-p\",namespace=\"ml\",pod=\"trainer-0\",container=\"main\",pid=\"702\",comm=\"\"";
    assert_eq!(
        collector.metric(&format!("gpuprof_allocator_allocated_bytes{{{torch_process},device=\"0\"}}")),
        6 * MIB
    );
    assert_eq!(
        collector.metric(&format!("gpuprof_allocator_reserved_bytes{{{torch_process},device=\"0\"}}")),
        10 * MIB
    );
    let torch_stack = "node=\"node-p\",namespace=\"ml\",pod=\"trainer-0\",pid=\"702\",comm=\"\",layer=\"allocator\"";
    assert_eq!(
        collector.metric(&format!(
            "gpuprof_top_stack_live_bytes{{{torch_stack},rank=\"1\",stack=\"Linear.forward (/srv/train.py:128)\"}}"
        )),
        6 * MIB
    );
    assert_eq!(
        collector.metric(&format!("gpuprof_recent_finding_bytes{{id=\"1\",finding_id=\"{finding_id}\",node=\"node-p\",namespace=\"\",pod=\"\",pid=\"701\",comm=\"trainer\",kind=\"exit_with_live_allocations\",severity=\"leak\",user_line=\"/srv/train.py:42 in step\",stack=\"step (/srv/train.py:42)\",report=\"\"}}")),
        MIB
    );
    assert_eq!(
        collector.metric("gpuprof_findings{node=\"node-p\",kind=\"exit_with_live_allocations\",severity=\"leak\"}"),
        1
    );
    // NVML's figure for the pod's process: its 8 MiB of driver allocations and its context.
    let pod_process =
        "node=\"node-p\",namespace=\"ml\",pod=\"trainer-0\",container=\"main\",pid=\"700\",comm=\"trainer\"";
    assert_eq!(collector.metric(&format!("gpuprof_nvml_used_bytes{{{pod_process}}}")), 8 * MIB + 500 * MIB);
    assert_eq!(collector.metric(&format!("gpuprof_not_probed_bytes{{{pod_process}}}")), 500 * MIB);
    assert_eq!(collector.metric("gpuprof_collector_received_profiles_total"), 2);
    let started = Instant::now();
    let mut promtool = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (Debian package prometheus) must be installed: scripts/install-prerequisites.sh");
    std::io::Write::write_all(&mut promtool.stdin.take().unwrap(), text.as_bytes()).unwrap();
    let output = promtool.output_within(PATIENCE, "promtool");
    assert!(
        output.status.success(),
        "{}{}\n{text}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(started.elapsed() < Duration::from_secs(30));
    collector.stop();
}

struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The spans the stand-in trace backend decoded, once there are at least `count`.
fn wait_for_spans(path: &Path, count: usize) -> Vec<Value> {
    let started = Instant::now();
    loop {
        let spans: Vec<Value> = std::fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        if spans.len() >= count || started.elapsed() > Duration::from_secs(15) {
            return spans;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn the_python_sdk_is_accepted_and_forwarded_spans_decode_with_opentelemetry_proto() {
    let dir = scratch("collector_peer_sink");
    let received = dir.join("forwarded.jsonl");
    let mut sink = KillOnDrop(
        Command::new(tools_python())
            .arg(fixtures().join("otlp/sink.py"))
            .arg(&received)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let ready =
        line_within(&mut BufReader::new(sink.0.stdout.take().unwrap()), READY_LIMIT, "the sink's \"listening PORT\"");
    let port = ready.trim().strip_prefix("listening ").unwrap_or_else(|| panic!("sink said {ready:?}"));
    let collector = Collector::start(&dir.join("c.redb"), &["--forward-endpoint", &format!("http://127.0.0.1:{port}")]);

    // The OpenTelemetry Python SDK, over OTLP/HTTP.
    let sdk = Command::new(tools_python())
        .arg(fixtures().join("otlp/sdk_spans.py"))
        .arg(&collector.http)
        .output_within(PATIENCE);
    assert_eq!(
        String::from_utf8_lossy(&sdk.stdout),
        "SUCCESS SUCCESS SUCCESS\n",
        "{}",
        String::from_utf8_lossy(&sdk.stderr)
    );
    assert_eq!(sdk.status.code(), Some(0));

    // An agent whose worker leaves an IPC mapping open.
    let run = run_agent("peers", "ipc-left-open", &["--otlp-endpoint", &collector.grpc, "--node-name", "node-f"]);
    let allocation_spans = allocations(&run.events) as usize;
    let spans = wait_for_spans(&received, 3 + allocation_spans + 1);
    assert_eq!(spans.len(), 3 + allocation_spans + 1, "{}\n{spans:#?}", collector.get("/metrics").1);
    drop(sink);

    let peer: Vec<&Value> = spans.iter().filter(|s| s["resource"]["service.name"] == "python-peer").collect();
    let names: Vec<&str> = peer.iter().map(|s| s["name"].as_str().unwrap()).collect();
    assert_eq!(names, vec!["step", "load", "save"]);
    assert_eq!(peer[0]["parent_span_id"], peer[1]["span_id"]);
    assert_eq!(peer[0]["attributes"]["batch"], 7);

    let (parent, worker) = (pid_of_role(&run.expected, "parent"), pid_of_role(&run.expected, "worker"));
    // The exported buffer's span tells its IPC story.
    let buffer = spans
        .iter()
        .find(|s| s["resource"]["process.pid"] == parent && s["attributes"]["gpu.memory.size"] == 4 * MIB)
        .unwrap_or_else(|| panic!("{spans:#?}"));
    assert_eq!(buffer["name"], "cuMemAlloc_v2");
    assert_eq!(buffer["resource"]["host.name"], "node-f");
    let events: Vec<&str> = buffer["events"].as_array().unwrap().iter().map(|e| e["name"].as_str().unwrap()).collect();
    assert_eq!(events, vec!["gpu.memory.ipc_export", "gpu.memory.ipc_open"]);
    assert_eq!(buffer["events"][1]["attributes"]["gpu.memory.ipc.peer_pid"], worker);

    // One span per finding, in the trace of the process it is about, flagged as an error.
    let api = collector.findings("?node=node-f");
    let findings: Vec<&Value> =
        spans.iter().filter(|s| s["name"].as_str().unwrap().starts_with("gpuprof.finding.")).collect();
    let summary: Vec<(&str, &Value, &Value, i64)> = findings
        .iter()
        .map(|s| {
            (
                s["name"].as_str().unwrap(),
                &s["attributes"]["process.pid"],
                &s["attributes"]["gpuprof.finding.bytes"],
                s["status_code"].as_i64().unwrap(),
            )
        })
        .collect();
    let (w, four) = (Value::from(worker), Value::from(4 * MIB));
    assert_eq!(summary, vec![("gpuprof.finding.ipc_handle_not_closed", &w, &four, 2)]);
    for (span, finding) in findings.iter().zip(&api) {
        let since = finding["process_since"].as_u64().unwrap();
        let trace = gpuprof_otlp::ids::process_trace_id("node-f", worker, since);
        assert_eq!(span["trace_id"], gpuprof_model::hex::format_bytes(&trace).trim_start_matches("0x"));
        assert_eq!(span["attributes"]["gpuprof.finding.detail"], finding["detail"]);
    }
    assert_eq!(collector.metric("gpuprof_collector_forwarded_spans_total"), (3 + allocation_spans + 1) as u64);
    collector.stop();
}

#[test]
fn a_collector_that_is_away_costs_counted_drops_not_a_stalled_capture() {
    // A port nobody listens on.
    let port = free_port();
    // The agent is brought up to date before the clock starts: it times the capture, not a build.
    gpuprof();
    let started = Instant::now();
    let run = run_agent(
        "outage",
        "fork-clean",
        &["--otlp-endpoint", &format!("http://127.0.0.1:{port}"), "--otlp-protocol", "http"],
    );
    let (records, _, _, spans, points) = handed_over(&run.stderr);
    assert_eq!(records, run.events.len() as u64 + handed_over(&run.stderr).2, "{}", run.stderr);
    let all = records + spans + points;
    assert!(
        run.stderr.contains(&format!("sent 0 log records, 0 spans, 0 metric points in 0 requests (0 bytes, the largest 0); dropped {all} (queue full 0, delivery failed {all}, too large 0)")),
        "{}",
        run.stderr
    );
    assert!(run.stderr.contains("last error: POST http://127.0.0.1:"), "{}", run.stderr);
    // Retries stop at the end of the capture: at most the 5 s drain, not a hang.
    assert!(started.elapsed() < Duration::from_secs(20), "{:?}", started.elapsed());
}

/// Past its rate a connection is refused with RESOURCE_EXHAUSTED carrying a RetryInfo (1 s), as
/// HTTP's 429 carries Retry-After: without it the OpenTelemetry Collector's OTLP exporter drops
/// the batch instead of retrying it.
#[test]
fn a_rate_limited_grpc_request_says_when_to_retry() {
    use gpuprof_collector::receive::grpc::{RetryInfo, RpcStatus, RETRY_INFO_TYPE};
    use gpuprof_otlp::proto::collector::logs::v1::logs_service_client::LogsServiceClient;
    let dir = scratch("collector_grpc_rate");
    // A bucket of 2 requests, refilled at 1 a second.
    let collector = Collector::start(&dir.join("c.redb"), &["--rate-limit", "1"]);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let endpoint = collector.grpc.clone();
    let exchange = async move {
        let mut client = LogsServiceClient::connect(endpoint).await.unwrap();
        let request = ExportLogsServiceRequest::decode(
            logs_request("node-q", 810, &[synthetic(1, 810, Op::Alloc, "cuMemAlloc_v2", 0x1000, 4096)]).as_slice(),
        )
        .unwrap();
        let mut answers = Vec::new();
        for _ in 0..3 {
            answers.push(client.export(request.clone()).await.map(|_| ()));
        }
        answers
    };
    let answers = runtime
        .block_on(async { tokio::time::timeout(HTTP_LIMIT, exchange).await })
        .unwrap_or_else(|_| panic!("the gRPC exchange with gpuprof-collector did not end within {HTTP_LIMIT:?}"));
    assert!(answers[0].is_ok() && answers[1].is_ok(), "{answers:?}");
    let refusal = answers[2].as_ref().unwrap_err();
    assert_eq!(refusal.code(), tonic::Code::ResourceExhausted);
    assert_eq!(refusal.message(), "too many requests on this connection; retry later");
    let details = RpcStatus::decode(refusal.details()).unwrap();
    assert_eq!(details.code, tonic::Code::ResourceExhausted as i32);
    assert_eq!(details.details.len(), 1);
    assert_eq!(details.details[0].type_url, RETRY_INFO_TYPE);
    let retry = RetryInfo::decode(details.details[0].value.as_slice()).unwrap();
    assert_eq!(retry.retry_delay.map(|d| (d.seconds, d.nanos)), Some((1, 0)));
    assert_eq!(collector.metric("gpuprof_collector_refused_requests_total{reason=\"rate_limited\"}"), 1);
    collector.stop();
}

#[test]
fn grpc_refuses_oversized_and_unauthenticated_requests_and_keeps_serving() {
    use gpuprof_otlp::proto::collector::logs::v1::logs_service_client::LogsServiceClient;
    let dir = scratch("collector_grpc_bad_input");
    let collector = Collector::start(&dir.join("c.redb"), &["--token", "s3cret", "--max-request-mib", "1"]);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let endpoint = collector.grpc.clone();
    let exchange = async move {
        let mut client = LogsServiceClient::connect(endpoint).await.unwrap();
        let with_token = |request: ExportLogsServiceRequest, token: Option<&str>| {
            let mut request = tonic::Request::new(request);
            if let Some(token) = token {
                request.metadata_mut().insert("authorization", format!("Bearer {token}").parse().unwrap());
            }
            request
        };
        let good = ExportLogsServiceRequest::decode(
            logs_request("node-g", 800, &[synthetic(1, 800, Op::Alloc, "cuMemAlloc_v2", 0x1000, 4096)]).as_slice(),
        )
        .unwrap();
        let mut big = good.clone();
        let record = big.resource_logs[0].scope_logs[0].log_records[0].clone();
        big.resource_logs[0].scope_logs[0].log_records = vec![record; 8000];
        assert!(big.encoded_len() > 1 << 20);
        let mut codes = Vec::new();
        for (request, token) in
            [(good.clone(), None), (good.clone(), Some("wrong")), (big, Some("s3cret")), (good, Some("s3cret"))]
        {
            codes.push(match client.export(with_token(request, token)).await {
                Ok(_) => tonic::Code::Ok,
                Err(status) => status.code(),
            });
        }
        codes
    };
    let codes = runtime
        // The timer is made inside the runtime: it needs its clock.
        .block_on(async { tokio::time::timeout(4 * HTTP_LIMIT, exchange).await })
        .unwrap_or_else(|_| panic!("the gRPC exchange with gpuprof-collector did not end within {:?}", 4 * HTTP_LIMIT));
    assert_eq!(
        codes,
        vec![tonic::Code::Unauthenticated, tonic::Code::Unauthenticated, tonic::Code::OutOfRange, tonic::Code::Ok]
    );
    let (_, processes) = collector.get("/api/v1/processes?node=node-g");
    assert!(processes.contains("\"open_allocations\":1"), "{processes}");
    collector.stop();
}

/// The fleet through a real OpenTelemetry Collector (deploy/otelcol, built from the Collector's
/// modules): two nodes' agents send to it, its load_balancing exporter routes each node
/// (`host.name`) to one of two gpuprof-collector shards, and each node's findings, processes
/// and events are on exactly one shard — the agent's own findings, whole. Its traces go to
/// Jaeger v2 as well: each finding's span is in its process's trace with its attributes.
#[test]
fn nodes_through_a_real_opentelemetry_collector_land_each_whole_on_one_shard() {
    let dir = scratch("collector_otelcol");
    let shards = [Collector::start(&dir.join("s0.redb"), &[]), Collector::start(&dir.join("s1.redb"), &[])];
    let jaeger = Jaeger::start(&dir);
    let shard_endpoints = [endpoint(&shards[0]), endpoint(&shards[1])];
    let otelcol = OpenTelemetryCollector::start(&dir, &shard_endpoints, Some(&jaeger.otlp));
    let through = otelcol.grpc.clone();

    let runs = [
        ("node-a", run_agent("otelcol_a", "ipc-left-open", &["--otlp-endpoint", &through, "--node-name", "node-a"])),
        ("node-b", run_agent("otelcol_b", "export-freed", &["--otlp-endpoint", &through, "--node-name", "node-b"])),
    ];
    for (node, run) in &runs {
        assert!(!run.findings.is_empty(), "{node}: {}", run.stderr);
        assert!(
            run.stderr
                .contains("dropped 0 (queue full 0, delivery failed 0, too large 0); rejected by the collector 0"),
            "{node}: {}",
            run.stderr
        );
        // The Collector batches and forwards: wait for the node's findings on some shard.
        let on = |shard: &Collector| shard.findings(&format!("?node={node}"));
        let started = Instant::now();
        while on(&shards[0]).len() + on(&shards[1]).len() < run.findings.len() {
            assert!(started.elapsed() < Duration::from_secs(30), "{node}'s findings never reached a shard");
            std::thread::sleep(Duration::from_millis(100));
        }
        let (first, second) = (on(&shards[0]), on(&shards[1]));
        let holder = if first.is_empty() { &second } else { &first };
        assert!(first.is_empty() || second.is_empty(), "{node} is on both shards: {first:?} {second:?}");
        assert_eq!(holder.iter().map(contract).collect::<Vec<_>>(), run.findings, "{node}");
        // Its processes too: the shard without its findings knows nothing of it.
        let other = if first.is_empty() { &shards[0] } else { &shards[1] };
        let (status, body) = other.get(&format!("/api/v1/processes?node={node}"));
        assert_eq!((status, body.trim()), (200, "[]"), "{node}");
    }
    // node-a's finding is its worker's, which only opened an IPC handle (no allocation span);
    // node-b's is the exporter's, whose trace holds the allocation it freed too early.
    let beside: Vec<usize> = runs.iter().map(|(node, run)| assert_findings_in_jaeger(&jaeger, node, run)).collect();
    assert_eq!(beside[0], 0);
    assert!(beside[1] > 0, "{beside:?}");
    otelcol.stop();
}

/// An agent straight to Jaeger, no collector between: its spans are there (each finding in its
/// process's trace, the freed export's allocation beside it), and what Jaeger does not serve —
/// logs, metrics — is said and counted as not taken by the endpoint, apart from what is lost.
#[test]
fn an_agent_sends_its_spans_straight_to_jaeger_and_says_what_jaeger_does_not_take() {
    let dir = scratch("collector_jaeger_direct");
    let jaeger = Jaeger::start(&dir);
    for (protocol, endpoint) in [("grpc", format!("http://{}", jaeger.otlp)), ("http", jaeger.otlp_http.clone())] {
        let node = format!("direct-{protocol}");
        let run = run_agent(
            &format!("jaeger_direct_{protocol}"),
            "export-freed",
            &["--otlp-endpoint", &endpoint, "--otlp-protocol", protocol, "--node-name", &node],
        );
        let (records, _, _, spans, points) = handed_over(&run.stderr);
        assert!(
            run.stderr.contains(&format!(
                "sent 0 log records, {spans} spans, 0 metric points in 1 requests"
            )) && run.stderr.contains(&format!(
                "dropped 0 (queue full 0, delivery failed 0, too large 0); rejected by the collector 0; not taken by the endpoint {} (it serves no logs, metrics: a trace store? findings, gauges and memory profiles need a gpuprof-collector or an OpenTelemetry Collector)",
                records + points
            )),
            "{protocol}: {}",
            run.stderr
        );
        assert!(assert_findings_in_jaeger(&jaeger, &node, &run) > 0, "{protocol}");
    }
}

/// A shard's OTLP/gRPC address as the Collector's static resolver names it.
fn endpoint(shard: &Collector) -> String {
    shard.grpc.trim_start_matches("http://").to_string()
}

/// A shard restarted while a node sends: the Collector's per-shard queue and retry hold the
/// node's data meanwhile and deliver it once the shard is back (its database kept what it had
/// before). docs/collector.md says what is kept and what would be lost.
#[test]
fn a_shard_restarted_while_its_node_sends_gets_what_was_sent_meanwhile() {
    let dir = scratch("collector_otelcol_restart");
    let ports = [free_port(), free_port()];
    let start_shard = |n: usize| {
        let listen = format!("127.0.0.1:{}", ports[n]);
        Collector::start(&dir.join(format!("s{n}.redb")), &["--grpc-listen", &listen])
    };
    let mut shards = [Some(start_shard(0)), Some(start_shard(1))];
    let endpoints: Vec<String> = ports.iter().map(|port| format!("127.0.0.1:{port}")).collect();
    let otelcol = OpenTelemetryCollector::start(&dir, &endpoints, None);
    let through = otelcol.grpc.clone();
    let send =
        |name: &str, scenario: &str| run_agent(name, scenario, &["--otlp-endpoint", &through, "--node-name", "node-r"]);
    let findings_on = |shard: &Option<Collector>| shard.as_ref().map_or(0, |s| s.findings("?node=node-r").len());

    let before = send("otelcol_restart_1", "ipc-left-open");
    let started = Instant::now();
    while findings_on(&shards[0]) + findings_on(&shards[1]) < before.findings.len() {
        assert!(started.elapsed() < Duration::from_secs(30), "the node's findings never reached a shard");
        std::thread::sleep(Duration::from_millis(100));
    }
    let holder = if findings_on(&shards[0]) > 0 { 0 } else { 1 };
    shards[holder].take().unwrap().stop();

    // The node sends while its shard is away: the agent's own delivery (to the Collector) loses
    // nothing; the Collector holds the shard's part.
    let during = send("otelcol_restart_2", "export-freed");
    assert!(
        during.stderr.contains("dropped 0 (queue full 0, delivery failed 0, too large 0); rejected by the collector 0"),
        "{}",
        during.stderr
    );
    std::thread::sleep(Duration::from_secs(2));
    shards[holder] = Some(start_shard(holder));
    let expected: Vec<Finding> = before.findings.iter().chain(&during.findings).cloned().collect();
    let started = Instant::now();
    while findings_on(&shards[holder]) < expected.len() {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "{} of {} findings on the restarted shard: {}",
            findings_on(&shards[holder]),
            expected.len(),
            otelcol.log_tail(5)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let mut got: Vec<Finding> =
        shards[holder].as_ref().unwrap().findings("?node=node-r").iter().map(contract).collect();
    let mut want = expected;
    got.sort_by(|a, b| a.finding_id.cmp(&b.finding_id));
    want.sort_by(|a, b| a.finding_id.cmp(&b.finding_id));
    assert_eq!(got, want);
    assert_eq!(findings_on(&shards[1 - holder]), 0, "the node moved to the other shard");
    otelcol.stop();
}

/// Each of the run's findings is a span in Jaeger (service `gpuprof`), in its process's trace,
/// with the finding's attributes and its node; how many allocation spans those traces hold.
fn assert_findings_in_jaeger(jaeger: &Jaeger, node: &str, run: &AgentRun) -> usize {
    let tag = |span: &Value, key: &str| -> Option<Value> {
        span["tags"].as_array()?.iter().find(|t| t["key"] == key).map(|t| t["value"].clone())
    };
    let started = Instant::now();
    loop {
        let (status, body) = jaeger.get("/api/traces?service=gpuprof&limit=1000&lookback=1h");
        let traces: Value = if status == 200 { serde_json::from_str(&body).unwrap() } else { Value::Null };
        let mut found = Vec::new();
        for trace in traces["data"].as_array().into_iter().flatten() {
            let spans = trace["spans"].as_array().unwrap();
            for span in spans {
                let process = &trace["processes"][span["processID"].as_str().unwrap()];
                let on_node =
                    process["tags"].as_array().unwrap().iter().any(|t| t["key"] == "host.name" && t["value"] == node);
                if on_node && span["operationName"].as_str().unwrap().starts_with("gpuprof.finding.") {
                    found.push((span.clone(), spans.clone(), trace["processes"].clone()));
                }
            }
        }
        if found.len() >= run.findings.len() {
            let mut allocations_beside = 0;
            for finding in &run.findings {
                let (span, trace, processes) = found
                    .iter()
                    .find(|(span, _, _)| {
                        tag(span, "gpuprof.finding.id") == Some(Value::from(finding.finding_id.clone()))
                    })
                    .unwrap_or_else(|| panic!("{node}: no span for {finding:?}"));
                assert_eq!(span["operationName"], format!("gpuprof.finding.{}", finding.kind.as_str()));
                assert_eq!(tag(span, "gpuprof.finding.kind"), Some(Value::from(finding.kind.as_str())));
                assert_eq!(tag(span, "gpuprof.finding.severity"), Some(Value::from(finding.severity.as_str())));
                assert_eq!(tag(span, "process.pid"), Some(Value::from(finding.pid)));
                assert_eq!(tag(span, "gpuprof.finding.diagnosis"), finding.diagnosis.map(|d| Value::from(d.as_str())));
                if let Some(user) = &finding.user_frame {
                    let line = format!("{}:{} in {}", user.file, user.line, user.function);
                    assert_eq!(tag(span, "gpuprof.finding.user_frame"), Some(Value::from(line)));
                }
                // In its process's trace: every span there is that process's, within the bound
                // a trace is held to.
                assert!(trace.len() <= 2_000, "{node}: {} spans in one trace", trace.len());
                // The pid is a span's own attribute on a finding, its resource's on an allocation.
                let pid_of = |s: &Value| {
                    tag(s, "process.pid").or_else(|| tag(&processes[s["processID"].as_str().unwrap()], "process.pid"))
                };
                let pids: Vec<Option<Value>> = trace.iter().map(pid_of).collect();
                assert!(pids.iter().all(|pid| *pid == Some(Value::from(finding.pid))), "{node}: {pids:?}");
                allocations_beside += trace
                    .iter()
                    .filter(|s| !s["operationName"].as_str().unwrap().starts_with("gpuprof.finding."))
                    .count();
            }
            return allocations_beside;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "{node}: {} finding spans in Jaeger, {} findings",
            found.len(),
            run.findings.len()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The configuration the chart and docs ship in front of several collectors is one the built
/// OpenTelemetry Collector accepts.
#[test]
fn the_shipped_opentelemetry_collector_configuration_is_valid() {
    let config = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/otel-collector/loadbalancing.yaml");
    let output = Command::new(otelcol_bin())
        .arg("validate")
        .arg("--config")
        .arg(&config)
        .env("GPUPROF_COLLECTOR_TOKEN", "s3cret")
        .env("GPUPROF_COLLECTOR_SHARDS", "[shard-0:4317, shard-1:4317]")
        .env("GPUPROF_TRACES_OTLP", "jaeger:4317")
        .output_within(PATIENCE);
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
    // And a mistake is caught: the key that routes a node whole, misspelt.
    let wrong = scratch("collector_otelcol_validate").join("wrong.yaml");
    std::fs::write(&wrong, std::fs::read_to_string(&config).unwrap().replace("routing_key:", "routing_keys:")).unwrap();
    let output = Command::new(otelcol_bin())
        .arg("validate")
        .arg("--config")
        .arg(&wrong)
        .env("GPUPROF_COLLECTOR_TOKEN", "s3cret")
        .env("GPUPROF_COLLECTOR_SHARDS", "[shard-0:4317, shard-1:4317]")
        .env("GPUPROF_TRACES_OTLP", "jaeger:4317")
        .output_within(PATIENCE);
    assert_eq!(output.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("routing_keys"),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}
