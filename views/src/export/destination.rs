//! Where an export goes. `-o FILE` is that file, `-o -` stdout; without `-o` a view goes down a
//! pipe as it always did (`gpuprof export run.gpuprof -f folded | flamegraph.pl`), and on a
//! terminal to a file named after the input and the moment (`gpuprof-train-…-peak.svg`): never a
//! page or binary onto a terminal. Every file written is said, with how to open it.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};

use anyhow::{bail, Result};
use gpuprof_model::bytes::human;

use super::request::{ExportFormat, Moment};

/// Where the export's bytes go: a file, or stdout (None).
pub(crate) fn resolve(
    input: &Path,
    format: ExportFormat,
    output: Option<&Path>,
    moment: Moment,
) -> Result<Option<PathBuf>> {
    let stdout_is_terminal = std::io::stdout().is_terminal();
    match output {
        Some(path) if path == Path::new("-") => {
            if stdout_is_terminal && is_binary(format) {
                bail!(
                    "-f {} is binary: it does not go onto a terminal; give -o FILE (or redirect stdout)",
                    format.name()
                );
            }
            Ok(None)
        }
        Some(path) => Ok(Some(path.to_path_buf())),
        None if !stdout_is_terminal => Ok(None),
        None => {
            let named = default_name(input, format, moment);
            if named == input || named.canonicalize().ok().is_some_and(|n| input.canonicalize().ok() == Some(n)) {
                bail!("the export would be named {} like its input: give -o FILE for it", named.display());
            }
            Ok(Some(named))
        }
    }
}

/// `gpuprof-train-20261127-011000-peak.svg` for `gpuprof-train-20261127-011000.gpuprof` at its
/// peak, in the current directory.
pub(crate) fn default_name(input: &Path, format: ExportFormat, moment: Moment) -> PathBuf {
    let file = input.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "gpuprof".into());
    let stem = [".gpuprof", ".jsonl", ".ndjson", ".json"]
        .iter()
        .find_map(|ext| file.strip_suffix(ext))
        .unwrap_or(&file)
        .to_string();
    let (suffix, extension) = match format {
        ExportFormat::Html => (Some("report".to_string()), "html"),
        ExportFormat::Jsonl => (None, "jsonl"),
        ExportFormat::Recording => (None, "gpuprof"),
        ExportFormat::Folded => (Some(moment_name(moment)), "folded"),
        ExportFormat::Flamegraph => (Some(moment_name(moment)), "svg"),
        ExportFormat::Speedscope => (Some(moment_name(moment)), "speedscope.json"),
        ExportFormat::MemoryViz => (Some(moment_name(moment)), "pickle"),
    };
    let name = match suffix {
        Some(suffix) => format!("{stem}-{suffix}.{extension}"),
        None => format!("{stem}.{extension}"),
    };
    PathBuf::from(name)
}

fn moment_name(moment: Moment) -> String {
    match moment {
        Moment::Peak | Moment::AfterEvents(_) => "peak".into(),
        Moment::End => "end".into(),
        Moment::At(secs) => format!("at-{secs}s"),
        Moment::Oom(n) => format!("oom-{n}"),
    }
}

fn is_binary(format: ExportFormat) -> bool {
    matches!(format, ExportFormat::Recording | ExportFormat::MemoryViz)
}

/// "gpuprof: wrote peak.svg (24.0 KiB): open it in a browser".
pub(crate) fn say_written(path: &Path, format: ExportFormat) {
    let size = std::fs::metadata(path).map(|m| human(m.len())).unwrap_or_default();
    let file = path.display();
    let how = match format {
        ExportFormat::Html => "open it in a browser (one file; it works offline)".to_string(),
        ExportFormat::Flamegraph => "open it in a browser (click a frame to zoom)".to_string(),
        ExportFormat::Speedscope => {
            "open https://www.speedscope.app and drop the file in (or `speedscope FILE`)".to_string()
        }
        ExportFormat::MemoryViz => "open https://pytorch.org/memory_viz and drop the file in".to_string(),
        ExportFormat::Folded => "one stack a line: draw it with inferno-flamegraph or flamegraph.pl".to_string(),
        ExportFormat::Jsonl => {
            "one event a line (docs/events.md): jq, or pandas.read_json(FILE, lines=True)".to_string()
        }
        ExportFormat::Recording => format!("read it with `gpuprof summary {file}` or `gpuprof report {file}`"),
    };
    eprintln!("gpuprof: wrote {file} ({size}): {how}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_export_is_named_after_its_input_and_its_moment() {
        let name = |input: &str, format, moment| default_name(Path::new(input), format, moment);
        let run = "/data/gpuprof-train-20261127-011000.gpuprof";
        assert_eq!(
            name(run, ExportFormat::Flamegraph, Moment::Peak),
            Path::new("gpuprof-train-20261127-011000-peak.svg")
        );
        assert_eq!(
            name(run, ExportFormat::Folded, Moment::At(12.5)),
            Path::new("gpuprof-train-20261127-011000-at-12.5s.folded")
        );
        assert_eq!(
            name(run, ExportFormat::MemoryViz, Moment::Oom(2)),
            Path::new("gpuprof-train-20261127-011000-oom-2.pickle")
        );
        assert_eq!(name(run, ExportFormat::Html, Moment::Peak), Path::new("gpuprof-train-20261127-011000-report.html"));
        assert_eq!(name("events.jsonl", ExportFormat::Recording, Moment::Peak), Path::new("events.gpuprof"));
        assert_eq!(name("run.gpuprof", ExportFormat::Jsonl, Moment::End), Path::new("run.jsonl"));
    }

    #[test]
    fn an_export_is_not_named_like_its_input() {
        let error = resolve(Path::new("run.gpuprof"), ExportFormat::Recording, None, Moment::Peak);
        // Through a pipe (as tests run) the export streams: only a terminal names a file.
        if std::io::stdout().is_terminal() {
            assert_eq!(
                error.unwrap_err().to_string(),
                "the export would be named run.gpuprof like its input: give -o FILE for it"
            );
        } else {
            assert_eq!(error.unwrap(), None);
        }
    }
}
