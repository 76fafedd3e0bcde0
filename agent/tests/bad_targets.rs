//! Every way a capture can be refused ends in one line naming the thing and the remedy, a
//! non-zero exit, and no panic.

use std::io::{BufReader, Write};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use gpuprof_model::event::Op;
use gpuprof_testkit::*;

/// Exactly one line on stderr, starting `gpuprof: error: `, and exit code 1.
fn assert_one_line_error(output: &Output, wanted: &str) {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "one line expected: {stderr}");
    assert!(stderr.starts_with("gpuprof: error: "), "{stderr}");
    assert!(stderr.contains(wanted), "wanted {wanted:?} in {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

fn unused_pid() -> u32 {
    let max: u32 = std::fs::read_to_string("/proc/sys/kernel/pid_max").unwrap().trim().parse().unwrap();
    (1..max).rev().find(|pid| !std::path::Path::new(&format!("/proc/{pid}")).exists()).unwrap()
}

#[test]
fn missing_pid() {
    let pid = unused_pid();
    let output = Command::new(gpuprof()).args(["attach", &pid.to_string()]).output_within(PATIENCE);
    assert_one_line_error(&output, &format!("no process with pid {pid}: check the pid with `ps -p {pid}`"));
}

#[test]
fn process_without_libcuda() {
    let mut sleeper = Command::new("sleep").arg("30").spawn().unwrap();
    let output = Command::new(gpuprof()).args(["attach", &sleeper.id().to_string()]).output_within(PATIENCE);
    sleeper.kill().unwrap();
    sleeper.wait_within(PATIENCE, "sleeper");
    assert_one_line_error(
        &output,
        &format!(
            "process {} (sleep) has not loaded libcuda.so: it has not initialised CUDA yet; use --wait",
            sleeper.id()
        ),
    );
}

#[test]
fn wait_attaches_once_the_process_loads_libcuda() {
    let dir = scratch("wait_for_libcuda");
    let (log, out) = (dir.join("expected.jsonl"), dir.join("events.jsonl"));
    // Loads libcuda only after a line on stdin, then gives the agent time to attach.
    let script = "import sys, time\n\
                  print('ready', flush=True); sys.stdin.readline()\n\
                  from cuda_driver import Driver\n\
                  cuda = Driver(); time.sleep(1.0); cuda.init()\n\
                  r, a = cuda.mem_alloc(1 << 20); cuda.mem_free(a)\n";
    let mut command = Command::new(python3());
    command.args(["-c", script]);
    workload_env(&mut command, &log);
    let mut workload = start_ready_workload(command);
    let mut agent = Command::new(gpuprof())
        .args(["attach", &workload.id().to_string(), "--wait", "--output", out.to_str().unwrap()])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(agent.stderr.take().unwrap());
    wait_for_stderr(&mut stderr, "waiting for process");
    writeln!(workload.stdin.as_mut().unwrap(), "go").unwrap();
    wait_for_stderr(&mut stderr, "capturing pid");
    assert!(workload.wait_within(Duration::from_secs(30), "workload").success());
    assert!(agent.wait_within(Duration::from_secs(30), "agent").success());
    let events = read_events(&out);
    assert_same_calls(&expected_calls(&read_expected(&log)), &driver_events(&events));
    assert_eq!(events.last().unwrap().op, Op::Exit);
}

#[test]
fn wait_gives_up_when_the_process_exits_first() {
    let mut short = Command::new("sleep").arg("0.3").spawn().unwrap();
    let output = Command::new(gpuprof()).args(["attach", &short.id().to_string(), "--wait"]).output_within(PATIENCE);
    short.wait_within(PATIENCE, "short");
    // The waiting notice comes first; the error is the last line.
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert_eq!(
        stderr.lines().last().unwrap(),
        format!("gpuprof: error: process {} exited before it loaded libcuda.so", short.id())
    );
}

/// `--duration` bounds the wait for libcuda too: a process that never loads it is given up on.
#[test]
fn wait_ends_at_the_duration() {
    let mut idle = Command::new("sleep").arg("30").spawn().unwrap();
    let started = std::time::Instant::now();
    let output = Command::new(gpuprof())
        .args(["attach", &idle.id().to_string(), "--wait", "--duration", "0.5"])
        .output_within(PATIENCE);
    let took = started.elapsed();
    idle.kill().unwrap();
    idle.wait_within(PATIENCE, "idle");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert_eq!(
        stderr.lines().last().unwrap(),
        format!(
            "gpuprof: error: process {} did not load libcuda.so within --duration 0.5 s: nothing was captured",
            idle.id()
        )
    );
    assert!(took < std::time::Duration::from_secs(10), "took {took:?}");
}

#[test]
fn missing_privileges_name_the_capabilities() {
    // A copy an unprivileged user can run, wherever the checkout lives.
    use std::os::unix::fs::PermissionsExt;
    let dir = std::env::temp_dir().join(format!("gpuprof-unprivileged-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let binary = dir.join("gpuprof");
    std::fs::copy(gpuprof(), &binary).unwrap();
    std::fs::set_permissions(&binary, std::fs::Permissions::from_mode(0o755)).unwrap();
    let output = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all"])
        .arg(&binary)
        .args(["run", "--", "true"])
        .output_within(PATIENCE);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_one_line_error(&output, "missing privileges CAP_BPF, CAP_PERFMON, CAP_SYS_PTRACE: ");
    assert_one_line_error(&output, "or capture without them from inside the process: `gpuprof run --via shim -- CMD`");
    assert!(String::from_utf8_lossy(&output.stderr).contains("setcap cap_bpf,cap_perfmon,cap_sys_ptrace+ep"));
}

/// Runs gpuprof in a private mount namespace with `dir` hidden under an empty tmpfs.
fn with_hidden(dir: &str) -> Output {
    let script = format!("mount -t tmpfs none {dir} && exec \"$0\" run -- true");
    Command::new("unshare").args(["-m", "sh", "-c", &script]).arg(gpuprof()).output_within(PATIENCE)
}

#[test]
fn kernel_without_btf() {
    let output = with_hidden("/sys/kernel/btf");
    assert_one_line_error(
        &output,
        "this kernel has no BTF (/sys/kernel/btf/vmlinux is missing): gpuprof's CO-RE probes need a kernel built with CONFIG_DEBUG_INFO_BTF=y",
    );
    assert!(String::from_utf8_lossy(&output.stderr).ends_with(
        "(the default of current distributions' kernels) (gpuprof doctor says what this machine can capture)\n"
    ));
}

#[test]
fn kernel_without_uprobes() {
    assert_one_line_error(
        &with_hidden("/sys/bus/event_source/devices/uprobe"),
        "this kernel has no uprobe support (/sys/bus/event_source/devices/uprobe/type is missing)",
    );
}

#[test]
fn command_that_does_not_exist() {
    let output = Command::new(gpuprof()).args(["run", "--", "/nonexistent/train.py"]).output_within(PATIENCE);
    assert_one_line_error(&output, "cannot run `/nonexistent/train.py`: No such file or directory");
    let output = Command::new(gpuprof()).args(["run", "--", "no-such-command-gpuprof"]).output_within(PATIENCE);
    assert_one_line_error(&output, "cannot run `no-such-command-gpuprof`: no such command in PATH");
    let dir = scratch("not_executable");
    let data = dir.join("train.py");
    std::fs::write(&data, "print('hi')\n").unwrap();
    let output = Command::new(gpuprof()).args(["run", "--"]).arg(&data).output_within(PATIENCE);
    assert_one_line_error(&output, &format!("cannot run `{}`: it is not an executable file", data.display()));
}

#[test]
fn libcuda_that_is_not_a_library() {
    let output =
        Command::new(gpuprof()).args(["run", "--libcuda", "/etc/hostname", "--", "true"]).output_within(PATIENCE);
    assert_one_line_error(&output, "/etc/hostname is not an ELF shared library");
    let output = Command::new(gpuprof())
        .args(["run", "--libcuda", "/nonexistent/libcuda.so.1", "--", "true"])
        .output_within(PATIENCE);
    assert_one_line_error(
        &output,
        "--libcuda /nonexistent/libcuda.so.1: cannot open /nonexistent/libcuda.so.1: No such file or directory",
    );
}

#[test]
fn bad_flag_values() {
    let output = Command::new(gpuprof()).args(["run", "--duration", "-1", "--", "true"]).output_within(PATIENCE);
    assert_one_line_error(&output, "--duration -1: give a positive number of seconds");
    let output = Command::new(gpuprof()).args(["run", "--buffer-mib", "3", "--", "true"]).output_within(PATIENCE);
    assert_one_line_error(&output, "--buffer-mib 3: give a power of two from 1 to 1024");
    let output = Command::new(gpuprof())
        .args(["run", "--output", "/nonexistent/dir/x.jsonl", "--", "true"])
        .output_within(PATIENCE);
    assert_one_line_error(&output, "cannot create output file /nonexistent/dir/x.jsonl: No such file or directory");
}
