//! The fault matrix of docs/reliability.md, a test a row: what breaks under gpuprof while jobs
//! run, what is lost (counted) and what is said.

use std::process::Command;
use std::time::Duration;

use gpuprof_testkit::caching_job::{caching_job_line, CachingJob};
use gpuprof_testkit::collector::{send_a_finding, Collector};
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

/// A tmpfs of `bytes` mounted at `dir` (a disk that fills), unmounted when dropped.
struct SmallDisk(std::path::PathBuf);

impl SmallDisk {
    fn mount(dir: &std::path::Path, bytes: u64) -> SmallDisk {
        let _ = Command::new("umount").arg(dir).status_within(PATIENCE);
        std::fs::create_dir_all(dir).unwrap();
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes}"), "tmpfs"])
            .arg(dir)
            .status_within(PATIENCE);
        assert!(status.success(), "cannot mount a tmpfs at {} (the tests run as root)", dir.display());
        SmallDisk(dir.to_path_buf())
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status_within(PATIENCE);
    }
}

/// The disk under a recording fills: the output stops, the capture and the job go on, the end
/// of the run still covers every event, and gpuprof ends in an error that counts what was not
/// written; what reached the disk reads back as a recording cut short.
#[test]
fn a_full_disk_under_a_recording_stops_the_output_not_the_capture_nor_the_job() {
    // Its job is a CUDA process: a daemon under test would see it.
    let _node = one_daemon_at_a_time();
    let dir = scratch("faults_full_disk");
    let disk = SmallDisk::mount(&dir.join("disk"), 64 << 10);
    let recording = disk.0.join("run.gpuprof");
    let log = dir.join("training.log");
    let training = workloads().join("training.py");
    let run = gpuprof_run(
        &["--output", recording.to_str().unwrap()],
        &[python3(), training.to_str().unwrap(), "--seconds", "2", "--leak-every", "20"],
        &log,
    );
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(1), "{stderr}");
    // The job ran its two seconds to the end, unharmed.
    let job: serde_json::Value = serde_json::from_str(std::fs::read_to_string(&log).unwrap().trim()).unwrap();
    assert!(job["steps"].as_u64().unwrap() > 0, "{job}");
    let number = |text: &str| text.replace(',', "").parse::<u64>().unwrap();
    let stopped = stderr.lines().find(|l| l.starts_with("gpuprof: error: cannot write ")).unwrap();
    let expected = format!(
        "gpuprof: error: cannot write {} (No space left on device (os error 28)): the output stops after ",
        recording.display()
    );
    assert!(stopped.starts_with(&expected), "{stderr}");
    let written = number(stopped[expected.len()..].split(' ').next().unwrap());
    assert!(
        stopped.ends_with(" events; the capture goes on, and what it says at the end covers every event"),
        "{stopped}"
    );
    // The end of the run covers every event: the leak's growth, found after the disk filled.
    assert!(stderr.contains("growth [leak] pid "), "{stderr}");
    let captured = stderr.lines().find(|l| l.starts_with("gpuprof: captured ")).unwrap();
    let total = number(captured.split(' ').nth(2).unwrap());
    assert!(written < total, "{stderr}");
    assert!(!stderr.contains("; next:"), "an incomplete file is not offered to read: {stderr}");
    assert_eq!(
        stderr.lines().last().unwrap(),
        format!(
            "gpuprof: error: cannot write the output: {}: No space left on device (os error 28): it stopped after {written} of the {total} events captured (what reached it reads back, cut short)",
            recording.display()
        )
    );
    let summary = Command::new(gpuprof()).args(["summary", "-f", "json"]).arg(&recording).output_within(PATIENCE);
    let said = String::from_utf8_lossy(&summary.stderr);
    assert_eq!(summary.status.code(), Some(0), "{said}");
    let prefix = format!("gpuprof: warning: {} is cut short after ", recording.display());
    assert!(said.starts_with(&prefix), "{said}");
    let kept = number(said[prefix.len()..].split(' ').next().unwrap());
    assert!(kept > 0 && kept <= written, "{kept} of {written}: {said}");
}

/// The disk under the collector's database fills while nodes send: the collector takes and
/// serves every finding from memory, counts what the database refused, and saves it all at the
/// first checkpoint after room comes back; a restart then finds every finding.
#[test]
fn a_full_disk_under_the_collectors_database_loses_no_finding_once_room_comes_back() {
    let dir = scratch("faults_collector_disk");
    let disk = SmallDisk::mount(&dir.join("disk"), 192 << 10);
    let db = disk.0.join("c.redb");
    let collector = Collector::start(&db, &["--checkpoint-secs", "1"]);
    let base = 1_800_000_000_000_000_000u64;
    let mut sent = 0;
    while collector.metric("gpuprof_collector_store_errors_total") == 0 {
        assert!(sent < 2000, "the database took {sent} nodes' findings on a 192 KiB disk");
        send_a_finding(&collector, &format!("node-{sent}"), base + sent * 1000);
        sent += 1;
    }
    // A few more while it is full: taken and served all the same.
    for n in sent..sent + 20 {
        send_a_finding(&collector, &format!("node-{n}"), base + n * 1000);
    }
    sent += 20;
    assert_eq!(collector.findings("").len() as u64, sent);
    assert!(collector.metric("gpuprof_collector_findings_unsaved") > 0);

    let remounted = Command::new("mount").args(["-o", "remount,size=64m"]).arg(&disk.0).status_within(PATIENCE);
    assert!(remounted.success());
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while collector.metric("gpuprof_collector_findings_unsaved") > 0 {
        assert!(std::time::Instant::now() < deadline, "the findings were not saved after room came back");
        std::thread::sleep(Duration::from_millis(200));
    }
    collector.stop();
    let restarted = Collector::start(&db, &[]);
    assert_eq!(restarted.warnings, Vec::<String>::new());
    assert_eq!(restarted.findings("").len() as u64, sent);
    restarted.stop();
}
