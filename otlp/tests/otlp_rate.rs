//! The OTLP reporter at a training job's rate: two training-like processes (tens of thousands of allocator
//! events a second between them, 41-frame Python stacks, a block kept every few steps) through
//! `gpuprof run --otlp-endpoint` to a real gpuprof-collector whose request limit is 1 MiB. The
//! node summarizes: nothing is lost, no request is over the limit, the collector serves the
//! agent's own findings and the allocator's exact final totals per process, and each process's
//! memory profile is read by a real pprof consumer (`go tool pprof`) with the leaking line's
//! bytes. The same with the collector down for the first seconds: what was queued arrives.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use gpuprof_model::Finding;
use gpuprof_testkit::collector::{handed_over, Collector};
use gpuprof_testkit::*;
use serde_json::Value;

const LIMIT_BYTES: u64 = 1 << 20;

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// `gpuprof run` of two training processes to `endpoint`; returns (stderr, the workloads' summaries, the agent's findings).
fn run_training(dir: &Path, endpoint: &str, seconds: u32) -> (String, Vec<Value>, Vec<Finding>) {
    let (log, findings) = (dir.join("expected.jsonl"), dir.join("findings.json"));
    let training = format!(
        "{} {} --seconds {seconds} --depth 10 --leak-every 3",
        python3(),
        workloads().join("training.py").display()
    );
    let mut command = Command::new(gpuprof());
    command
        .args(["run", "--stats", "--otlp-endpoint", endpoint, "--node-name", "rate-node", "--growth-window", "1"])
        .args([
            "--otlp-max-request-bytes",
            &LIMIT_BYTES.to_string(),
            "--findings",
            findings.to_str().unwrap(),
            "--format",
            "none",
        ])
        .args(["--", "sh", "-c", &format!("{training} & {training} & wait")]);
    workload_env(&mut command, &log);
    let output = command.output_within(PATIENCE);
    let stderr = String::from_utf8_lossy(&output.stderr).to_string();
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    let findings: Vec<Finding> = serde_json::from_str(&std::fs::read_to_string(&findings).unwrap()).unwrap();
    (stderr, read_expected(&log), findings)
}

/// What the collector must have of the run, exactly.
fn check_the_collector_has_it_all(collector: &Collector, stderr: &str, workloads: &[Value], findings: &[Finding]) {
    // Lost nothing, anywhere.
    let counters = counters_line(stderr);
    assert!(counters.contains("; lost 0 (ring buffer full 0, call table full 0);"), "{stderr}");
    assert!(
        stderr.contains("dropped 0 (queue full 0, delivery failed 0, too large 0); rejected by the collector 0"),
        "{stderr}"
    );
    let (records, _, _, spans, points) = handed_over(stderr);
    assert!(
        stderr.contains(&format!("sent {records} log records, {spans} spans, {points} metric points in ")),
        "{stderr}"
    );
    let largest: u64 = stderr.split("the largest ").nth(1).unwrap().split(')').next().unwrap().parse().unwrap();
    assert!(largest <= LIMIT_BYTES, "a request of {largest} bytes");
    for (signal, sent) in [("log_records", records), ("spans", spans), ("metric_points", points)] {
        assert_eq!(
            collector.metric(&format!("gpuprof_collector_received_total{{signal=\"{signal}\"}}")),
            sent,
            "{signal}"
        );
    }
    // Hundreds of events for each item sent.
    let events: u64 = counters["gpuprof: ".len()..].split(" events (").next().unwrap().parse().unwrap();
    assert!(events >= 100 * (records + spans + points), "{events} events, {} items", records + spans + points);
    assert_eq!(collector.metric("gpuprof_collector_refused_requests_total{reason=\"too_large\"}"), 0);

    // The agent's own findings, each one.
    let served: Vec<Finding> = collector
        .findings("?node=rate-node")
        .iter()
        .map(|f| {
            let mut f = f.clone();
            for key in ["id", "node"] {
                f.as_object_mut().unwrap().remove(key);
            }
            serde_json::from_value(f).unwrap()
        })
        .collect();
    // Findings of one instant (two processes' growth judged at the same window's end) arrive in
    // one batch, in no promised order.
    let in_order = |mut list: Vec<Finding>| {
        list.sort_by_key(|f| (f.first_ts, f.last_ts, f.pid, f.kind));
        list
    };
    assert_eq!(in_order(served), in_order(findings.to_vec()));
    let (_, processes) = collector.get("/api/v1/processes?node=rate-node");
    let processes: Vec<Value> = serde_json::from_str(&processes).unwrap();
    let leak_line = workloads[0]["leak_line"].as_u64().unwrap();
    for workload in workloads {
        let pid = workload["pid"].as_u64().unwrap();
        // A growth finding at the line that keeps the blocks.
        assert!(
            findings.iter().any(|f| u64::from(f.pid) == pid
                && f.kind == gpuprof_model::FindingKind::Growth
                && f.stack.get(1).is_some_and(|s| s.function == "keep_for_later" && u64::from(s.line) == leak_line)),
            "no growth finding at keep_for_later for {pid}: {findings:#?}"
        );
        // The allocator's totals as the process ended.
        let process = processes
            .iter()
            .find(|p| p["pid"] == pid && p["state"] == "exited")
            .unwrap_or_else(|| panic!("{pid} not in {processes:#?}"));
        assert_eq!(
            process["allocator"]["0"],
            serde_json::json!({"allocated": workload["allocated"], "reserved": workload["reserved"]}),
            "{pid}"
        );
        // Its profile at exit, through pprof: the kept blocks under keep_for_later.
        let url = format!("{}/api/v1/profile?node=rate-node&pid={pid}", collector.http);
        let traces = go_pprof(&["-traces", "-sample_index=inuse_space", &url]);
        let kept = workload["kept_bytes"].as_u64().unwrap();
        let sample =
            traces.split("-----------+").find(|t| t.contains("keep_for_later")).unwrap_or_else(|| panic!("{traces}"));
        let bytes = sample
            .lines()
            .find_map(|l| l.split_whitespace().next().filter(|w| w.ends_with("MB") || w.ends_with("kB")))
            .unwrap();
        assert_eq!(bytes, pprof_bytes(kept), "{sample}");
        let objects = go_pprof(&["-traces", "-sample_index=inuse_objects", &url]);
        let sample = objects.split("-----------+").find(|t| t.contains("keep_for_later")).unwrap();
        assert!(sample.contains(&format!("      {}   CachingAllocator.malloc", workload["kept_blocks"])), "{sample}");
    }
}

/// `go tool pprof ARGS…`, its output.
fn go_pprof(args: &[&str]) -> String {
    let home = std::env::temp_dir().join("gpuprof-go-home");
    std::fs::create_dir_all(&home).unwrap();
    let output = Command::new("go")
        .args(["tool", "pprof"])
        .args(args)
        .env("HOME", &home)
        .env("PPROF_TMPDIR", &home)
        .stdin(Stdio::null())
        .output_within(PATIENCE);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8_lossy(&output.stdout).to_string()
}

/// Bytes as pprof prints them (`65.50MB`, `12MB`, `256kB`: powers of 1024, two decimals unless whole).
fn pprof_bytes(bytes: u64) -> String {
    let (value, unit) =
        if bytes >= 1 << 20 { (bytes as f64 / (1 << 20) as f64, "MB") } else { (bytes as f64 / 1024.0, "kB") };
    let text = format!("{value:.2}");
    format!("{}{unit}", text.strip_suffix(".00").unwrap_or(&text))
}

#[test]
fn a_training_job_at_a_real_rate_reaches_the_collector_summarized_and_whole() {
    let _alone = one_at_a_time();
    let dir = scratch("otlp_rate");
    let collector = Collector::start(&dir.join("c.redb"), &["--max-request-mib", "1"]);
    let (stderr, workloads, findings) = run_training(&dir, &collector.grpc, 6);
    assert_eq!(workloads.len(), 2, "{stderr}");
    let rate: u64 = workloads.iter().map(|w| w["events_per_s"].as_u64().unwrap()).sum();
    assert!(
        rate >= 50_000,
        "the two processes made {rate} allocator events a second, short of a training job's 50,000"
    );
    check_the_collector_has_it_all(&collector, &stderr, &workloads, &findings);
    collector.stop();
}

#[test]
fn a_collector_that_comes_up_late_gets_what_was_queued() {
    let _alone = one_at_a_time();
    let dir = scratch("otlp_late");
    let port = gpuprof_testkit::collector::free_port();
    let endpoint = format!("http://127.0.0.1:{port}");
    let run = {
        let (dir, endpoint) = (dir.clone(), endpoint.clone());
        std::thread::spawn(move || run_training(&dir, &endpoint, 6))
    };
    // The collector starts 3 s into the run, on the port the agent sends to.
    std::thread::sleep(Duration::from_secs(3));
    let started = Instant::now();
    let collector = Collector::start(
        &dir.join("c.redb"),
        &["--grpc-listen", &format!("127.0.0.1:{port}"), "--max-request-mib", "1"],
    );
    let (stderr, workloads, findings) = run.join().unwrap();
    assert!(started.elapsed() < Duration::from_secs(30));
    assert!(stderr.contains("last error: gRPC Unavailable"), "the agent never found the collector away: {stderr}");
    check_the_collector_has_it_all(&collector, &stderr, &workloads, &findings);
    let kinds: BTreeMap<String, usize> = findings.iter().fold(BTreeMap::new(), |mut m, f| {
        *m.entry(f.kind.as_str().to_string()).or_default() += 1;
        m
    });
    assert!(kinds.contains_key("growth"), "{kinds:?}");
    collector.stop();
}
