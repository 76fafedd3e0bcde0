//! caching_job.py (testkit/fixtures/workloads): a training-shaped job over the caching-allocator
//! stand-ins, as a node daemon's tests run it beside others.

use std::io::BufReader;
use std::path::Path;
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::Duration;

use crate::{libc10_cuda_standin, libtorch_cpu_standin, line_within, python3, workload_env, workloads, READY_LIMIT};

/// A caching_job.py process: the child, its pid (its "ready PID" line) and its stdout.
pub struct CachingJob {
    pub child: Child,
    pub pid: u32,
    stdout: BufReader<ChildStdout>,
}

impl CachingJob {
    /// Starts `caching_job.py MODE SECONDS` (its log in `dir`) and waits for its "ready PID".
    pub fn start(dir: &Path, mode: &str, seconds: u32, env: &[(&str, &str)]) -> CachingJob {
        let mut command = Command::new(python3());
        command.arg(workloads().join("caching_job.py")).args([mode, &seconds.to_string()]);
        workload_env(&mut command, &dir.join(format!("{mode}.log")));
        command.env("GPUPROF_LIBC10_CUDA", libc10_cuda_standin()).env("GPUPROF_LIBTORCH_CPU", libtorch_cpu_standin());
        for (name, value) in env {
            command.env(name, value);
        }
        let mut child = command.stdout(Stdio::piped()).spawn().unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let line = line_within(&mut stdout, READY_LIMIT, &format!("the {mode} job's \"ready PID\""));
        let pid = line.strip_prefix("ready ").and_then(|p| p.trim().parse().ok()).unwrap_or_else(|| panic!("{line:?}"));
        CachingJob { child, pid, stdout }
    }

    /// Its next line, within `limit`, trimmed.
    pub fn line(&mut self, what: &str, limit: Duration) -> String {
        line_within(&mut self.stdout, limit, what).trim().to_string()
    }
}

/// The line of caching_job.py holding `text`.
pub fn caching_job_line(text: &str) -> u64 {
    let source = std::fs::read_to_string(workloads().join("caching_job.py")).unwrap();
    source.lines().position(|line| line.contains(text)).unwrap_or_else(|| panic!("no {text:?} in caching_job.py"))
        as u64
        + 1
}
