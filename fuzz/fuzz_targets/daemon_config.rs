//! The node daemon's configuration file (`gpuprof daemon --config FILE`, TOML), as the daemon
//! takes it: `FileConfig::parse`, then every value through the check the daemon runs it through
//! (`gpuprof_daemon_config::checks`, and the OTLP export's `OtlpTuning::options`).
//!
//! Checked: every failure is an error value in one line naming the file (never a panic), and
//! every value the file gives is either taken or refused with its message.

#![no_main]

use std::path::Path;

use gpuprof_daemon_config::{checks, CaptureMode, FileConfig};
use gpuprof_otlp::client::Protocol;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let file = match FileConfig::parse(text, Path::new("/etc/gpuprof/daemon.toml")) {
        Ok(file) => file,
        Err(error) => {
            let message = error.to_string();
            assert!(message.starts_with("config file /etc/gpuprof/daemon.toml"), "{message}");
            assert_eq!(message.lines().count(), 1, "{message:?}");
            return;
        }
    };
    let seconds = [
        ("retain_exited", file.retain_exited),
        ("growth_window", file.growth_window),
        ("orphan_grace", file.orphan_grace),
        ("detail", file.detail),
        ("postmortem_retention", file.postmortem_retention),
    ];
    for (name, value) in seconds {
        value.map(|value| checks::seconds(name, value)).transpose().ok();
    }
    file.scan_interval.map(checks::scan_interval).transpose().ok();
    let memory_cap_mib = file.memory_cap_mib.map(checks::memory_cap_mib).transpose().ok().flatten().unwrap_or(256);
    file.buffer_mib.map(checks::buffer_mib).transpose().ok();
    file.shim_socket_mode.as_deref().map(checks::socket_mode).transpose().ok();
    file.growth_rises.map(checks::growth_rises).transpose().ok();
    if let Some(Ok(level)) = file.level.as_deref().map(checks::level) {
        checks::level_for_capture(level, file.capture.unwrap_or(CaptureMode::Ebpf)).ok();
    }
    file.postmortem_window.map(checks::postmortem_window).transpose().ok();
    let (process_mib, node_mib) = (file.postmortem_process_mib.unwrap_or(16), file.postmortem_node_mib);
    checks::postmortem_memory(process_mib, node_mib.unwrap_or(memory_cap_mib / 4), memory_cap_mib).ok();
    if let Err(error) = file.tuning().options("http://collector:4317", Protocol::Grpc, None, None) {
        assert_eq!(error.to_string().lines().count(), 1, "{error}");
    }
});
