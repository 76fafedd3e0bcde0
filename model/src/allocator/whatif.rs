//! The questions `gpuprof whatif` asks of a trace: does the model reproduce what happened (the
//! check, which every prediction needs first), what would happen under other settings or on
//! another device, which of the usual settings would help, and the smallest device it fits.

use super::{replay_at, replay_checked, AllocatorConfig, AllocatorTrace, ConfigError, Divergence, Replay, MIB};

/// Device memory that is never the allocator's: the CUDA context, the driver's own reserve and
/// libraries' own allocations. Measured on an H100 machine (PyTorch 2.11, CUDA 13): the device's
/// 81,559 MiB less the 80,552 MiB its allocator had when it ran out (tests/gpu/validate_whatif.sh).
/// Used only where the recording cannot tell: it can when the job ran out of memory.
pub(crate) const NON_ALLOCATOR_DEFAULT: u64 = 1007 * MIB;

/// The settings people try first, in the order `--suggest` tries them.
pub const USUAL_SETTINGS: &[&str] = &[
    "expandable_segments:True",
    "max_split_size_mb:128",
    "max_split_size_mb:512",
    "roundup_power2_divisions:4",
    "expandable_segments:True,roundup_power2_divisions:4",
];

/// A trace and the settings it ran with.
#[derive(Debug, Clone)]
pub struct RecordedRun<'t> {
    pub trace: &'t AllocatorTrace,
    /// `PYTORCH_CUDA_ALLOC_CONF` as it was.
    pub ran_with: String,
    pub ran_with_source: SettingsSource,
}

/// Where the settings a job ran with come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SettingsSource {
    /// The caller said (`--ran-with`).
    Declared,
    /// The environment the process was started with, as the capture read it.
    Environment,
    /// The environment, and expandable segments the driver calls show but it did not set (the
    /// program set them itself).
    EnvironmentAndDriver,
    /// Nothing said; the driver calls show expandable segments.
    Driver,
    /// Nothing said either way: PyTorch's defaults are assumed.
    Assumed,
}

impl SettingsSource {
    pub fn describe(self) -> &'static str {
        match self {
            SettingsSource::Declared => "as --ran-with says",
            SettingsSource::Environment => "from the environment it was started with",
            SettingsSource::EnvironmentAndDriver => {
                "from the environment it was started with, and expandable segments seen in its driver calls"
            }
            SettingsSource::Driver => "expandable segments seen in its driver calls",
            SettingsSource::Assumed => "assumed: the recording does not say (--ran-with says)",
        }
    }
}

/// The device memory the allocator may have in a replay, and how that was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Budget {
    /// No limit: the question is the curve, not whether it fits.
    Unbounded,
    /// What the recorded device gave the allocator when it ran out of memory.
    Recorded(u64),
    /// A device of `device_memory` bytes, less what was not the allocator's (`non_allocator`,
    /// found as `source` says).
    Device { device_memory: u64, non_allocator: u64, source: NonAllocatorSource },
}

/// Where the share of device memory that is not the allocator's comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NonAllocatorSource {
    /// The device less what it could give the allocator when the job ran out of memory.
    OutOfMemory,
    /// The most the device held beyond the allocator's reserve in the capture's device readings
    /// (the CUDA context, cuBLAS and NCCL buffers, other processes on the device).
    Readings,
    /// `NON_ALLOCATOR_DEFAULT`: the recording has neither.
    Default,
}

impl NonAllocatorSource {
    pub fn describe(self) -> &'static str {
        match self {
            NonAllocatorSource::OutOfMemory => "measured when the job ran out of memory",
            NonAllocatorSource::Readings => {
                "the most the device held beyond the allocator's reserve in the capture's device readings"
            }
            NonAllocatorSource::Default => {
                "as measured on an H100 machine: the recording has no device readings to measure it from"
            }
        }
    }
}

impl Budget {
    pub fn bytes(&self) -> Option<u64> {
        match *self {
            Budget::Unbounded => None,
            Budget::Recorded(bytes) => Some(bytes),
            Budget::Device { device_memory, non_allocator, .. } => Some(device_memory.saturating_sub(non_allocator)),
        }
    }

    /// Device memory that was not the allocator's: measured where the job ran out (the device
    /// less what it could give the allocator then), else from the device readings, else
    /// `NON_ALLOCATOR_DEFAULT`; and where it came from.
    pub fn non_allocator(trace: &AllocatorTrace) -> (u64, NonAllocatorSource) {
        match (trace.budget.zip(trace.device_memory), trace.beyond_allocator) {
            (Some((budget, total)), _) => (total.saturating_sub(budget), NonAllocatorSource::OutOfMemory),
            (None, Some(seen)) => (seen, NonAllocatorSource::Readings),
            (None, None) => (NON_ALLOCATOR_DEFAULT, NonAllocatorSource::Default),
        }
    }

    /// The budget of a replay on a device of `device_memory` bytes (`None`: the recorded one).
    pub fn for_device(trace: &AllocatorTrace, device_memory: Option<u64>) -> Budget {
        let (non_allocator, source) = Budget::non_allocator(trace);
        match (device_memory, trace.budget, trace.device_memory) {
            (Some(device_memory), _, _) => Budget::Device { device_memory, non_allocator, source },
            (None, Some(recorded), _) => Budget::Recorded(recorded),
            (None, None, Some(device_memory)) => Budget::Device { device_memory, non_allocator, source },
            (None, None, None) => Budget::Unbounded,
        }
    }
}

/// One setting's replay.
#[derive(Debug, Clone)]
pub struct Prediction {
    /// `PYTORCH_CUDA_ALLOC_CONF` of the replay: the recorded settings with the asked ones added.
    pub setting: String,
    /// The asked ones.
    pub extra: Vec<String>,
    pub replay: Replay,
}

impl<'t> RecordedRun<'t> {
    /// The settings it ran with: `declared` when the caller knows them, else the environment the
    /// capture read, with expandable segments where the driver calls show them.
    pub fn new(trace: &'t AllocatorTrace, declared: Option<&str>) -> Self {
        const EXPANDABLE: &str = "expandable_segments:True";
        let (ran_with, ran_with_source) = match (declared, &trace.started_with) {
            (Some(conf), _) => (conf.to_string(), SettingsSource::Declared),
            (None, Some(environment)) => {
                let expandable = AllocatorConfig::parse(environment).is_ok_and(|c| c.expandable_segments);
                if trace.expandable && !expandable {
                    let joined = if environment.is_empty() {
                        EXPANDABLE.to_string()
                    } else {
                        format!("{environment},{EXPANDABLE}")
                    };
                    (joined, SettingsSource::EnvironmentAndDriver)
                } else {
                    (environment.clone(), SettingsSource::Environment)
                }
            }
            (None, None) if trace.expandable => (EXPANDABLE.to_string(), SettingsSource::Driver),
            (None, None) => (String::new(), SettingsSource::Assumed),
        };
        RecordedRun { trace, ran_with, ran_with_source }
    }

    /// The settings it ran with, with `extra` (KEY:VALUE items) on top.
    pub fn setting(&self, extra: &[String]) -> String {
        let mut parts: Vec<&str> = self.ran_with.split(',').filter(|p| !p.trim().is_empty()).collect();
        parts.extend(extra.iter().map(String::as_str));
        parts.join(",")
    }

    /// Replays under the settings it ran with, on the device it ran on, and compares every step
    /// with what the allocator reported; and the segments with the driver's.
    pub fn check(&self) -> Result<(), WhatifError> {
        self.as_it_ran().map(|_| ())
    }

    /// The replay under the settings it ran with, on the device it ran on, its segments where the
    /// job's were — what happened — once it passed `check`, in the same pass.
    pub fn as_it_ran(&self) -> Result<Prediction, WhatifError> {
        let config = AllocatorConfig::parse(&self.ran_with)?;
        if let Some(why) = &self.trace.incomplete {
            return Err(WhatifError::Incomplete(why.clone()));
        }
        let (requests, recorded) = (&self.trace.requests, &self.trace.recorded);
        let replay = replay_checked(&config, self.trace.budget, requests, recorded, &self.trace.segment_addresses)
            .map_err(WhatifError::Diverged)?;
        if replay.device_allocations != self.trace.segments_allocated {
            return Err(WhatifError::Diverged(Divergence::Segments {
                replayed: replay.device_allocations,
                recorded: self.trace.segments_allocated,
            }));
        }
        Ok(Prediction { setting: self.ran_with.clone(), extra: Vec::new(), replay })
    }

    /// The replay under the recorded settings plus `extra`, within `budget`.
    pub fn predict(&self, extra: &[String], budget: Budget) -> Result<Prediction, WhatifError> {
        let setting = self.setting(extra);
        let config = AllocatorConfig::parse(&setting)?;
        let addresses = &self.trace.segment_addresses;
        let replay =
            replay_at(&config, budget.bytes(), &self.trace.requests, addresses).map_err(WhatifError::Replay)?;
        Ok(Prediction { setting, extra: extra.to_vec(), replay })
    }

    /// The usual settings, each replayed within `budget`, best first: those that never run out of
    /// memory before those that do, then by peak reserved. The recorded settings are among them
    /// on another device than the one it ran on (on that one they are `as_it_ran`). `replayed`
    /// is told after each replay how many are done, of how many, for a person waiting on them.
    pub fn suggest(
        &self,
        budget: Budget,
        mut replayed: impl FnMut(usize, usize),
    ) -> Result<Vec<Prediction>, WhatifError> {
        let mut extras: Vec<Vec<String>> = Vec::new();
        if budget != Budget::for_device(self.trace, None) {
            extras.push(Vec::new());
        }
        for usual in USUAL_SETTINGS {
            let extra = vec![usual.to_string()];
            let setting = self.setting(&extra);
            if extras.iter().any(|e| self.setting(e) == setting) {
                continue;
            }
            extras.push(extra);
        }
        let mut tried = Vec::with_capacity(extras.len());
        for (done, extra) in extras.iter().enumerate() {
            tried.push(self.predict(extra, budget)?);
            replayed(done + 1, extras.len());
        }
        tried.sort_by_key(|p| (p.replay.out_of_memory.len(), p.replay.peak_reserved));
        Ok(tried)
    }

    /// The least allocator budget (to 2 MiB) under which the replay with `extra` never runs out
    /// of memory: at least the peak allocated, at most the unbounded replay's peak reserved.
    /// `replayed` is told after each replay how many are done, of at most how many.
    pub fn smallest_budget(
        &self,
        extra: &[String],
        mut replayed: impl FnMut(usize, usize),
    ) -> Result<u64, WhatifError> {
        let unbounded = self.predict(extra, Budget::Unbounded)?.replay;
        let fits = |bytes: u64| -> Result<bool, WhatifError> {
            Ok(self.predict(extra, Budget::Recorded(bytes))?.replay.out_of_memory.is_empty())
        };
        let (mut low, mut high) = (unbounded.peak_allocated / (2 * MIB), unbounded.peak_reserved.div_ceil(2 * MIB));
        // The unbounded replay, then at most one a halving of the range.
        let most = 1 + high.saturating_sub(low).checked_ilog2().map_or(0, |bits| bits as usize + 1);
        let mut done = 1;
        replayed(done, most);
        while low < high {
            let middle = low + (high - low) / 2;
            let fit = fits(middle * 2 * MIB)?;
            done += 1;
            replayed(done, most);
            if fit {
                high = middle;
            } else {
                low = middle + 1;
            }
        }
        Ok(high * 2 * MIB)
    }
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum WhatifError {
    #[error(transparent)]
    Setting(#[from] ConfigError),
    #[error("the recording cannot be replayed: {0}")]
    Incomplete(String),
    #[error("the replay under the settings the job ran with parts from the recording at {0}; no prediction is made")]
    Diverged(Divergence),
    #[error("the replay cannot go on at {0}")]
    Replay(Divergence),
}
