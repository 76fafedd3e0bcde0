//! What the environment a process was started with says of it: the job a distributed launcher
//! made it one rank of (`job`) and its allocator's settings. A live capture reads them at the
//! process's first call and puts them on that event (`Event::job`, `rank`, `local_rank`,
//! `world_size`, `allocator_settings`); whoever reads the environment (procfs, from /proc) hands
//! over the raw values and this says what they mean.

use crate::allocator::settings_in_environment;
use crate::job::Job;

/// What the environment a process was started with says of it.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct StartEnvironment {
    /// The job it is one rank of, its rank (`RANK` first: torchrun, torch.distributed,
    /// DeepSpeed, Accelerate; else its MPI or Slurm launcher's), local rank and world size.
    pub job: Job,
    /// PyTorch's allocator settings (`allocator::SETTINGS_VARIABLES`, the first set); empty when
    /// none is set, `None` when the environment could not be read.
    pub allocator_settings: Option<String>,
}

impl StartEnvironment {
    /// What an environment says, `value_of` a variable's value as the process was given it.
    pub fn from_environment<'a>(value_of: impl Fn(&str) -> Option<&'a [u8]>) -> Self {
        StartEnvironment {
            job: Job::from_environment(&value_of),
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
    fn the_rank_is_the_rank_variable_first_and_a_local_rank_is_no_rank() {
        let rank_in = |environ: &[u8]| started_with(environ).job.rank;
        assert_eq!(
            rank_in(b"PATH=/usr/bin\0LOCAL_RANK=3\0RANK=11\0WORLD_SIZE=16\0SLURM_PROCID=2\0SLURM_NTASKS=4\0"),
            Some(11)
        );
        assert_eq!(rank_in(b"LOCAL_RANK=3\0GROUP_RANK=1\0"), None);
        assert_eq!(rank_in(b"RANK=x\0"), None);
        assert_eq!(rank_in(b""), None);
    }

    #[test]
    fn the_job_is_read_with_the_rank() {
        let started = started_with(b"TORCHELASTIC_RUN_ID=r7\0RANK=1\0LOCAL_RANK=1\0WORLD_SIZE=2\0");
        let job = Job { id: Some("torchrun:r7".into()), rank: Some(1), local_rank: Some(1), world_size: Some(2) };
        assert_eq!(started.job, job);
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
