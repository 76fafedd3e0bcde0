//! `gpuprof top` driven under tmux like a person would: start it, start a workload that holds
//! device memory, read the screen, quit with `q`.

use std::io::BufReader;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use gpuprof_testkit::*;

struct Tmux {
    socket: String,
}

impl Tmux {
    fn run(&self, args: &[&str]) -> std::process::Output {
        Command::new("tmux").arg("-L").arg(&self.socket).args(args).output_within(PATIENCE)
    }

    fn screen(&self) -> String {
        String::from_utf8(self.run(&["capture-pane", "-p", "-t", "top"]).stdout).unwrap()
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        self.run(&["kill-server"]);
    }
}

#[test]
fn top_shows_a_cuda_process_and_quits_on_q() {
    let dir = scratch("top");
    let exit_file = dir.join("exit");
    let tmux = Tmux { socket: format!("gpuprof-test-{}", std::process::id()) };
    let command = format!("{} top --interval 0.2; echo $? > {}", gpuprof(), exit_file.display());
    let started = tmux.run(&["new-session", "-d", "-s", "top", "-x", "160", "-y", "40", &command]);
    assert!(started.status.success(), "{}", String::from_utf8_lossy(&started.stderr));
    std::thread::sleep(Duration::from_millis(500));

    // A process that loads libcuda, lets top find it (it scans every second), then holds memory.
    let log = dir.join("expected.jsonl");
    let script = "from cuda_driver import Driver\n\
                  import time\n\
                  cuda = Driver()\n\
                  time.sleep(1.5)\n\
                  cuda.init()\n\
                  cuda.mem_alloc(8 << 20); cuda.mem_alloc(3 << 20); cuda.host_alloc(65536)\n\
                  print('holding', flush=True)\n\
                  time.sleep(20)\n";
    let mut cmd = Command::new(python3());
    cmd.args(["-c", script]).stdout(Stdio::piped());
    workload_env(&mut cmd, &log);
    let mut workload = cmd.spawn().unwrap();
    let line =
        line_within(&mut BufReader::new(workload.stdout.as_mut().unwrap()), READY_LIMIT, "the workload's \"holding\"");
    assert_eq!(line.trim(), "holding");
    let pid = workload.id().to_string();

    let deadline = Instant::now() + Duration::from_secs(10);
    let screen = loop {
        let screen = tmux.screen();
        if screen.lines().any(|l| l.contains(&pid) && l.contains("11.0 MiB")) || Instant::now() > deadline {
            break screen;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let row: Vec<&str> = screen
        .lines()
        .find(|l| l.split_whitespace().next().map(|c| c.trim_start_matches('│')) == Some(&pid))
        .unwrap_or_else(|| panic!("no row for pid {pid}:\n{screen}"))
        .trim_matches(|c| c == '│' || c == ' ')
        .split_whitespace()
        .collect();
    // PID COMM STATE DEV DRIVER ALLOCATED RESERVED BEFORE NVML-USED NOT-PROBED IPC CTX CALLS (no
    // NVML here, no allocator); device 0's context current.
    assert_eq!(
        row,
        [pid.as_str(), "python3", "running", "0", "11.0", "MiB", "-", "-", "-", "-", "-", "0", "1", "4"],
        "{screen}"
    );
    assert!(screen.contains("1 CUDA process,"), "{screen}");
    assert!(screen.contains(&format!("Live bytes by the user's line — pid {pid}")), "{screen}");
    assert!(screen.lines().any(|l| l.contains("11.0 MiB device") && l.contains("Driver.call")), "{screen}");
    assert!(screen.lines().any(|l| l.contains("64.0 KiB host_pinned")), "{screen}");

    // An exited process stays, with what it held when it ended, and no longer counts as running.
    workload.kill().unwrap();
    workload.wait_within(PATIENCE, "workload");
    let deadline = Instant::now() + Duration::from_secs(10);
    let screen = loop {
        let screen = tmux.screen();
        if screen.contains("0 CUDA processes") || Instant::now() > deadline {
            break screen;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let row = screen
        .lines()
        .find(|l| l.contains(&format!("│{pid} ")) || l.contains(&format!(" {pid} ")))
        .unwrap_or_else(|| panic!("{screen}"));
    assert!(row.contains("exited(137)") && row.contains("11.0 MiB"), "{screen}");
    assert!(screen.contains("exit_with_live_allocations [leak] pid"), "{screen}");

    tmux.run(&["send-keys", "-t", "top", "q"]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !exit_file.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(std::fs::read_to_string(&exit_file).expect("top exited").trim(), "0");
}
