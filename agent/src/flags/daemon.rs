//! The flags of `gpuprof daemon`. Each has an environment variable (`GPUPROF_…`) and a key of
//! the same name in the TOML file given by `--config`, so each is optional here: `setup::daemon`
//! fills what is not given from the file, then the defaults.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Args;

use super::otlp::{OtlpTuningArgs, Protocol};

values_of! {
    /// How the daemon captures.
    CaptureMode => gpuprof_fleet::daemon::CaptureMode {
        Ebpf,
        Shim,
    }
}

/// `gpuprof daemon` flags. Each is optional here so that the file can fill what is not given.
#[derive(Debug, Default, Args)]
pub struct DaemonArgs {
    /// A TOML file with any of the settings below (keys as the flags, with `_` for `-`).
    #[arg(long, value_name = "FILE", env = "GPUPROF_CONFIG")]
    pub config: Option<PathBuf>,
    /// Send the node's capture, summarized (docs/otlp.md), to this OTLP endpoint
    /// (e.g. http://gpuprof-collector:4317).
    #[arg(long, value_name = "URL", env = "GPUPROF_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,
    /// grpc (default) or http.
    #[arg(long, value_enum, env = "GPUPROF_OTLP_PROTOCOL")]
    pub otlp_protocol: Option<Protocol>,
    /// Bearer token the collector asks for.
    #[arg(long, value_name = "TOKEN", env = "GPUPROF_OTLP_TOKEN", hide_env_values = true)]
    pub otlp_token: Option<String>,
    /// Read the bearer token from this file (a mounted secret).
    #[arg(long, value_name = "FILE", env = "GPUPROF_OTLP_TOKEN_FILE")]
    pub otlp_token_file: Option<PathBuf>,
    #[command(flatten)]
    pub otlp_tuning: OtlpTuningArgs,
    /// Resident memory the daemon keeps under, in MiB (default 256): its OTLP queue takes at
    /// most a quarter; past the cap, the full event stream's tensor events are shed (counted).
    #[arg(long, value_name = "MIB", env = "GPUPROF_MEMORY_CAP_MIB")]
    pub memory_cap_mib: Option<u64>,
    /// The node's name in `host.name` (default: $K8S_NODE_NAME, else the host name).
    #[arg(long, value_name = "NAME", env = "GPUPROF_NODE_NAME")]
    pub node_name: Option<String>,
    /// Also write every event as jsonl to this file.
    #[arg(long, value_name = "FILE", env = "GPUPROF_OUTPUT")]
    pub output: Option<PathBuf>,
    /// Where /healthz, /readyz and /metrics are served (default 0.0.0.0:9464).
    #[arg(long, value_name = "ADDR", env = "GPUPROF_LISTEN")]
    pub listen: Option<SocketAddr>,
    /// Bearer token a scraper must send for /metrics (/healthz and /readyz stay open for the
    /// kubelet's probes).
    #[arg(long, value_name = "TOKEN", env = "GPUPROF_METRICS_TOKEN", hide_env_values = true)]
    pub metrics_token: Option<String>,
    /// Read the /metrics bearer token from this file (a mounted secret).
    #[arg(long, value_name = "FILE", env = "GPUPROF_METRICS_TOKEN_FILE")]
    pub metrics_token_file: Option<PathBuf>,
    /// Seconds between scans of /proc for processes that map libcuda or libc10 (default 0.5).
    #[arg(long, value_name = "SECS", env = "GPUPROF_SCAN_INTERVAL")]
    pub scan_interval: Option<f64>,
    /// Seconds an exited process's tables are kept after it exits (default 300).
    #[arg(long, value_name = "SECS", env = "GPUPROF_RETAIN_EXITED")]
    pub retain_exited: Option<f64>,
    /// Also probe this libcuda (e.g. the host's driver mounted into the daemon's container).
    #[arg(long, value_name = "PATH", env = "GPUPROF_LIBCUDA")]
    pub libcuda: Option<PathBuf>,
    /// ebpf (default): probes on every CUDA process; shim: no eBPF at all (a node that forbids
    /// it), only what processes running gpuprof's shim send to --shim-socket.
    #[arg(long, value_enum, env = "GPUPROF_CAPTURE")]
    pub capture: Option<CaptureMode>,
    /// Also take events from processes running gpuprof's shim, on this Unix socket (give them
    /// the same GPUPROF_SHIM_SOCKET=PATH); a call both the shim and the probes see is kept once.
    #[arg(long, value_name = "PATH", env = gpuprof_model::shim::SOCKET_VAR)]
    pub shim_socket: Option<PathBuf>,
    /// Run as one pod's sidecar (docs/deploy.md): copy the shim into DIR (a volume the pod's
    /// containers share), take their events on DIR/shim.sock (mode 0666 unless given: only the
    /// pod mounts DIR), and name the pod from the downward API (K8S_POD_NAME, K8S_NAMESPACE,
    /// K8S_POD_UID, K8S_NODE_NAME; GPUPROF_WORKLOAD_CONTAINER: the container). No eBPF unless
    /// --capture ebpf (with the pod's shareProcessNamespace): then the probes see only the
    /// processes of the sidecar's pid namespace, by their pids there.
    #[arg(long, value_name = "DIR", env = "GPUPROF_SIDECAR")]
    pub sidecar: Option<PathBuf>,
    /// Who may connect to --shim-socket: its mode, in octal (default 0660: the daemon's user and
    /// the socket's group). Each connection speaks only for its own process, whoever connects.
    #[arg(long, value_name = "OCTAL", env = "GPUPROF_SHIM_SOCKET_MODE")]
    pub shim_socket_mode: Option<String>,
    /// The group that owns --shim-socket (a name or a number): give the workloads this group
    /// (in Kubernetes, `supplementalGroups`) to let them connect under the default mode.
    #[arg(long, value_name = "GROUP", env = "GPUPROF_SHIM_SOCKET_GROUP")]
    pub shim_socket_group: Option<String>,
    /// Ring buffer size in MiB, a power of two (default 16).
    #[arg(long, value_name = "MIB", env = "GPUPROF_BUFFER_MIB")]
    pub buffer_mib: Option<u32>,
    /// Do not walk Python stacks.
    #[arg(long, env = "GPUPROF_NO_STACKS")]
    pub no_stacks: bool,
    /// Growth rule: window length in seconds (default 10).
    #[arg(long, value_name = "SECS", env = "GPUPROF_GROWTH_WINDOW")]
    pub growth_window: Option<f64>,
    /// Growth rule: consecutive rising windows that make a finding (default 3).
    #[arg(long, value_name = "N", env = "GPUPROF_GROWTH_RISES")]
    pub growth_rises: Option<u32>,
    /// Orphan rule: seconds a CUDA process's descendants may hold memory after it ends (default 5).
    #[arg(long, value_name = "SECS", env = "GPUPROF_ORPHAN_GRACE")]
    pub orphan_grace: Option<f64>,
    /// What every process is recorded at (docs/levels.md): driver (default: the driver's memory
    /// calls, which a warm training step does not make), tensors (every tensor block with its
    /// stack), or off (capture shim only: nothing until a process is raised).
    #[arg(long, value_name = "LEVEL", env = "GPUPROF_LEVEL")]
    pub level: Option<String>,
    /// Seconds a process raised to tensors stays there (default 120): raised when its memory
    /// grows, its device is nearly full or it runs out of memory, or when asked (POST /v1/level).
    #[arg(long, value_name = "SECS", env = "GPUPROF_DETAIL")]
    pub detail: Option<f64>,
    /// Raise processes only when asked, never on what the rules see.
    #[arg(long, env = "GPUPROF_NO_AUTO_RAISE")]
    pub no_auto_raise: bool,
    /// Where post-mortems go: when a process runs out of memory or a leak finding fires, the
    /// last --postmortem-window seconds of its events as a recording and its HTML report
    /// (docs/postmortem.md; default /var/lib/gpuprof/postmortems, a sidecar's DIR/postmortems;
    /// made if missing).
    #[arg(long, value_name = "DIR", env = "GPUPROF_POSTMORTEM_DIR")]
    pub postmortem_dir: Option<PathBuf>,
    /// Keep no window of events and write no post-mortem.
    #[arg(long, env = "GPUPROF_NO_POSTMORTEMS")]
    pub no_postmortems: bool,
    /// Seconds of each process's last events a post-mortem holds (default 60; 0: none kept).
    #[arg(long, value_name = "SECS", env = "GPUPROF_POSTMORTEM_WINDOW")]
    pub postmortem_window: Option<f64>,
    /// MiB of post-mortems the directory keeps; the oldest are deleted first (default 1024).
    #[arg(long, value_name = "MIB", env = "GPUPROF_POSTMORTEM_MAX_MIB")]
    pub postmortem_max_mib: Option<u64>,
    /// Seconds a post-mortem is kept (default 604800: 7 days).
    #[arg(long, value_name = "SECS", env = "GPUPROF_POSTMORTEM_RETENTION")]
    pub postmortem_retention: Option<f64>,
    /// MiB of memory one process's window of events takes at most (default 16); past it its
    /// oldest events go (counted).
    #[arg(long, value_name = "MIB", env = "GPUPROF_POSTMORTEM_PROCESS_MIB")]
    pub postmortem_process_mib: Option<u64>,
    /// MiB of memory all windows take together at most (default a quarter of --memory-cap-mib);
    /// past it the oldest events of any process go (counted).
    #[arg(long, value_name = "MIB", env = "GPUPROF_POSTMORTEM_NODE_MIB")]
    pub postmortem_node_mib: Option<u64>,
}

impl DaemonArgs {
    /// The daemon's settings as its environment alone gives them: what `gpuprof daemon` with no
    /// flags would start from (`gpuprof doctor` reads its collector there).
    pub fn from_environment() -> Result<DaemonArgs, clap::Error> {
        use clap::FromArgMatches;
        let command = DaemonArgs::augment_args(clap::Command::new("daemon").no_binary_name(true));
        DaemonArgs::from_arg_matches(&command.try_get_matches_from(std::iter::empty::<&str>())?)
    }
}
