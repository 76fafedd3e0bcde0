//! The test runner's limit (scripts/test-runner.py, cargo's runner for this workspace): a test
//! that hangs fails within the limit, with its name, and what it started is stopped with it.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use gpuprof_testkit::*;

/// Hangs, holding a child process, as a stuck capture would. Run only by the test below, through
/// the runner: `--ignored --exact a_test_that_hangs_on_purpose`.
#[test]
#[ignore = "hangs on purpose: the runner's test below runs it to see it stopped"]
fn a_test_that_hangs_on_purpose() {
    let mut held = Command::new("sleep").arg("3600").spawn().unwrap();
    std::fs::write(std::env::var("GPUPROF_HUNG_CHILD").unwrap(), held.id().to_string()).unwrap();
    let _ = held.wait();
}

#[test]
fn a_hung_test_fails_within_its_limit_with_its_name_and_what_it_started_is_stopped() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let pid_file = scratch("hung-test").join("child.pid");
    let mut runner = Command::new(python3());
    runner
        .arg(root.join("scripts/test-runner.py"))
        .arg(std::env::current_exe().unwrap())
        .args(["--ignored", "--exact", "a_test_that_hangs_on_purpose"])
        .env("GPUPROF_TEST_LIMIT_S", "3")
        .env("GPUPROF_HUNG_CHILD", &pid_file);
    let began = Instant::now();
    // libtest names a test that runs long after 60 s; the runner's limit counts from its start.
    let output = runner.output_within(Duration::from_secs(120));
    let took = began.elapsed();
    let (stdout, stderr) = (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert_eq!(output.status.code(), Some(101), "{stdout}\n{stderr}");
    assert!(stdout.contains("test a_test_that_hangs_on_purpose has been running for over 60 seconds\n"), "{stdout}");
    assert!(stdout.ends_with("test a_test_that_hangs_on_purpose ... FAILED\n"), "{stdout}");
    let binary = std::env::current_exe().unwrap();
    let binary = binary.file_name().unwrap().to_str().unwrap();
    assert_eq!(
        stderr.trim_end(),
        format!(
            "gpuprof test runner: test a_test_that_hangs_on_purpose ran past its limit of 3 s (GPUPROF_TEST_LIMIT_S): stopped {binary} and what it started"
        )
    );
    assert!(took >= Duration::from_secs(60) && took < Duration::from_secs(75), "{took:?}");
    let child: i32 = std::fs::read_to_string(&pid_file).unwrap().parse().unwrap();
    // SAFETY: signal 0 only asks whether the pid exists.
    let alive = unsafe { libc::kill(child, 0) } == 0;
    assert!(
        !alive || std::fs::read_to_string(format!("/proc/{child}/stat")).unwrap().contains(") Z "),
        "pid {child} still runs"
    );
}
