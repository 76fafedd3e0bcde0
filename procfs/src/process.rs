//! What gpuprof reads about processes themselves from /proc: existence, names, parents,
//! namespaces, the environment they were started with, and this process's own costs (their maps
//! and the files mapped are `maps` and `elf`).

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

/// The environment a process was started with, as /proc/PID/environ holds it: `NAME=value`
/// entries, each ended by a NUL. Only read here; what a value means is the model's to say.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Environment(Vec<u8>);

impl Environment {
    /// The value of variable `name` as the process was given it (bytes: the kernel does not ask
    /// for UTF-8); `None` when it is not set.
    pub fn value(&self, name: &str) -> Option<&[u8]> {
        self.0.split(|&b| b == 0).find_map(|entry| entry.strip_prefix(name.as_bytes())?.strip_prefix(b"="))
    }
}

/// The environment process `pid` was started with; `None` when it is gone or not ours to read.
pub fn start_environment(pid: u32) -> Option<Environment> {
    fs::read(format!("/proc/{pid}/environ")).ok().map(Environment)
}

/// State and parent from /proc/PID/stat; `None` when the process is gone.
pub fn stat(pid: u32) -> Option<(char, u32)> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let mut fields = after_comm(&stat)?;
    let state = fields.next()?.chars().next()?;
    let ppid = fields.next()?.parse().ok()?;
    Some((state, ppid))
}

/// The process group of process `pid` (/proc/PID/stat's fifth field); `None` when it is gone.
/// Only read here: that a group stands for the launcher its members were started under is the
/// reader's to say.
pub fn process_group(pid: u32) -> Option<u32> {
    process_group_in(&fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

fn process_group_in(stat: &str) -> Option<u32> {
    // After comm: state, parent, then the group.
    after_comm(stat)?.nth(2)?.parse().ok()
}

/// How long process `pid` had been running when process `than` started (both alive): None when
/// either is gone or `pid` started later.
pub fn started_before(pid: u32, than: u32) -> Option<std::time::Duration> {
    let start = |pid: u32| start_ticks_in(&fs::read_to_string(format!("/proc/{pid}/stat")).ok()?);
    let (theirs, ours) = (start(pid)?, start(than)?);
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    (theirs < ours).then(|| std::time::Duration::from_secs_f64((ours - theirs) as f64 / hz))
}

/// When the process started, in clock ticks since boot (/proc/PID/stat's 22nd field).
fn start_ticks_in(stat: &str) -> Option<u64> {
    // After comm the state is the third field: the start time is 19 fields on.
    after_comm(stat)?.nth(19)?.parse().ok()
}

/// The fields of a /proc/PID/stat line from the state on (the third field).
fn after_comm(stat: &str) -> Option<std::str::SplitWhitespace<'_>> {
    // comm may contain spaces and parentheses: the fields after it follow the last ')'.
    Some(stat.get(stat.rfind(')')? + 1..)?.split_whitespace())
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
    fn a_value_is_its_variable_alone() {
        let value = |environ: &[u8], name| Environment(environ.to_vec()).value(name).map(<[u8]>::to_vec);
        let environ = b"PATH=/usr/bin\0XRANK=2\0LOCAL_RANK=3\0RANK=11\0EMPTY=\0";
        assert_eq!(value(environ, "RANK"), Some(b"11".to_vec()));
        assert_eq!(value(environ, "EMPTY"), Some(Vec::new()));
        assert_eq!(value(environ, "ANK"), None);
        assert_eq!(value(b"", "RANK"), None);
    }

    #[test]
    fn reads_this_process() {
        let me = std::process::id();
        assert!(exists(me));
        assert!(is_running(me));
        assert_eq!(stat(me).unwrap().1, std::os::unix::process::parent_id());
        assert!(!comm(me).is_empty());
        // SAFETY: getpgrp has no preconditions and cannot fail.
        let group = unsafe { libc::getpgrp() };
        assert_eq!(process_group(me), u32::try_from(group).ok());
    }

    #[test]
    fn the_start_is_the_twenty_second_field_and_a_parent_started_before_its_child() {
        let line = "4711 (py (worker) 3) S 4700 4690 4690 0 -1 4194560 1520 0 0 0 12 3 0 0 20 0 9 0 173 9\n";
        assert_eq!(start_ticks_in(line), Some(173));
        assert_eq!(start_ticks_in("4711 (python3) R 1 4711"), None);
        let mut child = std::process::Command::new("sleep").arg("5").spawn().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(50));
        // The test's parent (cargo, its runner) started ticks before the child just spawned.
        let (parent, them) = (std::os::unix::process::parent_id(), child.id());
        assert!(started_before(parent, them).is_some_and(|d| d < std::time::Duration::from_secs(3600)));
        assert_eq!(started_before(them, parent), None);
        assert_eq!(started_before(parent, 0), None);
        child.kill().unwrap();
        child.wait().unwrap();
    }

    #[test]
    fn the_group_is_the_fifth_field_whatever_comm_holds() {
        let line = "4711 (py (worker) 3) S 4700 4690 4690 0 -1 4194560 1520 0 0 0 12 3 0 0 20 0 9 0 173\n";
        assert_eq!(process_group_in(line), Some(4690));
        assert_eq!(process_group_in("4711 (python3) R 1 4711 4711 0"), Some(4711));
        assert_eq!(process_group_in("4711 (python3) R 1"), None);
        assert_eq!(process_group_in("4711 (python3"), None);
    }
}
