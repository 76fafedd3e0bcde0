//! The shipped Grafana dashboards against a real Prometheus (Debian's): a node's daemon and a
//! gpuprof-collector are scraped while a known job holds device memory on the stand-ins, and
//! every panel's query, run over Prometheus' HTTP API with the dashboard's variables as Grafana
//! fills them for "all", returns series — a panel that shows nothing fails — and the panels whose
//! value the job fixes return it. Grafana itself cannot be installed here; its panels are their
//! queries.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use gpuprof_testkit::collector::{free_port, wait_ready, Collector, Jaeger};
use gpuprof_testkit::daemon::{one_daemon_at_a_time, Daemon};
use gpuprof_testkit::*;
use serde_json::Value;

const MIB: f64 = (1 << 20) as f64;

/// Every panel query of a dashboard: (panel title, expression).
fn queries(dashboard: &str) -> Vec<(String, String)> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/helm/gpuprof/dashboards").join(dashboard);
    let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let mut found = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            if let Some(expr) = target["expr"].as_str() {
                found.push((panel["title"].as_str().unwrap().to_string(), expr.to_string()));
            }
        }
    }
    found
}

/// The expression as Grafana sends it with every variable at "All" (a regex matching anything,
/// empty labels included) over the last 10 minutes.
fn as_grafana_sends(expr: &str) -> String {
    expr.replace("$node", ".*")
        .replace("$namespace", ".*")
        .replace("$pod", ".*")
        .replace("$__range", "10m")
        .replace("$__rate_interval", "1m")
}

struct Prometheus {
    child: Child,
    url: String,
    agent: ureq::Agent,
}

impl Prometheus {
    fn start(dir: &Path, targets: &[(&str, &str)]) -> Prometheus {
        let port = free_port();
        let jobs: String = targets
            .iter()
            .map(|(job, address)| format!("  - job_name: {job}\n    static_configs: [{{targets: ['{address}']}}]\n"))
            .collect();
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!("global: {{scrape_interval: 1s, evaluation_interval: 1s}}\nscrape_configs:\n{jobs}"),
        )
        .unwrap();
        let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("tsdb").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start prometheus ({e}): run scripts/install-prerequisites.sh"));
        let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
        let mut prometheus = Prometheus { child, url: format!("http://127.0.0.1:{port}"), agent };
        let (url, agent) = (prometheus.url.clone(), prometheus.agent.clone());
        wait_ready("prometheus", &mut prometheus.child, &dir.join("prometheus.log"), Duration::from_secs(30), || {
            agent.get(&format!("{url}/-/ready")).call().is_ok_and(|r| r.status().as_u16() == 200)
        });
        prometheus
    }

    /// An instant query: each series' labels and value.
    fn query(&self, expr: &str) -> Vec<(Value, f64)> {
        let response = self
            .agent
            .get(&format!("{}/api/v1/query", self.url))
            .query("query", expr)
            .call()
            .unwrap_or_else(|e| panic!("{expr}: {e}"));
        let body: Value = serde_json::from_str(&response.into_body().read_to_string().unwrap()).unwrap();
        assert_eq!(body["status"], "success", "{expr}: {body}");
        body["data"]["result"]
            .as_array()
            .unwrap()
            .iter()
            .map(|series| (series["metric"].clone(), series["value"][1].as_str().unwrap().parse().unwrap()))
            .collect()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
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
    assert!(leak.status().unwrap().success());
    // The job that holds memory while the panels are read.
    let mut holder = Command::new(python3());
    holder.arg("-c").arg(HOLDER).arg(workloads());
    workload_env(&mut holder, &dir.join("holder.log"));
    holder.env("GPUPROF_STANDIN_NVML_DIR", &nvml);
    let mut holder = holder.stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
    let mut line = String::new();
    BufReader::new(holder.stdout.as_mut().unwrap()).read_line(&mut line).unwrap();
    assert_eq!(line, "holding\n");

    let panels: Vec<(String, String, String)> = ["fleet.json", "pipeline.json"]
        .iter()
        .flat_map(|dashboard| {
            queries(dashboard).into_iter().map(move |(title, expr)| (dashboard.to_string(), title, expr))
        })
        .collect();
    assert!(panels.len() >= 40, "{}", panels.len());
    // Every panel shows something once a few scrapes have come in.
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
    let _ = wait_with_limit(&mut holder, Duration::from_secs(10));
}
