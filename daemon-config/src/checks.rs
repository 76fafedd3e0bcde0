//! What each setting must be, whether a flag, its variable or the file gave it: each check takes
//! the value and returns what the daemon runs with, or the error that names the setting, the
//! value and what to give instead.

use std::time::Duration;

use gpuprof_model::level::UnknownLevel;
use gpuprof_model::seconds::{positive_seconds, seconds_at_most_a_century, SecondsError};
use gpuprof_model::Level;

use crate::CaptureMode;

/// A setting the daemon cannot run with.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SettingError {
    #[error("{name} {value}: give a positive number of seconds")]
    Seconds { name: &'static str, value: f64 },
    /// More seconds than `gpuprof_model::seconds` takes (a century).
    #[error("{name} {value}: {}", SecondsError::TooLong)]
    TooLong { name: &'static str, value: f64 },
    #[error("scan_interval {0:?}: at most 1 second, or new processes are found late")]
    ScanInterval(Duration),
    #[error("memory_cap_mib {0}: give at least 64")]
    MemoryCap(u64),
    #[error("buffer_mib {0}: give a power of two from 1 to 1024")]
    BufferMib(u32),
    #[error("shim_socket_mode {0}: give permission bits in octal, e.g. 0660")]
    SocketMode(String),
    #[error("growth_rises 0: give at least 1")]
    GrowthRises,
    #[error("level {text}: {error}")]
    Level { text: String, error: UnknownLevel },
    #[error("level off: the eBPF capture records at least the driver's calls; give --level driver, or --capture shim to start every shim paused")]
    OffWithEbpf,
    #[error("postmortem_window {0}: give a number of seconds (0 keeps none)")]
    PostmortemWindow(f64),
    #[error("postmortem_node_mib {node_mib}: at most half of memory_cap_mib ({memory_cap_mib}), which the windows share with the OTLP queue and the capture; give less, or a larger memory_cap_mib")]
    PostmortemNode { node_mib: u64, memory_cap_mib: u64 },
    #[error("postmortem_process_mib and postmortem_node_mib: give at least 1 MiB each (or --no-postmortems)")]
    PostmortemEmpty,
}

/// A duration in seconds (`name` names the setting): positive, and at most a century.
pub fn seconds(name: &'static str, value: f64) -> Result<Duration, SettingError> {
    positive_seconds(value).map_err(|error| match error {
        SecondsError::NotPositive => SettingError::Seconds { name, value },
        SecondsError::TooLong => SettingError::TooLong { name, value },
    })
}

/// How often /proc is scanned: at most a second, or new processes are found late.
pub fn scan_interval(value: f64) -> Result<Duration, SettingError> {
    let interval = seconds("scan_interval", value)?;
    if interval > Duration::from_secs(1) {
        return Err(SettingError::ScanInterval(interval));
    }
    Ok(interval)
}

/// The daemon's memory cap: the windows, the OTLP queue and the capture share it.
pub fn memory_cap_mib(mib: u64) -> Result<u64, SettingError> {
    if mib < 64 {
        return Err(SettingError::MemoryCap(mib));
    }
    Ok(mib)
}

/// The kernel's ring buffer: a power of two (the kernel's own rule), at most 1 GiB.
pub fn buffer_mib(mib: u32) -> Result<u32, SettingError> {
    if !mib.is_power_of_two() || mib > 1024 {
        return Err(SettingError::BufferMib(mib));
    }
    Ok(mib)
}

/// A socket mode in octal ("0660"); the set-id and sticky bits mean nothing on a socket.
pub fn socket_mode(text: &str) -> Result<u32, SettingError> {
    match u32::from_str_radix(text.trim_start_matches("0o"), 8) {
        Ok(mode) if mode <= 0o777 => Ok(mode),
        _ => Err(SettingError::SocketMode(text.to_string())),
    }
}

/// How many rises in a row make growth.
pub fn growth_rises(rises: u32) -> Result<u32, SettingError> {
    if rises == 0 {
        return Err(SettingError::GrowthRises);
    }
    Ok(rises)
}

/// The level every process is recorded at, by name.
pub fn level(text: &str) -> Result<Level, SettingError> {
    text.parse::<Level>().map_err(|error| SettingError::Level { text: text.to_string(), error })
}

/// The eBPF capture cannot record less than the driver's calls; the shims can pause.
pub fn level_for_capture(level: Level, capture: CaptureMode) -> Result<Level, SettingError> {
    if level == Level::Off && capture == CaptureMode::Ebpf {
        return Err(SettingError::OffWithEbpf);
    }
    Ok(level)
}

/// How much of each process's recent events a post-mortem keeps (zero: none, post-mortems off).
pub fn postmortem_window(value: f64) -> Result<Duration, SettingError> {
    seconds_at_most_a_century(value).map_err(|error| match error {
        SecondsError::NotPositive => SettingError::PostmortemWindow(value),
        SecondsError::TooLong => SettingError::TooLong { name: "postmortem_window", value },
    })
}

/// The windows' memory, per process and for the node: some for each, and the node's at most half
/// of the daemon's cap.
pub fn postmortem_memory(process_mib: u64, node_mib: u64, memory_cap_mib: u64) -> Result<(), SettingError> {
    if node_mib > memory_cap_mib / 2 {
        return Err(SettingError::PostmortemNode { node_mib, memory_cap_mib });
    }
    if process_mib == 0 || node_mib == 0 {
        return Err(SettingError::PostmortemEmpty);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(result: Result<impl std::fmt::Debug, SettingError>) -> String {
        result.unwrap_err().to_string()
    }

    #[test]
    fn each_setting_says_what_to_give() {
        assert_eq!(seconds("detail", 120.0), Ok(Duration::from_secs(120)));
        assert_eq!(message(seconds("detail", 0.0)), "detail 0: give a positive number of seconds");
        assert_eq!(message(seconds("detail", f64::NAN)), "detail NaN: give a positive number of seconds");
        assert_eq!(message(scan_interval(2.0)), "scan_interval 2s: at most 1 second, or new processes are found late");
        assert_eq!(message(memory_cap_mib(63)), "memory_cap_mib 63: give at least 64");
        assert_eq!(message(buffer_mib(3)), "buffer_mib 3: give a power of two from 1 to 1024");
        assert_eq!(message(buffer_mib(2048)), "buffer_mib 2048: give a power of two from 1 to 1024");
        assert_eq!(socket_mode("0o640"), Ok(0o640));
        assert_eq!(message(socket_mode("0999")), "shim_socket_mode 0999: give permission bits in octal, e.g. 0660");
        assert_eq!(message(growth_rises(0)), "growth_rises 0: give at least 1");
        assert_eq!(message(level("full")), "level full: unknown capture level \"full\": give off, driver or tensors");
        assert_eq!(level_for_capture(Level::Off, CaptureMode::Shim), Ok(Level::Off));
        assert!(message(level_for_capture(Level::Off, CaptureMode::Ebpf)).starts_with("level off: the eBPF capture"));
        assert_eq!(postmortem_window(0.0), Ok(Duration::ZERO));
        assert_eq!(message(postmortem_window(-1.0)), "postmortem_window -1: give a number of seconds (0 keeps none)");
        assert_eq!(message(postmortem_memory(16, 200, 256)), "postmortem_node_mib 200: at most half of memory_cap_mib (256), which the windows share with the OTLP queue and the capture; give less, or a larger memory_cap_mib");
        assert_eq!(
            message(postmortem_memory(0, 64, 256)),
            "postmortem_process_mib and postmortem_node_mib: give at least 1 MiB each (or --no-postmortems)"
        );
    }
}
