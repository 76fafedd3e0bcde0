//! A process's memory maps: `/proc/PID/maps` read and parsed in one place into [`Mapping`]s, and
//! the views gpuprof takes of them (the files mapped, the code ranges, the load bases).

use std::collections::HashMap;
use std::fs;
use std::io;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;

use thiserror::Error;

/// A file deleted since it was mapped: the kernel appends this to its path.
const DELETED: &str = " (deleted)";

/// One line of /proc/PID/maps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapping {
    pub range: Range<u64>,
    pub perms: Permissions,
    /// Where in the file the mapping starts.
    pub offset: u64,
    pub dev: String,
    /// 0 for memory no file backs.
    pub inode: u64,
    /// The file's path as the process sees it (inside its own mount namespace, ending in
    /// " (deleted)" once the file is gone), a pseudo-name ("[stack]", "[vdso]"), or empty for
    /// anonymous memory.
    pub path: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Permissions {
    pub read: bool,
    pub write: bool,
    pub execute: bool,
    /// Shared rather than private (copy-on-write).
    pub shared: bool,
}

impl Mapping {
    /// The path, when a file backs the mapping.
    pub fn file_path(&self) -> Option<&str> {
        self.path.starts_with('/').then_some(self.path.as_str())
    }

    /// The backed file's name ("libcuda.so.1"), without the " (deleted)" mark.
    pub fn file_name(&self) -> Option<&str> {
        let path = self.file_path()?;
        let path = path.strip_suffix(DELETED).unwrap_or(path);
        path.rsplit('/').next()
    }
}

#[derive(Debug, Error)]
#[error("cannot read /proc/{pid}/maps: {error}")]
pub struct MapsError {
    pub pid: u32,
    pub error: io::Error,
}

/// The mappings of a process, in address order.
pub fn read(pid: u32) -> Result<Vec<Mapping>, MapsError> {
    let text = fs::read_to_string(format!("/proc/{pid}/maps")).map_err(|error| MapsError { pid, error })?;
    Ok(parse(&text))
}

/// Every well-formed line of a maps file (`address perms offset dev inode path`).
pub fn parse(maps: &str) -> Vec<Mapping> {
    maps.lines().filter_map(parse_line).collect()
}

fn parse_line(line: &str) -> Option<Mapping> {
    // The path is the rest of the line after padding: it may hold spaces itself.
    let mut fields = line.splitn(6, ' ');
    let (start, end) = fields.next()?.split_once('-')?;
    let perms = fields.next()?.as_bytes();
    let offset = fields.next()?;
    let dev = fields.next()?;
    let inode = fields.next()?;
    Some(Mapping {
        range: u64::from_str_radix(start, 16).ok()?..u64::from_str_radix(end, 16).ok()?,
        perms: Permissions {
            read: perms.first() == Some(&b'r'),
            write: perms.get(1) == Some(&b'w'),
            execute: perms.get(2) == Some(&b'x'),
            shared: perms.get(3) == Some(&b's'),
        },
        offset: u64::from_str_radix(offset, 16).ok()?,
        dev: dev.to_string(),
        inode: inode.parse().ok()?,
        path: fields.next().map(str::trim_start).unwrap_or_default().to_string(),
    })
}

/// A file a process maps, as the process names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MappedFile {
    /// The path as the process sees it (inside its own mount namespace).
    pub path: String,
    pub dev: String,
    pub inode: u64,
}

/// The files mapped, each once (a library maps several segments).
pub fn mapped_files(mappings: &[Mapping]) -> Vec<MappedFile> {
    let mut files: Vec<MappedFile> = Vec::new();
    for mapping in mappings.iter().filter(|m| m.inode != 0) {
        let Some(path) = mapping.file_path() else { continue };
        let file = MappedFile { path: path.to_string(), dev: mapping.dev.clone(), inode: mapping.inode };
        if !files.contains(&file) {
            files.push(file);
        }
    }
    files
}

/// A process's code by address: the file mapped executable at each range.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct CodeMap {
    /// (start, end, the file's name), sorted by start.
    ranges: Vec<(u64, u64, Arc<str>)>,
}

impl CodeMap {
    /// The executable file-backed mappings among `mappings`. A name `earlier` (the same
    /// process's map before) had is shared with it, so names handed out stay one allocation.
    pub fn new(mappings: &[Mapping], earlier: Option<&CodeMap>) -> CodeMap {
        let known: HashMap<&str, &Arc<str>> =
            earlier.map(|e| e.ranges.iter().map(|(_, _, name)| (&**name, name)).collect()).unwrap_or_default();
        let mut ranges: Vec<(u64, u64, Arc<str>)> = mappings
            .iter()
            .filter(|m| m.perms.execute)
            .filter_map(|m| {
                let name = m.file_name()?;
                let name = known.get(name).map_or_else(|| Arc::from(name), |&shared| shared.clone());
                Some((m.range.start, m.range.end, name))
            })
            .collect();
        ranges.sort();
        CodeMap { ranges }
    }

    /// The name of the file whose code is at `addr`.
    pub fn module_at(&self, addr: u64) -> Option<Arc<str>> {
        let at = self.ranges.partition_point(|(start, _, _)| *start <= addr);
        let (_, end, module) = self.ranges.get(at.checked_sub(1)?)?;
        (addr < *end).then(|| module.clone())
    }
}

/// Where each file is mapped from its offset 0 (a shared library's load base): (start, the
/// file's name), the first such mapping of each name.
pub fn load_bases(mappings: &[Mapping]) -> Vec<(u64, String)> {
    let mut bases: Vec<(u64, String)> = Vec::new();
    for mapping in mappings.iter().filter(|m| m.offset == 0) {
        let Some(name) = mapping.file_name() else { continue };
        if !bases.iter().any(|(_, n)| n == name) {
            bases.push((mapping.range.start, name.to_string()));
        }
    }
    bases
}

/// A path of a process's mount namespace, opened from ours (a container's own files).
pub fn path_in_root(pid: u32, path: &str) -> PathBuf {
    PathBuf::from(format!("/proc/{pid}/root{path}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_field_and_keeps_the_path_whole() {
        let maps = "\
7f0000001000-7f0000002000 r-xp 00001000 fd:01 1234                       /usr/lib/libcuda.so.1
7f0000003000-7f0000004000 rw-s 00000000 00:00 0 
7ffd00000000-7ffd00001000 rw-p 00000000 00:00 0                          [stack]
not a mapping
7f0000005000-7f0000006000 r--p 00000000 fd:01 99 /tmp/dir with space/lib.so (deleted)
";
        let mappings = parse(maps);
        assert_eq!(
            mappings[0],
            Mapping {
                range: 0x7f00_0000_1000..0x7f00_0000_2000,
                perms: Permissions { read: true, write: false, execute: true, shared: false },
                offset: 0x1000,
                dev: "fd:01".into(),
                inode: 1234,
                path: "/usr/lib/libcuda.so.1".into(),
            }
        );
        assert_eq!(mappings[1].perms, Permissions { read: true, write: true, execute: false, shared: true });
        assert_eq!((mappings[1].path.as_str(), mappings[1].file_path()), ("", None));
        assert_eq!((mappings[2].path.as_str(), mappings[2].file_name()), ("[stack]", None));
        assert_eq!(mappings.len(), 4);
        assert_eq!(mappings[3].file_path(), Some("/tmp/dir with space/lib.so (deleted)"));
        assert_eq!(mappings[3].file_name(), Some("lib.so"));
    }

    #[test]
    fn parses_file_backed_mappings_once_each() {
        let maps = "\
7f0000000000-7f0000001000 r--p 00000000 fd:01 1234 /usr/lib/x86_64-linux-gnu/libcuda.so.580.95
7f0000001000-7f0000002000 r-xp 00001000 fd:01 1234 /usr/lib/x86_64-linux-gnu/libcuda.so.580.95
7f0000003000-7f0000004000 rw-p 00000000 00:00 0 
7ffd00000000-7ffd00001000 rw-p 00000000 00:00 0                          [stack]
7f0000005000-7f0000006000 r-xp 00000000 fd:01 99 /tmp/dir with space/lib.so (deleted)
";
        let files = mapped_files(&parse(maps));
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
        let code = CodeMap::new(&parse(maps), None);
        assert_eq!(
            code.ranges,
            vec![
                (0x7e00_0000_1000, 0x7e00_0000_3000, Arc::from("libnccl.so.2")),
                (0x7f00_0000_1000, 0x7f00_0000_2000, Arc::from("libcuda.so.580.95")),
                (0x7f00_0000_5000, 0x7f00_0000_6000, Arc::from("ext.so")),
            ]
        );
        assert_eq!(code.module_at(0x7e00_0000_1000).as_deref(), Some("libnccl.so.2"));
        assert_eq!(code.module_at(0x7e00_0000_2fff).as_deref(), Some("libnccl.so.2"));
        assert_eq!(code.module_at(0x7e00_0000_3000), None);
        assert_eq!(code.module_at(0x7f00_0000_1800).as_deref(), Some("libcuda.so.580.95"));
        assert_eq!(code.module_at(0x7f00_0000_3800), None, "anonymous code has no file");
        assert_eq!(code.module_at(0x1000), None);
        let again = CodeMap::new(&parse(maps), Some(&code));
        assert!(Arc::ptr_eq(&again.ranges[1].2, &code.ranges[1].2), "a name known before is shared");
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
            load_bases(&parse(maps)),
            vec![(0x7f00_0000_0000, "libtorch_cpu.so".to_string()), (0x7e00_0000_0000, "libc10.so".to_string())]
        );
    }

    #[test]
    fn reads_this_process_and_names_the_pid_it_cannot_read() {
        let me = std::process::id();
        let exe = std::env::current_exe().unwrap();
        let mappings = read(me).unwrap();
        assert!(mappings.iter().any(|m| m.perms.execute && m.file_path() == exe.to_str()));
        let err = read(u32::MAX).unwrap_err();
        assert_eq!(err.to_string(), "cannot read /proc/4294967295/maps: No such file or directory (os error 2)");
    }
}
