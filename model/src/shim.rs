//! The contract between gpuprof's in-process shim (`libgpuprof_shim.so`) and the agent, beside the
//! events themselves (`event`): the environment both spell, PyTorch's symbol both capture back ends
//! attach to, and the counters line a shim sends last. The shim writes with these types and the
//! agent reads with the same ones (docs/shim.md). Fields are added, never renamed: an agent reads
//! the lines of older shims.

pub mod wire;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The shim library's file name (built by the gpuprof-shim package; preloaded by `run --via shim`
/// and shared by a sidecar with its pod).
pub const LIBRARY_FILE: &str = "libgpuprof_shim.so";

/// The agent's Unix socket a shim sends its events to (`gpuprof run --via shim` sets it; the
/// daemon listens where `--shim-socket` or this variable says).
pub const SOCKET_VAR: &str = "GPUPROF_SHIM_SOCKET";
/// The jsonl file a shim appends its events to when no agent answers.
pub const OUTPUT_VAR: &str = "GPUPROF_SHIM_OUTPUT";
/// `0` or `off`: the shim reads no autograd thread-locals (`--no-autograd` sets it).
pub const AUTOGRAD_VAR: &str = "GPUPROF_SHIM_AUTOGRAD";
/// The capture level a shim starts at: `off`, `driver` or `tensors` (the default); the agent or
/// the process itself changes it at run time (docs/shim.md).
pub const LEVEL_VAR: &str = "GPUPROF_SHIM_LEVEL";
/// Set: the shim times each report's phases on the calling thread and says so in the counters
/// line (`timing`), for the overhead breakdown.
pub const TIMING_VAR: &str = "GPUPROF_SHIM_TIMING";

/// The exported (mangled) name of PyTorch's `c10::reportMemoryUsageToProfiler(void*, int64_t,
/// size_t, size_t, c10::Device)` in libc10.so, as a literal: the shim exports its own definition
/// under it (`#[export_name]` takes a literal, or a macro that expands to one).
#[macro_export]
macro_rules! allocator_symbol {
    () => {
        "_ZN3c1027reportMemoryUsageToProfilerEPvlmmNS_6DeviceE"
    };
}

/// PyTorch's allocator report, the hook of tensor-level events: the eBPF capture probes it, the
/// shim interposes it.
pub const ALLOCATOR_SYMBOL: &str = allocator_symbol!();

/// The exported (mangled) name of PyTorch's `c10::reportOutOfMemoryToProfiler(int64_t, size_t,
/// size_t, c10::Device)` in libc10.so, which its caching allocator calls when it gives up on a
/// request: the allocator's totals at an out-of-memory failure.
#[macro_export]
macro_rules! oom_report_symbol {
    () => {
        "_ZN3c1027reportOutOfMemoryToProfilerElmmNS_6DeviceE"
    };
}

/// PyTorch's out-of-memory report: the eBPF capture probes it at every level.
pub const OOM_REPORT_SYMBOL: &str = oom_report_symbol!();

/// The last line a shim sends on its connection (and writes to stderr with `GPUPROF_SHIM_REPORT`):
/// `{"gpuprof_shim":{…}}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CountersLine {
    pub gpuprof_shim: Counters,
}

impl CountersLine {
    /// True for a counters line, false for an event line (no event starts with this key).
    pub fn is_one(line: &str) -> bool {
        line.starts_with("{\"gpuprof_shim\"")
    }
}

/// What one process's shim counted, at its exit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Counters {
    pub pid: u32,
    /// Events written to the destination.
    pub sent: u64,
    /// Records dropped because the queue was full and the sender took nothing for a second (an
    /// agent that stopped reading); a sender that keeps up makes the calling threads wait instead.
    pub dropped_queue_full: u64,
    /// Records whose calling thread waited for room in the queue (a burst the sender had not
    /// caught up with yet), and how long they waited in all, in ns. Absent (0) in the lines of
    /// shims that dropped instead of waiting.
    #[serde(default)]
    pub waits: u64,
    #[serde(default)]
    pub wait_ns: u64,
    /// Python stacks cut at the walk's depth.
    pub stacks_cut: u64,
    /// Events sent without a stack because a frame's code object was unknown.
    pub stacks_unresolved: u64,
    /// Where the process's CUPTI subscription stood at exit. This and the next two are absent
    /// from the lines of shims from before CUPTI.
    #[serde(default)]
    pub cupti: Option<CuptiState>,
    /// The libcupti the shim bound (null: none).
    #[serde(default)]
    pub cupti_library: Option<String>,
    #[serde(default)]
    pub cupti_cross_check: Option<CrossCheck>,
    /// With `GPUPROF_SHIM_TIMING`: where a report's time went on the calling thread.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timing: Option<PhaseTimes>,
}

/// Nanoseconds per report on the calling thread, by phase (`GPUPROF_SHIM_TIMING`): reading
/// autograd's thread-locals, walking the Python stack, recording (the walk included: the clock,
/// the ring's slot), forwarding to libc10, and the whole hook.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PhaseTimes {
    pub reports: u64,
    pub autograd_ns: f64,
    pub walk_ns: f64,
    pub record_ns: f64,
    pub forward_ns: f64,
    pub hook_ns: f64,
}

/// Where a process's CUPTI subscription stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CuptiState {
    /// CUDA was not initialized (or not yet): nothing tried.
    NotStarted,
    /// The shim holds CUPTI's one subscriber slot.
    Subscribed,
    /// Another CUPTI subscriber held the process's slot first.
    SlotTaken,
    /// No libcupti found.
    #[serde(rename = "no_libcupti")]
    NoLibrary,
    /// CUPTI refused in another way.
    Failed,
    /// Handed over to a profiler that subscribed after the shim (and not yet taken back).
    HandedOver,
    /// A state a later shim names that this build does not know.
    #[serde(other)]
    Unknown,
}

/// The driver calls CUPTI's callbacks saw beside CUPTI's memory activity records, each as
/// `{memory kind: [allocations, releases]}` with the kinds `CUpti_ActivityMemoryKind` names
/// (`device`, `managed`, `pinned`, `device_static`, …) that counted anything.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CrossCheck {
    #[serde(default)]
    pub callbacks: BTreeMap<String, [u64; 2]>,
    #[serde(default)]
    pub activity: BTreeMap<String, [u64; 2]>,
    /// `MEMORY_POOL` records (pool creation, trim, destruction): counted, not compared.
    #[serde(default)]
    pub activity_pool_records: u64,
    /// Records CUPTI dropped for want of buffer space.
    #[serde(default)]
    pub activity_dropped: u64,
    /// The slot changed hands: the two sides do not cover one span, nothing was compared.
    #[serde(default)]
    pub interrupted: bool,
    /// The shim's verdict: the two sides agree, or there was nothing to compare.
    pub agrees: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_counters_line_keeps_its_shape_and_reads_lines_of_older_and_later_shims() {
        // As shims wrote it before this type (serde_json's map: keys in alphabetical order).
        let line = r#"{"gpuprof_shim":{"cupti":"no_libcupti","cupti_cross_check":{"activity":{},"activity_dropped":0,"activity_pool_records":0,"agrees":false,"callbacks":{"device":[2,1],"managed":[1,0]},"interrupted":false},"cupti_library":null,"dropped_queue_full":3,"pid":7,"sent":12,"stacks_cut":1,"stacks_unresolved":0}}"#;
        assert!(CountersLine::is_one(line));
        let read: CountersLine = serde_json::from_str(line).unwrap();
        assert_eq!(read.gpuprof_shim.cupti, Some(CuptiState::NoLibrary));
        assert_eq!(read.gpuprof_shim.cupti_cross_check.as_ref().unwrap().callbacks["device"], [2, 1]);
        // Written back: the same fields, values and nesting, and the waits it could not have
        // counted (it dropped instead) as none.
        let written = serde_json::to_string(&read).unwrap();
        assert!(CountersLine::is_one(&written));
        let mut written: serde_json::Value = serde_json::from_str(&written).unwrap();
        let fields = written["gpuprof_shim"].as_object_mut().unwrap();
        assert_eq!((fields.remove("waits"), fields.remove("wait_ns")), (Some(0.into()), Some(0.into())));
        assert_eq!(written, serde_json::from_str::<serde_json::Value>(line).unwrap());
        // Before CUPTI: no such fields.
        let old = r#"{"gpuprof_shim":{"pid":7,"sent":1,"dropped_queue_full":0,"stacks_cut":0,"stacks_unresolved":0}}"#;
        let read: CountersLine = serde_json::from_str(old).unwrap();
        assert_eq!(
            (read.gpuprof_shim.sent, read.gpuprof_shim.cupti, read.gpuprof_shim.cupti_cross_check),
            (1, None, None)
        );
        // A state this build does not know is still a counters line.
        let later = old.replace("\"stacks_unresolved\":0", "\"stacks_unresolved\":0,\"cupti\":\"paused\"");
        let read: CountersLine = serde_json::from_str(&later).unwrap();
        assert_eq!(read.gpuprof_shim.cupti, Some(CuptiState::Unknown));
        assert!(!CountersLine::is_one(r#"{"ts":1,"pid":7,"tid":7,"source":"shim"}"#));
    }
}
