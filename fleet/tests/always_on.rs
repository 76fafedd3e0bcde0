//! Always on, always right: `gpuprof daemon` at its defaults (the driver's level, raising what
//! grows to its tensors) with gpuprof-collector and Jaeger behind it, and jobs shaped like
//! PyTorch's: their segments made by a caching allocator (the libc10_cuda stand-in's, in its
//! alloc_block, as PyTorch's libc10_cuda.so makes them), their blocks through the libc10 hook,
//! their backward pass on an autograd thread. One leak per problem, none for a healthy job that
//! exits holding its allocator's cache; the same findings in the collector, its /metrics and
//! Jaeger.

// A test reads as one scenario from start to end, so it may run past the length limit on functions.
#![allow(clippy::too_many_lines)]

use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt;
use std::time::{Duration, Instant};

use gpuprof_model::event::{Event, Layer, Op};
use gpuprof_testkit::caching_job::{caching_job_line, CachingJob};
use gpuprof_testkit::collector::{Collector, Jaeger};
use gpuprof_testkit::daemon::{one_daemon_at_a_time, Daemon};
use gpuprof_testkit::*;
use serde_json::Value;

#[test]
fn the_daemon_at_its_defaults_says_one_leak_per_problem_and_none_of_healthy_jobs() {
    let _node = one_daemon_at_a_time();
    let dir = scratch("always_on");
    let jaeger = Jaeger::start(&dir);
    let collector = Collector::start(&dir.join("c.redb"), &["--forward-endpoint", &jaeger.otlp_http]);
    let libcuda = standin_dir().join("libcuda.so.1");
    let postmortems = dir.join("postmortems");
    let daemon = Daemon::start(&[
        "--otlp-endpoint",
        &collector.grpc,
        "--node-name",
        "always-on",
        "--libcuda",
        libcuda.to_str().unwrap(),
        "--postmortem-dir",
        postmortems.to_str().unwrap(),
    ]);

    // 45-second jobs side by side, as on a node; an OOM job, and a launcher killed under its
    // workers.
    let mut leak = CachingJob::start(&dir, "leak", 45, &[]);
    let mut healthy = CachingJob::start(&dir, "healthy", 45, &[]);
    let mut loader = CachingJob::start(&dir, "workers", 10, &[]);
    let mut launcher = CachingJob::start(&dir, "orphans", 20, &[]);
    let mut oom = CachingJob::start(&dir, "oom", 62, &[("GPUPROF_STANDIN_DEVICE_MEMORY", "2147483648")]);
    let orphans: Vec<u32> = launcher
        .line("the launcher's \"orphans PID PID\"", Duration::from_secs(30))
        .strip_prefix("orphans ")
        .unwrap()
        .split(' ')
        .map(|pid| pid.parse().unwrap())
        .collect();
    assert_eq!(launcher.child.wait_within(Duration::from_secs(10), "launcher").signal(), Some(9));
    for (job, name) in [(&mut leak, "leak"), (&mut healthy, "healthy"), (&mut loader, "workers")] {
        assert_eq!(job.line(&format!("the {name} job's \"done\""), Duration::from_secs(60)), "done");
        assert_eq!(job.child.wait_within(Duration::from_secs(10), "job").code(), Some(0), "{name}");
    }
    for _ in &orphans {
        assert_eq!(launcher.line("an orphan's \"done\"", Duration::from_secs(40)), "done");
    }
    assert_eq!(oom.line("the oom job's \"out of memory\"", Duration::from_secs(40)), "out of memory");
    assert_eq!(oom.child.wait_within(Duration::from_secs(10), "oom").code(), Some(1));

    // What the node said, at the collector: every process's findings by kind and severity.
    // Leaks: the growth (leak job), a context in each of the loader's workers, each orphan, the
    // out-of-memory; the rest are infos.
    let findings = collector.settled_findings("always-on", 6, Duration::from_secs(30));
    let mut by_pid: BTreeMap<u64, Vec<(String, String)>> = BTreeMap::new();
    for finding in &findings {
        by_pid
            .entry(finding["pid"].as_u64().unwrap())
            .or_default()
            .push((finding["kind"].as_str().unwrap().to_string(), finding["severity"].as_str().unwrap().to_string()));
    }
    let leaks = |pid: u32| -> Vec<String> {
        by_pid.get(&u64::from(pid)).into_iter().flatten().filter(|(_, s)| s == "leak").map(|(k, _)| k.clone()).collect()
    };
    let exit_info = ("exit_with_live_allocations".to_string(), "info".to_string());
    assert_eq!(leaks(leak.pid), ["growth"], "{findings:#?}");
    assert_eq!(leaks(healthy.pid), Vec::<String>::new(), "{findings:#?}");
    assert_eq!(by_pid[&u64::from(healthy.pid)], std::slice::from_ref(&exit_info));
    for orphan in &orphans {
        assert_eq!(leaks(*orphan), ["orphan_holding_memory"], "{findings:#?}");
        // Its exit is its orphan finding's, not a second leak.
        assert!(by_pid[&u64::from(*orphan)].contains(&exit_info), "{findings:#?}");
    }
    assert_eq!(leaks(launcher.pid), Vec::<String>::new(), "{findings:#?}");
    assert_eq!(leaks(oom.pid), ["oom"], "{findings:#?}");
    let workers: Vec<&Value> =
        findings.iter().filter(|f| f["kind"] == "worker_cuda_context" && f["peer_pid"] == loader.pid).collect();
    assert_eq!(workers.len(), 2, "{findings:#?}");
    for worker in &workers {
        assert_eq!((&worker["severity"], &worker["peer_pid"]), (&Value::from("leak"), &Value::from(loader.pid)));
        let pid = worker["pid"].as_u64().unwrap() as u32;
        assert_eq!(leaks(pid), ["worker_cuda_context"], "{findings:#?}");
    }
    assert_eq!(leaks(loader.pid), Vec::<String>::new(), "{findings:#?}");
    let leak_count = findings.iter().filter(|f| f["severity"] == "leak").count();
    assert_eq!(leak_count, 6, "one leak per problem and process: {findings:#?}");
    // The jobs exited holding their allocators' caches: facts, not leaks (the OOM job's
    // allocator gave its cache back to the driver before asking again).
    for pid in [leak.pid, loader.pid] {
        assert!(by_pid[&u64::from(pid)].contains(&exit_info), "{pid}: {findings:#?}");
    }
    // Processes are named by their main thread, not by the autograd thread that made a segment.
    assert!(findings.iter().all(|f| f["comm"] == "python3"), "{findings:#?}");

    // Each at its line: the growth where the job keeps its tensor (the daemon raised it to its
    // tensors), the out-of-memory where the job asked for too much.
    let workload = workloads().join("caching_job.py").display().to_string();
    let at = |finding: &Value| {
        (finding["user_frame"]["file"].as_str().unwrap().to_string(), finding["user_frame"]["line"].as_u64().unwrap())
    };
    let growth = findings.iter().find(|f| f["kind"] == "growth").unwrap();
    assert_eq!(
        at(growth),
        (workload.clone(), caching_job_line("kept.append(model.allocator.standin_caching_malloc(1 * MiB))"))
    );
    assert_eq!(growth["diagnosis"], "tensors_kept_by_user_code", "{growth:#}");
    assert_eq!(growth["api"], "c10::reportMemoryUsageToProfiler");
    // The out-of-memory as PyTorch's allocator told it (it is probed at every level): the
    // request at its line, and its totals then: enough cached, in pieces too small.
    let out_of_memory = findings.iter().find(|f| f["kind"] == "oom").unwrap();
    let load_line = caching_job_line("block = model.allocator.standin_caching_malloc(512 * MiB)");
    assert_eq!(at(out_of_memory), (workload.clone(), load_line));
    assert_eq!(
        (&out_of_memory["api"], &out_of_memory["diagnosis"], &out_of_memory["bytes"]),
        (&Value::from("c10::reportOutOfMemoryToProfiler"), &Value::from("fragmentation"), &Value::from(512u64 << 20))
    );
    let healthy_exit = findings.iter().find(|f| f["pid"] == healthy.pid).unwrap();
    assert!(
        healthy_exit["detail"].as_str().unwrap().contains(": PyTorch's caching allocator's segments hold "),
        "{healthy_exit:#}"
    );

    // The collector's /metrics count them by kind and severity.
    assert_eq!(collector.metric("gpuprof_findings{node=\"always-on\",kind=\"growth\",severity=\"leak\"}"), 1);
    assert_eq!(
        collector.metric("gpuprof_findings{node=\"always-on\",kind=\"orphan_holding_memory\",severity=\"leak\"}"),
        2
    );
    assert_eq!(collector.metric("gpuprof_findings{node=\"always-on\",kind=\"oom\",severity=\"leak\"}"), 1);
    assert_eq!(
        collector.metric("gpuprof_findings{node=\"always-on\",kind=\"worker_cuda_context\",severity=\"leak\"}"),
        2
    );
    let (_, metrics) = collector.get("/metrics");
    assert!(!metrics.contains("kind=\"exit_with_live_allocations\",severity=\"leak\""), "{metrics}");

    // Jaeger has every leak as a span with its kind, severity and pid.
    let tag = |tags: &Value, key: &str| -> Value {
        tags.as_array().and_then(|t| t.iter().find(|t| t["key"] == key)).map_or(Value::Null, |t| t["value"].clone())
    };
    for finding in findings.iter().filter(|f| f["severity"] == "leak") {
        let started = Instant::now();
        let span = loop {
            let (status, body) = jaeger.get("/api/traces?service=gpuprof&limit=1000&lookback=1h");
            let traces: Value = if status == 200 { serde_json::from_str(&body).unwrap() } else { Value::Null };
            let found = traces["data"].as_array().into_iter().flatten().find_map(|trace| {
                trace["spans"]
                    .as_array()?
                    .iter()
                    .find(|s| tag(&s["tags"], "gpuprof.finding.id") == finding["finding_id"])
                    .cloned()
            });
            if let Some(span) = found {
                break span;
            }
            assert!(started.elapsed() < Duration::from_secs(30), "no span in Jaeger for {finding:#}");
            std::thread::sleep(Duration::from_millis(200));
        };
        for key in ["kind", "severity"] {
            assert_eq!(tag(&span["tags"], &format!("gpuprof.finding.{key}")), finding[key], "{span:#}");
        }
        assert_eq!(tag(&span["tags"], "process.pid"), finding["pid"]);
    }

    // The out-of-memory failure left its post-mortem: the job's last 60 s (it ran 62), on the
    // node and at the collector, its page showing the failure.
    let postmortem = &out_of_memory["postmortem"];
    let (start, end) = (postmortem["window_start"].as_u64().unwrap(), postmortem["window_end"].as_u64().unwrap());
    assert_eq!(end - start, 60_000_000_000, "{postmortem:#}");
    let recording = std::path::PathBuf::from(postmortem["recording"].as_str().unwrap());
    let report = std::path::PathBuf::from(postmortem["report"].as_str().unwrap());
    assert_eq!((recording.parent(), report.parent()), (Some(postmortems.as_path()), Some(postmortems.as_path())));
    daemon.wait_for_at_least("gpuprof_daemon_postmortems_written_total", 1, Duration::from_secs(30));
    let mut file = gpuprof_recording::EventFile::open(&recording).unwrap();
    let events: Vec<Event> = std::iter::from_fn(|| file.next_event().unwrap()).collect();
    let of_job: Vec<&Event> = events.iter().filter(|e| e.pid == oom.pid).collect();
    assert!(of_job.iter().all(|e| e.ts >= start && e.ts <= end));
    // It opens at the window's start with the job's segments then; its training steps fill the
    // minute; it ends at the failure.
    assert!(of_job.iter().any(|e| e.ts == start && e.op == Op::Alloc && e.allocator_segment.is_some()), "{of_job:#?}");
    let steps = of_job.iter().filter(|e| e.ts > start && e.layer == Layer::Allocator).count();
    // The driver refused the 512 MiB segment twice (the allocator emptied its cache between),
    // then the allocator gave up: the report the finding is made of ends the window.
    let failed: Vec<(Layer, u64, i32)> =
        of_job.iter().filter(|e| e.result != 0).map(|e| (e.layer, e.size, e.result)).collect();
    assert_eq!(
        failed,
        [(Layer::Driver, 512 << 20, 2), (Layer::Driver, 512 << 20, 2), (Layer::Allocator, 512 << 20, 2)]
    );
    let failure = of_job.last().unwrap();
    assert_eq!((failure.api.as_ref(), failure.ts), ("c10::reportOutOfMemoryToProfiler", end));
    assert_eq!(failure.stack.first().map(|f| f.line as u64), Some(load_line));
    eprintln!("post-mortem of pid {}: {} events, {steps} tensor events after its start", oom.pid, of_job.len());
    let page = browse_report(
        &report,
        serde_json::json!([
            {"eval": "[...document.querySelectorAll('#findings tbody tr')].filter(r => r.dataset.kind == 'oom').map(r => [r.dataset.kind, Number(r.dataset.pid)])"},
        ]),
    );
    assert_eq!(page["results"][0], serde_json::json!([["oom", oom.pid]]));
    let html = std::fs::read(&report).unwrap();
    let finding_id = out_of_memory["finding_id"].as_str().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let served = loop {
        let (status, body) = collector.get_bytes(&format!("/api/v1/findings/{finding_id}/report"));
        if status == 200 || Instant::now() > deadline {
            break (status, body);
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(served == (200, html), "the collector does not serve {}", report.display());

    assert_eq!(daemon.metric("gpuprof_daemon_events_lost_total"), 0);
    daemon.stop();
    collector.stop();
}
