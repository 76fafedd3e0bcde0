//! The file's keys and how it is read. A key gpuprof does not know is an error, so a typo does not
//! silently leave a default in place; an error names the file and the line.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use gpuprof_otlp::reporter::{EventStream, OtlpTuning};
use serde::Deserialize;

/// How the daemon captures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CaptureMode {
    Ebpf,
    Shim,
}

/// The file's keys: the flags' names. Each is optional: a flag or variable wins over it, and
/// the default fills what neither gives.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    pub otlp_endpoint: Option<String>,
    pub otlp_protocol: Option<String>,
    pub otlp_token: Option<String>,
    pub otlp_token_file: Option<PathBuf>,
    pub metrics_token: Option<String>,
    pub metrics_token_file: Option<PathBuf>,
    pub otlp_events: Option<EventStream>,
    pub otlp_metrics_interval: Option<f64>,
    pub otlp_profile_interval: Option<f64>,
    pub otlp_profile_stacks: Option<usize>,
    pub otlp_span_min_bytes: Option<u64>,
    pub otlp_max_spans: Option<u64>,
    pub otlp_queue_mib: Option<u64>,
    pub otlp_max_request_bytes: Option<usize>,
    pub memory_cap_mib: Option<u64>,
    pub node_name: Option<String>,
    pub output: Option<PathBuf>,
    pub listen: Option<SocketAddr>,
    pub scan_interval: Option<f64>,
    pub retain_exited: Option<f64>,
    pub libcuda: Option<PathBuf>,
    pub capture: Option<CaptureMode>,
    pub shim_socket: Option<PathBuf>,
    pub shim_socket_mode: Option<String>,
    pub shim_socket_group: Option<String>,
    pub sidecar: Option<PathBuf>,
    pub buffer_mib: Option<u32>,
    pub no_stacks: Option<bool>,
    pub growth_window: Option<f64>,
    pub growth_rises: Option<u32>,
    pub orphan_grace: Option<f64>,
    pub level: Option<String>,
    pub detail: Option<f64>,
    pub no_auto_raise: Option<bool>,
    pub postmortem_dir: Option<PathBuf>,
    pub no_postmortems: Option<bool>,
    pub postmortem_window: Option<f64>,
    pub postmortem_max_mib: Option<u64>,
    pub postmortem_retention: Option<f64>,
    pub postmortem_process_mib: Option<u64>,
    pub postmortem_node_mib: Option<u64>,
}

/// Why the file could not be taken, in one line that names it.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("config file {}: cannot read it: {error}", path.display())]
    Read { path: PathBuf, error: std::io::Error },
    #[error("config file {} line {line}: {message}", path.display())]
    AtLine { path: PathBuf, line: usize, message: String },
    #[error("config file {}: {message}", path.display())]
    Whole { path: PathBuf, message: String },
}

impl FileConfig {
    /// The file at `path`, read and parsed.
    pub fn read(path: &Path) -> Result<FileConfig, FileError> {
        let text =
            std::fs::read_to_string(path).map_err(|error| FileError::Read { path: path.to_path_buf(), error })?;
        FileConfig::parse(&text, path)
    }

    /// The file's text parsed (`path` names it in an error).
    pub fn parse(text: &str, path: &Path) -> Result<FileConfig, FileError> {
        toml::from_str(text).map_err(|error| {
            // toml's message spans lines (it quotes the file); the first says what is wrong.
            let message = error.message().to_string();
            let path = path.to_path_buf();
            match error.span() {
                Some(span) => {
                    let line = text[..span.start].matches('\n').count() + 1;
                    FileError::AtLine { path, line, message }
                }
                None => FileError::Whole { path, message },
            }
        })
    }

    /// The OTLP export's settings the file gives.
    pub fn tuning(&self) -> OtlpTuning {
        OtlpTuning {
            otlp_events: self.otlp_events,
            otlp_metrics_interval: self.otlp_metrics_interval,
            otlp_profile_interval: self.otlp_profile_interval,
            otlp_profile_stacks: self.otlp_profile_stacks,
            otlp_span_min_bytes: self.otlp_span_min_bytes,
            otlp_max_spans: self.otlp_max_spans,
            otlp_queue_mib: self.otlp_queue_mib,
            otlp_max_request_bytes: self.otlp_max_request_bytes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(text: &str) -> String {
        FileConfig::parse(text, Path::new("/etc/gpuprof/daemon.toml")).unwrap_err().to_string()
    }

    #[test]
    fn a_bad_file_names_itself_and_the_line() {
        assert_eq!(
            error("otlp_endpoint = \"http://x:4317\"\nscan_intervall = 0.5\n"),
            "config file /etc/gpuprof/daemon.toml line 2: unknown field `scan_intervall`, expected one of `otlp_endpoint`, `otlp_protocol`, `otlp_token`, `otlp_token_file`, `metrics_token`, `metrics_token_file`, `otlp_events`, `otlp_metrics_interval`, `otlp_profile_interval`, `otlp_profile_stacks`, `otlp_span_min_bytes`, `otlp_max_spans`, `otlp_queue_mib`, `otlp_max_request_bytes`, `memory_cap_mib`, `node_name`, `output`, `listen`, `scan_interval`, `retain_exited`, `libcuda`, `capture`, `shim_socket`, `shim_socket_mode`, `shim_socket_group`, `sidecar`, `buffer_mib`, `no_stacks`, `growth_window`, `growth_rises`, `orphan_grace`, `level`, `detail`, `no_auto_raise`, `postmortem_dir`, `no_postmortems`, `postmortem_window`, `postmortem_max_mib`, `postmortem_retention`, `postmortem_process_mib`, `postmortem_node_mib`"
        );
        assert_eq!(
            error("scan_interval = \"fast\"\n"),
            "config file /etc/gpuprof/daemon.toml line 1: invalid type: string \"fast\", expected f64"
        );
        assert_eq!(
            error("capture = \"ebpf\"\ncapture = \"shim\"\n"),
            "config file /etc/gpuprof/daemon.toml line 2: duplicate key"
        );
        let missing = FileConfig::read(Path::new("/nonexistent/daemon.toml")).unwrap_err().to_string();
        assert_eq!(
            missing,
            "config file /nonexistent/daemon.toml: cannot read it: No such file or directory (os error 2)"
        );
    }

    #[test]
    fn the_keys_are_the_flags_names() {
        let file = FileConfig::parse(
            "otlp_endpoint = \"http://collector:4317\"\ncapture = \"shim\"\nbuffer_mib = 32\notlp_events = \"all\"\n",
            Path::new("daemon.toml"),
        )
        .unwrap();
        assert_eq!(file.otlp_endpoint.as_deref(), Some("http://collector:4317"));
        assert_eq!((file.capture, file.buffer_mib), (Some(CaptureMode::Shim), Some(32)));
        assert_eq!(file.tuning().otlp_events, Some(EventStream::All));
    }
}
