//! Where `attach` and `run` write, decided once from `--format` and `--output`: with neither, a
//! recording in a file named after the job (as py-spy and memray do), so that the terminal gets
//! a summary and the next commands rather than a flood of events.

use std::ffi::OsStr;
use std::io;
use std::path::{Path, PathBuf};

use anyhow::Result;

use gpuprof_model::event::{Event, Layer};
use gpuprof_recording::naming::file_name_safe;

use super::{EndOfRun, EventSink, Format, RECORDING_EXTENSION};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Destination {
    pub format: Format,
    /// The file written; None for stdout.
    pub file: Option<PathBuf>,
    /// gpuprof named the file (no --output): it is not kept when nothing was captured.
    pub chosen: bool,
}

/// The sink of a file gpuprof named itself: the file is removed unless the run captured a CUDA
/// call (a run that made none, or ended in an error, leaves nothing behind).
pub(crate) struct ChosenFileSink {
    inner: Box<dyn EventSink>,
    path: PathBuf,
    cuda_events: u64,
    keep: bool,
}

impl ChosenFileSink {
    pub(crate) fn new(inner: Box<dyn EventSink>, path: PathBuf) -> Self {
        ChosenFileSink { inner, path, cuda_events: 0, keep: false }
    }
}

impl EventSink for ChosenFileSink {
    fn event(&mut self, event: &Event) -> io::Result<()> {
        if event.layer != Layer::Process {
            self.cuda_events += 1;
        }
        self.inner.event(event)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }

    fn finish(&mut self, end: &EndOfRun<'_>) -> io::Result<()> {
        self.inner.finish(end)?;
        self.keep = self.cuda_events > 0;
        if !self.keep {
            // Now, not when dropped: what comes after the sink looks for the file.
            let _ = std::fs::remove_file(&self.path);
            eprintln!("gpuprof: no CUDA call was captured: no recording kept");
        }
        Ok(())
    }
}

impl Drop for ChosenFileSink {
    fn drop(&mut self) {
        if !self.keep {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

impl Destination {
    /// `name`: what the file is named after when gpuprof names it ("train" for `python train.py`).
    pub fn resolve(given: Option<Format>, output: Option<&Path>, name: &str) -> Result<Destination> {
        if given.is_none() && output.is_none() {
            return Ok(Destination { format: Format::Recording, file: Some(unused_name(name)), chosen: true });
        }
        // `-o -` is stdout; the rest is what --format and --output always meant.
        let file = output.filter(|path| *path != Path::new("-"));
        if let (None, Some(path)) = (given, file) {
            if Format::by_name(path).1 {
                eprintln!(
                    "gpuprof: writing a recording (gpuprof's compact format) to {}: name it *.jsonl or give -f jsonl for one event a line",
                    path.display()
                );
            }
        }
        Ok(Destination { format: Format::resolve(given, file)?, file: file.map(Path::to_path_buf), chosen: false })
    }
}

/// "gpuprof-train-20261125-223001.gpuprof" in the current directory; "-2", "-3"… when taken.
fn unused_name(name: &str) -> PathBuf {
    let stamp = local_time_stamp();
    let base = format!("gpuprof-{}-{stamp}", file_name_safe(name));
    (1..)
        .map(|n| {
            if n == 1 {
                PathBuf::from(format!("{base}.{RECORDING_EXTENSION}"))
            } else {
                PathBuf::from(format!("{base}-{n}.{RECORDING_EXTENSION}"))
            }
        })
        .find(|path| !path.exists())
        .expect("some suffix is free")
}

/// What a run is named after: the script or module for Python (`python3 -u train.py` →
/// "train", `python -m pkg.main` → "pkg.main"), else the program ("torchrun", "python3" for -c).
pub fn name_of_command(command: &[impl AsRef<OsStr>]) -> String {
    let text = |arg: &OsStr| arg.to_string_lossy().into_owned();
    let stem = |arg: &OsStr| Path::new(arg).file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    let Some(program) = command.first() else { return "run".to_string() };
    let program = stem(program.as_ref());
    if !program.starts_with("python") {
        return program;
    }
    let mut args = command[1..].iter().map(AsRef::as_ref);
    while let Some(arg) = args.next() {
        match text(arg).as_str() {
            "-c" => break,
            "-m" => return args.next().map(text).unwrap_or(program),
            flag if flag.starts_with('-') => continue,
            _ => return stem(arg),
        }
    }
    program
}

/// YYYYMMDD-HHMMSS in local time.
fn local_time_stamp() -> String {
    // SAFETY: time(2) and localtime_r(3) with valid pointers to our own stack.
    let tm = unsafe {
        let now = libc::time(std::ptr::null_mut());
        let mut tm: libc::tm = std::mem::zeroed();
        libc::localtime_r(&now, &mut tm);
        tm
    };
    time_stamp(&tm)
}

/// The broken-down time as file names carry it.
fn time_stamp(tm: &libc::tm) -> String {
    format!(
        "{:04}{:02}{:02}-{:02}{:02}{:02}",
        tm.tm_year + 1900,
        tm.tm_mon + 1,
        tm.tm_mday,
        tm.tm_hour,
        tm.tm_min,
        tm.tm_sec
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_are_named_after_their_script_or_program() {
        assert_eq!(name_of_command(&["python3", "-u", "train.py", "--epochs", "1"]), "train");
        assert_eq!(name_of_command(&["/usr/bin/python3.12", "/src/my model.py"]), "my model");
        assert_eq!(name_of_command(&["torchrun", "--nproc-per-node", "2", "train.py"]), "torchrun");
        assert_eq!(name_of_command(&["python3", "-c", "import torch"]), "python3");
        assert_eq!(name_of_command(&["python", "-m", "pkg.main", "--lr", "3"]), "pkg.main");
    }

    #[test]
    fn format_and_file_follow_the_flags() {
        let d = Destination::resolve(None, Some(Path::new("run.gpuprof")), "x").unwrap();
        assert_eq!(
            d,
            Destination { format: Format::Recording, file: Some(PathBuf::from("run.gpuprof")), chosen: false }
        );
        let d = Destination::resolve(None, Some(Path::new("ev.jsonl")), "x").unwrap();
        assert_eq!(d, Destination { format: Format::Jsonl, file: Some(PathBuf::from("ev.jsonl")), chosen: false });
        let d = Destination::resolve(None, Some(Path::new("-")), "x").unwrap();
        assert_eq!(d, Destination { format: Format::Jsonl, file: None, chosen: false });
        // memray's habit: a name that says nothing gets the compact recording, and says so.
        let d = Destination::resolve(None, Some(Path::new("run.bin")), "x").unwrap();
        assert_eq!(d, Destination { format: Format::Recording, file: Some(PathBuf::from("run.bin")), chosen: false });
        assert_eq!(Format::by_name(Path::new("run.bin")), (Format::Recording, true));
        assert_eq!(Format::by_name(Path::new("Events.NDJSON")), (Format::Jsonl, false));
        // Not a plain file: a stream.
        assert_eq!(Format::by_name(Path::new("/dev/null")), (Format::Jsonl, false));
        let d = Destination::resolve(Some(Format::Table), None, "x").unwrap();
        assert_eq!(d, Destination { format: Format::Table, file: None, chosen: false });
        let d = Destination::resolve(None, None, "train").unwrap();
        assert_eq!((d.format, d.chosen), (Format::Recording, true));
        let name = d.file.unwrap().to_string_lossy().into_owned();
        assert!(
            name.starts_with("gpuprof-train-")
                && name.ends_with(".gpuprof")
                && name.len() == "gpuprof-train-20261125-223001.gpuprof".len(),
            "{name}"
        );
    }
}
