//! gpuprof-fleet-sim: a fleet of simulated nodes sending to one gpuprof-collector. Each node is
//! the agent's own OTLP export (queue, sender thread, its own connection, `host.name` = the
//! node) replaying M processes of a recorded event stream, as fast as it can, with the agent's
//! own tracker and rules beside it. Reports the collector's ingest rate (events received per
//! second until it has them all) and finding latency (from the event that makes a finding
//! leaving the node to the finding being served by the collector's API).
//!
//!   gpuprof-fleet-sim --input events.jsonl --nodes 100 --processes 2 \
//!       --collector-grpc http://127.0.0.1:4317 --collector-http http://127.0.0.1:4318

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Parser;
use gpuprof::telemetry::transport::Protocol;
use gpuprof::telemetry::{OtlpOptions, Telemetry};
use gpuprof_model::event::wall_clock_ns;
use gpuprof_model::{Analyzer, Event, RuleConfig};

/// Pids of simulated processes start here: above Linux's highest pid (2^22), so no lookup in
/// /proc ever finds a real process of this machine.
const SIMULATED_PID_BASE: u32 = 5_000_000;
/// Pids one replayed process tree may use.
const PIDS_PER_TREE: u32 = 64;
const POLL: Duration = Duration::from_millis(50);

#[derive(Debug, Parser)]
#[command(name = "gpuprof-fleet-sim", about = "Simulated nodes replaying a recorded capture to gpuprof-collector")]
struct Args {
    /// A recorded event stream (gpuprof jsonl).
    #[arg(long)]
    input: PathBuf,
    #[arg(long, default_value_t = 10)]
    nodes: u32,
    /// Process trees each node replays (the recording's processes, under new pids).
    #[arg(long, default_value_t = 2)]
    processes: u32,
    /// Threads replaying (nodes are spread over them).
    #[arg(long, default_value_t = 2)]
    threads: u32,
    #[arg(long)]
    collector_grpc: String,
    /// The collector's HTTP address (API and /metrics).
    #[arg(long)]
    collector_http: String,
    #[arg(long, env = "GPUPROF_OTLP_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Give up waiting for the collector after this many seconds.
    #[arg(long, default_value_t = 120.0)]
    timeout: f64,
}

/// (node, pid, kind) → how long after its event the collector first served the finding (ns).
type SeenFindings = BTreeMap<(String, u32, String), u64>;

/// What the fleet sent, to compare with what the collector has.
#[derive(Default)]
struct Sent {
    events: u64,
    /// (node, pid) → the ts of the event that made the agent's own rules fire, per finding kind.
    findings: HashMap<(String, u32, &'static str), u64>,
    lost: u64,
}

fn main() {
    let args = Args::parse();
    match run(&args) {
        Ok(report) => println!("{report}"),
        Err(error) => {
            eprintln!("gpuprof-fleet-sim: error: {error:#}");
            std::process::exit(1);
        }
    }
}

fn run(args: &Args) -> Result<String> {
    let recording = read_recording(&args.input)?;
    let http = ureq::Agent::config_builder().http_status_as_error(false).build().into();
    let received_before = received_log_records(&http, &args.collector_http)?;
    let sent = Arc::new(Mutex::new(Sent::default()));
    let seen: Arc<Mutex<SeenFindings>> = Arc::default();
    let replay_done = Arc::new(AtomicBool::new(false));
    let started_ns = wall_clock_ns();
    let started = Instant::now();
    let replayed_events = Arc::new(AtomicU64::new(0));

    // Findings as the collector serves them, with when they were first seen.
    let poller = {
        let (seen, done, http_base) = (seen.clone(), replay_done.clone(), args.collector_http.clone());
        let deadline = started + Duration::from_secs_f64(args.timeout);
        let expected = args.nodes as usize * args.processes as usize;
        std::thread::spawn(move || -> Result<()> {
            let http: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
            let mut since = started_ns;
            loop {
                let found = findings_since(&http, &http_base, since)?;
                let now = wall_clock_ns();
                let mut seen = seen.lock().expect("seen");
                for (node, pid, kind, last_ts) in found {
                    seen.entry((node, pid, kind)).or_insert(now.saturating_sub(last_ts));
                }
                // Later findings have later timestamps; keep a margin for batches in flight.
                since = now.saturating_sub(10_000_000_000).max(started_ns);
                let complete = done.load(Ordering::Relaxed) && seen.len() >= expected;
                drop(seen);
                if complete || Instant::now() > deadline {
                    return Ok(());
                }
                std::thread::sleep(POLL);
            }
        })
    };

    let workers: Vec<_> = (0..args.threads.max(1))
        .map(|thread| {
            let nodes: Vec<u32> = (0..args.nodes).filter(|n| n % args.threads.max(1) == thread).collect();
            let (recording, sent, replayed) = (recording.clone(), sent.clone(), replayed_events.clone());
            let options = (args.collector_grpc.clone(), args.token.clone(), args.processes);
            std::thread::spawn(move || replay_nodes(&nodes, &recording, options, &sent, &replayed))
        })
        .collect();
    for worker in workers {
        worker.join().map_err(|_| anyhow::anyhow!("a replay thread panicked"))??;
    }
    let replayed_in = started.elapsed();
    replay_done.store(true, Ordering::Relaxed);
    let sent = std::mem::take(&mut *sent.lock().expect("sent"));

    // The collector has them all when its log-record counter says so.
    let deadline = started + Duration::from_secs_f64(args.timeout);
    let received = loop {
        let received = received_log_records(&http, &args.collector_http)? - received_before;
        if received >= sent.events || Instant::now() > deadline {
            break received;
        }
        std::thread::sleep(POLL);
    };
    let ingested_in = started.elapsed();
    poller.join().map_err(|_| anyhow::anyhow!("the findings poller panicked"))??;

    let seen = seen.lock().expect("seen");
    let mut latencies: Vec<u64> = Vec::new();
    let mut missing = 0;
    for (node, pid, kind) in sent.findings.keys() {
        match seen.get(&(node.clone(), *pid, kind.to_string())) {
            Some(latency) => latencies.push(*latency),
            None => missing += 1,
        }
    }
    latencies.sort_unstable();
    let percentile = |p: f64| latencies.get(((latencies.len() as f64 - 1.0) * p).round() as usize).copied().unwrap_or(0) as f64 / 1e6;
    let report = serde_json::json!({
        "nodes": args.nodes,
        "processes_per_node": args.processes,
        "events_sent": sent.events,
        "events_received": received,
        "otlp_items_lost": sent.lost,
        "replay_s": replayed_in.as_secs_f64(),
        "ingest_s": ingested_in.as_secs_f64(),
        "ingest_events_per_s": received as f64 / ingested_in.as_secs_f64(),
        "findings_expected": sent.findings.len(),
        "findings_served": latencies.len(),
        "findings_missing": missing,
        "finding_latency_ms": {"p50": percentile(0.5), "p99": percentile(0.99), "max": percentile(1.0)},
    });
    if received != sent.events || missing > 0 || sent.lost > 0 {
        bail!("the collector does not have everything the fleet sent: {report}");
    }
    Ok(report.to_string())
}

/// One thread's nodes: each replays its process trees in turn, the nodes interleaved so that
/// all of them are sending at once.
fn replay_nodes(
    nodes: &[u32],
    recording: &[Event],
    (endpoint, token, processes): (String, Option<String>, u32),
    sent: &Mutex<Sent>,
    replayed: &AtomicU64,
) -> Result<()> {
    let mut fleet: Vec<(String, Telemetry, Analyzer)> = Vec::new();
    for node in nodes {
        let name = format!("sim-node-{node:04}");
        let options =
            OtlpOptions { endpoint: endpoint.clone(), protocol: Protocol::Grpc, token: token.clone(), queue: 256, node: Some(name.clone()) };
        fleet.push((name, Telemetry::start(options)?, Analyzer::new(RuleConfig::default())));
    }
    let mut mine = Sent::default();
    for tree in 0..processes {
        for (index, (name, telemetry, analyzer)) in fleet.iter_mut().enumerate() {
            let base = SIMULATED_PID_BASE + (nodes[index] * processes + tree) * PIDS_PER_TREE;
            let mut pids: HashMap<u32, u32> = HashMap::new();
            for original in recording {
                let mut event = original.clone();
                let next = pids.len() as u32;
                let pid = *pids.entry(event.pid).or_insert(base + next.min(PIDS_PER_TREE - 1));
                event.ppid = event.ppid.and_then(|p| pids.get(&p).copied());
                event.tid = pid + (event.tid.wrapping_sub(original.pid) % 1_000);
                event.pid = pid;
                event.ts = wall_clock_ns();
                telemetry.before(&event, analyzer.tracker());
                let fired = analyzer.observe(&mut event);
                telemetry.after(&event);
                for finding in fired {
                    mine.findings.insert((name.clone(), finding.pid, finding.kind.as_str()), event.ts);
                }
                mine.events += 1;
            }
            telemetry.flush(analyzer.tracker());
            replayed.fetch_add(recording.len() as u64, Ordering::Relaxed);
        }
    }
    for (name, telemetry, analyzer) in fleet {
        // Findings the rules would only give at the end of a capture are not the collector's to
        // give (a collector never ends): only those fired by events were counted above.
        let delivery = telemetry.finish(analyzer.tracker());
        if delivery.lost > 0 {
            eprintln!("gpuprof-fleet-sim: {name}: {delivery}");
        }
        mine.lost += delivery.lost;
    }
    let mut total = sent.lock().expect("sent");
    total.events += mine.events;
    total.lost += mine.lost;
    total.findings.extend(mine.findings);
    Ok(())
}

fn read_recording(path: &PathBuf) -> Result<Vec<Event>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("--input {}: cannot read it", path.display()))?;
    let mut events: Vec<Event> = text
        .lines()
        .enumerate()
        .map(|(i, line)| serde_json::from_str(line).with_context(|| format!("--input {} line {}: not a gpuprof event", path.display(), i + 1)))
        .collect::<Result<_>>()?;
    if events.is_empty() {
        bail!("--input {}: no events", path.display());
    }
    events.sort_by_key(|e| e.ts);
    Ok(events)
}

fn received_log_records(http: &ureq::Agent, base: &str) -> Result<u64> {
    let mut response = http.get(&format!("{base}/metrics")).call().with_context(|| format!("cannot reach the collector at {base}"))?;
    let text = response.body_mut().read_to_string().context("reading the collector's metrics")?;
    text.lines()
        .find_map(|l| l.strip_prefix("gpuprof_collector_received_total{signal=\"log_records\"} "))
        .and_then(|v| v.trim().parse().ok())
        .context("the collector's /metrics has no gpuprof_collector_received_total{signal=\"log_records\"}")
}

fn findings_since(http: &ureq::Agent, base: &str, since: u64) -> Result<Vec<(String, u32, String, u64)>> {
    let mut response = http
        .get(&format!("{base}/api/v1/findings?since={since}"))
        .call()
        .with_context(|| format!("cannot reach the collector at {base}"))?;
    let body = response.body_mut().with_config().limit(1 << 30).read_to_string().context("reading the collector's findings")?;
    let findings: Vec<serde_json::Value> = serde_json::from_str(&body).context("the collector's findings are not JSON")?;
    Ok(findings
        .iter()
        .map(|f| {
            (
                f["node"].as_str().unwrap_or_default().to_string(),
                f["pid"].as_u64().unwrap_or(0) as u32,
                f["kind"].as_str().unwrap_or_default().to_string(),
                f["last_ts"].as_u64().unwrap_or(0),
            )
        })
        .collect())
}
