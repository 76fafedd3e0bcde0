//! The post-mortem directory: names a person finds a post-mortem by —
//! `<node>-<pid>-<comm>-<kind>-<YYYYmmdd-HHMMSS>.gpuprof` and `.html`, the time in UTC — and the
//! sweep that keeps it within its size cap and retention, the oldest post-mortems first. The
//! directory is gpuprof's own: every `.gpuprof` and `.html` file in it counts.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// Extensions of a post-mortem's two files.
pub(crate) const RECORDING_EXTENSION: &str = "gpuprof";
pub(crate) const REPORT_EXTENSION: &str = "html";
/// Added to a file's name while it is written; renamed away once whole.
pub(crate) const PARTIAL_SUFFIX: &str = ".partial";
/// A partial file this old was left by a daemon stopped while writing it.
const ABANDONED: Duration = Duration::from_secs(3600);

/// A post-mortem's two files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Names {
    pub recording: PathBuf,
    pub report: PathBuf,
}

/// Names for a post-mortem of `kind` about `pid` (`comm`) on `node`, found at `ts` (ns since the
/// epoch); `taken` says whether a name is used already (another is made with `-2`, `-3`…).
pub(crate) fn names(
    dir: &Path,
    node: &str,
    pid: u32,
    comm: &str,
    kind: &str,
    ts: u64,
    taken: impl Fn(&Path) -> bool,
) -> Names {
    let stem = format!("{}-{pid}-{}-{kind}-{}", file_name_safe(node), file_name_safe(comm), utc_stamp(ts));
    let of = |stem: &str| Names {
        recording: dir.join(format!("{stem}.{RECORDING_EXTENSION}")),
        report: dir.join(format!("{stem}.{REPORT_EXTENSION}")),
    };
    let mut names = of(&stem);
    let mut n = 2;
    while taken(&names.recording) || taken(&names.report) {
        names = of(&format!("{stem}-{n}"));
        n += 1;
    }
    names
}

use gpuprof_recording::naming::file_name_safe;
pub(crate) use gpuprof_recording::naming::utc_stamp;

/// How much the directory keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Policy {
    /// Bytes of post-mortems kept at most.
    pub max_bytes: u64,
    /// How long one is kept.
    pub retention: Duration,
}

/// What a sweep did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Swept {
    /// Post-mortems deleted (both files of one count once).
    pub removed: u64,
    /// Bytes of post-mortems left.
    pub bytes: u64,
}

/// One post-mortem on disk: its files, their bytes, when it was last written.
struct OnDisk {
    files: Vec<PathBuf>,
    bytes: u64,
    modified: SystemTime,
}

/// Deletes the post-mortems of `dir` older than the retention, then the oldest until what is
/// left is within the cap; and partial files abandoned by a daemon stopped while writing.
pub(crate) fn sweep(dir: &Path, policy: Policy, now: SystemTime) -> io::Result<Swept> {
    let mut by_stem: BTreeMap<String, OnDisk> = BTreeMap::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let metadata = entry.metadata()?;
        if !metadata.is_file() {
            continue;
        }
        let name = entry.file_name().to_string_lossy().into_owned();
        let modified = metadata.modified()?;
        if name.ends_with(PARTIAL_SUFFIX) {
            if now.duration_since(modified).unwrap_or_default() > ABANDONED {
                remove(&entry.path())?;
            }
            continue;
        }
        let Some((stem, extension)) = name.rsplit_once('.') else { continue };
        if extension != RECORDING_EXTENSION && extension != REPORT_EXTENSION {
            continue;
        }
        let on_disk = by_stem.entry(stem.to_string()).or_insert(OnDisk { files: Vec::new(), bytes: 0, modified });
        on_disk.files.push(entry.path());
        on_disk.bytes += metadata.len();
        on_disk.modified = on_disk.modified.max(modified);
    }
    let mut oldest_first: Vec<OnDisk> = by_stem.into_values().collect();
    oldest_first.sort_by_key(|p| p.modified);
    let mut bytes: u64 = oldest_first.iter().map(|p| p.bytes).sum();
    let mut swept = Swept::default();
    for postmortem in oldest_first {
        let expired = now.duration_since(postmortem.modified).unwrap_or_default() > policy.retention;
        if !expired && bytes <= policy.max_bytes {
            break;
        }
        for file in &postmortem.files {
            remove(file)?;
        }
        bytes -= postmortem.bytes;
        swept.removed += 1;
    }
    swept.bytes = bytes;
    Ok(swept)
}

/// A file gone already is as good as removed.
fn remove(path: &Path) -> io::Result<()> {
    match std::fs::remove_file(path) {
        Err(error) if error.kind() != io::ErrorKind::NotFound => Err(error),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR: Duration = Duration::from_secs(3600);

    fn file(dir: &Path, name: &str, bytes: usize, age: Duration) {
        let path = dir.join(name);
        std::fs::write(&path, vec![b'x'; bytes]).unwrap();
        std::fs::File::options().write(true).open(&path).unwrap().set_modified(SystemTime::now() - age).unwrap();
    }

    fn names_in(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> =
            std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        names.sort();
        names
    }

    #[test]
    fn names_say_node_process_finding_and_time_and_never_repeat() {
        let dir = Path::new("/var/lib/gpuprof/postmortems");
        // 2026-11-27 01:16:17 UTC.
        let ts = 1_795_742_177_000_000_000;
        assert_eq!(utc_stamp(ts), "20261127-011617");
        let names = names(dir, "gpu-node/1", 4711, "pt_main thread", "oom", ts, |_| false);
        assert_eq!(names.recording, dir.join("gpu-node_1-4711-pt_main_thread-oom-20261127-011617.gpuprof"));
        assert_eq!(names.report, dir.join("gpu-node_1-4711-pt_main_thread-oom-20261127-011617.html"));
        let taken = |path: &Path| path.to_string_lossy().ends_with("-oom-20261127-011617.html");
        let again = super::names(dir, "n", 7, "python3", "oom", ts, taken);
        assert_eq!(again.recording, dir.join("n-7-python3-oom-20261127-011617-2.gpuprof"));
    }

    #[test]
    fn a_sweep_deletes_what_is_past_the_retention_then_the_oldest_past_the_cap() {
        let dir = std::env::temp_dir().join(format!("gpuprof-postmortem-sweep-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        file(&dir, "a-1-x-oom-1.gpuprof", 100, 3 * HOUR);
        file(&dir, "a-1-x-oom-1.html", 100, 3 * HOUR);
        file(&dir, "a-2-x-growth-2.gpuprof", 200, 2 * HOUR);
        file(&dir, "a-2-x-growth-2.html", 200, 2 * HOUR);
        file(&dir, "a-3-x-oom-3.gpuprof", 300, HOUR);
        file(&dir, "a-3-x-oom-3.html", 300, HOUR);
        // Left by a daemon stopped while writing: an old one goes, one being written stays.
        file(&dir, "a-4-x-oom-4.gpuprof.partial", 50, 2 * HOUR);
        file(&dir, "a-5-x-oom-5.gpuprof.partial", 50, Duration::ZERO);
        file(&dir, "README.txt", 1000, 5 * HOUR);
        let policy = Policy { max_bytes: 700, retention: 150 * Duration::from_secs(60) };
        let swept = sweep(&dir, policy, SystemTime::now()).unwrap();
        // The first is past the retention; the second goes for the cap (1000 bytes left).
        assert_eq!(swept, Swept { removed: 2, bytes: 600 });
        assert_eq!(
            names_in(&dir),
            ["README.txt", "a-3-x-oom-3.gpuprof", "a-3-x-oom-3.html", "a-5-x-oom-5.gpuprof.partial"]
        );
        // Within both now: nothing more goes.
        assert_eq!(sweep(&dir, policy, SystemTime::now()).unwrap(), Swept { removed: 0, bytes: 600 });
        // A cap smaller than one post-mortem keeps none.
        let tiny = Policy { max_bytes: 10, ..policy };
        assert_eq!(sweep(&dir, tiny, SystemTime::now()).unwrap(), Swept { removed: 1, bytes: 0 });
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
