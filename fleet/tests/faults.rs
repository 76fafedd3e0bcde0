//! The fault matrix of docs/reliability.md, a test a row: what breaks under gpuprof while jobs
//! run, what is lost (counted) and what is said.

use std::time::Duration;

use gpuprof_testkit::caching_job::{caching_job_line, CachingJob};
use gpuprof_testkit::collector::Collector;
use gpuprof_testkit::daemon::{one_daemon_at_a_time, Daemon};
use gpuprof_testkit::*;

/// The node daemon SIGKILLed under two running jobs and started again: the new daemon picks the
/// jobs up (the kernel's probes and a scan of /proc), says for each that what it allocated
/// before is not known to it, and their leaks still come to the collector, at their line.
#[test]
fn a_daemon_killed_and_restarted_under_two_jobs_says_the_gap_and_still_finds_their_leaks() {
    let _node = one_daemon_at_a_time();
    let dir = scratch("faults_daemon_restart");
    let collector = Collector::start(&dir.join("c.redb"), &[]);
    let libcuda = standin_dir().join("libcuda.so.1");
    let args = ["--otlp-endpoint", &collector.grpc, "--node-name", "restarted", "--libcuda", libcuda.to_str().unwrap()];
    let mut first = Daemon::start(&args);
    let mut jobs = [
        CachingJob::start(&scratch("faults_daemon_restart_a"), "leak", 45, &[]),
        CachingJob::start(&scratch("faults_daemon_restart_b"), "leak", 45, &[]),
    ];
    first.wait_for("gpuprof_daemon_processes_discovered_total", 2, Duration::from_secs(10));
    std::thread::sleep(Duration::from_secs(2));
    first.child.kill().unwrap();
    first.child.wait_within(Duration::from_secs(10), "the first daemon, killed");
    drop(first);

    let second = Daemon::start(&args);
    assert!(second.started.contains("daemon on node restarted following 2 CUDA process(es)"), "{}", second.started);
    for job in &jobs {
        let said = second.wait_for_line(
            &format!("pid {} (python3) was already using CUDA, running for ", job.pid),
            Duration::from_secs(10),
        );
        let ran: f64 = said.split("running for ").nth(1).unwrap().split(' ').next().unwrap().parse().unwrap();
        assert!((2.0..30.0).contains(&ran), "{said}");
        assert!(
            said.trim_end().ends_with(" s, when the daemon started: what it allocated before now is not known to gpuprof; its memory and findings count from now on"),
            "{said}"
        );
    }
    for job in &mut jobs {
        assert_eq!(job.line("the leak job's \"done\"", Duration::from_secs(60)), "done");
        assert_eq!(job.child.wait_within(Duration::from_secs(10), "a leak job").code(), Some(0));
    }

    // Each job's growth, found by the second daemon alone, at the line that keeps the tensors.
    let findings = collector.settled_findings("restarted", 2, Duration::from_secs(30));
    let leaks: Vec<(u64, &str, u64)> = findings
        .iter()
        .filter(|f| f["severity"] == "leak")
        .map(|f| (f["pid"].as_u64().unwrap(), f["kind"].as_str().unwrap(), f["user_frame"]["line"].as_u64().unwrap()))
        .collect();
    let kept = caching_job_line("kept.append(model.allocator.standin_caching_malloc(1 * MiB))");
    let mut expected: Vec<(u64, &str, u64)> = jobs.iter().map(|job| (u64::from(job.pid), "growth", kept)).collect();
    expected.sort();
    let mut leaks = leaks;
    leaks.sort();
    assert_eq!(leaks, expected, "{findings:#?}");
    second.stop();
}
