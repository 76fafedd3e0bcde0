//! The CUDA processes running now — those a node-wide capture would pick up (they map libcuda
//! or libc10) — each with the CPython it runs, found as the Python stack walk finds it.

use gpuprof_capture::libcuda;
use gpuprof_procfs::process;
use gpuprof_pystack::{find_interpreter, DiscoveryError};

use super::ebpf::Privileges;
use super::Check;

/// Processes named in the line; the rest are counted.
const SHOWN: usize = 10;

/// CPython versions whose stacks gpuprof reads.
const READ_VERSIONS: &str = "3.8–3.13";

pub(super) fn check(privileges: &Privileges) -> Check {
    let pids = libcuda::cuda_processes_on_node(&Default::default());
    if pids.is_empty() {
        // Another user's maps are not readable without CAP_SYS_PTRACE: their processes are unseen.
        let unseen = if privileges.sees_every_process() {
            String::new()
        } else {
            format!(" that uid {} can see (other users' need CAP_SYS_PTRACE)", privileges.uid())
        };
        return Check::not_applicable("cuda_processes", format!("none running{unseen}"));
    }
    let mut unreadable = Vec::new();
    let mut shown: Vec<String> = pids
        .iter()
        .map(|&pid| {
            let python = match find_interpreter(pid) {
                Ok(Some(interpreter)) => format!("CPython {}", interpreter.layout.version),
                Ok(None) => "no CPython".to_string(),
                Err(DiscoveryError::Unsupported { version, .. }) => {
                    unreadable.push(pid);
                    format!("CPython {version}, not read")
                }
                Err(error) => format!("CPython not read: {error}"),
            };
            format!("{pid} {} ({python})", process::comm(pid))
        })
        .collect();
    if shown.len() > SHOWN {
        let more = shown.len() - SHOWN;
        shown.truncate(SHOWN);
        shown.push(format!("and {more} more"));
    }
    let detail = shown.join(", ");
    if unreadable.is_empty() {
        Check::ok("cuda_processes", detail)
    } else {
        Check::fail(
            "cuda_processes",
            detail,
            format!("gpuprof reads the Python stacks of CPython {READ_VERSIONS}: run the job on one of them"),
        )
    }
}
