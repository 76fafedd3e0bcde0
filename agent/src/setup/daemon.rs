//! The daemon's one typed configuration: its flags (`flags::daemon`, each with its `GPUPROF_…`
//! variable), else the key of the same name in the TOML file given by `--config`, else the
//! default, resolved and checked into `gpuprof_fleet`'s `DaemonConfig`. The file's keys and the
//! checks of each value are `gpuprof_daemon_config`'s; what needs the machine (token files, the
//! group database) is done here.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use gpuprof_capture::postmortem::PostmortemConfig;
use gpuprof_capture::shim_socket::SocketAccess;
use gpuprof_daemon_config::{checks, FileConfig};
use gpuprof_fleet::daemon::DEFAULT_POSTMORTEM_DIR;
use gpuprof_fleet::daemon::{CaptureMode, DaemonConfig};
use gpuprof_model::escalation::EscalationConfig;
use gpuprof_model::{Level, RuleConfig};
use gpuprof_otlp::client::Protocol;
use gpuprof_otlp::reporter::{OtlpOptions, OtlpTuning};

use crate::flags::DaemonArgs;

/// Where the capture goes, and what a scraper of /metrics must send.
struct Destinations {
    otlp: Option<OtlpOptions>,
    node_name: Option<String>,
    output: Option<PathBuf>,
    metrics_token: Option<String>,
    postmortems: Option<PostmortemConfig>,
    postmortem_dir_given: bool,
}

/// Where the events come from: the probes, the shims' socket, or both.
struct Sources {
    scan_interval: Duration,
    buffer_mib: u32,
    sidecar: Option<PathBuf>,
    capture: CaptureMode,
    shim_socket: Option<PathBuf>,
    shim_access: SocketAccess,
}

/// What the rules look for, and what processes are recorded at.
struct Levels {
    rules: RuleConfig,
    level: Level,
    detail: Duration,
    escalation: Option<EscalationConfig>,
}

impl DaemonArgs {
    pub fn resolve(&self) -> Result<DaemonConfig> {
        let file = match &self.config {
            Some(path) => FileConfig::read(path)?,
            None => FileConfig::default(),
        };
        let destinations = self.destinations(&file)?;
        let sources = self.sources(&file)?;
        let levels = self.levels(&file, sources.capture)?;
        Ok(DaemonConfig {
            otlp: destinations.otlp,
            node_name: destinations.node_name,
            output: destinations.output,
            listen: self.listen.or(file.listen).unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 9464))),
            metrics_token: destinations.metrics_token,
            scan_interval: sources.scan_interval,
            retain_exited: checks::seconds(
                "retain_exited",
                self.retain_exited.or(file.retain_exited).unwrap_or(300.0),
            )?,
            libcuda: self.libcuda.clone().or(file.libcuda),
            capture: sources.capture,
            shim_socket: sources.shim_socket,
            shim_access: sources.shim_access,
            sidecar: sources.sidecar,
            ring_buffer_bytes: sources.buffer_mib << 20,
            python_stacks: !(self.no_stacks || file.no_stacks.unwrap_or(false)),
            rules: levels.rules,
            level: levels.level,
            detail: levels.detail,
            escalation: levels.escalation,
            postmortems: destinations.postmortems,
            postmortem_dir_given: destinations.postmortem_dir_given,
        })
    }

    /// The collector the daemon would send to, and where that was said (`gpuprof doctor`):
    /// `--otlp-endpoint` or its variable, else the config file's `otlp_endpoint`.
    pub(crate) fn endpoint(&self) -> Result<Option<(String, String)>> {
        if let Some(endpoint) = &self.otlp_endpoint {
            return Ok(Some((endpoint.clone(), "GPUPROF_OTLP_ENDPOINT".to_string())));
        }
        let Some(path) = &self.config else { return Ok(None) };
        let file = FileConfig::read(path)?;
        Ok(file.otlp_endpoint.map(|endpoint| (endpoint, format!("otlp_endpoint in {}", path.display()))))
    }

    /// OTLP, the jsonl file and the post-mortems; at least one of the first two.
    fn destinations(&self, file: &FileConfig) -> Result<Destinations> {
        let protocol = match (&self.otlp_protocol, &file.otlp_protocol) {
            (Some(protocol), _) => Protocol::from(*protocol),
            (None, Some(name)) => crate::flags::protocol_named(name)
                .ok_or_else(|| anyhow::anyhow!("otlp_protocol = \"{name}\" in the config file: give grpc or http"))?,
            (None, None) => Protocol::Grpc,
        };
        let token = token_of(
            self.otlp_token.clone().or(file.otlp_token.clone()),
            self.otlp_token_file.clone().or(file.otlp_token_file.clone()),
            "otlp",
        )?;
        let metrics_token = token_of(
            self.metrics_token.clone().or(file.metrics_token.clone()),
            self.metrics_token_file.clone().or(file.metrics_token_file.clone()),
            "metrics",
        )?;
        let node_name = self.node_name.clone().or(file.node_name.clone());
        let memory_cap_mib = checks::memory_cap_mib(self.memory_cap_mib.or(file.memory_cap_mib).unwrap_or(256))?;
        let postmortem_dir_given = self.postmortem_dir.is_some() || file.postmortem_dir.is_some();
        let postmortems = self.postmortems(file, node_name.as_deref(), memory_cap_mib)?;
        let otlp = match self.otlp_endpoint.clone().or(file.otlp_endpoint.clone()) {
            Some(endpoint) => {
                let mut tuning = OtlpTuning::from(&self.otlp_tuning).or(&file.tuning());
                // The queue takes at most a quarter of the cap.
                tuning.otlp_queue_mib = Some(tuning.otlp_queue_mib.unwrap_or(64).min(memory_cap_mib / 4));
                let mut options = tuning.options(&endpoint, protocol, token, node_name.clone())?;
                options.memory_cap = Some(memory_cap_mib << 20);
                if self.sidecar.is_some() || file.sidecar.is_some() {
                    let mut pod = gpuprof_otlp::reporter::PodIdentity::from_environment();
                    pod.processes_visible = self.capture().or(file.capture) == Some(CaptureMode::Ebpf);
                    options.pod = Some(pod);
                }
                Some(options)
            }
            None => None,
        };
        let output = self.output.clone().or(file.output.clone());
        if otlp.is_none() && output.is_none() {
            bail!("the daemon has nowhere to send what it captures: give --otlp-endpoint URL (a gpuprof-collector) or --output FILE");
        }
        Ok(Destinations { otlp, node_name, output, metrics_token, postmortems, postmortem_dir_given })
    }

    /// The scan, the ring buffer, the capture and the shims' socket.
    fn sources(&self, file: &FileConfig) -> Result<Sources> {
        let scan_interval = checks::scan_interval(self.scan_interval.or(file.scan_interval).unwrap_or(0.5))?;
        let buffer_mib = checks::buffer_mib(self.buffer_mib.or(file.buffer_mib).unwrap_or(16))?;
        let sidecar = self.sidecar.clone().or(file.sidecar.clone());
        let given_capture = self.capture().or(file.capture);
        let capture = given_capture.unwrap_or(if sidecar.is_some() { CaptureMode::Shim } else { CaptureMode::Ebpf });
        let sidecar_socket = sidecar.as_ref().map(|dir| dir.join("shim.sock"));
        let shim_socket = self.shim_socket.clone().or(file.shim_socket.clone()).or(sidecar_socket).or_else(|| {
            // The name this setting had before it took the workloads' one.
            let old = std::env::var_os("GPUPROF_SHIM_LISTEN")?;
            eprintln!("gpuprof: warning: GPUPROF_SHIM_LISTEN is now GPUPROF_SHIM_SOCKET (the workloads' name for the same socket); taking it this time");
            Some(PathBuf::from(old))
        });
        if capture == CaptureMode::Shim && shim_socket.is_none() {
            bail!("capture shim takes its events from processes running gpuprof's shim: give --shim-socket PATH (and the workloads GPUPROF_SHIM_SOCKET=PATH)");
        }
        let shim_access = SocketAccess {
            // In a sidecar the directory is the pod's own volume: any of its containers' users.
            mode: checks::socket_mode(
                self.shim_socket_mode.as_deref().or(file.shim_socket_mode.as_deref()).unwrap_or(if sidecar.is_some() {
                    "0666"
                } else {
                    "0660"
                }),
            )?,
            group: self.shim_socket_group.as_deref().or(file.shim_socket_group.as_deref()).map(group_id).transpose()?,
        };
        Ok(Sources { scan_interval, buffer_mib, sidecar, capture, shim_socket, shim_access })
    }

    /// The leak rules' thresholds, the level every process is recorded at and when the rules
    /// raise one.
    fn levels(&self, file: &FileConfig, capture: CaptureMode) -> Result<Levels> {
        let growth_window =
            checks::seconds("growth_window", self.growth_window.or(file.growth_window).unwrap_or(10.0))?;
        let growth_rises = checks::growth_rises(self.growth_rises.or(file.growth_rises).unwrap_or(3))?;
        let orphan_grace = checks::seconds("orphan_grace", self.orphan_grace.or(file.orphan_grace).unwrap_or(5.0))?;
        let level = match self.level.as_deref().or(file.level.as_deref()) {
            Some(text) => checks::level(text)?,
            None => Level::Driver,
        };
        let level = checks::level_for_capture(level, capture)?;
        let detail = checks::seconds("detail", self.detail.or(file.detail).unwrap_or(120.0))?;
        let auto_raise = !(self.no_auto_raise || file.no_auto_raise.unwrap_or(false));
        let escalation = (auto_raise && !level.tensors()).then(|| EscalationConfig {
            window_ns: growth_window.as_nanos() as u64,
            detail_ns: detail.as_nanos() as u64,
            ..EscalationConfig::default()
        });
        let rules = RuleConfig {
            growth_window_ns: growth_window.as_nanos() as u64,
            growth_rises,
            orphan_grace_ns: orphan_grace.as_nanos() as u64,
        };
        Ok(Levels { rules, level, detail, escalation })
    }

    /// `--capture`, as the daemon's own type.
    fn capture(&self) -> Option<CaptureMode> {
        self.capture.map(CaptureMode::from)
    }

    /// The post-mortems' settings (docs/postmortem.md), or None when they are off.
    fn postmortems(
        &self,
        file: &FileConfig,
        node_name: Option<&str>,
        memory_cap_mib: u64,
    ) -> Result<Option<PostmortemConfig>> {
        let sidecar = self.sidecar.as_deref().or(file.sidecar.as_deref());
        let window = checks::postmortem_window(self.postmortem_window.or(file.postmortem_window).unwrap_or(60.0))?;
        if self.no_postmortems || file.no_postmortems.unwrap_or(false) || window.is_zero() {
            return Ok(None);
        }
        let dir = match (self.postmortem_dir.clone().or(file.postmortem_dir.clone()), sidecar) {
            (Some(dir), _) => dir,
            // A sidecar's root is read-only; its pod's volume is its own.
            (None, Some(sidecar)) => sidecar.join("postmortems"),
            (None, None) => PathBuf::from(DEFAULT_POSTMORTEM_DIR),
        };
        let process_mib = self.postmortem_process_mib.or(file.postmortem_process_mib).unwrap_or(16);
        let node_mib = self.postmortem_node_mib.or(file.postmortem_node_mib).unwrap_or(memory_cap_mib / 4);
        checks::postmortem_memory(process_mib, node_mib, memory_cap_mib)?;
        let max_mib = self.postmortem_max_mib.or(file.postmortem_max_mib).unwrap_or(1024);
        let retention = self.postmortem_retention.or(file.postmortem_retention).unwrap_or(7.0 * 86400.0);
        Ok(Some(PostmortemConfig {
            dir,
            node: gpuprof_otlp::reporter::node_name(node_name),
            window,
            process_bytes: process_mib << 20,
            node_bytes: node_mib << 20,
            max_bytes: max_mib << 20,
            retention: checks::seconds("postmortem_retention", retention)?,
        }))
    }
}

/// A group by number or by name (from the system's group database).
fn group_id(group: &str) -> Result<u32> {
    if let Ok(gid) = group.parse::<u32>() {
        return Ok(gid);
    }
    let name =
        std::ffi::CString::new(group).map_err(|_| anyhow::anyhow!("shim_socket_group {group:?}: not a group name"))?;
    // SAFETY: getgrnam reads the group database; the entry is copied out before any other call.
    let entry = unsafe { libc::getgrnam(name.as_ptr()) };
    if entry.is_null() {
        bail!("shim_socket_group {group}: no such group on this machine: give its number or create it");
    }
    // SAFETY: a non-null entry from getgrnam.
    Ok(unsafe { (*entry).gr_gid })
}

/// A token given as a value or in a file (`what`: "otlp" or "metrics", for the error).
fn token_of(value: Option<String>, file: Option<PathBuf>, what: &str) -> Result<Option<String>> {
    let token = match (value, file) {
        (Some(token), _) => Some(token),
        (None, Some(path)) => Some(
            std::fs::read_to_string(&path)
                .with_context(|| format!("{what} token file {}: cannot read it", path.display()))?
                .trim()
                .to_string(),
        ),
        (None, None) => None,
    };
    if token.as_deref() == Some("") {
        bail!("the {what} token is empty: give a non-empty --{what}-token or --{what}-token-file");
    }
    Ok(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(text: &str) -> PathBuf {
        let path =
            std::env::temp_dir().join(format!("gpuprof-daemon-config-{}-{}.toml", std::process::id(), text.len()));
        std::fs::write(&path, text).unwrap();
        path
    }

    #[test]
    fn flags_win_over_the_file_and_the_file_over_defaults() {
        let path = write("otlp_endpoint = \"http://file:4317\"\notlp_protocol = \"http\"\nscan_interval = 0.25\nnode_name = \"from-file\"\notlp_events = \"all\"\notlp_profile_interval = 30\notlp_max_spans = 200\nmemory_cap_mib = 128\n");
        let mut args = DaemonArgs { config: Some(path), node_name: Some("from-flag".into()), ..Default::default() };
        args.otlp_tuning.otlp_max_spans = Some(500);
        let config = args.resolve().unwrap();
        let otlp = config.otlp.unwrap();
        assert_eq!(otlp.client.endpoint, "http://file:4317");
        assert_eq!(otlp.client.protocol, Protocol::Http);
        assert_eq!(otlp.node.as_deref(), Some("from-flag"));
        assert_eq!(otlp.events, gpuprof_otlp::reporter::EventStream::All);
        assert_eq!(otlp.profile_interval, Duration::from_secs(30));
        assert_eq!(otlp.metrics_interval, Duration::from_secs(1));
        assert_eq!(otlp.spans.max_per_process, 500);
        // The queue takes a quarter of the memory cap at most.
        assert_eq!((otlp.client.queue_bytes, otlp.memory_cap), (32 << 20, Some(128 << 20)));
        assert_eq!(config.scan_interval, Duration::from_millis(250));
        assert_eq!(config.retain_exited, Duration::from_secs(300));
        assert_eq!(config.listen, "0.0.0.0:9464".parse().unwrap());
        assert!(config.python_stacks);
        // The cheap level, raised on what the rules see, for two minutes.
        assert_eq!((config.level, config.detail), (Level::Driver, Duration::from_secs(120)));
        assert_eq!(config.escalation.map(|e| (e.window_ns, e.rises)), Some((10_000_000_000, 2)));
    }

    #[test]
    fn levels_are_checked_against_the_capture() {
        let base = || DaemonArgs { output: Some("x".into()), ..Default::default() };
        let error = DaemonArgs { level: Some("off".into()), ..base() }.resolve().unwrap_err().to_string();
        assert!(error.starts_with("level off: the eBPF capture records at least the driver's calls"), "{error}");
        let shim = DaemonArgs {
            level: Some("off".into()),
            capture: Some(crate::flags::daemon::CaptureMode::Shim),
            shim_socket: Some("/tmp/s.sock".into()),
            ..base()
        };
        assert_eq!(shim.resolve().unwrap().level, Level::Off);
        let error = DaemonArgs { level: Some("full".into()), ..base() }.resolve().unwrap_err().to_string();
        assert_eq!(error, "level full: unknown capture level \"full\": give off, driver or tensors");
        // At tensors, or told not to, nothing is raised on the rules' word.
        assert!(DaemonArgs { level: Some("tensors".into()), ..base() }.resolve().unwrap().escalation.is_none());
        assert!(DaemonArgs { no_auto_raise: true, ..base() }.resolve().unwrap().escalation.is_none());
    }

    #[test]
    fn an_unknown_key_names_the_file_and_line() {
        let path = write("otlp_endpoint = \"http://x:4317\"\nscan_intervall = 0.5\n");
        let error = DaemonArgs { config: Some(path.clone()), ..Default::default() }.resolve().unwrap_err().to_string();
        assert!(
            error.starts_with(&format!("config file {} line 2: unknown field `scan_intervall`", path.display())),
            "{error}"
        );
    }

    #[test]
    fn nowhere_to_send_is_an_error() {
        let error = DaemonArgs::default().resolve().unwrap_err().to_string();
        assert!(error.contains("give --otlp-endpoint URL"), "{error}");
    }

    #[test]
    fn post_mortems_are_on_by_default_and_each_setting_comes_from_flag_variable_or_file() {
        let base = || DaemonArgs { output: Some("x".into()), node_name: Some("gpu-1".into()), ..Default::default() };
        let defaults = base().resolve().unwrap();
        assert_eq!(
            defaults.postmortems,
            Some(PostmortemConfig {
                dir: PathBuf::from("/var/lib/gpuprof/postmortems"),
                node: "gpu-1".into(),
                window: Duration::from_secs(60),
                process_bytes: 16 << 20,
                // A quarter of the default memory cap of 256 MiB.
                node_bytes: 64 << 20,
                max_bytes: 1024 << 20,
                retention: Duration::from_secs(7 * 86400),
            })
        );
        assert!(!defaults.postmortem_dir_given);
        let path = write("postmortem_dir = \"/srv/pm\"\npostmortem_window = 30\npostmortem_max_mib = 10\npostmortem_retention = 3600\npostmortem_process_mib = 4\npostmortem_node_mib = 8\n");
        let from_file = DaemonArgs { config: Some(path.clone()), postmortem_window: Some(45.0), ..base() };
        let config = from_file.resolve().unwrap();
        let postmortems = config.postmortems.unwrap();
        assert_eq!(
            (postmortems.dir, postmortems.window, postmortems.max_bytes, postmortems.retention),
            (PathBuf::from("/srv/pm"), Duration::from_secs(45), 10 << 20, Duration::from_secs(3600))
        );
        assert_eq!(
            (postmortems.process_bytes, postmortems.node_bytes, config.postmortem_dir_given),
            (4 << 20, 8 << 20, true)
        );
        // A sidecar's root is read-only: its pod's volume takes them.
        let sidecar =
            DaemonArgs { sidecar: Some("/gpuprof".into()), shim_socket: Some("/gpuprof/shim.sock".into()), ..base() };
        assert_eq!(sidecar.resolve().unwrap().postmortems.unwrap().dir, PathBuf::from("/gpuprof/postmortems"));
        // Off, two ways.
        assert_eq!(DaemonArgs { no_postmortems: true, ..base() }.resolve().unwrap().postmortems, None);
        assert_eq!(DaemonArgs { postmortem_window: Some(0.0), ..base() }.resolve().unwrap().postmortems, None);
        let error = DaemonArgs { postmortem_node_mib: Some(200), ..base() }.resolve().unwrap_err().to_string();
        assert_eq!(error, "postmortem_node_mib 200: at most half of memory_cap_mib (256), which the windows share with the OTLP queue and the capture; give less, or a larger memory_cap_mib");
        let error = DaemonArgs { postmortem_window: Some(-1.0), ..base() }.resolve().unwrap_err().to_string();
        assert_eq!(error, "postmortem_window -1: give a number of seconds (0 keeps none)");
    }

    #[test]
    fn a_slow_scan_is_refused() {
        let args = DaemonArgs { output: Some("x".into()), scan_interval: Some(2.0), ..Default::default() };
        assert!(args.resolve().unwrap_err().to_string().starts_with("scan_interval 2s: at most 1 second"));
    }
}
