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
        "growth_window 22222222222222224000000000000: too long: give at most 3155760000 seconds"
    );
    assert_eq!(
        checks::postmortem_window(1e300).unwrap_err().to_string(),
        format!("postmortem_window {}: too long: give at most 3155760000 seconds", 1e300)
    );
    // A duration holds 1e19 s, but a deadline of now + 1e19 s overflows an Instant (the daemon's
    // raised level ends at one): refused; a century is taken.
    assert_eq!(checks::seconds("detail", 1e19), Err(SettingError::TooLong { name: "detail", value: 1e19 }));
    assert_eq!(checks::seconds("detail", 3_155_760_000.0), Ok(Duration::from_secs(3_155_760_000)));
}
