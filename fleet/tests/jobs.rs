//! A distributed job across nodes as one: two nodes (daemons named node-a and node-b, each
//! taking its processes' shim), one job of four ranks on them (RANK, WORLD_SIZE, LOCAL_RANK and
//! TORCHELASTIC_RUN_ID as torchrun sets them), rank 3 keeping a block every step, and a second
//! job of three alike ranks, sent through gpuprof's OpenTelemetry Collector (the shipped
//! configuration) to two collector shards. Each job lands whole on one shard; its view lists
//! every rank on its node with what its workload allocated; exactly one `rank_divergence`, for
//! rank 3 at the line that keeps its blocks; none for the alike job. The Job dashboard's every
//! panel answers from a real Prometheus scraping both shards, with the view's numbers.

use std::io::BufReader;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use gpuprof_testkit::collector::{free_ports, Collector, Jaeger, ShippedCollector};
use gpuprof_testkit::daemon::{one_daemon_at_a_time, Daemon};
use gpuprof_testkit::prometheus::{as_grafana_sends, queries, Prometheus};
use gpuprof_testkit::*;
use serde_json::Value;

const TOKEN: &str = "fleet-s3cret";
const MIB: u64 = 1 << 20;

/// A rank of a job: its process, and what it said when its steps were done.
struct Rank {
    job: String,
    rank: u32,
    node: usize,
    child: Child,
    said: Value,
}

/// A rank as the job's view shows it: (rank, node, pid, allocated bytes, local rank).
type RankRow = (u64, String, u64, u64, Option<u64>);

const NODES: [&str; 2] = ["node-a", "node-b"];

/// Two nodes (shim daemons) sending through the shipped OpenTelemetry Collector to two shards
/// and Jaeger.
struct Fleet {
    dir: std::path::PathBuf,
    jaeger: Jaeger,
    shards: Vec<Collector>,
    _otelcol: ShippedCollector,
    daemons: Vec<Daemon>,
    sockets: [std::path::PathBuf; 2],
    nvml: std::path::PathBuf,
}

impl Fleet {
    fn start() -> Fleet {
        let dir = scratch("jobs_across_nodes");
        let _ = libc10_cuda_standin();
        let jaeger = Jaeger::start(&dir);
        let shard_ports: [u16; 2] = free_ports();
        let shards: Vec<Collector> = (0..2)
            .map(|n| {
                let listen = format!("127.0.0.1:{}", shard_ports[n]);
                Collector::start(&dir.join(format!("shard-{n}.redb")), &["--grpc-listen", &listen, "--token", TOKEN])
            })
            .collect();
        let shard_addresses = shard_ports.map(|port| format!("127.0.0.1:{port}"));
        let otelcol = ShippedCollector::start(&dir, &shard_addresses, jaeger.otlp.as_str(), TOKEN);
        let nvml = dir.join("nvml");
        let wrapper = [
            "env".to_string(),
            format!("LD_LIBRARY_PATH={}:{}", standin_dir().display(), nvml_standin_dir().display()),
            format!("GPUPROF_STANDIN_NVML_DIR={}", nvml.display()),
        ];
        let wrapper: Vec<&str> = wrapper.iter().map(String::as_str).collect();
        let sockets = NODES.map(|node| dir.join(format!("{node}.sock")));
        let daemons: Vec<Daemon> = NODES
            .iter()
            .zip(&sockets)
            .map(|(name, socket)| {
                let mut args =
                    vec!["--capture", "shim", "--shim-socket", socket.to_str().unwrap(), "--node-name", name];
                args.extend(["--level", "tensors", "--output", "/dev/null"]);
                args.extend(["--otlp-endpoint", &otelcol.grpc, "--otlp-token", TOKEN, "--otlp-profile-interval", "1"]);
                Daemon::start_under(&wrapper, &args)
            })
            .collect();
        Fleet { dir, jaeger, shards, _otelcol: otelcol, daemons, sockets, nvml }
    }

    /// Rank `rank` of `job` (torchrun's variables) on node `node`, keeping a block each step or not.
    fn spawn_rank(&self, job: &str, world: u32, rank: u32, node: usize, keep: bool) -> Child {
        let mut command = Command::new(python3());
        command.arg(workloads().join("dp_rank.py")).args(["30", if keep { "1" } else { "0" }]);
        workload_env(&mut command, &self.dir.join(format!("{job}-rank{rank}.log")));
        command
            .env("LD_PRELOAD", shim_library())
            .env("GPUPROF_SHIM_SOCKET", &self.sockets[node])
            .env("GPUPROF_SHIM_LEVEL", "tensors")
            .env("GPUPROF_LIBC10_CUDA", libc10_cuda_standin())
            .env("GPUPROF_STANDIN_NVML_DIR", &self.nvml)
            .env("TORCHELASTIC_RUN_ID", job)
            .env("RANK", rank.to_string())
            .env("LOCAL_RANK", (rank % 2).to_string())
            .env("WORLD_SIZE", world.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap()
    }

    /// The job's view once its ranks' last gauges came (`expected`): on which shard, and what
    /// it says. A job is on one shard only.
    fn view_of(&self, job: &str, expected: &[RankRow]) -> (usize, Value) {
        let id = format!("torchrun:{job}").replace(':', "%3A").replace('/', "%2F");
        let started = Instant::now();
        loop {
            let on: Vec<(usize, Value)> = (0..2)
                .filter_map(|n| {
                    let (status, body) = self.shards[n].get(&format!("/api/v1/jobs/{id}"));
                    (status == 200).then(|| (n, serde_json::from_str::<Value>(&body).unwrap()))
                })
                .collect();
            assert!(on.len() <= 1, "{job} is on both shards: {on:#?}");
            let late = started.elapsed() > Duration::from_secs(30);
            if let Some((n, view)) = on.into_iter().next() {
                if late || shown(&view) == expected {
                    return (n, view);
                }
            }
            assert!(!late, "{job} never reached a shard");
            std::thread::sleep(Duration::from_millis(250));
        }
    }
}

/// What each rank of `job` said it holds, as the view should show it.
fn expected(ranks: &[Rank], job: &str) -> Vec<RankRow> {
    ranks
        .iter()
        .filter(|r| r.job == job)
        .map(|r| {
            let (pid, allocated) = (r.said["pid"].as_u64().unwrap(), r.said["allocated"].as_u64().unwrap());
            (u64::from(r.rank), NODES[r.node].to_string(), pid, allocated, Some(u64::from(r.rank % 2)))
        })
        .collect()
}

/// The ranks a job's view shows with their process, sorted.
fn shown(view: &Value) -> Vec<RankRow> {
    let mut shown: Vec<RankRow> = view["ranks"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| r["process"].is_object())
        .map(|r| {
            (
                r["rank"].as_u64().unwrap(),
                r["node"].as_str().unwrap().to_string(),
                r["pid"].as_u64().unwrap(),
                r["allocated_bytes"].as_u64().unwrap(),
                r["local_rank"].as_u64(),
            )
        })
        .collect();
    shown.sort();
    shown
}

#[test]
fn a_job_on_two_nodes_is_one_view_and_the_rank_that_keeps_blocks_is_the_one_named() {
    let _node = one_daemon_at_a_time();
    let fleet = Fleet::start();
    // Job 1: ranks 0 and 1 on node-a, 2 and 3 on node-b; rank 3 keeps 16 MiB a step.
    // Job 2: ranks 0 and 1 on node-a, 2 on node-b, alike.
    let mut started: Vec<(&str, u32, usize, Child)> = Vec::new();
    for (r, node) in [(0, 0), (1, 0), (2, 1), (3, 1)] {
        started.push(("train-7f3a", r, node, fleet.spawn_rank("train-7f3a", 4, r, node, r == 3)));
    }
    for (r, node) in [(0, 0), (1, 0), (2, 1)] {
        started.push(("eval-51c0", r, node, fleet.spawn_rank("eval-51c0", 3, r, node, false)));
    }
    let mut ranks: Vec<Rank> = started
        .into_iter()
        .map(|(job, rank, node, mut child)| {
            let line = line_within(
                &mut BufReader::new(child.stdout.as_mut().unwrap()),
                Duration::from_secs(60),
                &format!("{job} rank {rank}'s steps"),
            );
            let said: Value = serde_json::from_str(&line).unwrap();
            Rank { job: job.to_string(), rank, node, child, said }
        })
        .collect();

    // Each job whole on one shard, its ranks each on its node with what it allocated.
    let (train_expected, eval_expected) = (expected(&ranks, "train-7f3a"), expected(&ranks, "eval-51c0"));
    let (shard, train) = fleet.view_of("train-7f3a", &train_expected);
    let (_, eval) = fleet.view_of("eval-51c0", &eval_expected);
    assert_eq!(train["id"], "torchrun:train-7f3a");
    assert_eq!((train["world_size"].as_u64(), train["ranks_seen"].as_u64()), (Some(4), Some(4)));
    assert_eq!(train["nodes"], serde_json::json!(["node-a", "node-b"]));
    assert_eq!((eval["world_size"].as_u64(), eval["ranks_seen"].as_u64()), (Some(3), Some(3)));
    assert_eq!(shown(&train), train_expected);
    assert_eq!(shown(&eval), eval_expected);
    // What each workload holds: the weights, and rank 3's kept blocks.
    assert_eq!(train["ranks"][3]["allocated_bytes"].as_u64(), Some(256 * MIB + 30 * 16 * MIB));
    assert_eq!(train["ranks"][0]["allocated_bytes"].as_u64(), Some(256 * MIB));

    let found = assert_one_divergence(&fleet, &ranks[3]);
    // The job's view shows it; the shard without the job has none of it.
    let (_, train) = fleet.view_of("train-7f3a", &train_expected);
    let named: Vec<&Value> =
        train["findings"].as_array().unwrap().iter().filter(|f| f["kind"] == "rank_divergence").collect();
    assert_eq!(named.len(), 1);
    assert_eq!(named[0]["finding_id"], found["finding_id"]);
    assert!(fleet.shards[1 - shard].findings("?kind=rank_divergence").is_empty());
    let (status, listed) = fleet.shards[shard].get("/api/v1/jobs");
    assert_eq!(status, 200);
    let listed: Value = serde_json::from_str(&listed).unwrap();
    let train_listed = listed.as_array().unwrap().iter().find(|j| j["id"] == "torchrun:train-7f3a").unwrap();
    assert_eq!(train_listed["allocated_bytes"].as_u64(), Some(4 * 256 * MIB + 30 * 16 * MIB));
    // Its peak: rank 3's, sampled each second, some step's activations (64 MiB) in it or not.
    let peak = train_listed["peak_allocated_bytes"].as_u64().unwrap();
    assert!((256 * MIB + 30 * 16 * MIB..=320 * MIB + 30 * 16 * MIB).contains(&peak), "{train_listed}");

    assert_job_dashboard(&fleet, &train);
    for rank in &mut ranks {
        drop(rank.child.stdin.take());
        assert!(rank.child.wait_within(Duration::from_secs(30), "rank").success());
    }
    assert_job_trace(&fleet, shard, &train, train_expected);
    drop(fleet.daemons);
}

/// The one `rank_divergence` of every shard, once no other came for 3 s: rank 3 of the
/// training job, at the line that keeps its blocks.
fn assert_one_divergence(fleet: &Fleet, keeper: &Rank) -> Value {
    let keep_line = keeper.said["keep_line"].as_u64().unwrap();
    let started = Instant::now();
    let divergences = loop {
        let found: Vec<Value> = fleet.shards.iter().flat_map(|s| s.findings("?kind=rank_divergence")).collect();
        if !found.is_empty() && started.elapsed() > Duration::from_secs(3)
            || started.elapsed() > Duration::from_secs(30)
        {
            break found;
        }
        std::thread::sleep(Duration::from_millis(250));
    };
    assert_eq!(divergences.len(), 1, "{divergences:#?}");
    let found = &divergences[0];
    assert_eq!(found["job"], "torchrun:train-7f3a");
    assert_eq!((found["rank"].as_u64(), found["node"].as_str()), (Some(3), Some("node-b")));
    assert_eq!(found["pid"], keeper.said["pid"]);
    assert_eq!(found["severity"], "leak");
    let frames = found["stack"].as_array().unwrap();
    let keeper = frames.iter().find(|f| f["function"] == "keep_for_later").unwrap_or_else(|| panic!("{found:#}"));
    assert_eq!(keeper["line"].as_u64(), Some(keep_line));
    assert!(keeper["file"].as_str().unwrap().ends_with("dp_rank.py"));
    assert_eq!(found["stacks"][0]["stack"], found["stack"]);
    found.clone()
}

/// The Job dashboard: every panel answers from a Prometheus scraping both shards, with the
/// view's numbers per rank.
fn assert_job_dashboard(fleet: &Fleet, train: &Value) {
    let prometheus = Prometheus::start(
        &fleet.dir,
        &[
            ("shard-0", fleet.shards[0].http.trim_start_matches("http://")),
            ("shard-1", fleet.shards[1].http.trim_start_matches("http://")),
        ],
    );
    let panels = queries("job.json");
    assert_eq!(panels.len(), 8);
    let started = Instant::now();
    loop {
        let empty: Vec<&(String, String)> =
            panels.iter().filter(|(_, expr)| prometheus.query(&as_grafana_sends(expr)).is_empty()).collect();
        if empty.is_empty() {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(45), "Job panels that show nothing: {empty:#?}");
        std::thread::sleep(Duration::from_millis(500));
    }
    let per_rank = |metric: &str| -> Vec<(u64, u64)> {
        let expr = format!("sum by (rank) ({metric}{{job_id=\"torchrun:train-7f3a\"}})");
        let mut values: Vec<(u64, u64)> = prometheus
            .query(&expr)
            .iter()
            .map(|(labels, value)| (labels["rank"].as_str().unwrap().parse().unwrap(), *value as u64))
            .collect();
        values.sort();
        values
    };
    let from_view = |field: &str| -> Vec<(u64, u64)> {
        train["ranks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| (r["rank"].as_u64().unwrap(), r[field].as_u64().unwrap()))
            .collect()
    };
    assert_eq!(per_rank("gpuprof_job_rank_allocated_bytes"), from_view("allocated_bytes"));
    assert_eq!(per_rank("gpuprof_job_rank_reserved_bytes"), from_view("reserved_bytes"));
    assert_eq!(
        per_rank("gpuprof_job_rank_over_median_bytes"),
        [(0, 0), (1, 0), (2, 0), (3, 30 * 16 * MIB)],
        "rank 3's kept blocks over the others' median"
    );
    let findings = prometheus.query("gpuprof_job_rank_findings{kind=\"rank_divergence\"}");
    assert_eq!(findings.len(), 1, "{findings:?}");
    assert_eq!(
        (findings[0].0["job_id"].as_str(), findings[0].0["rank"].as_str(), findings[0].1),
        (Some("torchrun:train-7f3a"), Some("3"), 1.0)
    );
    let started = Instant::now();
    let eval_world = loop {
        let found = prometheus.query("gpuprof_job_world_size{job_id=\"torchrun:eval-51c0\"}");
        if !found.is_empty() || started.elapsed() > Duration::from_secs(30) {
            break found;
        }
        std::thread::sleep(Duration::from_millis(250));
    };
    assert_eq!(eval_world.iter().map(|(_, v)| *v).collect::<Vec<_>>(), [3.0]);
}

/// The ranks ended: in Jaeger, through the Collector, the job's trace has a span per rank, from
/// whichever node, holding what the view said and its findings as events.
fn assert_job_trace(fleet: &Fleet, shard: usize, train: &Value, train_expected: Vec<RankRow>) {
    let trace_id = train["trace_id"].as_str().unwrap().to_string();
    assert_eq!(trace_id.len(), 32);
    let attribute = |attributes: &Value, key: &str| -> Value {
        let value = attributes.as_array().and_then(|a| a.iter().find(|kv| kv["key"] == key)).map(|kv| &kv["value"]);
        match value {
            Some(v) if v["intValue"].is_string() => {
                Value::from(v["intValue"].as_str().unwrap().parse::<u64>().unwrap())
            }
            Some(v) if !v["intValue"].is_null() => v["intValue"].clone(),
            Some(v) => v["stringValue"].clone(),
            None => Value::Null,
        }
    };
    let started = Instant::now();
    let spans: Vec<(Value, Value)> = loop {
        let (status, body) = fleet.jaeger.get(&format!("/api/v3/traces/{trace_id}"));
        let trace: Value = if status == 200 { serde_json::from_str(&body).unwrap() } else { Value::Null };
        let spans: Vec<(Value, Value)> = trace["result"]["resourceSpans"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|resource| {
                let attributes = resource["resource"]["attributes"].clone();
                resource["scopeSpans"].as_array().cloned().unwrap_or_default().into_iter().flat_map(move |scope| {
                    let attributes = attributes.clone();
                    scope["spans"]
                        .as_array()
                        .cloned()
                        .unwrap_or_default()
                        .into_iter()
                        .map(move |s| (attributes.clone(), s))
                })
            })
            .filter(|(_, span)| span["name"] == "gpuprof.rank")
            .collect();
        if spans.len() >= 4 {
            break spans;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "the job's trace in Jaeger: {status} {body}");
        std::thread::sleep(Duration::from_millis(250));
    };
    let mut seen: Vec<(u64, String, u64, u64, Vec<String>)> = spans
        .iter()
        .map(|(resource, span)| {
            assert_eq!(attribute(&span["attributes"], "gpuprof.job.id"), "torchrun:train-7f3a");
            assert_eq!(attribute(resource, "gpuprof.job.id"), "torchrun:train-7f3a");
            let mut events: Vec<String> = span["events"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|e| attribute(&e["attributes"], "gpuprof.finding.id").as_str().unwrap().to_string())
                .collect();
            events.sort();
            (
                attribute(&span["attributes"], "gpuprof.rank").as_u64().unwrap(),
                attribute(resource, "host.name").as_str().unwrap().to_string(),
                attribute(resource, "process.pid").as_u64().unwrap(),
                attribute(&span["attributes"], "gpuprof.rank.allocated_bytes").as_u64().unwrap(),
                events,
            )
        })
        .collect();
    seen.sort();
    // Each rank left holding its allocator's memory: at least its exit's finding is an event.
    assert!(seen.iter().all(|(.., events)| !events.is_empty()), "{seen:?}");
    let node_findings = |node: &str, pid: u64| -> Vec<String> {
        let mut ids: Vec<String> = fleet.shards[shard]
            .findings(&format!("?node={node}&pid={pid}"))
            .iter()
            .filter(|f| f["kind"] != "rank_divergence")
            .map(|f| f["finding_id"].as_str().unwrap().to_string())
            .collect();
        ids.sort();
        ids
    };
    let want: Vec<(u64, String, u64, u64, Vec<String>)> = train_expected
        .into_iter()
        .map(|(rank, node, pid, allocated, _)| {
            let findings = node_findings(&node, pid);
            (rank, node, pid, allocated, findings)
        })
        .collect();
    assert_eq!(seen, want, "the rank spans in Jaeger against the job's view and findings");
}
