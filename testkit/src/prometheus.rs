//! A real Prometheus for the tests of what the dashboards ask it, and the dashboards' queries as
//! Grafana sends them.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;

use crate::collector::{free_port, wait_ready};
use crate::http_client;

/// Every panel query of a dashboard: (panel title, expression).
pub fn queries(dashboard: &str) -> Vec<(String, String)> {
    let path = crate::workspace::root().join("deploy/helm/gpuprof/dashboards").join(dashboard);
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
pub fn as_grafana_sends(expr: &str) -> String {
    expr.replace("$node", ".*")
        .replace("$namespace", ".*")
        .replace("$pod", ".*")
        .replace("$job", ".*")
        .replace("$rank", ".*")
        .replace("$__range", "10m")
        .replace("$__rate_interval", "1m")
}

/// A Prometheus scraping `targets` every second, on a loopback port, its data under the test's
/// directory (`prometheus` on PATH: scripts/install-prerequisites.sh installs it).
pub struct Prometheus {
    child: Child,
    url: String,
    agent: ureq::Agent,
}

impl Prometheus {
    pub fn start(dir: &Path, targets: &[(&str, &str)]) -> Prometheus {
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
        let agent: ureq::Agent = http_client();
        let mut prometheus = Prometheus { child, url: format!("http://127.0.0.1:{port}"), agent };
        let (url, agent) = (prometheus.url.clone(), prometheus.agent.clone());
        wait_ready("prometheus", &mut prometheus.child, &dir.join("prometheus.log"), Duration::from_secs(30), || {
            agent.get(&format!("{url}/-/ready")).call().is_ok_and(|r| r.status().as_u16() == 200)
        });
        prometheus
    }

    /// An instant query: each series' labels and value.
    pub fn query(&self, expr: &str) -> Vec<(Value, f64)> {
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
