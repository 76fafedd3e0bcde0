//! The shipped Grafana dashboards against a real Prometheus (Debian's): a node's daemon and a
//! gpuprof-collector are scraped while a known job holds device memory on the stand-ins, and
//! every panel's query, run over Prometheus' HTTP API with the dashboard's variables as Grafana
//! fills them for "all", returns series — a panel that shows nothing fails — and the panels whose
//! value the job fixes return it. Grafana itself cannot be installed here; its panels are their
//! queries. The second test runs the whole fleet path: nodes and a sidecar through the
//! OpenTelemetry Collector to shards, Jaeger and Prometheus.

// A test reads as one scenario from start to end, so it may run past the length limit on functions.
#![allow(clippy::too_many_lines)]

use std::io::BufReader;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use gpuprof_testkit::collector::{free_ports, Collector, Jaeger, ShippedCollector};
use gpuprof_testkit::daemon::{one_daemon_at_a_time, Daemon};
use gpuprof_testkit::prometheus::{as_grafana_sends, queries, Prometheus};
use gpuprof_testkit::*;
use serde_json::Value;

const MIB: f64 = (1 << 20) as f64;

/// Every panel query of the shipped dashboards: (dashboard, panel title, expression).
fn every_panel() -> Vec<(String, String, String)> {
    ["fleet.json", "pipeline.json"]
        .iter()
        .flat_map(|dashboard| {
            queries(dashboard).into_iter().map(move |(title, expr)| (dashboard.to_string(), title, expr))
        })
        .collect()
}

/// Every panel shows something once a few scrapes have come in (45 s at most).
fn assert_every_panel_answers(prometheus: &Prometheus, panels: &[(String, String, String)]) {
    let started = Instant::now();
    let empty = loop {
        let empty: Vec<&(String, String, String)> =
            panels.iter().filter(|(_, _, expr)| prometheus.query(&as_grafana_sends(expr)).is_empty()).collect();
        if empty.is_empty() || started.elapsed() > Duration::from_secs(45) {
            break empty;
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    assert!(empty.is_empty(), "panels that show nothing: {empty:#?}");
}

/// A PyTorch-like job (the miniature torch over the stand-ins): 8 MiB of tensors live and a
/// 4 MiB segment cached, held until its stdin closes.
const HOLDER: &str = r#"
import os, sys
sys.path.insert(0, os.path.join(sys.argv[1], "site-packages"))
import minitorch
minitorch.init()
kept = minitorch.empty(8 << 20)
freed = minitorch.empty(4 << 20)
del freed
print("holding", flush=True)
sys.stdin.read()
"#;

#[test]
fn every_dashboard_panel_answers_from_a_real_prometheus() {
    let _node = one_daemon_at_a_time();
    let dir = scratch("dashboards");
    // The collector forwards spans to a trace store (the pipeline dashboard shows how many).
    let jaeger = Jaeger::start(&dir);
    let collector = Collector::start(&dir.join("c.redb"), &["--forward-endpoint", &jaeger.otlp_http]);
    let nvml = dir.join("nvml");
    let library_path = format!("{}:{}", standin_dir().display(), nvml_standin_dir().display());
    let daemon = Daemon::start_under(
        &["env", &format!("LD_LIBRARY_PATH={library_path}"), &format!("GPUPROF_STANDIN_NVML_DIR={}", nvml.display())],
        &[
            "--otlp-endpoint",
            &collector.grpc,
            "--node-name",
            "dash-node",
            "--libcuda",
            standin_dir().join("libcuda.so.1").to_str().unwrap(),
            // Tensors recorded: the allocator panels (allocated, reserved, cache) come from them.
            "--level",
            "tensors",
            "--otlp-profile-interval",
            "1",
            "--output",
            "/dev/null",
        ],
    );
    let prometheus = Prometheus::start(
        &dir,
        &[
            ("daemon", daemon.health.trim_start_matches("http://")),
            ("collector", collector.http.trim_start_matches("http://")),
        ],
    );

    // A leak that stays a finding: a worker leaves its parent's IPC mapping open.
    let log = dir.join("leaks.log");
    let mut leak = Command::new(python3());
    leak.arg(workloads().join("leaks.py")).arg("ipc-left-open");
    workload_env(&mut leak, &log);
    leak.env("GPUPROF_STANDIN_NVML_DIR", &nvml);
    assert!(leak.status_within(PATIENCE).success());
    // The job that holds memory while the panels are read.
    let mut holder = Command::new(python3());
    holder.arg("-c").arg(HOLDER).arg(workloads());
    workload_env(&mut holder, &dir.join("holder.log"));
    holder.env("GPUPROF_STANDIN_NVML_DIR", &nvml);
    let mut holder = holder.stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
    let line =
        line_within(&mut BufReader::new(holder.stdout.as_mut().unwrap()), READY_LIMIT, "the holder's \"holding\"");
    assert_eq!(line, "holding\n");

    let panels = every_panel();
    assert!(panels.len() >= 40, "{}", panels.len());
    assert_every_panel_answers(&prometheus, &panels);
    // Which work from the daemons' own metrics alone (docs/deploy.md); the rest need a
    // gpuprof-collector.
    let mut daemon_only: Vec<&str> = panels
        .iter()
        .filter(|(_, _, expr)| expr.contains("gpuprof_daemon_"))
        .map(|(_, title, _)| title.as_str())
        .collect();
    daemon_only.dedup();
    assert_eq!(
        daemon_only,
        [
            "Events captured by node",
            "Capture losses by node",
            "Processes followed and retained",
            "Process churn by node",
            "Daemon resident memory and OTLP queue",
            "Libraries probed",
            "Findings fired by daemons",
            "OTLP items sent vs lost"
        ]
    );

    // The panels the job fixes: its 12 MiB of segments, 4 MiB of them cached, the one leak.
    let pid = holder.id().to_string();
    let value = |expr: &str| -> f64 {
        let series = prometheus.query(&as_grafana_sends(expr));
        assert_eq!(series.len(), 1, "{expr}: {series:?}");
        series[0].1
    };
    let by_process = prometheus.query(&as_grafana_sends(
        r#"sum by (node, pid, comm) (gpuprof_live_bytes{node=~"$node", namespace=~"$namespace", pod=~"$pod"})"#,
    ));
    let held: Vec<(String, f64)> = by_process
        .iter()
        .filter(|(labels, _)| labels["pid"] == pid.as_str())
        .map(|(labels, v)| (labels["node"].as_str().unwrap().to_string(), *v))
        .collect();
    assert_eq!(held, vec![("dash-node".to_string(), 12.0 * MIB)], "{by_process:?}");
    let cache = value(
        r#"sum(gpuprof_allocator_reserved_bytes{node=~"$node", namespace=~"$namespace", pod=~"$pod"}) - sum(gpuprof_allocator_allocated_bytes{node=~"$node", namespace=~"$namespace", pod=~"$pod"})"#,
    );
    assert_eq!(cache, 4.0 * MIB);
    assert_eq!(value(r#"sum(gpuprof_findings{node=~"$node", severity="leak"})"#), 1.0);

    drop(holder.stdin.take());
    let _ = holder.wait_within(Duration::from_secs(10), "holder");
}

/// gpuprof's OpenTelemetry Collector running deploy/otel-collector/loadbalancing.yaml as it
/// ships, the environment filling it in (as the chart does).
/// Shard `n`, running.
fn on(shards: &[Option<Collector>], n: usize) -> &Collector {
    shards[n].as_ref().unwrap()
}

/// The bearer token of the fleet: the agents send it, the Collector and the shards ask for it.
const TOKEN: &str = "fleet-s3cret";

/// A job's process that holds a 12 MiB segment, 8 MiB of it a tensor (the allocator's report
/// through the libc10_cuda stand-in, which the shim sees), until its stdin closes.
const SHIM_HOLDER: &str = r#"
import ctypes, os, sys
from cuda_driver import Driver
MiB = 1 << 20
class Device(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int8), ("index", ctypes.c_int8)]
cuda = Driver()
cuda.init()
ctypes.CDLL(os.environ["GPUPROF_LIBC10"])
report = ctypes.CDLL(os.environ["GPUPROF_LIBC10_CUDA"]).standin_allocator_report
report.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_size_t, ctypes.c_size_t, Device]
r, segment = cuda.mem_alloc(12 * MiB)
assert r == 0
report(segment, 8 * MiB, 8 * MiB, 12 * MiB, Device(1, 0))
print("holding", flush=True)
sys.stdin.read()
"#;

/// The acceptance of the fleet on the real pieces: two nodes (daemons named node-a and node-b,
/// each taking the events of its jobs' shim: two daemons' eBPF on one machine would both see
/// every process) and a pod's sidecar on node-b send through gpuprof's OpenTelemetry Collector
/// (the shipped configuration) to two gpuprof-collector shards, Jaeger v2 and Prometheus.
/// Each node lands whole on one shard; every finding is a span in Jaeger with its attributes;
/// every dashboard panel answers from Prometheus with the values the jobs fix; the Collector's
/// Prometheus exporter serves the agents' gauges; a shard restarted while its node sends gets
/// what was sent meanwhile and keeps what it had.
#[test]
fn two_nodes_and_a_sidecar_through_the_opentelemetry_collector_fill_shards_jaeger_and_prometheus() {
    let _node = one_daemon_at_a_time();
    let dir = scratch("dashboards_fleet");
    let shim = shim_library();
    let _ = libc10_cuda_standin();
    let jaeger = Jaeger::start(&dir);
    let shard_ports: [u16; 2] = free_ports();
    let start_shard = |n: usize| {
        let listen = format!("127.0.0.1:{}", shard_ports[n]);
        Collector::start(&dir.join(format!("shard-{n}.redb")), &["--grpc-listen", &listen, "--token", TOKEN])
    };
    let mut shards = [Some(start_shard(0)), Some(start_shard(1))];
    let otelcol = ShippedCollector::start(
        &dir,
        &shard_ports.map(|port| format!("127.0.0.1:{port}")),
        jaeger.otlp.as_str(),
        TOKEN,
    );

    let node_env = |nvml: &Path| -> Vec<String> {
        vec![
            "env".to_string(),
            format!("LD_LIBRARY_PATH={}:{}", standin_dir().display(), nvml_standin_dir().display()),
            format!("GPUPROF_STANDIN_NVML_DIR={}", nvml.display()),
        ]
    };
    let sending = ["--otlp-endpoint", &otelcol.grpc, "--otlp-token", TOKEN, "--otlp-profile-interval", "1"];
    let (nvml_a, nvml_b) = (dir.join("nvml-a"), dir.join("nvml-b"));
    let (socket_a, socket_b) = (dir.join("node-a.sock"), dir.join("node-b.sock"));
    let node_daemon = |name: &str, socket: &Path, nvml: &Path| {
        let wrapper = node_env(nvml);
        let wrapper: Vec<&str> = wrapper.iter().map(String::as_str).collect();
        let mut args = vec!["--capture", "shim", "--shim-socket", socket.to_str().unwrap(), "--node-name", name];
        args.extend(["--level", "tensors", "--output", "/dev/null"]);
        args.extend(sending);
        Daemon::start_under(&wrapper, &args)
    };
    let daemon_a = node_daemon("node-a", &socket_a, &nvml_a);
    let daemon_b = node_daemon("node-b", &socket_b, &nvml_b);
    // A pod on node-b with its sidecar (the downward API's names given as the pod would).
    let pod = dir.join("pod");
    std::fs::create_dir_all(&pod).unwrap();
    let mut wrapper = node_env(&nvml_b);
    wrapper.extend(
        [
            "K8S_NODE_NAME=node-b",
            "K8S_POD_NAME=train-0",
            "K8S_NAMESPACE=ml",
            "K8S_POD_UID=0b6a4c9e-52f1-4c3a-9d0e-6f1e2a3b4c5d",
            "GPUPROF_WORKLOAD_CONTAINER=trainer",
        ]
        .map(String::from),
    );
    let wrapper: Vec<&str> = wrapper.iter().map(String::as_str).collect();
    let mut args = vec!["--sidecar", pod.to_str().unwrap(), "--level", "tensors", "--output", "/dev/null"];
    args.extend(sending);
    let sidecar = Daemon::start_under(&wrapper, &args);

    let prometheus = Prometheus::start(
        &dir,
        &[
            ("daemon-a", daemon_a.health.trim_start_matches("http://")),
            ("daemon-b", daemon_b.health.trim_start_matches("http://")),
            ("sidecar", sidecar.health.trim_start_matches("http://")),
            ("shard-0", shards[0].as_ref().unwrap().http.trim_start_matches("http://")),
            ("shard-1", shards[1].as_ref().unwrap().http.trim_start_matches("http://")),
            ("otelcol-gauges", &otelcol.gauges),
            ("otelcol", &otelcol.metrics),
        ],
    );

    // A job as the node's shim sends it.
    let job = |args: &[&str], socket: &Path, shim: &Path, nvml: &Path, log: &str| {
        let mut command = Command::new(python3());
        command.args(args);
        workload_env(&mut command, &dir.join(log));
        command
            .env("LD_PRELOAD", shim)
            .env("GPUPROF_SHIM_SOCKET", socket)
            .env("GPUPROF_SHIM_LEVEL", "tensors")
            .env("GPUPROF_LIBC10_CUDA", libc10_cuda_standin())
            .env("GPUPROF_STANDIN_NVML_DIR", nvml);
        command
    };
    let leaks = workloads().join("leaks.py");
    let leaks = leaks.to_str().unwrap();
    // Multiprocess jobs whose worker exits holding 8 MiB: one on node-a, one in the pod as rank 1.
    let status = job(&[leaks, "worker-exit-live"], &socket_a, shim, &nvml_a, "leak-a.log").status_within(PATIENCE);
    assert!(status.success());
    let pod_shim = pod.join("libgpuprof_shim.so");
    let status = job(&[leaks, "worker-exit-live"], &pod.join("shim.sock"), &pod_shim, &nvml_b, "leak-pod.log")
        .env("RANK", "1")
        .env("WORLD_SIZE", "2")
        .status_within(PATIENCE);
    assert!(status.success());
    // A holder on each node while the panels are read.
    let hold = |socket: &Path, nvml: &Path, log: &str| {
        let mut holder = job(&["-c", SHIM_HOLDER], socket, shim, nvml, log)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let line =
            line_within(&mut BufReader::new(holder.stdout.as_mut().unwrap()), READY_LIMIT, "the holder's \"holding\"");
        assert_eq!(line, "holding\n");
        holder
    };
    let mut holder_a = hold(&socket_a, &nvml_a, "holder-a.log");
    let mut holder_b = hold(&socket_b, &nvml_b, "holder-b.log");

    // Each job whole on one shard: its processes and findings there, nothing of it on the other.
    let started = Instant::now();
    let on_shard = loop {
        let found: Vec<Vec<Value>> = (0..2)
            .map(|n| {
                ["node-a", "node-b"].iter().flat_map(|node| on(&shards, n).findings(&format!("?node={node}"))).collect()
            })
            .collect();
        if found.iter().map(Vec::len).sum::<usize>() >= 2 || started.elapsed() > Duration::from_secs(30) {
            break found;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    eprintln!("findings per shard: {on_shard:#?}");
    let shard_of = |node: &str| -> usize {
        let holding: Vec<usize> = (0..2)
            .filter(|&n| {
                let (status, body) = on(&shards, n).get(&format!("/api/v1/processes?node={node}"));
                assert_eq!(status, 200);
                body.trim() != "[]"
            })
            .collect();
        assert_eq!(holding.len(), 1, "{node} is on shards {holding:?}");
        holding[0]
    };
    // node-a's processes are one job (this test's process group, the job of a launcher-less
    // process), so node-a is whole on one shard. node-b has two: the pod's (its owner) and its
    // holder's, routed each to its shard, which may be the same or not; no process is on both.
    let shard_a = shard_of("node-a");
    let pids_on = |n: usize| -> Vec<u64> {
        let (status, body) = on(&shards, n).get("/api/v1/processes?node=node-b");
        assert_eq!(status, 200);
        let processes: Vec<Value> = serde_json::from_str(&body).unwrap();
        processes.iter().map(|p| p["pid"].as_u64().unwrap()).collect()
    };
    let (b_on_0, b_on_1) = (pids_on(0), pids_on(1));
    assert!(!b_on_0.is_empty() || !b_on_1.is_empty(), "node-b is on no shard");
    assert!(b_on_0.iter().all(|pid| !b_on_1.contains(pid)), "a node-b process on both shards: {b_on_0:?} {b_on_1:?}");
    // The findings: each worker's exit holding its 8 MiB, the pod's as rank 1.
    let worker_a = pid_of_role(&read_expected(&dir.join("leak-a.log")), "worker");
    let worker_pod = pid_of_role(&read_expected(&dir.join("leak-pod.log")), "worker");
    let findings: Vec<Value> = (0..2).flat_map(|n| on(&shards, n).findings("")).collect();
    let mut seen: Vec<(String, String, String, u64, Option<u64>, u64)> = findings
        .iter()
        .map(|f| {
            (
                f["node"].as_str().unwrap().to_string(),
                f["kind"].as_str().unwrap().to_string(),
                f["severity"].as_str().unwrap().to_string(),
                f["pid"].as_u64().unwrap(),
                f["rank"].as_u64(),
                f["bytes"].as_u64().unwrap(),
            )
        })
        .collect();
    seen.sort();
    let leak = |node: &str, pid: u32, rank: Option<u64>| {
        (node.to_string(), "exit_with_live_allocations".to_string(), "leak".to_string(), u64::from(pid), rank, 8 << 20)
    };
    assert_eq!(seen, [leak("node-a", worker_a, None), leak("node-b", worker_pod, Some(1))]);

    // In Jaeger, through the Collector: each finding a span in its process's trace, with its
    // attributes, the node (and the pod) of its resource, the driver spans of the process beside it.
    let tag = |tags: &Value, key: &str| -> Value {
        tags.as_array().and_then(|t| t.iter().find(|t| t["key"] == key)).map_or(Value::Null, |t| t["value"].clone())
    };
    for finding in &findings {
        let started = Instant::now();
        let (span, trace, processes) = loop {
            let (status, body) = jaeger.get("/api/traces?service=gpuprof&limit=1000&lookback=1h");
            let traces: Value = if status == 200 { serde_json::from_str(&body).unwrap() } else { Value::Null };
            let found = traces["data"].as_array().into_iter().flatten().find_map(|trace| {
                let spans = trace["spans"].as_array()?;
                let span = spans.iter().find(|s| tag(&s["tags"], "gpuprof.finding.id") == finding["finding_id"])?;
                Some((span.clone(), spans.clone(), trace["processes"].clone()))
            });
            if let Some(found) = found {
                break found;
            }
            assert!(started.elapsed() < Duration::from_secs(30), "no span in Jaeger for {finding}");
            std::thread::sleep(Duration::from_millis(200));
        };
        assert_eq!(span["operationName"], "gpuprof.finding.exit_with_live_allocations");
        for (key, value) in [
            ("gpuprof.finding.kind", finding["kind"].clone()),
            ("gpuprof.finding.severity", finding["severity"].clone()),
            ("process.pid", finding["pid"].clone()),
            ("gpuprof.rank", finding["rank"].clone()),
        ] {
            assert_eq!(tag(&span["tags"], key), value, "{key}: {span}");
        }
        let user = &finding["user_frame"];
        assert_eq!(
            tag(&span["tags"], "gpuprof.finding.user_frame"),
            format!("{}:{} in {}", user["file"].as_str().unwrap(), user["line"], user["function"].as_str().unwrap())
        );
        let resource = &processes[span["processID"].as_str().unwrap()]["tags"];
        assert_eq!(tag(resource, "host.name"), finding["node"]);
        let in_pod = finding["node"] == "node-b";
        assert_eq!(tag(resource, "k8s.pod.name"), if in_pod { Value::from("train-0") } else { Value::Null });
        assert_eq!(tag(resource, "k8s.namespace.name"), if in_pod { Value::from("ml") } else { Value::Null });
        if in_pod {
            assert_eq!(tag(resource, "k8s.container.name"), "trainer");
        }
        // The worker's 8 MiB segment is a span of the same trace, ended by the exit.
        assert!(trace.len() <= 2_000, "{} spans in one trace", trace.len());
        let segments: Vec<(Value, Value)> = trace
            .iter()
            .filter(|s| s["operationName"] != span["operationName"])
            .map(|s| (tag(&s["tags"], "gpu.memory.size"), tag(&s["tags"], "gpu.memory.leaked")))
            .collect();
        assert_eq!(segments, [(Value::from(8 << 20), Value::from(true))], "{trace:?}");
        // Its post-mortem: named on the finding, linked from its span, served by its shard.
        let url = finding["postmortem"]["url"].as_str().unwrap_or_else(|| panic!("no post-mortem in {finding}"));
        assert_eq!(url, format!("/api/v1/findings/{}/report", finding["finding_id"].as_str().unwrap()));
        assert_eq!(tag(&span["tags"], "gpuprof.postmortem.url"), url);
        // The shard that holds the finding serves its page (node-b's two jobs may be on two).
        let node = finding["node"].as_str().unwrap();
        let shard = (0..2)
            .find(|&n| {
                on(&shards, n)
                    .findings(&format!("?node={node}"))
                    .iter()
                    .any(|f| f["finding_id"] == finding["finding_id"])
            })
            .unwrap_or_else(|| panic!("no shard holds {finding}"));
        let started = Instant::now();
        let (status, page) = loop {
            let (status, page) = on(&shards, shard).get_bytes(url);
            if status == 200 || started.elapsed() > Duration::from_secs(30) {
                break (status, page);
            }
            std::thread::sleep(Duration::from_millis(200));
        };
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&page));
        assert!(page.starts_with(b"<!doctype html>"), "{url} is no page");
    }

    // Every panel shows something once a few scrapes have come in.
    assert_every_panel_answers(&prometheus, &every_panel());
    // The values the jobs fix: each holder's 12 MiB on its node, 4 MiB cached by each, the two leaks.
    let by_process = prometheus.query(&as_grafana_sends(
        r#"sum by (node, pid, comm) (gpuprof_live_bytes{node=~"$node", namespace=~"$namespace", pod=~"$pod"})"#,
    ));
    let held = |holder: &Child| -> Vec<(String, f64)> {
        by_process
            .iter()
            .filter(|(labels, _)| labels["pid"] == holder.id().to_string().as_str())
            .map(|(labels, v)| (labels["node"].as_str().unwrap().to_string(), *v))
            .collect()
    };
    assert_eq!(held(&holder_a), [("node-a".to_string(), 12.0 * MIB)], "{by_process:?}");
    assert_eq!(held(&holder_b), [("node-b".to_string(), 12.0 * MIB)], "{by_process:?}");
    let value = |expr: &str| -> f64 {
        let series = prometheus.query(&as_grafana_sends(expr));
        assert_eq!(series.len(), 1, "{expr}: {series:?}");
        series[0].1
    };
    assert_eq!(
        value(
            r#"sum(gpuprof_allocator_reserved_bytes{node=~"$node", namespace=~"$namespace", pod=~"$pod"}) - sum(gpuprof_allocator_allocated_bytes{node=~"$node", namespace=~"$namespace", pod=~"$pod"})"#
        ),
        8.0 * MIB
    );
    assert_eq!(value(r#"sum(gpuprof_findings{node=~"$node", severity="leak"})"#), 2.0);
    // The Collector's Prometheus exporter: the agents' own gauges, the resource as labels, under
    // names of their own (the shards' are what the dashboards sum).
    for (holder, node) in [(&holder_a, "node-a"), (&holder_b, "node-b")] {
        let expr = format!(
            r#"sum by (host_name) (agent_gpuprof_memory_live_bytes{{job="otelcol-gauges", process_pid="{}", gpu_memory_layer="driver"}})"#,
            holder.id()
        );
        let series = prometheus.query(&expr);
        assert_eq!(series.len(), 1, "{expr}: {series:?}");
        assert_eq!((series[0].0["host_name"].as_str().unwrap(), series[0].1), (node, 12.0 * MIB));
    }

    // node-a's shard restarted while node-a sends: what was sent meanwhile arrives (the
    // Collector's queue and retry for that shard), what it had is kept (its database).
    shards[shard_a].take().unwrap().stop();
    let status = job(&[leaks, "worker-exit-live"], &socket_a, shim, &nvml_a, "leak-a2.log").status_within(PATIENCE);
    assert!(status.success());
    let worker_a2 = pid_of_role(&read_expected(&dir.join("leak-a2.log")), "worker");
    std::thread::sleep(Duration::from_secs(2));
    shards[shard_a] = Some(start_shard(shard_a));
    let started = Instant::now();
    let pids_on_a = loop {
        let mut pids: Vec<u64> =
            on(&shards, shard_a).findings("?node=node-a").iter().map(|f| f["pid"].as_u64().unwrap()).collect();
        pids.sort_unstable();
        if pids.len() >= 2 || started.elapsed() > Duration::from_secs(60) {
            break pids;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let mut want = vec![u64::from(worker_a), u64::from(worker_a2)];
    want.sort_unstable();
    assert_eq!(pids_on_a, want);
    assert!(on(&shards, 1 - shard_a).findings("?node=node-a").is_empty(), "node-a moved to the other shard");
    assert!(
        on(&shards, shard_a).get("/api/v1/processes?node=node-a").1.contains(&format!("\"pid\":{}", holder_a.id())),
        "the restarted shard forgot node-a's holder"
    );

    drop(holder_a.stdin.take());
    drop(holder_b.stdin.take());
    let _ = holder_a.wait_within(Duration::from_secs(10), "holder_a");
    let _ = holder_b.wait_within(Duration::from_secs(10), "holder_b");
    drop(prometheus);
    drop(otelcol);
    for shard in shards.iter_mut() {
        shard.take().unwrap().stop();
    }
}
