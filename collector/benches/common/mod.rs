//! The benchmarks' collector: the real binary on loopback ports it picks, its rate limit out of
//! the way, its state in a fresh file.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

pub struct Collector {
    pub child: Child,
    pub http: String,
}

impl Drop for Collector {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn start(db: &std::path::Path) -> Collector {
    let _ = std::fs::remove_file(db);
    let mut child = Command::new(env!("CARGO_BIN_EXE_gpuprof-collector"))
        .args(["--db", db.to_str().unwrap(), "--grpc-listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0"])
        .args(["--rate-limit", "1000000"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stderr.take().unwrap()).read_line(&mut line).unwrap();
    let http = line.split("/metrics on ").nth(1).unwrap().split(',').next().unwrap().to_string();
    Collector { child, http: format!("http://{http}") }
}

/// One OTLP/HTTP protobuf request, which the collector must take.
pub fn post(agent: &ureq::Agent, url: &str, body: &[u8]) {
    let response = agent.post(url).header("content-type", "application/x-protobuf").send(body).unwrap();
    assert_eq!(response.status().as_u16(), 200, "{url}");
}
