//! A gpuprof-collector started for a test on loopback ports it picks itself, with helpers for
//! its HTTP API and metrics.

use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use std::borrow::Cow;

use gpuprof_model::{Event, Kind, Layer, Op, Source};
use gpuprof_otlp::proto::collector::logs::v1::ExportLogsServiceRequest;
use gpuprof_otlp::proto::logs::v1::{ResourceLogs, ScopeLogs};
use gpuprof_otlp::resource::ProcessIdentity;
use prost::Message;
use serde_json::Value;

use crate::{http_client, ChildWithin, CommandWithin};

/// The collector binary, `gpuprof-collector`, brought up to date first.
pub fn collector_bin() -> &'static Path {
    static BIN: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BIN.get_or_init(|| {
        crate::workspace::build("gpuprof-collector", &["--bin", "gpuprof-collector"], "gpuprof-collector")
    })
}

/// gpuprof's OpenTelemetry Collector (deploy/otelcol/builder-config.yaml), built once into its
/// cache by scripts/build-otelcol.sh (minutes the first time; install-prerequisites builds it).
pub fn otelcol_bin() -> &'static Path {
    static BIN: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BIN.get_or_init(|| built_by("build-otelcol.sh", "the OpenTelemetry Collector"))
}

/// Jaeger v2, built once into its cache by scripts/build-jaeger.sh.
pub fn jaeger_bin() -> &'static Path {
    static BIN: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BIN.get_or_init(|| built_by("build-jaeger.sh", "Jaeger"))
}

/// The binary a scripts/ build script prints the path of (building it when its cache has none).
fn built_by(script: &str, what: &str) -> PathBuf {
    let script = crate::workspace::root().join("scripts").join(script);
    // install-prerequisites built it; from nothing it takes about 265 s on 2 cores.
    let output = Command::new("bash").arg(&script).output_within(std::time::Duration::from_secs(600));
    assert!(
        output.status.success(),
        "cannot build {what} ({}): {}",
        script.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    PathBuf::from(String::from_utf8(output.stdout).unwrap().trim())
}

/// Waits (100 ms apart) until `ready` holds for a server `child` started with its stderr in
/// `log`; fails naming `what` with that log when it exits first or `limit` passes.
pub fn wait_ready(what: &str, child: &mut Child, log: &Path, limit: Duration, mut ready: impl FnMut() -> bool) {
    let started = std::time::Instant::now();
    while !ready() {
        let said = || std::fs::read_to_string(log).unwrap_or_default();
        assert!(child.try_wait().unwrap().is_none(), "{what} exited: {}", said());
        assert!(started.elapsed() < limit, "{what} never got ready: {}", said());
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A port nothing listens on now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// `N` distinct ports nothing listens on now (each held until all are chosen: ports asked for one
/// at a time may repeat).
pub fn free_ports<const N: usize>() -> [u16; N] {
    let listeners: [std::net::TcpListener; N] =
        std::array::from_fn(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap());
    listeners.map(|l| l.local_addr().unwrap().port())
}

/// Jaeger v2 with in-memory storage: OTLP/gRPC in at `otlp`, its query API at `query`.
pub struct Jaeger {
    child: Child,
    pub otlp: String,
    /// OTLP/HTTP in (what the gpuprof-collector forwards spans to).
    pub otlp_http: String,
    pub query: String,
    agent: ureq::Agent,
}

impl Jaeger {
    pub fn start(dir: &Path) -> Jaeger {
        let [otlp, otlp_http, query, query_grpc] = free_ports();
        let config = format!(
            "service:
  extensions: [jaeger_storage, jaeger_query]
  pipelines:
    traces: {{receivers: [otlp], processors: [batch], exporters: [jaeger_storage_exporter]}}
  telemetry:
    metrics:
      level: none
extensions:
  jaeger_storage:
    backends:
      mem: {{memory: {{max_traces: 100000}}}}
  jaeger_query:
    storage: {{traces: mem}}
    http: {{endpoint: 127.0.0.1:{query}}}
    grpc: {{endpoint: 127.0.0.1:{query_grpc}}}
receivers:
  otlp:
    protocols:
      grpc: {{endpoint: 127.0.0.1:{otlp}}}
      http: {{endpoint: 127.0.0.1:{otlp_http}}}
processors:
  batch: {{timeout: 200ms}}
exporters:
  jaeger_storage_exporter: {{trace_storage: mem}}
"
        );
        let config_file = dir.join("jaeger.yaml");
        std::fs::write(&config_file, config).unwrap();
        let log = std::fs::File::create(dir.join("jaeger.log")).unwrap();
        let child = Command::new(jaeger_bin())
            .arg("--config")
            .arg(&config_file)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let agent: ureq::Agent = http_client();
        let mut jaeger = Jaeger {
            child,
            otlp: format!("127.0.0.1:{otlp}"),
            otlp_http: format!("http://127.0.0.1:{otlp_http}"),
            query: format!("http://127.0.0.1:{query}"),
            agent,
        };
        let (query, agent) = (jaeger.query.clone(), jaeger.agent.clone());
        wait_ready("Jaeger", &mut jaeger.child, &dir.join("jaeger.log"), Duration::from_secs(60), || {
            agent.get(&format!("{query}/api/services")).call().is_ok_and(|r| r.status().as_u16() == 200)
        });
        jaeger
    }

    /// GET on the query API: status and body.
    pub fn get(&self, path: &str) -> (u16, String) {
        match self.agent.get(&format!("{}{path}", self.query)).call() {
            Ok(mut response) => (response.status().as_u16(), response.body_mut().read_to_string().unwrap_or_default()),
            Err(_) => (0, String::new()),
        }
    }
}

impl Drop for Jaeger {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub struct Collector {
    pub child: Child,
    pub grpc: String,
    pub http: String,
    agent: ureq::Agent,
    /// What it said before it listened (warnings about its database).
    pub warnings: Vec<String>,
}

impl Collector {
    pub fn start(db: &Path, args: &[&str]) -> Collector {
        let mut command = Command::new(collector_bin());
        command.args(["--db", db.to_str().unwrap()]);
        // Ports of its own unless given: a shard started again keeps its addresses.
        for listen in ["--http-listen", "--grpc-listen"] {
            if !args.contains(&listen) {
                command.args([listen, "127.0.0.1:0"]);
            }
        }
        let mut child = command.args(args).stderr(Stdio::piped()).spawn().unwrap();
        let mut stderr = BufReader::new(child.stderr.take().unwrap());
        // Warnings first (a database it could not read whole), then the line that says where it
        // listens.
        let mut warnings = Vec::new();
        let line = loop {
            let line = crate::line_within(&mut stderr, crate::READY_LIMIT, "gpuprof-collector to say where it listens");
            if line.contains("OTLP/gRPC on ") {
                break line;
            }
            warnings.push(line.trim_end().to_string());
        };
        // "gpuprof-collector: OTLP/gRPC on A, OTLP/HTTP + API + /metrics on B, state in C"
        let addr = |after: &str| {
            line.split(after).nth(1).unwrap_or_else(|| panic!("{line}")).split(',').next().unwrap().to_string()
        };
        let (grpc, http) = (addr("OTLP/gRPC on "), addr("/metrics on "));
        std::thread::spawn(move || {
            let mut rest = String::new();
            let _ = stderr.read_to_string(&mut rest);
            eprint!("{rest}");
        });
        let agent = http_client();
        Collector { child, grpc: format!("http://{grpc}"), http: format!("http://{http}"), agent, warnings }
    }

    pub fn get(&self, path: &str) -> (u16, String) {
        self.get_as(path, None)
    }

    /// GET with `Authorization: Bearer <token>`.
    pub fn get_as(&self, path: &str, token: Option<&str>) -> (u16, String) {
        let mut request = self.agent.get(&format!("{}{path}", self.http));
        if let Some(token) = token {
            request = request.header("authorization", &format!("Bearer {token}"));
        }
        let mut response = request.call().unwrap();
        (response.status().as_u16(), response.body_mut().read_to_string().unwrap())
    }

    pub fn get_bytes(&self, path: &str) -> (u16, Vec<u8>) {
        let mut response = self.agent.get(&format!("{}{path}", self.http)).call().unwrap();
        (response.status().as_u16(), response.body_mut().read_to_vec().unwrap())
    }

    pub fn post(&self, path: &str, content_type: &str, body: &[u8], token: Option<&str>) -> (u16, String) {
        self.post_encoded(path, content_type, "identity", body, token)
    }

    /// `post` with a `content-encoding` (gzip, as the OpenTelemetry Collector sends).
    pub fn post_encoded(
        &self,
        path: &str,
        content_type: &str,
        encoding: &str,
        body: &[u8],
        token: Option<&str>,
    ) -> (u16, String) {
        let mut request = self
            .agent
            .post(&format!("{}{path}", self.http))
            .header("content-type", content_type)
            .header("content-encoding", encoding);
        if let Some(token) = token {
            request = request.header("authorization", &format!("Bearer {token}"));
        }
        match request.send(body) {
            Ok(mut response) => (response.status().as_u16(), response.body_mut().read_to_string().unwrap_or_default()),
            // The collector may answer 413 and close before the whole body is sent.
            Err(error) => (0, error.to_string()),
        }
    }

    pub fn findings(&self, query: &str) -> Vec<Value> {
        let (status, body) = self.get(&format!("/api/v1/findings{query}"));
        assert_eq!(status, 200, "{body}");
        serde_json::from_str(&body).unwrap()
    }

    /// The findings of node `node`, once `leaks` of them are leaks and no finding more came for
    /// two seconds.
    pub fn settled_findings(&self, node: &str, leaks: usize, limit: Duration) -> Vec<Value> {
        let deadline = Instant::now() + limit;
        let mut last = (0, Instant::now());
        loop {
            let found = self.findings(&format!("?node={node}"));
            if found.len() != last.0 {
                last = (found.len(), Instant::now());
            }
            let leaking = found.iter().filter(|f| f["severity"] == "leak").count();
            if leaking >= leaks && last.1.elapsed() >= Duration::from_secs(2) {
                return found;
            }
            assert!(Instant::now() < deadline, "{leaking} leaks after {limit:?}, expected {leaks}: {found:#?}");
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    pub fn metric(&self, name_and_labels: &str) -> u64 {
        let (_, text) = self.get("/metrics");
        let line = text
            .lines()
            .find(|l| l.starts_with(name_and_labels) && l[name_and_labels.len()..].starts_with(' '))
            .unwrap_or_else(|| panic!("no {name_and_labels} in\n{text}"));
        line.rsplit(' ').next().unwrap().parse().unwrap()
    }

    /// SIGTERM: the collector saves its state and exits 0.
    pub fn stop(mut self) {
        // SAFETY: kill takes no memory; the pid is our own child's, not yet waited for, so not reused.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let status = self.child.wait_within(Duration::from_secs(10), "gpuprof-collector, stopped with SIGTERM");
        assert_eq!(status.code(), Some(0));
    }
}

impl Collector {
    /// SIGKILL: no checkpoint, no goodbye; what it had not saved is gone. Start another on its
    /// database and addresses in its place.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait_within(Duration::from_secs(10), "gpuprof-collector, killed with SIGKILL");
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A driver event of process `pid` ("trainer"), its stack one frame at /srv/train.py:42.
pub fn synthetic(ts: u64, pid: u32, op: Op, api: &'static str, addr: u64, size: u64) -> Event {
    let mut event = Event::new(ts, pid, pid, Source::Ebpf, Layer::Driver, op, Cow::Borrowed(api));
    event.kind = Some(Kind::Device);
    event.addr = Some(addr);
    event.size = size;
    event.comm = "trainer".into();
    event.stack = vec![gpuprof_model::Frame { function: "step".into(), file: "/srv/train.py".into(), line: 42 }].into();
    event
}

/// An OTLP/HTTP logs request body of these events, from one process of `node`.
pub fn logs_request(node: &str, pid: u32, events: &[Event]) -> Vec<u8> {
    logs_request_of(
        &ProcessIdentity { host_name: node.into(), pid, executable: "trainer".into(), ..Default::default() },
        events,
    )
}

pub fn logs_request_of(identity: &ProcessIdentity, events: &[Event]) -> Vec<u8> {
    records_request(identity, events.iter().map(gpuprof_otlp::logs::record_of).collect())
}

/// An OTLP/HTTP logs request body of these records, from one process.
pub fn records_request(
    identity: &ProcessIdentity,
    log_records: Vec<gpuprof_otlp::proto::logs::v1::LogRecord>,
) -> Vec<u8> {
    ExportLogsServiceRequest {
        resource_logs: vec![ResourceLogs {
            resource: Some(identity.resource()),
            scope_logs: vec![ScopeLogs { scope: Some(gpuprof_otlp::scope()), log_records, ..Default::default() }],
            ..Default::default()
        }],
    }
    .encode_to_vec()
}

/// One process of `node` ("trainer").
pub fn trainer(node: &str, pid: u32) -> ProcessIdentity {
    ProcessIdentity { host_name: node.into(), pid, executable: "trainer".into(), ..Default::default() }
}

/// A memory profile as a node sends it: (function at /srv/train.py, line, bytes, count) per
/// stack, one frame each, in `layer` on device 0.
pub fn profile_record(
    ts: u64,
    layer: &'static str,
    stacks: &[(&str, u32, u64, u64)],
) -> gpuprof_otlp::proto::logs::v1::LogRecord {
    let mut builder = gpuprof_otlp::pprof::ProfileBuilder::new(ts);
    for (function, line, bytes, count) in stacks {
        let stack = [gpuprof_model::Frame { function: (*function).into(), file: "/srv/train.py".into(), line: *line }];
        builder.add(&gpuprof_otlp::pprof::StackSample {
            stack: &stack,
            bytes: *bytes,
            count: *count,
            layer,
            device: Some(0),
        });
    }
    gpuprof_otlp::logs::profile_record(gpuprof_otlp::pprof::encode(&builder.finish()), ts, "periodic")
}

/// An OTLP/HTTP metrics request body: the allocator gauges of one process on device 0.
pub fn allocator_gauges(identity: &ProcessIdentity, ts: u64, allocated: u64, reserved: u64) -> Vec<u8> {
    use gpuprof_model::otel::metric as name;
    use gpuprof_otlp::proto::collector::metrics::v1::ExportMetricsServiceRequest;
    use gpuprof_otlp::proto::common::v1::{any_value, AnyValue, KeyValue};
    use gpuprof_otlp::proto::metrics::v1::{
        metric, number_data_point, Gauge, Metric, NumberDataPoint, ResourceMetrics, ScopeMetrics,
    };
    let device = KeyValue {
        key: name::ATTR_DEVICE.into(),
        value: Some(AnyValue { value: Some(any_value::Value::StringValue("0".into())) }),
        ..Default::default()
    };
    let gauge = |metric_name: &str, value: u64| Metric {
        name: metric_name.into(),
        unit: "By".into(),
        data: Some(metric::Data::Gauge(Gauge {
            data_points: vec![NumberDataPoint {
                time_unix_nano: ts,
                value: Some(number_data_point::Value::AsInt(value as i64)),
                attributes: vec![device.clone()],
                ..Default::default()
            }],
        })),
        ..Default::default()
    };
    ExportMetricsServiceRequest {
        resource_metrics: vec![ResourceMetrics {
            resource: Some(identity.resource()),
            scope_metrics: vec![ScopeMetrics {
                scope: Some(gpuprof_otlp::scope()),
                metrics: vec![gauge(name::ALLOCATOR_ALLOCATED, allocated), gauge(name::ALLOCATOR_RESERVED, reserved)],
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
    .encode_to_vec()
}

/// A node's NVML gauge of one process (its used memory on every device).
pub fn nvml_gauge(identity: &ProcessIdentity, ts: u64, used: u64) -> Vec<u8> {
    use gpuprof_model::otel::metric as name;
    use gpuprof_otlp::proto::collector::metrics::v1::ExportMetricsServiceRequest;
    use gpuprof_otlp::proto::metrics::v1::{
        metric, number_data_point, Gauge, Metric, NumberDataPoint, ResourceMetrics, ScopeMetrics,
    };
    let point = NumberDataPoint {
        time_unix_nano: ts,
        value: Some(number_data_point::Value::AsInt(used as i64)),
        ..Default::default()
    };
    let gauge = Metric {
        name: name::NVML_USED.into(),
        unit: "By".into(),
        data: Some(metric::Data::Gauge(Gauge { data_points: vec![point] })),
        ..Default::default()
    };
    ExportMetricsServiceRequest {
        resource_metrics: vec![ResourceMetrics {
            resource: Some(identity.resource()),
            scope_metrics: vec![ScopeMetrics {
                scope: Some(gpuprof_otlp::scope()),
                metrics: vec![gauge],
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
    .encode_to_vec()
}

/// What the agent's end-of-export line says it handed over: (log records, findings, profiles, spans, metric points).
pub fn handed_over(stderr: &str) -> (u64, u64, u64, u64, u64) {
    let line =
        stderr.lines().find(|l| l.contains(": handed over ")).unwrap_or_else(|| panic!("no export line in\n{stderr}"));
    let numbers: Vec<u64> = line
        .split(": handed over ")
        .nth(1)
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .split(|c: char| !c.is_ascii_digit())
        .filter(|n| !n.is_empty())
        .map(|n| n.parse().unwrap())
        .collect();
    (numbers[0], numbers[1], numbers[2], numbers[3], numbers[4])
}

/// gpuprof's OpenTelemetry Collector running the shipped configuration
/// (deploy/otel-collector/loadbalancing.yaml) as it is, in front of `shards`, on loopback ports.
pub struct ShippedCollector {
    child: Child,
    /// OTLP/gRPC in (what the nodes send to).
    pub grpc: String,
    /// The agents' gauges for Prometheus, and the Collector's own metrics (host:port).
    pub gauges: String,
    pub metrics: String,
}

impl ShippedCollector {
    pub fn start(dir: &Path, shards: &[String], traces: &str, token: &str) -> ShippedCollector {
        let config = crate::workspace::root().join("deploy/otel-collector/loadbalancing.yaml");
        let [grpc, http, health, gauges, metrics] = free_ports();
        let log_path = dir.join("otelcol.log");
        let mut child = Command::new(otelcol_bin())
            .arg("--config")
            .arg(&config)
            .env("GPUPROF_COLLECTOR_TOKEN", token)
            .env("GPUPROF_COLLECTOR_SHARDS", format!("[{}]", shards.join(", ")))
            .env("GPUPROF_TRACES_OTLP", traces)
            .env("GPUPROF_OTELCOL_LISTEN", "127.0.0.1")
            .env("GPUPROF_OTELCOL_GRPC_PORT", grpc.to_string())
            .env("GPUPROF_OTELCOL_HTTP_PORT", http.to_string())
            .env("GPUPROF_OTELCOL_HEALTH_PORT", health.to_string())
            .env("GPUPROF_OTELCOL_PROMETHEUS_PORT", gauges.to_string())
            .env("GPUPROF_OTELCOL_METRICS_PORT", metrics.to_string())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log_path).unwrap())
            .spawn()
            .unwrap();
        let agent: ureq::Agent = http_client();
        wait_ready("the OpenTelemetry Collector", &mut child, &log_path, Duration::from_secs(30), || {
            agent.get(&format!("http://127.0.0.1:{health}/")).call().is_ok_and(|r| r.status().as_u16() == 200)
        });
        ShippedCollector {
            child,
            grpc: format!("http://127.0.0.1:{grpc}"),
            gauges: format!("127.0.0.1:{gauges}"),
            metrics: format!("127.0.0.1:{metrics}"),
        }
    }
}

/// gpuprof's OpenTelemetry Collector routing each node (`host.name`) to one of `shards`, as
/// tests and `bench/fleet.py` run it: each node whole on one shard, so that what a node sent
/// can be looked for on its shard. Its exporter's resilience settings are the deployment's
/// (deploy/otel-collector/loadbalancing.yaml: the per-shard queue and retry that ride out a
/// shard's restart); its traces also go to Jaeger's OTLP/gRPC `jaeger` when given.
pub struct OpenTelemetryCollector {
    child: Child,
    /// OTLP/gRPC in (what the nodes send to), as a URL.
    pub grpc: String,
    /// Its log (stderr): what it gave up is said there, per shard.
    pub log: PathBuf,
    config: PathBuf,
    health: u16,
}

impl OpenTelemetryCollector {
    /// Started and healthy.
    pub fn start(dir: &Path, shards: &[String], jaeger: Option<&str>) -> OpenTelemetryCollector {
        let [grpc, health] = free_ports();
        let pipeline = "{receivers: [otlp], processors: [memory_limiter, batch], exporters: [load_balancing]}";
        let (jaeger_exporter, traces) = match jaeger {
            Some(address) => (
                format!("  otlp_grpc/jaeger: {{endpoint: {address}, tls: {{insecure: true}}}}\n"),
                "{receivers: [otlp], processors: [memory_limiter, batch], exporters: [load_balancing, otlp_grpc/jaeger]}",
            ),
            None => (String::new(), pipeline),
        };
        let config = format!(
            "extensions:
  health_check: {{endpoint: 127.0.0.1:{health}}}
receivers:
  otlp:
    protocols:
      grpc: {{endpoint: 127.0.0.1:{grpc}}}
processors:
  memory_limiter: {{check_interval: 1s, limit_mib: 512, spike_limit_mib: 128}}
  batch: {{timeout: 200ms}}
exporters:
  load_balancing:
    routing_key: attributes
    routing_attributes: [host.name]
    protocol:
      otlp: {SHARD_EXPORTER}
    resolver:
      static: {{hostnames: [{}]}}
{jaeger_exporter}service:
  extensions: [health_check]
  telemetry: {{metrics: {{level: none}}}}
  pipelines:
    logs: {pipeline}
    traces: {traces}
    metrics: {pipeline}
",
            shards.join(", "),
        );
        let config_file = dir.join("otelcol.yaml");
        std::fs::write(&config_file, config).unwrap();
        let log = dir.join("otelcol.log");
        std::fs::File::create(&log).unwrap();
        let child = Self::launch(&config_file, &log, health);
        OpenTelemetryCollector { child, grpc: format!("http://127.0.0.1:{grpc}"), log, config: config_file, health }
    }

    /// The Collector on `config`, its log appended to `log`, once healthy.
    fn launch(config: &Path, log: &Path, health: u16) -> Child {
        let mut child = Command::new(otelcol_bin())
            .arg("--config")
            .arg(config)
            .stdout(Stdio::null())
            .stderr(std::fs::OpenOptions::new().append(true).open(log).unwrap())
            .spawn()
            .unwrap();
        let agent = http_client();
        wait_ready("the OpenTelemetry Collector", &mut child, log, Duration::from_secs(30), || {
            agent.get(&format!("http://127.0.0.1:{health}/")).call().is_ok_and(|r| r.status().as_u16() == 200)
        });
        child
    }

    /// Stopped with `signal` (SIGTERM: it drains what it holds; SIGKILL: lost with it), and
    /// `down_for` later started again on its configuration and ports.
    pub fn restart(&mut self, signal: i32, down_for: Duration) {
        // SAFETY: kill takes no memory; the pid is our own child's, not yet waited for.
        unsafe { libc::kill(self.child.id() as i32, signal) };
        self.child.wait_within(Duration::from_secs(30), "the OpenTelemetry Collector, stopped");
        std::thread::sleep(down_for);
        self.child = Self::launch(&self.config, &self.log, self.health);
    }

    /// Its last `n` lines of log, to say why a test failed.
    pub fn log_tail(&self, n: usize) -> String {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    pub fn stop(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for OpenTelemetryCollector {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The per-shard exporter of `load_balancing` as the deployment sets it
/// (deploy/otel-collector/loadbalancing.yaml, where the choice is explained): the same
/// settings here, for tests and `bench/fleet.py`'s kill runs to measure.
pub const SHARD_EXPORTER: &str = "{timeout: 10s, tls: {insecure: true}, \
retry_on_failure: {initial_interval: 500ms, max_interval: 5s, max_elapsed_time: 300s}}";

impl Drop for ShippedCollector {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A node's finding (process 501 exited holding 1 MiB) sent to `collector`, as its agent sends it.
pub fn send_a_finding(collector: &Collector, node: &str, base: u64) {
    let events = [
        synthetic(base, 501, Op::Alloc, "cuMemAlloc_v2", 0x7000_0000, 1 << 20),
        Event::new(base + 1, 501, 501, Source::Ebpf, Layer::Process, Op::Exit, Cow::Borrowed("sched_process_exit")),
    ];
    assert_eq!(collector.post("/v1/logs", "application/x-protobuf", &logs_request(node, 501, &events), None).0, 200);
    let found = gpuprof_model::analyze(&events, gpuprof_model::RuleConfig::default());
    let finding = gpuprof_otlp::logs::finding_record(&found[0], base + 1);
    let request = records_request(&trainer(node, 501), vec![finding]);
    assert_eq!(collector.post("/v1/logs", "application/x-protobuf", &request, None).0, 200);
}
