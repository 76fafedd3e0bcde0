//! What NVML (the driver's management library, nvidia-smi's source) says of a process beside
//! what gpuprof saw it allocate: the agent samples it, the end of a run and `top` show it, and the
//! device readings it turns into events are named by `READING_API`.

/// The entry point named on the `mem_info` events of the device readings.
pub const READING_API: &str = "nvmlDeviceGetMemoryInfo";

/// What NVML said of a process, and what gpuprof had seen it allocate at that moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reconciled {
    /// Used device memory as the driver accounts it (nvidia-smi's figure).
    pub nvml_used: u64,
    /// Device memory the probed calls hold (driver allocations, pinned host memory left out).
    pub probed: u64,
    /// Wall-clock ns of the sample.
    pub ts: u64,
}

impl Reconciled {
    /// Memory no probed call made: the context, modules, what was there before the capture.
    pub fn not_probed(&self) -> i64 {
        self.nvml_used as i64 - self.probed as i64
    }
}
