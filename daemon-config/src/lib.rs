//! The node daemon's configuration file (`gpuprof daemon --config FILE`, TOML): its keys, which
//! are the daemon's flags' names (`file`), and the checks every setting passes whether it came
//! from a flag, its `GPUPROF_…` variable or the file (`checks`). Apart from the daemon itself
//! (`gpuprof_fleet::daemon`), which captures with eBPF, so that what reads a file a user wrote can
//! be built and tested on its own.

#![warn(unreachable_pub)]

pub mod checks;
mod file;

pub use checks::SettingError;
pub use file::{CaptureMode, FileConfig, FileError};
