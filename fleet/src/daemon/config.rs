//! The daemon's one typed configuration, resolved and checked. The binary builds it from the
//! daemon's flags, their `GPUPROF_…` environment variables and the TOML file given by
//! `--config` (a flag wins over the environment, which wins over the file, which wins over the
//! default); the daemon runs with it. The file's keys and the checks of each setting are
//! `gpuprof_daemon_config`'s.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use gpuprof_model::escalation::EscalationConfig;
use gpuprof_model::{Level, RuleConfig};

use gpuprof_capture::postmortem::PostmortemConfig;
use gpuprof_capture::shim_socket::SocketAccess;
use gpuprof_otlp::reporter::OtlpOptions;

/// Where post-mortems go unless told: a node's own directory, which the chart mounts from the
/// host.
pub const DEFAULT_POSTMORTEM_DIR: &str = "/var/lib/gpuprof/postmortems";

pub use gpuprof_daemon_config::CaptureMode;

/// Everything the daemon runs with, resolved and checked.
#[derive(Debug, Clone)]
pub struct DaemonConfig {
    pub otlp: Option<OtlpOptions>,
    pub node_name: Option<String>,
    pub output: Option<PathBuf>,
    pub listen: SocketAddr,
    /// What a scraper must send for /metrics.
    pub metrics_token: Option<String>,
    pub scan_interval: Duration,
    pub retain_exited: Duration,
    pub libcuda: Option<PathBuf>,
    pub capture: CaptureMode,
    pub shim_socket: Option<PathBuf>,
    pub shim_access: SocketAccess,
    /// The directory the sidecar shares with its pod's containers.
    pub sidecar: Option<PathBuf>,
    pub ring_buffer_bytes: u32,
    pub python_stacks: bool,
    pub rules: RuleConfig,
    /// What every process is recorded at.
    pub level: Level,
    /// How long a raised process stays raised.
    pub detail: Duration,
    /// When the rules raise a process on their own (None: only when asked).
    pub escalation: Option<EscalationConfig>,
    /// Windows kept and post-mortems written (None: off).
    pub postmortems: Option<PostmortemConfig>,
    /// The post-mortem directory was given (not the default): one that cannot be made is an
    /// error rather than a warning.
    pub postmortem_dir_given: bool,
}
