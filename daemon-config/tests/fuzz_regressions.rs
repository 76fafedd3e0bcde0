//! Inputs the fuzz target `daemon_config` found that once crashed the daemon, each with the clean
//! error it gets now (docs/reliability.md).

use std::path::Path;
use std::time::Duration;

use gpuprof_daemon_config::{checks, FileConfig, SettingError};

/// fuzz/corpus-seeds/daemon_config/crash-8881a1eb…: a growth window longer than a duration holds
/// panicked in `Duration::from_secs_f64` when the daemon started.
#[test]
fn seconds_beyond_what_a_duration_holds_are_refused() {
    let text = "buffer_mib = 16\ngrowth_rises = 3\ngrowth_window = 22222222222222222222222222221.5\n";
    let file = FileConfig::parse(text, Path::new("daemon.toml")).unwrap();
    let value = file.growth_window.unwrap();
    let error = checks::seconds("growth_window", value).unwrap_err();
    assert_eq!(error, SettingError::TooLong { name: "growth_window", value });
    assert_eq!(
        error.to_string(),
        "growth_window 22222222222222224000000000000: too long: give at most 18446744073709551615 seconds"
    );
    assert_eq!(
        checks::postmortem_window(1e300).unwrap_err().to_string(),
        format!("postmortem_window {}: too long: give at most 18446744073709551615 seconds", 1e300)
    );
    // The longest a duration holds is still taken.
    assert_eq!(checks::seconds("detail", 1e19), Ok(Duration::from_secs(10_000_000_000_000_000_000)));
}
