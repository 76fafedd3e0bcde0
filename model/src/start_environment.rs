//! What the environment a process was started with says of it: the rank a distributed launcher
//! gave it and its allocator's settings. A live capture reads them at the process's first call
//! and puts them on that event (`Event::rank`, `Event::allocator_settings`); whoever reads the
//! environment (procfs, from /proc) hands over the raw values and this says what they mean.

use crate::allocator::settings_in_environment;
use crate::rank::{self, RANK_VARIABLE};

/// What the environment a process was started with says of it.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct StartEnvironment {
    /// The rank a distributed launcher (torchrun, torch.distributed, DeepSpeed, Accelerate) gave
    /// it: `RANK`.
    pub rank: Option<u32>,
    /// PyTorch's allocator settings (`allocator::SETTINGS_VARIABLES`, the first set); empty when
    /// none is set, `None` when the environment could not be read.
    pub allocator_settings: Option<String>,
}

impl StartEnvironment {
    /// What an environment says, `value_of` a variable's value as the process was given it.
    pub fn from_environment<'a>(value_of: impl Fn(&str) -> Option<&'a [u8]>) -> Self {
        StartEnvironment {
            rank: value_of(RANK_VARIABLE).and_then(rank::parse),
            allocator_settings: Some(settings_in_environment(|name| {
                value_of(name).map(|v| String::from_utf8_lossy(v).into_owned())
            })),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `environ` (as /proc/PID/environ holds it: `NAME=value` entries, each ended by a NUL)
    /// says.
    fn started_with(environ: &[u8]) -> StartEnvironment {
        StartEnvironment::from_environment(|name| {
            environ.split(|&b| b == 0).find_map(|entry| entry.strip_prefix(name.as_bytes())?.strip_prefix(b"="))
        })
    }

    #[test]
    fn the_rank_is_the_rank_variable_alone() {
        let rank_in = |environ: &[u8]| started_with(environ).rank;
        assert_eq!(rank_in(b"PATH=/usr/bin\0LOCAL_RANK=3\0RANK=11\0WORLD_SIZE=16\0"), Some(11));
        assert_eq!(rank_in(b"LOCAL_RANK=3\0GROUP_RANK=1\0"), None);
        assert_eq!(rank_in(b"RANK=x\0"), None);
        assert_eq!(rank_in(b""), None);
    }

    #[test]
    fn allocator_settings_are_the_first_variable_pytorch_reads() {
        let settings = |environ: &[u8]| started_with(environ).allocator_settings;
        assert_eq!(
            settings(b"PATH=/usr/bin\0PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True\0"),
            Some("expandable_segments:True".into())
        );
        assert_eq!(settings(b"PYTORCH_ALLOC_CONF=max_split_size_mb:128\0"), Some("max_split_size_mb:128".into()));
        assert_eq!(
            settings(b"PYTORCH_ALLOC_CONF=max_split_size_mb:128\0PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True\0"),
            Some("expandable_segments:True".into())
        );
        // Read, and neither set: PyTorch's defaults.
        assert_eq!(settings(b"PATH=/usr/bin\0XPYTORCH_CUDA_ALLOC_CONF=x\0"), Some(String::new()));
    }
}
