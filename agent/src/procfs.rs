//! What gpuprof reads about other processes from /proc: existence, names, parents, namespaces,
//! and memory maps (to find the libcuda a process actually loaded).

use std::collections::HashMap;
use std::fs;
use std::io;
use std::path::PathBuf;

/// One file-backed line of /proc/PID/maps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MappedFile {
    /// The path as the process sees it (inside its own mount namespace).
    pub path: String,
    pub dev: String,
    pub inode: u64,
}

pub fn exists(pid: u32) -> bool {
    PathBuf::from(format!("/proc/{pid}")).exists()
}

/// The process's name (`comm`), or empty when it is gone.
pub fn comm(pid: u32) -> String {
    fs::read_to_string(format!("/proc/{pid}/comm")).map(|s| s.trim_end().to_string()).unwrap_or_default()
}

/// The rank a distributed launcher (torchrun, torch.distributed, DeepSpeed, Accelerate) gave the
/// process: `RANK` in the environment it was started with. `None` when it has none, or it is
/// gone or not ours to read.
pub fn rank(pid: u32) -> Option<u32> {
    let environ = fs::read(format!("/proc/{pid}/environ")).ok()?;
    rank_in(&environ)
}

fn rank_in(environ: &[u8]) -> Option<u32> {
    environ
        .split(|&b| b == 0)
        .find_map(|entry| entry.strip_prefix(b"RANK="))
        .and_then(|value| std::str::from_utf8(value).ok()?.parse().ok())
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

/// A live process (not a zombie waiting to be reaped).
/// CPU time (user + system) this process spent so far, its threads included, its children not.
pub fn own_cpu_seconds() -> f64 {
    // SAFETY: getrusage writes one rusage struct; RUSAGE_SELF needs nothing else.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
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

/// The file-backed mappings of a process.
pub fn mapped_files(pid: u32) -> io::Result<Vec<MappedFile>> {
    let maps = fs::read_to_string(format!("/proc/{pid}/maps"))?;
    Ok(parse_maps(&maps))
}

fn parse_maps(maps: &str) -> Vec<MappedFile> {
    let mut files: Vec<MappedFile> = Vec::new();
    for line in maps.lines() {
        // address perms offset dev inode path
        let mut fields = line.splitn(6, ' ');
        let (Some(_), Some(_), Some(_), Some(dev), Some(inode)) =
            (fields.next(), fields.next(), fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let Some(path) = fields.next().map(str::trim_start) else { continue };
        let Ok(inode) = inode.parse::<u64>() else { continue };
        if inode == 0 || !path.starts_with('/') {
            continue;
        }
        let file = MappedFile { path: path.to_string(), dev: dev.to_string(), inode };
        if !files.contains(&file) {
            files.push(file);
        }
    }
    files
}

/// The executable file-backed mappings of a process: (start, end, the file's name), sorted.
pub fn code_ranges(pid: u32) -> io::Result<Vec<(u64, u64, String)>> {
    let maps = fs::read_to_string(format!("/proc/{pid}/maps"))?;
    Ok(parse_code_ranges(&maps))
}

fn parse_code_ranges(maps: &str) -> Vec<(u64, u64, String)> {
    let mut ranges = Vec::new();
    for line in maps.lines() {
        let mut fields = line.splitn(6, ' ');
        let (Some(range), Some(perms)) = (fields.next(), fields.next()) else { continue };
        let Some(path) = fields.nth(3).map(str::trim_start) else { continue };
        if !perms.contains('x') || !path.starts_with('/') {
            continue;
        }
        let Some((start, end)) = range.split_once('-') else { continue };
        let (Ok(start), Ok(end)) = (u64::from_str_radix(start, 16), u64::from_str_radix(end, 16)) else { continue };
        let path = path.strip_suffix(" (deleted)").unwrap_or(path);
        let name = path.rsplit('/').next().unwrap_or(path);
        ranges.push((start, end, name.to_string()));
    }
    ranges.sort();
    ranges
}

/// Where each file-backed mapping of a process starts that maps its file from offset 0 (a shared
/// library's load base): (start, the file's name).
pub fn load_bases(pid: u32) -> io::Result<Vec<(u64, String)>> {
    let maps = fs::read_to_string(format!("/proc/{pid}/maps"))?;
    Ok(parse_load_bases(&maps))
}

fn parse_load_bases(maps: &str) -> Vec<(u64, String)> {
    let mut bases = Vec::new();
    for line in maps.lines() {
        let mut fields = line.splitn(6, ' ');
        let (Some(range), Some(_), Some(offset)) = (fields.next(), fields.next(), fields.next()) else { continue };
        let Some(path) = fields.nth(2).map(str::trim_start) else { continue };
        if !path.starts_with('/') || u64::from_str_radix(offset, 16) != Ok(0) {
            continue;
        }
        let Some(start) = range.split_once('-').and_then(|(start, _)| u64::from_str_radix(start, 16).ok()) else {
            continue;
        };
        let name = path.strip_suffix(" (deleted)").unwrap_or(path).rsplit('/').next().unwrap_or(path);
        if !bases.iter().any(|(_, n)| n == name) {
            bases.push((start, name.to_string()));
        }
    }
    bases
}

/// A path of a process's mount namespace, opened from ours.
pub fn path_in_root(pid: u32, path: &str) -> PathBuf {
    PathBuf::from(format!("/proc/{pid}/root{path}"))
}

#[cfg(test)]
mod tests {

    #[test]
    fn the_rank_is_the_rank_variable_alone() {
        assert_eq!(rank_in(b"PATH=/usr/bin\0LOCAL_RANK=3\0RANK=11\0WORLD_SIZE=16\0"), Some(11));
        assert_eq!(rank_in(b"LOCAL_RANK=3\0GROUP_RANK=1\0"), None);
        assert_eq!(rank_in(b"RANK=x\0"), None);
        assert_eq!(rank_in(b""), None);
    }

    use super::*;

    #[test]
    fn parses_file_backed_mappings_once_each() {
        let maps = "\
7f0000000000-7f0000001000 r--p 00000000 fd:01 1234 /usr/lib/x86_64-linux-gnu/libcuda.so.580.95
7f0000001000-7f0000002000 r-xp 00001000 fd:01 1234 /usr/lib/x86_64-linux-gnu/libcuda.so.580.95
7f0000003000-7f0000004000 rw-p 00000000 00:00 0 
7ffd00000000-7ffd00001000 rw-p 00000000 00:00 0                          [stack]
7f0000005000-7f0000006000 r-xp 00000000 fd:01 99 /tmp/dir with space/lib.so (deleted)
";
        let files = parse_maps(maps);
        assert_eq!(
            files,
            vec![
                MappedFile {
                    path: "/usr/lib/x86_64-linux-gnu/libcuda.so.580.95".into(),
                    dev: "fd:01".into(),
                    inode: 1234
                },
                MappedFile { path: "/tmp/dir with space/lib.so (deleted)".into(), dev: "fd:01".into(), inode: 99 },
            ]
        );
    }

    #[test]
    fn names_the_file_of_each_code_range() {
        let maps = "\
7f0000000000-7f0000001000 r--p 00000000 fd:01 1234 /usr/lib/x86_64-linux-gnu/libcuda.so.580.95
7f0000001000-7f0000002000 r-xp 00001000 fd:01 1234 /usr/lib/x86_64-linux-gnu/libcuda.so.580.95
7e0000001000-7e0000003000 r-xp 00001000 fd:01 77 /site-packages/nvidia/nccl/lib/libnccl.so.2
7f0000003000-7f0000004000 rwxp 00000000 00:00 0 
7f0000005000-7f0000006000 r-xp 00000000 fd:01 99 /tmp/dir with space/ext.so (deleted)
";
        assert_eq!(
            parse_code_ranges(maps),
            vec![
                (0x7e00_0000_1000, 0x7e00_0000_3000, "libnccl.so.2".to_string()),
                (0x7f00_0000_1000, 0x7f00_0000_2000, "libcuda.so.580.95".to_string()),
                (0x7f00_0000_5000, 0x7f00_0000_6000, "ext.so".to_string()),
            ]
        );
    }

    #[test]
    fn load_bases_are_the_mappings_of_file_offset_zero() {
        let maps = "\
7f0000000000-7f0000001000 r--p 00000000 fd:01 1234 /opt/torch/lib/libtorch_cpu.so
7f0000001000-7f0000002000 r-xp 00001000 fd:01 1234 /opt/torch/lib/libtorch_cpu.so
7f0000003000-7f0000004000 rw-p 00000000 00:00 0 
7e0000000000-7e0000001000 r--p 00000000 fd:01 77      /opt/torch/lib/libc10.so (deleted)
7e0000004000-7e0000005000 r--p 00000000 fd:01 77 /opt/torch/lib/libc10.so
";
        assert_eq!(
            parse_load_bases(maps),
            vec![(0x7f00_0000_0000, "libtorch_cpu.so".to_string()), (0x7e00_0000_0000, "libc10.so".to_string())]
        );
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
