//! The fleet in real time: every simulated node sends the node stream, renamed to itself
//! (`host.name`), through its own OTLP client and connection, each batch at its time; a poller
//! notes when each finding is first served by a collector's API (every shard's asked) and
//! which shards serve each node; the collectors' and the OpenTelemetry Collector's CPU and
//! memory are sampled from /proc.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use gpuprof_model::event::wall_clock_ns;
use gpuprof_otlp::client::{Client, ClientOptions, Delivery, Protocol};
use gpuprof_otlp::proto::common::v1::{any_value, AnyValue, KeyValue};
use gpuprof_otlp::proto::resource::v1::Resource;

use crate::node::{NodeStream, Outgoing};

const TICK: Duration = Duration::from_millis(20);
const POLL: Duration = Duration::from_millis(50);

pub struct Fleet {
    pub nodes: u32,
    pub threads: u32,
    pub collector_grpc: String,
    /// Every shard's HTTP address.
    pub collector_http: Vec<String>,
    pub token: Option<String>,
    pub collector_pids: Vec<u32>,
    pub otelcol_pid: Option<u32>,
    /// How long to wait for the collector to serve everything after the stream ends.
    pub timeout: Duration,
}

pub fn node_name(n: u32) -> String {
    format!("sim-node-{n:04}")
}

/// What the replay saw.
pub struct Replay {
    pub delivery: Delivery,
    /// Latencies (ms) from a finding's batch leaving its node to the collector serving it.
    pub latencies_ms: Vec<f64>,
    pub findings_missing: u64,
    /// The most any replay thread fell behind the stream's clock (ms).
    pub max_lag_ms: f64,
    pub seconds: f64,
    /// Each gpuprof-collector's use, in `collector_pids` order.
    pub collectors: Vec<Usage>,
    pub otelcol: Option<Usage>,
    /// Nodes each shard served findings of, in `collector_http` order.
    pub nodes_per_shard: Vec<usize>,
    /// Nodes whose findings more than one shard served (routing that split a node).
    pub nodes_on_several_shards: u64,
    /// Polls each shard did not answer (it was down: killed, restarting), in `collector_http` order.
    pub unanswered_polls: Vec<u64>,
}

/// A process's CPU seconds over the replay and its largest resident set.
#[derive(Debug, Default, Clone, Copy)]
pub struct Usage {
    pub cpu_seconds: f64,
    pub peak_resident_bytes: u64,
}

impl std::ops::Add for Usage {
    type Output = Usage;
    fn add(self, other: Usage) -> Usage {
        Usage {
            cpu_seconds: self.cpu_seconds + other.cpu_seconds,
            peak_resident_bytes: self.peak_resident_bytes + other.peak_resident_bytes,
        }
    }
}

/// (node, pid, kind) → when its batch was handed to the node's client, or when the collector
/// first served it (wall-clock ns).
type Sent = Mutex<HashMap<(String, u32, String), u64>>;

/// Which shards served each node's findings.
type ShardsOfNode = Mutex<HashMap<String, BTreeSet<usize>>>;

/// `stream_start`: wall-clock ns the stream's times count from (findings are asked for since then).
pub fn run(fleet: &Fleet, stream: &NodeStream, stream_start: u64) -> Result<Replay> {
    let sent: Sent = Mutex::default();
    let seen: Arc<Sent> = Arc::default();
    let shards_of_node: Arc<ShardsOfNode> = Arc::default();
    let done = Arc::new(AtomicBool::new(false));
    let poller = spawn_poller(fleet, stream_start, seen.clone(), shards_of_node.clone(), done.clone());
    let watched: Vec<u32> = fleet.collector_pids.iter().copied().chain(fleet.otelcol_pid).collect();
    let cpu_before: Vec<Option<f64>> = watched.iter().map(|&pid| cpu_seconds(pid)).collect();
    let peak_resident = Arc::new(Mutex::new(vec![0u64; watched.len()]));
    let sampler = spawn_sampler(watched.clone(), peak_resident.clone(), done.clone());

    let start = Instant::now();
    let (delivery, max_lag_ms) = send_stream(fleet, stream, start, &sent)?;
    let sent = std::mem::take(&mut *sent.lock().expect("sent"));
    let deadline = Instant::now() + fleet.timeout;
    while Instant::now() < deadline && seen.lock().expect("seen").len() < sent.len() {
        std::thread::sleep(POLL);
    }
    let seconds = start.elapsed().as_secs_f64();
    done.store(true, Ordering::Relaxed);
    let unanswered_polls = poller.join().map_err(|_| anyhow::anyhow!("the findings poller panicked"))??;
    let _ = sampler.join();
    let peak = peak_resident.lock().expect("peak").clone();
    let mut usages = usages(&watched, cpu_before, peak);
    let otelcol = fleet.otelcol_pid.and_then(|_| usages.pop());
    let (latencies_ms, findings_missing) = latencies(&sent, &seen.lock().expect("seen"));
    let shards_of_node = shards_of_node.lock().expect("shards");
    let nodes_per_shard = (0..fleet.collector_http.len())
        .map(|shard| shards_of_node.values().filter(|shards| shards.contains(&shard)).count())
        .collect();
    Ok(Replay {
        delivery,
        latencies_ms,
        findings_missing,
        max_lag_ms,
        seconds,
        collectors: usages,
        otelcol,
        nodes_per_shard,
        nodes_on_several_shards: shards_of_node.values().filter(|shards| shards.len() > 1).count() as u64,
        unanswered_polls,
    })
}

/// Asks every shard for the findings since `started_ns` until `done`, once more after it: notes
/// when each was first served, and by which shards. A shard that does not answer (killed,
/// restarting) is asked again at the next poll; the last poll, after `done`, must be answered.
/// Returns the polls each shard did not answer.
fn spawn_poller(
    fleet: &Fleet,
    started_ns: u64,
    seen: Arc<Sent>,
    shards_of_node: Arc<ShardsOfNode>,
    done: Arc<AtomicBool>,
) -> std::thread::JoinHandle<Result<Vec<u64>>> {
    let http: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(30)))
        .build()
        .into();
    let bases = fleet.collector_http.clone();
    std::thread::spawn(move || -> Result<Vec<u64>> {
        let mut unanswered = vec![0; bases.len()];
        loop {
            let stop = done.load(Ordering::Relaxed);
            for (shard, base) in bases.iter().enumerate() {
                let found = match findings_since(&http, base, started_ns) {
                    Ok(found) => found,
                    Err(error) if stop => return Err(error),
                    Err(_) => {
                        unanswered[shard] += 1;
                        continue;
                    }
                };
                let now = wall_clock_ns();
                let mut seen = seen.lock().expect("seen");
                let mut shards_of_node = shards_of_node.lock().expect("shards");
                for key in found {
                    shards_of_node.entry(key.0.clone()).or_default().insert(shard);
                    seen.entry(key).or_insert(now);
                }
            }
            if stop {
                return Ok(unanswered);
            }
            std::thread::sleep(POLL);
        }
    })
}

/// Notes the largest resident set of each `watched` process in `peak`, until `done`.
fn spawn_sampler(watched: Vec<u32>, peak: Arc<Mutex<Vec<u64>>>, done: Arc<AtomicBool>) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        while !done.load(Ordering::Relaxed) {
            for (n, &pid) in watched.iter().enumerate() {
                if let Some(bytes) = resident_bytes(pid) {
                    let mut peak = peak.lock().expect("peak");
                    peak[n] = peak[n].max(bytes);
                }
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    })
}

/// Sends the stream for every node, the nodes shared among the fleet's threads: what was
/// delivered, and the most any thread fell behind (ms).
fn send_stream(fleet: &Fleet, stream: &NodeStream, start: Instant, sent: &Sent) -> Result<(Delivery, f64)> {
    let mut delivery = Delivery::default();
    let mut max_lag_ms: f64 = 0.0;
    std::thread::scope(|scope| -> Result<()> {
        let workers: Vec<_> = (0..fleet.threads.max(1))
            .map(|thread| {
                let nodes: Vec<u32> = (0..fleet.nodes).filter(|n| n % fleet.threads.max(1) == thread).collect();
                let mut options = ClientOptions::new(&fleet.collector_grpc, Protocol::Grpc);
                options.token = fleet.token.clone();
                let batches = &stream.batches[..];
                scope.spawn(move || send_nodes(&nodes, batches, options, start, sent))
            })
            .collect();
        for worker in workers {
            let (d, lag) = worker.join().map_err(|_| anyhow::anyhow!("a replay thread panicked"))??;
            add(&mut delivery, &d);
            max_lag_ms = max_lag_ms.max(lag);
        }
        Ok(())
    })?;
    Ok((delivery, max_lag_ms))
}

/// Each watched process's CPU seconds since `cpu_before` and its `peak` resident set.
fn usages(watched: &[u32], cpu_before: Vec<Option<f64>>, peak: Vec<u64>) -> Vec<Usage> {
    watched
        .iter()
        .zip(cpu_before)
        .zip(peak)
        .map(|((&pid, before), peak_resident_bytes)| Usage {
            cpu_seconds: before.zip(cpu_seconds(pid)).map_or(0.0, |(b, a)| a - b),
            peak_resident_bytes,
        })
        .collect()
}

/// The latencies (ms, sorted) of the findings sent that were served, and how many never were.
fn latencies(
    sent: &HashMap<(String, u32, String), u64>,
    seen: &HashMap<(String, u32, String), u64>,
) -> (Vec<f64>, u64) {
    let mut latencies_ms = Vec::new();
    let mut findings_missing = 0;
    for (key, sent_at) in sent {
        match seen.get(key) {
            Some(seen_at) => latencies_ms.push(seen_at.saturating_sub(*sent_at) as f64 / 1e6),
            None => findings_missing += 1,
        }
    }
    latencies_ms.sort_by(f64::total_cmp);
    (latencies_ms, findings_missing)
}

/// One thread's nodes, each batch sent at its time, the nodes interleaved.
fn send_nodes(
    nodes: &[u32],
    batches: &[(u64, Outgoing)],
    options: ClientOptions,
    start: Instant,
    sent: &Sent,
) -> Result<(Delivery, f64)> {
    let mut clients: Vec<(String, Client)> = Vec::new();
    for &n in nodes {
        let name = node_name(n);
        clients.push((
            name,
            Client::start(options.clone(), "sim-otlp").context("cannot start a simulated node's client")?,
        ));
    }
    let mut next = 0;
    let mut max_lag_ms: f64 = 0.0;
    while next < batches.len() {
        let now = start.elapsed().as_nanos() as u64;
        let due_end = batches[next..].iter().position(|(t, _)| *t > now).map_or(batches.len(), |p| next + p);
        if due_end > next {
            max_lag_ms = max_lag_ms.max(now.saturating_sub(batches[next].0) as f64 / 1e6);
        }
        for (_, outgoing) in &batches[next..due_end] {
            for (name, client) in &clients {
                let handed = wall_clock_ns();
                match renamed(outgoing, name) {
                    Outgoing::Logs(groups) => {
                        let mine: Vec<(String, u32, String)> = groups
                            .iter()
                            .flat_map(|g| g.scope_logs.iter().flat_map(|s| &s.log_records))
                            .filter(|r| gpuprof_otlp::logs::kind_of(r) == gpuprof_otlp::logs::RecordKind::Finding)
                            .filter_map(|r| gpuprof_otlp::logs::finding_of(r).ok())
                            .map(|f| (name.clone(), f.pid, f.kind.as_str().to_string()))
                            .collect();
                        client.logs(groups);
                        let mut sent = sent.lock().expect("sent");
                        for key in mine {
                            sent.entry(key).or_insert(handed);
                        }
                    }
                    Outgoing::Spans(groups) => client.spans(groups),
                    Outgoing::Metrics(groups) => client.metrics(groups),
                }
            }
        }
        next = due_end;
        if next < batches.len() {
            let wait = batches[next].0.saturating_sub(start.elapsed().as_nanos() as u64);
            std::thread::sleep(Duration::from_nanos(wait).min(TICK));
        }
    }
    let mut delivery = Delivery::default();
    for (_, client) in clients {
        add(&mut delivery, &client.finish(Duration::from_secs(30)));
    }
    Ok((delivery, max_lag_ms))
}

/// The batch as node `name` sends it: its resources' `host.name` is the node's.
fn renamed(outgoing: &Outgoing, name: &str) -> Outgoing {
    let rename = |resource: &mut Option<Resource>| {
        if let Some(resource) = resource {
            for attribute in &mut resource.attributes {
                if attribute.key == gpuprof_model::otel::resource::HOST_NAME {
                    *attribute = KeyValue {
                        key: attribute.key.clone(),
                        value: Some(AnyValue { value: Some(any_value::Value::StringValue(name.to_string())) }),
                        ..Default::default()
                    };
                }
            }
        }
    };
    match outgoing {
        Outgoing::Logs(groups) => {
            let mut groups = groups.clone();
            groups.iter_mut().for_each(|g| rename(&mut g.resource));
            Outgoing::Logs(groups)
        }
        Outgoing::Spans(groups) => {
            let mut groups = groups.clone();
            groups.iter_mut().for_each(|g| rename(&mut g.resource));
            Outgoing::Spans(groups)
        }
        Outgoing::Metrics(groups) => {
            let mut groups = groups.clone();
            groups.iter_mut().for_each(|g| rename(&mut g.resource));
            Outgoing::Metrics(groups)
        }
    }
}

fn add(total: &mut Delivery, d: &Delivery) {
    total.sent_records += d.sent_records;
    total.sent_spans += d.sent_spans;
    total.sent_points += d.sent_points;
    total.requests += d.requests;
    total.bytes_sent += d.bytes_sent;
    total.largest_request = total.largest_request.max(d.largest_request);
    total.dropped_queue_full += d.dropped_queue_full;
    total.dropped_send_failed += d.dropped_send_failed;
    total.dropped_too_large += d.dropped_too_large;
    total.rejected += d.rejected;
    if d.last_error.is_some() {
        total.last_error.clone_from(&d.last_error);
    }
}

fn findings_since(http: &ureq::Agent, base: &str, since: u64) -> Result<Vec<(String, u32, String)>> {
    let body = get_text(http, base, &format!("/api/v1/findings?since={since}"), "findings")?;
    let findings: Vec<serde_json::Value> =
        serde_json::from_str(&body).context("the collector's findings are not JSON")?;
    Ok(findings
        .iter()
        .map(|f| {
            (
                f["node"].as_str().unwrap_or_default().to_string(),
                f["pid"].as_u64().unwrap_or(0) as u32,
                f["kind"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect())
}

/// A collector's answer to GET `path`, as text (`what` names it in errors).
fn get_text(http: &ureq::Agent, base: &str, path: &str, what: &str) -> Result<String> {
    let mut response =
        http.get(&format!("{base}{path}")).call().with_context(|| format!("cannot reach the collector at {base}"))?;
    response
        .body_mut()
        .with_config()
        .limit(1 << 30)
        .read_to_string()
        .with_context(|| format!("reading the collector's {what}"))
}

/// A process's CPU seconds (user + system), from /proc/PID/stat.
fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    Some(ticks as f64 / hz)
}

fn resident_bytes(pid: u32) -> Option<u64> {
    let statm = std::fs::read_to_string(format!("/proc/{pid}/statm")).ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    Some(pages * unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as u64)
}

/// Items the collectors say they received, by signal, from their /metrics, summed over shards.
pub fn received(bases: &[String]) -> Result<BTreeMap<String, u64>> {
    let http: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
    let mut total = BTreeMap::new();
    for base in bases {
        let text = get_text(&http, base, "/metrics", "metrics")?;
        for (signal, value) in
            text.lines().filter_map(|l| l.strip_prefix("gpuprof_collector_received_total{signal=\"")).filter_map(|l| {
                let (signal, value) = l.split_once("\"} ")?;
                Some((signal.to_string(), value.trim().parse::<u64>().ok()?))
            })
        {
            *total.entry(signal).or_insert(0) += value;
        }
    }
    Ok(total)
}
