//! What gpuprof reads about processes themselves from /proc: existence, names, parents,
//! namespaces, the rank a launcher gave them, and this process's own costs (their maps and the
//! files mapped are `maps` and `elf`).

use std::collections::HashMap;
use std::fs;
use std::path::PathBuf;

pub fn exists(pid: u32) -> bool {
    PathBuf::from(format!("/proc/{pid}")).exists()
}

/// The process's name (`comm`), or empty when it is gone.
pub fn comm(pid: u32) -> String {
    fs::read_to_string(format!("/proc/{pid}/comm")).map(|s| s.trim_end().to_string()).unwrap_or_default()
}

/// What the environment a process was started with says of it.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct StartEnvironment {
    /// The rank a distributed launcher (torchrun, torch.distributed, DeepSpeed, Accelerate) gave
    /// it: `RANK`.
    pub rank: Option<u32>,
    /// PyTorch's allocator settings (`gpuprof_model::allocator::SETTINGS_VARIABLES`, the first set);
    /// empty when none is set.
    pub allocator_settings: Option<String>,
}

/// The environment process `pid` was started with; all `None` when it is gone or not ours to
/// read.
pub fn start_environment(pid: u32) -> StartEnvironment {
    fs::read(format!("/proc/{pid}/environ")).map(|environ| start_environment_in(&environ)).unwrap_or_default()
}

fn start_environment_in(environ: &[u8]) -> StartEnvironment {
    use gpuprof_model::allocator::settings_in_environment;
    use gpuprof_model::rank::{parse, RANK_VARIABLE};
    let value = |name: &str| {
        environ.split(|&b| b == 0).find_map(|entry| entry.strip_prefix(name.as_bytes())?.strip_prefix(b"="))
    };
    StartEnvironment {
        rank: value(RANK_VARIABLE).and_then(parse),
        allocator_settings: Some(settings_in_environment(|name| {
            value(name).map(|v| String::from_utf8_lossy(v).into_owned())
        })),
    }
}

/// State and parent from /proc/PID/stat; `None` when the process is gone.
pub fn stat(pid: u32) -> Option<(char, u32)> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // comm may contain spaces and parentheses: the fields after it follow the last ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let ppid = fields.next()?.parse().ok()?;
    Some((state, ppid))
}

/// CPU time (user + system) this process spent so far, its threads included, its children not.
pub fn own_cpu_seconds() -> f64 {
    // SAFETY: rusage is plain integers, for which all zeros is a value.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage writes one rusage struct; RUSAGE_SELF needs nothing else.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return 0.0;
    }
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    seconds(usage.ru_utime) + seconds(usage.ru_stime)
}

/// Resident memory of this process, in bytes (0 if /proc cannot say).
pub fn own_resident_bytes() -> u64 {
    let statm = fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm.split_whitespace().nth(1).and_then(|p| p.parse().ok()).unwrap_or(0);
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as u64;
    pages * page
}

/// A live process (not a zombie waiting to be reaped).
pub fn is_running(pid: u32) -> bool {
    matches!(stat(pid), Some((state, _)) if state != 'Z' && state != 'X')
}

/// The pid inside the process's own pid namespace, when it differs from the host pid.
pub fn ns_pid(pid: u32) -> Option<u32> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find_map(|line| line.strip_prefix("NSpid:"))?;
    let innermost: u32 = line.split_whitespace().last()?.parse().ok()?;
    (innermost != pid).then_some(innermost)
}

/// Every process on the machine now.
pub fn all_pids() -> Vec<u32> {
    let Ok(entries) = fs::read_dir("/proc") else { return Vec::new() };
    entries.flatten().filter_map(|e| e.file_name().to_str().and_then(|n| n.parse().ok())).collect()
}

/// Every descendant of `root` alive now (children, grandchildren, …), in no particular order.
pub fn descendants(root: u32) -> Vec<u32> {
    let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
    for pid in all_pids() {
        if let Some((_, ppid)) = stat(pid) {
            children.entry(ppid).or_default().push(pid);
        }
    }
    let mut found = Vec::new();
    let mut queue = vec![root];
    while let Some(pid) = queue.pop() {
        for &child in children.get(&pid).map(Vec::as_slice).unwrap_or(&[]) {
            found.push(child);
            queue.push(child);
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rank_is_the_rank_variable_alone() {
        let rank_in = |environ: &[u8]| start_environment_in(environ).rank;
        assert_eq!(rank_in(b"PATH=/usr/bin\0LOCAL_RANK=3\0RANK=11\0WORLD_SIZE=16\0"), Some(11));
        assert_eq!(rank_in(b"LOCAL_RANK=3\0GROUP_RANK=1\0"), None);
        assert_eq!(rank_in(b"RANK=x\0"), None);
        assert_eq!(rank_in(b""), None);
    }

    #[test]
    fn allocator_settings_are_the_first_variable_pytorch_reads() {
        let settings = |environ: &[u8]| start_environment_in(environ).allocator_settings;
        assert_eq!(
            settings(b"PATH=/usr/bin\0PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True\0"),
            Some("expandable_segments:True".into())
        );
        assert_eq!(settings(b"PYTORCH_ALLOC_CONF=max_split_size_mb:128\0"), Some("max_split_size_mb:128".into()));
        assert_eq!(
            settings(b"PYTORCH_ALLOC_CONF=max_split_size_mb:128\0PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True\0"),
            Some("expandable_segments:True".into())
        );
        // Read, and neither set: PyTorch's defaults.
        assert_eq!(settings(b"PATH=/usr/bin\0XPYTORCH_CUDA_ALLOC_CONF=x\0"), Some(String::new()));
    }

    #[test]
    fn reads_this_process() {
        let me = std::process::id();
        assert!(exists(me));
        assert!(is_running(me));
        assert_eq!(stat(me).unwrap().1, std::os::unix::process::parent_id());
        assert!(!comm(me).is_empty());
    }
}
